package render

import (
	"path/filepath"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// TestPickleCostShortcuts: the bound with its shortcuts (the frames list and the
// strings counted last) is the bound without them, rank after rank of one part.
func TestPickleCostShortcuts(t *testing.T) {
	var names []string
	for _, g := range []string{"ddp4/*.pickle", "legacy2/*.pickle", "single/*.pickle", "protocols/*.pickle"} {
		m, err := filepath.Glob(filepath.Join(filepath.Dir(filepath.Dir(testutil.Snapshot(t, "ddp4/rank0.5.memory_snapshot.pickle"))), g))
		if err != nil || len(m) == 0 {
			t.Fatalf("%s: %v", g, err)
		}
		names = append(names, m...)
	}
	fast, slow := newPickleCost(), newPickleCost()
	slow.slow = true
	in := NewInterner()
	for i, name := range names {
		s, err := snapshot.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		r := analysis.RankFromSnapshot(s, i, name)
		for _, ev := range r.Trace { // frames shared across ranks, as a merge shares them
			in.FrameList(ev.Frames)
		}
		in.Forget()
		ftr, ftail := fast.rank(r, r.Trace)
		str, stail := slow.rank(r, r.Trace)
		if ftr != str || ftail != stail {
			t.Fatalf("%s: bound %d+%d with the shortcuts, %d+%d without", name, ftr, ftail, str, stail)
		}
		if i%3 != 2 { // now and then a rank is bounded and not written
			fast.commit()
			slow.commit()
		}
		t.Logf("%s: %d+%d", filepath.Base(name), ftr, ftail)
	}
}
