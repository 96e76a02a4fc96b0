package coordinator

import (
	"context"
	"time"

	"github.com/memsnap/memsnap/coordinator/view"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/runlog"
)

// TriggerRank is view.TriggerRank: the leader's queue and the publication read a
// trigger window's reason back with it.
func TriggerRank(reason string) (rank int, why string, ok bool) { return view.TriggerRank(reason) }

// stillCrossing says what rank's latest figures still cross ("" once they do not,
// or once the rank has not reported for viewStale report periods: it left, or
// ran out of memory), for a trigger request that waited in the leader's queue.
func (c *Coordinator) stillCrossing(rank int) string {
	c.mu.Lock()
	rv, ok := c.views[rank]
	c.mu.Unlock()
	if !ok || time.Since(rv.at) > viewStale*max(c.cfg.FiguresInterval, time.Second) {
		return ""
	}
	return c.cfg.Triggers.Crossed(rank, rv.f)
}

// loadLastTrigger takes the cooldown up where an earlier leader left it: the
// newest trigger window in the run's log is the last trigger. Every plan within
// the cooldown is read, however many windows were asked meanwhile.
func (l *leaderRun) loadLastTrigger(ctx context.Context) {
	if !l.c.cfg.Triggers.Enabled() {
		return
	}
	ids, err := l.rl.PlanIDs(ctx)
	if err != nil {
		l.log.Warn("cannot read the run's log for the last trigger window; its cooldown starts now", "err", err)
		l.c.mu.Lock()
		l.c.lastTrigger = time.Now() // (unknown: the cautious side, no second trigger window at once)
		l.c.mu.Unlock()
		return
	}
	since := time.Now().Add(-max(l.c.cfg.Triggers.Cooldown, time.Second))
	for i := len(ids) - 1; i >= 0; i-- {
		p, err := l.rl.ReadPlan(ctx, ids[i])
		if err != nil {
			continue
		}
		if p.Kind == runlog.KindTrigger {
			l.c.mu.Lock()
			if p.Created.After(l.c.lastTrigger) {
				l.c.lastTrigger = p.Created
			}
			l.c.mu.Unlock()
			return
		}
		if p.Created.Before(since) {
			return
		}
	}
}

// checkTriggers runs on the leader when a rank's figures arrive: a crossing
// plans a trigger window (through the leader's queue, as a request of its own)
// unless one was planned less than Cooldown ago.
func (c *Coordinator) checkTriggers(rank int, f *pb.Figures) {
	t := c.cfg.Triggers
	if !t.Enabled() {
		return
	}
	why := t.Crossed(rank, f)
	if why == "" {
		return
	}
	c.mu.Lock()
	l := c.lead
	if l == nil || (!c.lastTrigger.IsZero() && time.Since(c.lastTrigger) < max(t.Cooldown, time.Second)) {
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	if l.triggerPending() {
		return // (one at a time, whatever the cooldown)
	}
	c.mu.Lock()
	c.lastTrigger = time.Now()
	c.mu.Unlock()
	c.log.Warn("a rank crossed a trigger: planning a window of every rank", "why", why, "cooldown", t.Cooldown)
	env := c.envelope(0)
	env.Body = &pb.Envelope_Request{Request: &pb.SnapshotRequest{Kind: pb.WindowKind_WINDOW_KIND_TRIGGER, Reason: view.TriggerPrefix + why}}
	l.deliver(env)
}
