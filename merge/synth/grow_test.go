package synth

import (
	"path/filepath"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// TestGrownSnapshotsReplay: a grown snapshot is one a memory viewer can replay
// (its blocks inside segments, every allocation undone finding its block), for
// every rank's skew.
func TestGrownSnapshotsReplay(t *testing.T) {
	base, err := snapshot.ReadFile(filepath.Join(testutil.RepoRoot(t), "testdata", "snapshots", "single", "transformer.memory_snapshot.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	if err := base.CheckReplay(0); err != nil {
		t.Fatalf("the base: %v", err)
	}
	for _, skew := range []int64{0, 4096, 7 * 4096} {
		g := Grow(base, 50000, skew)
		if n := len(g.DeviceTraces[0]); n < 50000 {
			t.Fatalf("skew %d: %d events", skew, n)
		}
		if err := g.CheckReplay(0); err != nil {
			t.Fatalf("skew %d: %v", skew, err)
		}
	}
}
