package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/internal/pb"
)

// TestProgressLines: a rank's progress says the batch it is at and the window it
// will record before it records, then the window's batches, the same on every
// rank whichever batch each was at when it said so (the demo printed "acked
// batch 3", "recording batch 13", and "spooled batch 15" on one rank, 16 on the
// others).
func TestProgressLines(t *testing.T) {
	var out bytes.Buffer
	p := newProgressPrinter(&out, false)
	p.update(coordinator.Update{Window: 1, Rank: -1, State: pb.Step_STEP_PLANNED, Batch: -1, Reason: "batches [12, 15) on 2 of 2 ranks"})
	for _, u := range []coordinator.Update{
		{Rank: 0, State: pb.Step_STEP_ACKED, Batch: 3},
		{Rank: 1, State: pb.Step_STEP_ACKED, Batch: -1},
		{Rank: 0, State: pb.Step_STEP_RECORDING, Batch: 12},
		{Rank: 0, State: pb.Step_STEP_SPOOLED, Batch: 15},
		{Rank: 1, State: pb.Step_STEP_SPOOLED, Batch: 16},
		{Rank: 1, State: pb.Step_STEP_UPLOADED, Batch: 17},
		{Rank: 0, State: pb.Step_STEP_FAILED, Batch: 18, Reason: "disk full"},
	} {
		u.Window = 1
		p.update(u)
	}
	want := []string{
		"window 1 planned batches [12, 15) on 2 of 2 ranks",
		"  rank 0   acked      at batch 3; records batches 12-14",
		"  rank 1   acked      records batches 12-14",
		"  rank 0   recording  batches 12-14",
		"  rank 0   spooled    batches 12-14",
		"  rank 1   spooled    batches 12-14",
		"  rank 1   uploaded   batches 12-14",
		"  rank 0   failed     at batch 18  disk full",
	}
	if got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("progress:\n%s\nwant:\n%s", out.String(), strings.Join(want, "\n"))
	}
	// a window of one batch, and a plan whose batches are not said
	if got := rankProgressLine(coordinator.Update{Rank: 2, State: pb.Step_STEP_SPOOLED, Batch: 8}, plannedSpan("batches [7, 8) on 3 of 3 ranks")); got != "  rank 2   spooled    batch 7" {
		t.Errorf("one batch: %q", got)
	}
	if got := rankProgressLine(coordinator.Update{Rank: 2, State: pb.Step_STEP_SPOOLED, Batch: 8}, plannedSpan("asked again")); got != "  rank 2   spooled    at batch 8" {
		t.Errorf("no plan: %q", got)
	}
}
