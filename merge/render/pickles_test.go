package render

import (
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// TestPickleCostBoundsTheEncoding: the bound a part is planned with is never
// below what the encoder writes, and not wildly above it.
func TestPickleCostBoundsTheEncoding(t *testing.T) {
	for _, name := range []string{"ddp4/rank3.5.memory_snapshot.pickle", "single/transformer.memory_snapshot.pickle", "single/expandable.memory_snapshot.pickle", "single/oom.memory_snapshot.pickle"} {
		s, err := snapshot.ReadFile(testutil.Snapshot(t, name))
		if err != nil {
			t.Fatal(err)
		}
		pp := &PickleParts{Dir: t.TempDir(), Cap: 1 << 40}
		r := analysis.RankFromSnapshot(s, 0, name)
		tr, tail := newPickleCost().rank(r, r.Trace)
		bound := pickleOverhead + tr + tail
		if err := pp.Add(r, r.Trace); err != nil {
			t.Fatal(err)
		}
		if err := pp.Finish(1); err != nil {
			t.Fatal(err)
		}
		size := pp.done[0].size
		t.Logf("%s: written %d bytes, bound %d", name, size, bound)
		if size > bound || bound > 3*size+pickleOverhead {
			t.Fatalf("%s: written %d bytes, bound %d", name, size, bound)
		}
	}
}
