package leader

import (
	"log/slog"
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/coordinator/view"
	"github.com/memsnap/memsnap/internal/pb"
)

// TestOneTriggerAtATime: while a trigger's window is queued or in progress, a
// rank that keeps crossing asks for no other, whatever the cooldown (a short
// one filled the leader's queue with trigger windows a request waited behind).
func TestOneTriggerAtATime(t *testing.T) {
	cfg := config.Config{Triggers: view.Triggers{GrowthBytes: 1, GrowthBatches: 1}}
	l := New(&fakeMember{name: "job/rank0"}, &cfg, slog.New(slog.DiscardHandler))
	if !l.Crossed("rank 1: growing 1.0 MiB a batch") || len(l.msgs) != 1 {
		t.Fatalf("%d requests after a crossing", len(l.msgs))
	}
	l.queue(<-l.msgs) // queued, as the leader's loop does
	l.lastTrigger = time.Time{}
	if l.Crossed("rank 1: growing 1.0 MiB a batch") || len(l.msgs) != 0 {
		t.Fatal("a second trigger window asked for while one is queued")
	}
	l.requests = nil
	l.triggering = true // (in progress)
	if l.Crossed("rank 1: growing 1.0 MiB a batch") || len(l.msgs) != 0 {
		t.Fatal("a second trigger window asked for while one is in progress")
	}
	l.triggering = false
	if !l.Crossed("rank 1: growing 1.0 MiB a batch") || len(l.msgs) != 1 {
		t.Fatal("no trigger window once the last one ended")
	}
	r := (<-l.msgs).GetRequest()
	if l.Crossed("rank 1: growing 1.0 MiB a batch") || len(l.msgs) != 0 {
		t.Fatal("a second trigger window within the cooldown")
	}
	if rank, why, ok := view.TriggerRank(r.GetReason()); r.GetKind() != pb.WindowKind_WINDOW_KIND_TRIGGER || !ok || rank != 1 || why == "" {
		t.Fatalf("the trigger's request: %v %q", r.GetKind(), r.GetReason())
	}
}
