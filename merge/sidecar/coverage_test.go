package sidecar

import (
	"strings"
	"testing"
)

// TestCovers: the one coverage verdict: every batch once in order is exact; a
// run of consecutive batches inside the window is a partial recording's;
// anything else is neither.
func TestCovers(t *testing.T) {
	for _, c := range []struct {
		batches    []int64
		exact, run bool
	}{
		{[]int64{5, 6, 7}, true, true},
		{[]int64{5, 6}, false, true},
		{[]int64{6, 7}, false, true},
		{nil, false, true},
		{[]int64{5, 7}, false, false},
		{[]int64{4, 5, 6}, false, false},
		{[]int64{6, 7, 8}, false, false},
		{[]int64{5, 5, 6}, false, false},
	} {
		if exact, run := Covers(5, 8, c.batches); exact != c.exact || run != c.run {
			t.Errorf("Covers(5, 8, %v) = %v, %v; want %v, %v", c.batches, exact, run, c.exact, c.run)
		}
	}
	m := &RankMeta{Rank: 1, RunName: "r", Window: &WindowInfo{ID: 3}, Batches: []BatchMark{{Batch: 5}, {Batch: 6}}}
	for _, c := range []struct {
		rank    int
		id      uint64
		partial bool
		want    string
	}{
		{1, 3, true, ""},
		{1, 3, false, "it recorded 2 batches, the window has 3"},
		{2, 3, true, "its metadata is rank 1's"},
		{1, 4, true, "its metadata names another window"},
	} {
		if got := m.Fits(c.rank, "r", c.id, 5, 8, c.partial, false); (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("Fits(rank %d, window %d, partial %v) = %q, want %q", c.rank, c.id, c.partial, got, c.want)
		}
	}
}
