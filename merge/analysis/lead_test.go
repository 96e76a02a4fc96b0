package analysis

import (
	"strings"
	"testing"
)

// TestFindingsLeadWithWhatIsKnown: when most of the outlier's peak is unknown
// (its trainer did not call watch), the findings lead with the known category
// that differs (the demo's first finding was the peak of which 69% is unknown),
// and the headline names a known category even where unknown differs more; a
// peak that is mostly known keeps its line first; with no known difference, the
// headline names unknown.
func TestFindingsLeadWithWhatIsKnown(t *testing.T) {
	const MiB = 1 << 20
	summary := func(atPeak map[string]int64, diffs ...CategoryDiff) *Summary {
		return &Summary{
			Spread: &Spread{OutlierRank: 3, OutlierRanks: []int{3}},
			Ranks: []RankSummary{{Rank: 1, PeakAllocatedBytes: 391 * MiB},
				{Rank: 3, PeakAllocatedBytes: 487 * MiB, Categories: &Categories{AtPeak: atPeak}}},
			Diff: &RankDiff{Base: DiffSide{Label: "rank 1", Rank: 1}, Other: DiffSide{Label: "rank 3", Rank: 3}, Categories: diffs},
		}
	}
	other := CategoryDiff{Category: CatOther, BaseBytes: 1 * MiB, OtherBytes: 98 * MiB, DeltaBytes: 97 * MiB, Module: "<module> (train.py:27)", ModuleDeltaBytes: 96 * MiB}
	unknown := CategoryDiff{Category: CatUnknown, BaseBytes: 100 * MiB, OtherBytes: 300 * MiB, DeltaBytes: 200 * MiB}
	cases := []struct {
		name   string
		s      *Summary
		first  string
		absent string
	}{
		{"mostly unknown", summary(map[string]int64{CatTemporaries: 54 * MiB, CatOther: 98 * MiB, CatUnknown: 336 * MiB}, unknown, other),
			"rank 3 holds 97.0 MiB more other allocations than rank 1, 96.0 MiB of it in <module> (train.py:27)", "more unknown"},
		{"mostly known", summary(map[string]int64{CatActivations: 300 * MiB, CatOther: 98 * MiB, CatUnknown: 89 * MiB}, unknown, other),
			"rank 3 at its peak of 487.0 MiB: ", "more unknown"},
		{"only unknown differs", summary(map[string]int64{CatOther: 98 * MiB, CatUnknown: 336 * MiB}, unknown),
			"rank 3 at its peak of 487.0 MiB: ", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := c.s.Findings()
			all := strings.Join(f, "\n")
			if len(f) < 2 || !strings.HasPrefix(f[0], c.first) || (c.absent != "" && strings.Contains(all, c.absent)) {
				t.Fatalf("findings:\n%s\nwant the first to begin %q, and no %q", all, c.first, c.absent)
			}
			if c.absent == "" && !strings.Contains(all, "rank 3 holds 200.0 MiB more unknown than rank 1") {
				t.Fatalf("findings:\n%s\nwant the unknown difference named", all)
			}
		})
	}
}
