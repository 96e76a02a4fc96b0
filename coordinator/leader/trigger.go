package leader

import (
	"context"
	"time"

	"github.com/memsnap/memsnap/coordinator/view"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/runlog"
)

// loadLastTrigger takes the cooldown up where an earlier leader left it: the
// newest trigger window in the run's log is the last trigger. Every plan within
// the cooldown is read, however many windows were asked meanwhile.
func (l *Leader) loadLastTrigger(ctx context.Context) {
	if !l.cfg.Triggers.Enabled() {
		return
	}
	p, err := l.rl.NewestOf(ctx, time.Now().Add(-max(l.cfg.Triggers.Cooldown, time.Second)), runlog.KindTrigger)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err != nil:
		l.log.Warn("cannot read the run's log for the last trigger window; its cooldown starts now", "err", err)
		l.lastTrigger = time.Now() // (unknown: the cautious side, no second trigger window at once)
	case p != nil && p.Created.After(l.lastTrigger):
		l.lastTrigger = p.Created
	}
}

// Crossed takes a trigger window for a rank's figures crossing a trigger (why
// says how), through the leader's queue as a request of its own, unless one was
// taken less than the cooldown ago or one is queued or in progress. It reports
// whether it took one.
func (l *Leader) Crossed(why string) bool {
	cool := max(l.cfg.Triggers.Cooldown, time.Second)
	l.mu.Lock()
	if !l.lastTrigger.IsZero() && time.Since(l.lastTrigger) < cool || l.triggerPendingLocked() {
		l.mu.Unlock()
		return false
	}
	l.lastTrigger = time.Now()
	l.mu.Unlock()
	l.log.Warn("a rank crossed a trigger: planning a window of every rank", "why", why, "cooldown", l.cfg.Triggers.Cooldown)
	env := l.m.Envelope(0)
	env.Body = &pb.Envelope_Request{Request: &pb.SnapshotRequest{Kind: pb.WindowKind_WINDOW_KIND_TRIGGER, Reason: view.TriggerPrefix + why}}
	l.Deliver(env)
	return true
}
