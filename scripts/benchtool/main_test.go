package main

import (
	"path/filepath"
	"strconv"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// TestGeneratedSnapshotsReplay: what `benchtool gen` writes (with a planted buffer,
// balanced, skewed) is a snapshot a memory viewer can replay, and ranks differ.
func TestGeneratedSnapshotsReplay(t *testing.T) {
	base := filepath.Join(testutil.RepoRoot(t), "testdata", "snapshots", "single", "transformer.memory_snapshot.pickle")
	for _, args := range [][]string{{"-skew", "4096"}, {"-skew", "0", "-balance", "-plant-rank", "1", "-marks", "3"}} {
		out := t.TempDir()
		if err := gen(append(append([]string{"-events", "30000", "-ranks", "3", "-out", out}, args...), base)); err != nil {
			t.Fatal(err)
		}
		var peaks []int64
		for r := 0; r < 3; r++ {
			s, err := snapshot.ReadFile(filepath.Join(out, "rank"+strconv.Itoa(r)+".1.memory_snapshot.pickle"))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.CheckReplay(0); err != nil {
				t.Fatalf("%v rank %d: %v", args, r, err)
			}
			peaks = append(peaks, s.ComputeFigures().Devices[0].PeakAllocatedBytes)
		}
		if peaks[0] == peaks[1] && peaks[1] == peaks[2] {
			t.Fatalf("%v: every rank peaks at %d", args, peaks[0])
		}
	}
}
