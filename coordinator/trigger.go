package coordinator

import (
	"time"

	"github.com/memsnap/memsnap/coordinator/view"
	"github.com/memsnap/memsnap/internal/pb"
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
	c.mu.Unlock()
	if l != nil {
		l.Crossed(why)
	}
}
