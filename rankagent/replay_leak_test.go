package rankagent

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// TestReplayLeakInTheSnapshot: a leaking replay trainer's window snapshot holds
// its leak as the allocator would (a block a batch, allocated from LeakSite and
// never freed, in segments of their own): the trace still replays back from the
// segments, the snapshot ends holding the leak of every batch so far, and the
// analysis names the leaking site as what the window kept.
func TestReplayLeakInTheSnapshot(t *testing.T) {
	b, err := os.ReadFile(testutil.Snapshot(t, "ddp4/rank1.5.memory_snapshot.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	base, err := snapshot.DecodeAny(b)
	if err != nil {
		t.Fatal(err)
	}
	const leak = int64(16 << 20)
	r := &replay{cfg: ReplayConfig{LeakPerBatch: leak}, base: base}
	marks := []BatchMark{{Batch: 5, StartUS: 1e6, EndUS: 1.1e6}, {Batch: 6, StartUS: 1.2e6, EndUS: 1.3e6}, {Batch: 7, StartUS: 1.4e6, EndUS: 1.5e6}}
	s := r.spreadOver(marks)
	if err := s.CheckReplay(0); err != nil {
		t.Fatalf("the leaking snapshot does not replay: %v", err)
	}
	if got, want := s.AllocatedAtEnd(0), base.AllocatedAtEnd(0)+8*leak; got != want {
		t.Fatalf("allocated at the end %d, want the recorded %d and 8 batches' leak", got, want)
	}
	if len(base.Segments) == len(s.Segments) || len(base.DeviceTraces[0]) != len(s.DeviceTraces[0])-6 {
		t.Fatal("the base snapshot was changed, or the leak's events are not 6")
	}
	a, err := analysis.AnalyzeSnapshot(context.Background(), s, nil, analysis.AnalyzeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	site := fmt.Sprintf("%s (%s:%d)", LeakSite.Name, LeakSite.Filename, LeakSite.Line)
	found := false
	for _, k := range a.KeptSites {
		found = found || k.Site == site && k.Bytes == 3*leak && k.Blocks == 3
	}
	if !found {
		t.Fatalf("kept sites %+v, want %s with 3 blocks of the leak", a.KeptSites, site)
	}
	if r.cfg.LeakPerBatch = 0; len(r.spreadOver(marks).Segments) != len(base.Segments) {
		t.Fatal("a replay that does not leak added segments")
	}
}
