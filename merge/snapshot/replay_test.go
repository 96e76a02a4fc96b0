package snapshot

import (
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
)

func TestRealSnapshotsReplay(t *testing.T) {
	root := testutil.RepoRoot(t)
	files, _ := filepath.Glob(filepath.Join(root, "testdata", "snapshots", "*", "*.pickle"))
	shared, _ := filepath.Glob(filepath.Join(root, "..", "shared", "testdata", "torch-2.11", "*", "*.pickle"))
	for _, f := range append(files, shared...) {
		s, err := ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for d := range s.DeviceTraces {
			if err := s.CheckReplay(d); err != nil {
				t.Errorf("%s device %d: %v", filepath.Base(filepath.Dir(f))+"/"+filepath.Base(f), d, err)
			}
		}
	}
}

// TestSegmentsBeforeStaysValid: undoing random tails (odd orders, sizes out of
// range, segments over segments) never panics, and every segment it returns is
// tiled by blocks of positive size, with no two segments overlapping.
func TestSegmentsBeforeStaysValid(t *testing.T) {
	s, err := ReadFile(filepath.Join(testutil.RepoRoot(t), "testdata", "snapshots", "ddp4", "rank0.5.memory_snapshot.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	var addrs []int64
	for _, g := range s.Segments {
		for _, b := range g.Blocks {
			addrs = append(addrs, b.Address, b.Address+b.Size/2)
		}
		addrs = append(addrs, g.Address, g.Address+g.TotalSize)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	actions := []string{ActionAlloc, ActionFreeCompleted, ActionSegmentAlloc, ActionSegmentFree, ActionFreeRequested}
	sizes := []int64{-1000, 0, 1, 512, 4096, 1 << 20, 20 << 20, 1<<63 - 100}
	for round := 0; round < 2000; round++ {
		var tail []*TraceEntry
		for i := rng.IntN(30); i > 0; i-- {
			tail = append(tail, &TraceEntry{Action: actions[rng.IntN(len(actions))], Addr: addrs[rng.IntN(len(addrs))], Size: sizes[rng.IntN(len(sizes))]})
		}
		before := SegmentsBefore(s.Segments, tail)
		var prevEnd int64
		for i, g := range before {
			if i > 0 && g.Address < prevEnd {
				t.Fatalf("round %d: segment %#x overlaps the one before it", round, g.Address)
			}
			prevEnd = g.Address + g.TotalSize
			at := g.Address
			for _, b := range g.Blocks {
				if b.Size <= 0 || b.Address != at {
					t.Fatalf("round %d: segment %#x: a block of %d bytes at %#x, %#x expected", round, g.Address, b.Size, b.Address, at)
				}
				at += b.Size
			}
			if at != g.Address+g.TotalSize {
				t.Fatalf("round %d: segment %#x: blocks cover %d of %d", round, g.Address, at-g.Address, g.TotalSize)
			}
		}
	}
	// the segments given are not changed
	if err := s.CheckReplay(0); err != nil {
		t.Fatal(err)
	}
}
