package analysis

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
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
	// Focus is the rank the window was taken for; the findings lead with it.
	Focus *Focus `json:"focus,omitempty"`
}

// Focus is the rank a window was taken for, and why: the rank that crossed a
// trigger ("trigger: rank 5: headroom 3.1 GiB (3.9%) < 5%"), or the rank that
// failed first in a post-mortem.
type Focus struct {
	Rank int    `json:"rank"`
	Why  string `json:"why"`
	// Elsewhere says where the rank's history is when the window does not hold
	// it (the rank is gone: "its history is in oom post-mortem window 3").
	Elsewhere string `json:"elsewhere,omitempty"`
}

// PicklePart is one merged pickle: device i of it is rank FirstRank+i, for ranks
// FirstRank to LastRank; Ranks says which of them hold events (the others are
// missing, not selected, or not decoded).
type PicklePart struct {
	Name      string `json:"name"` // its key, as Outputs names it
	FirstRank int    `json:"first_rank"`
	LastRank  int    `json:"last_rank"`
	Ranks     string `json:"ranks"` // as --ranks writes them, "0-7,63"
	Bytes     int64  `json:"bytes"`
	// OverCap is set when one rank alone is larger than the bound, and was
	// written alone.
	OverCap bool `json:"over_cap,omitempty"`
}

// CutInfo is how a merge was cut, as the summary records it.
type CutInfo struct {
	Ranks   string `json:"ranks,omitempty"`
	Batches string `json:"batches,omitempty"`
	FromUS  *int64 `json:"from_us,omitempty"` // aligned
	ToUS    *int64 `json:"to_us,omitempty"`
}

// Spread compares the ranks' peaks: the largest over the median, and the rank
// with the largest peak (the outlier: the one nearest an OOM). OutlierRanks are
// the ranks whose peak is that largest one when it is above the median (ties are
// named together); none when no rank peaks above the median. OutlierRank is the
// lowest of the ranks with the largest peak, the one diffs compare with the
// median rank.
type Spread struct {
	MinPeakAllocatedBytes    int64   `json:"min_peak_allocated_bytes"`
	MedianPeakAllocatedBytes int64   `json:"median_peak_allocated_bytes"`
	MaxPeakAllocatedBytes    int64   `json:"max_peak_allocated_bytes"`
	MaxOverMedian            float64 `json:"max_over_median"`
	OutlierRank              int     `json:"outlier_rank"`
	OutlierRanks             []int   `json:"outlier_ranks,omitempty"`
	OutlierPeakBytes         int64   `json:"outlier_peak_allocated_bytes"`
	OutlierOverMedian        float64 `json:"outlier_over_median"`
}

// Line says how far the peaks spread and names the outlier, as the answer's
// first line: "peak allocated: median 390.9 MiB, max 487.5 MiB (1.247x the
// median); outlier: rank 3 (487.5 MiB)".
func (sp *Spread) Line() string {
	l := fmt.Sprintf("peak allocated: median %s, max %s (%.3fx the median); outlier: %s", HumanBytes(sp.MedianPeakAllocatedBytes),
		HumanBytes(sp.MaxPeakAllocatedBytes), sp.MaxOverMedian, sp.OutlierText())
	switch len(sp.OutlierRanks) {
	case 0:
	case 1:
		l += " (" + HumanBytes(sp.OutlierPeakBytes) + ")"
	default:
		l += " (" + HumanBytes(sp.OutlierPeakBytes) + " each)"
	}
	return l
}

// IsOutlier reports whether rank is one the spread names as the outlier.
func (sp *Spread) IsOutlier(rank int) bool {
	return sp != nil && slices.Contains(sp.OutlierRanks, rank)
}

// OutlierText names the outlier ranks ("rank 3", "ranks 3, 7"), or says there
// is none.
func (sp *Spread) OutlierText() string {
	switch len(sp.OutlierRanks) {
	case 0:
		return "none (no rank peaks above the median)"
	case 1:
		return fmt.Sprintf("rank %d", sp.OutlierRanks[0])
	}
	parts := make([]string, len(sp.OutlierRanks))
	for i, r := range sp.OutlierRanks {
		parts[i] = strconv.Itoa(r)
	}
	return "ranks " + strings.Join(parts, ", ") + " (tied)"
}

// MedianInt is the median of v (of its middle two when even), 0 when empty.
func MedianInt(v []int64) int64 {
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

// ComputeSpread compares the ranks' peaks (see Spread); nil without ranks.
func ComputeSpread(ranks []RankSummary) *Spread {
	if len(ranks) == 0 {
		return nil
	}
	peaks := make([]int64, len(ranks))
	for i, r := range ranks {
		peaks[i] = r.PeakAllocatedBytes
	}
	sp := &Spread{MedianPeakAllocatedBytes: MedianInt(peaks), MinPeakAllocatedBytes: math.MaxInt64, MaxPeakAllocatedBytes: math.MinInt64}
	for _, r := range ranks {
		p := r.PeakAllocatedBytes
		sp.MinPeakAllocatedBytes = min(sp.MinPeakAllocatedBytes, p)
		if p > sp.MaxPeakAllocatedBytes || p == sp.MaxPeakAllocatedBytes && r.Rank < sp.OutlierRank {
			sp.MaxPeakAllocatedBytes, sp.OutlierRank, sp.OutlierPeakBytes = p, r.Rank, p
		}
	}
	if sp.MaxPeakAllocatedBytes > sp.MedianPeakAllocatedBytes {
		for _, r := range ranks {
			if r.PeakAllocatedBytes == sp.MaxPeakAllocatedBytes {
				sp.OutlierRanks = append(sp.OutlierRanks, r.Rank)
			}
		}
		slices.Sort(sp.OutlierRanks)
	}
	if sp.MedianPeakAllocatedBytes > 0 {
		sp.MaxOverMedian = round3(float64(sp.MaxPeakAllocatedBytes) / float64(sp.MedianPeakAllocatedBytes))
		sp.OutlierOverMedian = round3(float64(sp.OutlierPeakBytes) / float64(sp.MedianPeakAllocatedBytes))
	}
	return sp
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// MedianRank is the rank whose peak is nearest the median peak (the lowest such
// rank), other than exclude.
func MedianRank(ranks []RankSummary, sp *Spread, exclude int) (int, bool) {
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

// RankRanges writes sorted ranks compactly, as ranges: 0-3,7.
func RankRanges(ranks []int) string {
	var b strings.Builder
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(ranks[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(ranks[j]))
		}
		i = j + 1
	}
	return b.String()
}
