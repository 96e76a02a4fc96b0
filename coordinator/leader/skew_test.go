package leader

import (
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/rankagent"
	"github.com/memsnap/memsnap/runlog"
)

// TestQuietFromAheadClock: a post-mortem planned by a leader whose clock ran 10
// minutes ahead, with 10 windows after it, is no quiet time here: its time cannot
// be judged on this host's clock, and taken as it says it would have every crash
// declined as part of it for 10.5 minutes, no post-mortem taken.
func TestQuietFromAheadClock(t *testing.T) {
	st, rl, ctx := folderLog(t)
	now := time.Now()
	plan := func(kind string, created time.Time) uint64 {
		t.Helper()
		p, err := rl.CreatePlan(ctx, runlog.Plan{Leader: "job/rank0", Kind: kind, Start: 1, Stop: 2, WorldSize: 2, Ranks: []int{0, 1}, Created: created}, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p.ID
	}
	pm := plan(runlog.KindOOM, now.Add(10*time.Minute)) // leader with a clock 10 min ahead
	for range 10 {
		plan(runlog.KindWindow, now.Add(-time.Minute)) // this clock, older than the quiet
	}
	f := &fakeMember{name: "job/rank1", world: 2}
	cfg := config.Config{Identity: rankagent.Identity{RunName: "job", Rank: 1, WorldSize: 2}, OnOOM: true}
	l := New(f, &cfg, testutil.Logger(t))
	l.rl, l.st, l.term = rl, st, 2
	req := &pb.Envelope{Sender: "job/rank0", SenderRank: 0, Seq: 7,
		Body: &pb.Envelope_Request{Request: &pb.SnapshotRequest{Kind: pb.WindowKind_WINDOW_KIND_CRASH, FailedRank: 0, Cause: "stopped"}}}
	if l.declined(ctx, req) {
		l.mu.Lock()
		until := time.Until(l.lastPM.Add(postmortemQuiet))
		l.mu.Unlock()
		t.Errorf("a crash now declined as part of post-mortem window %d, dated 10 min in the future; every post-mortem declined for %v more", pm, until.Round(time.Second))
	}
}
