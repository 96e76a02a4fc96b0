package merge

import (
	"math"
	"sort"
)

// Summary is merged.summary.json.
type Summary struct {
	Version      int    `json:"version"`
	WorldSize    int    `json:"world_size"`
	Align        string `json:"align"`
	RanksMerged  []int  `json:"ranks_merged"`
	MissingRanks []int  `json:"missing_ranks"`
	// MissingReasons says why each missing rank is missing (rank -> reason).
	MissingReasons map[string]string `json:"missing_reasons,omitempty"`
	Spread         *Spread           `json:"spread,omitempty"`
	ClockOffsetsUS map[string]int64  `json:"clock_offsets_us"`
	// ClockUnmeasured are the ranks whose clock offset was never measured: they
	// are in no clock_offsets_us, and their times are their own clocks'
	ClockUnmeasured []int             `json:"clock_unmeasured,omitempty"`
	Ranks           []RankSummary     `json:"ranks"`
	Outputs         map[string]string `json:"outputs,omitempty"`
	// Pickles are the merged pickles, one per group of ranks.
	Pickles []PicklePart `json:"pickles,omitempty"`
	// Cut says which ranks and which part of their traces were merged (nil: all).
	Cut *CutInfo `json:"cut,omitempty"`
	// Diff says why the outlier differs from the median rank; DiffsAsked compares
	// the ranks the merge was asked about with the median rank.
	Diff       *RankDiff  `json:"diff,omitempty"`
	DiffsAsked []RankDiff `json:"diffs_asked,omitempty"`
}

// Spread compares the ranks' peaks: the largest over the median, and the rank
// farthest from the median (the outlier).
type Spread struct {
	MinPeakAllocatedBytes    int64   `json:"min_peak_allocated_bytes"`
	MedianPeakAllocatedBytes int64   `json:"median_peak_allocated_bytes"`
	MaxPeakAllocatedBytes    int64   `json:"max_peak_allocated_bytes"`
	MaxOverMedian            float64 `json:"max_over_median"`
	OutlierRank              int     `json:"outlier_rank"`
	OutlierPeakBytes         int64   `json:"outlier_peak_allocated_bytes"`
	OutlierOverMedian        float64 `json:"outlier_over_median"`
}

func medianInt(v []int64) int64 {
	s := append([]int64(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func computeSpread(ranks []RankSummary) *Spread {
	if len(ranks) == 0 {
		return nil
	}
	peaks := make([]int64, len(ranks))
	for i, r := range ranks {
		peaks[i] = r.PeakAllocatedBytes
	}
	sp := &Spread{MedianPeakAllocatedBytes: medianInt(peaks), MinPeakAllocatedBytes: math.MaxInt64}
	far := -1.0
	for _, r := range ranks {
		p := r.PeakAllocatedBytes
		sp.MinPeakAllocatedBytes = min(sp.MinPeakAllocatedBytes, p)
		sp.MaxPeakAllocatedBytes = max(sp.MaxPeakAllocatedBytes, p)
		d := math.Abs(float64(p - sp.MedianPeakAllocatedBytes))
		if d > far {
			far, sp.OutlierRank, sp.OutlierPeakBytes = d, r.Rank, p
		}
	}
	if sp.MedianPeakAllocatedBytes > 0 {
		sp.MaxOverMedian = round3(float64(sp.MaxPeakAllocatedBytes) / float64(sp.MedianPeakAllocatedBytes))
		sp.OutlierOverMedian = round3(float64(sp.OutlierPeakBytes) / float64(sp.MedianPeakAllocatedBytes))
	}
	return sp
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// medianRank is the rank whose peak is nearest the median peak (the lowest such
// rank), other than exclude.
func medianRank(ranks []RankSummary, sp *Spread, exclude int) (int, bool) {
	best, found := 0, false
	var bestD int64
	for _, r := range ranks {
		if r.Rank == exclude {
			continue
		}
		d := r.PeakAllocatedBytes - sp.MedianPeakAllocatedBytes
		if d < 0 {
			d = -d
		}
		if !found || d < bestD {
			best, bestD, found = r.Rank, d, true
		}
	}
	return best, found
}
