package leader

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/coordinator/view"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/rankagent"
	"github.com/memsnap/memsnap/runlog"
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
	end := l.begin(pb.WindowKind_WINDOW_KIND_TRIGGER) // (in progress)
	if l.Crossed("rank 1: growing 1.0 MiB a batch") || len(l.msgs) != 0 || !l.Busy() {
		t.Fatal("a second trigger window asked for while one is in progress")
	}
	end()
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

// TestUrgentWindowsGoFirst: behind 200 asked windows (each with a reason of its
// own, so no cooldown merges them), a trigger's window, then a post-mortem, then
// an alert's go first, in the order they came; a full queue makes room for an
// urgent window by answering the newest asked one.
func TestUrgentWindowsGoFirst(t *testing.T) {
	f := &fakeMember{name: "job/rank0"}
	cfg := config.Config{}
	l := New(f, &cfg, slog.New(slog.DiscardHandler))
	ask := func(i int, kind pb.WindowKind, reason string) *pb.Envelope {
		return &pb.Envelope{Sender: fmt.Sprintf("job/client-%d", i), SenderRank: -1, Seq: uint64(i + 1),
			Body: &pb.Envelope_Request{Request: &pb.SnapshotRequest{Kind: kind, Reason: reason}}}
	}
	for i := range 200 {
		l.queue(ask(i, pb.WindowKind_WINDOW_KIND_WINDOW, fmt.Sprintf("api: asked %d", i)))
	}
	l.queue(ask(200, pb.WindowKind_WINDOW_KIND_TRIGGER, "trigger: rank 3: growing 24.0 MiB a batch"))
	l.queue(ask(201, pb.WindowKind_WINDOW_KIND_OOM, "out of memory"))
	l.queue(ask(202, pb.WindowKind_WINDOW_KIND_WINDOW, "alert: HeadroomLow (rank 3)"))
	for i, want := range []uint64{201, 202, 203, 1, 2} {
		if got := l.pop(); got.Seq != want {
			t.Fatalf("request %d served: seq %d (%q), want %d", i, got.Seq, got.GetRequest().GetReason(), want)
		}
	}
	l.requests = nil
	for i := range maxQueued {
		l.queue(ask(i, pb.WindowKind_WINDOW_KIND_WINDOW, fmt.Sprintf("api: asked %d", i)))
	}
	if l.queue(ask(maxQueued, pb.WindowKind_WINDOW_KIND_WINDOW, "api: one more")) {
		t.Fatal("an asked window queued past the limit")
	}
	if !l.queue(ask(maxQueued+1, pb.WindowKind_WINDOW_KIND_TRIGGER, "trigger: rank 1: headroom 1.0 GiB")) || l.pop().Seq != maxQueued+2 {
		t.Fatal("a trigger's window not queued first in a full queue")
	}
	told := f.told()
	if len(told) != 1 || told[0].GetAck().GetOk() || told[0].GetAck().GetCode() != pb.AckCode_ACK_ERROR {
		t.Fatalf("the asked window that made room was told %v", told)
	}
}

// TestQuietReadWhole: a new leader reads the post-mortem quiet and the trigger
// cooldown of the leaders before it from the whole of their time in the run's
// log: a crash reported 10 s after another leader's post-mortem is part of it,
// and no trigger window is taken 30 s after the last one under a 10-minute
// cooldown, however many windows were asked in between (the newest 16 plans,
// or 4, were read before).
func TestQuietReadWhole(t *testing.T) {
	st, rl, ctx := folderLog(t)
	now := time.Now()
	plan := func(kind string, ago time.Duration) uint64 {
		t.Helper()
		p, err := rl.CreatePlan(ctx, runlog.Plan{Leader: "job/rank0", Kind: kind, Start: 1, Stop: 2, WorldSize: 2, Ranks: []int{0, 1}, Created: now.Add(-ago)}, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p.ID
	}
	trigger := plan(runlog.KindTrigger, 30*time.Second)
	pm := plan(runlog.KindOOM, 10*time.Second)
	for range 20 {
		plan(runlog.KindWindow, 0)
	}
	// and a post-mortem of orphaned incidents, dated by its oldest: newer, and
	// older than the quiet time
	plan(runlog.KindCrash, 2*time.Minute)
	f := &fakeMember{name: "job/rank1", world: 2}
	cfg := config.Config{Identity: rankagent.Identity{RunName: "job", Rank: 1, WorldSize: 2}, OnOOM: true,
		Triggers: view.Triggers{GrowthBytes: 1, GrowthBatches: 1, Cooldown: 10 * time.Minute}}
	l := New(f, &cfg, testutil.Logger(t))
	l.rl, l.st, l.term = rl, st, 2
	l.loadLastTrigger(ctx)
	if l.Crossed("rank 1: growing 1.0 MiB a batch") {
		t.Fatalf("a trigger window 30 s after window %d, under a 10-minute cooldown", trigger)
	}
	req := &pb.Envelope{Sender: "job/rank0", SenderRank: 0, Seq: 7,
		Body: &pb.Envelope_Request{Request: &pb.SnapshotRequest{Kind: pb.WindowKind_WINDOW_KIND_CRASH, FailedRank: 0, Cause: "stopped"}}}
	if !l.declined(ctx, req) {
		t.Fatal("a crash 10 s after another leader's post-mortem: a new post-mortem")
	}
	told := f.told()
	if want := fmt.Sprintf("part of post-mortem window %d", pm); len(told) != 1 || told[0].GetAck().GetMessage() != want {
		t.Fatalf("told %v; want %q", told, want)
	}
}
