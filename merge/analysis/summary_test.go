package analysis

import (
	"slices"
	"strings"
	"testing"
)

// TestOutlierIsAboveTheMedian: the outlier is the rank with the largest peak,
// never one below the median (a rank that held less is no danger), ties are named
// together, and with no rank above the median there is none.
func TestOutlierIsAboveTheMedian(t *testing.T) {
	ranks := func(peaks ...int64) []RankSummary {
		var out []RankSummary
		for i, p := range peaks {
			out = append(out, RankSummary{Rank: i, PeakAllocatedBytes: p})
		}
		return out
	}
	for _, c := range []struct {
		peaks []int64
		want  []int
		text  string
	}{
		// one rank far below the others: the largest of the rest, not it
		{[]int64{100, 100, 101, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 10}, []int{2}, "outlier: rank 2 (101 B)"},
		{[]int64{100, 120, 100, 120}, []int{1, 3}, "outlier: ranks 1, 3 (tied) (120 B each)"},
		{[]int64{100, 100, 100, 50}, nil, "outlier: none (no rank peaks above the median)"},
		{[]int64{7, 9}, []int{1}, "outlier: rank 1 (9 B)"},
	} {
		sp := ComputeSpread(ranks(c.peaks...))
		if !slices.Equal(sp.OutlierRanks, c.want) || !strings.HasSuffix(sp.Line(), c.text) {
			t.Errorf("%v: outliers %v, %q; want %v, %q", c.peaks, sp.OutlierRanks, sp.Line(), c.want, c.text)
		}
		if sp.MaxPeakAllocatedBytes != slices.Max(c.peaks) || sp.OutlierPeakBytes != sp.MaxPeakAllocatedBytes {
			t.Errorf("%v: max %d, outlier peak %d", c.peaks, sp.MaxPeakAllocatedBytes, sp.OutlierPeakBytes)
		}
	}
}
