package coordinator

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/runlog"
)

// Triggers are the thresholds that make the leader take a window before an OOM:
// as soon as a rank's figures (view.go) cross one, the leader plans a window of
// every rank, of kind trigger, whose reason names the rank and what it crossed.
// At most one every Cooldown.
type Triggers struct {
	// HeadroomBytes and HeadroomRatio: a rank whose headroom falls below either
	// (0: not set; the ratio is of its device's size).
	HeadroomBytes int64
	HeadroomRatio float64
	// GrowthBytes over GrowthBatches: a rank whose allocated bytes grow at least
	// this much over that many batches (a leak), at its measured growth per batch.
	GrowthBytes   int64
	GrowthBatches int64
	// Cooldown is the least time between two trigger windows.
	Cooldown time.Duration
	// Dump: a trigger asks every rank for the allocator history its trainer
	// keeps (--record-always) at once, as a post-mortem does, rather than
	// planning batches to come: the window holds what led to the crossing.
	Dump bool
}

// Enabled reports whether any threshold is set.
func (t Triggers) Enabled() bool {
	return t.HeadroomBytes > 0 || t.HeadroomRatio > 0 || t.GrowthBytes > 0
}

// Crossed says which of t's thresholds the rank's figures cross, as a reason a
// person reads ("" when none): "rank 5: headroom 3.1 GiB (3.9%) < 5%, growing
// 48.0 MiB a batch".
func (t Triggers) Crossed(rank int, f *pb.Figures) string {
	var parts []string
	if f.DeviceTotal > 0 {
		pct := 100 * float64(f.Headroom) / float64(f.DeviceTotal)
		switch {
		case t.HeadroomRatio > 0 && float64(f.Headroom) < t.HeadroomRatio*float64(f.DeviceTotal):
			parts = append(parts, fmt.Sprintf("headroom %s (%.1f%%) < %g%%", analysis.HumanBytes(f.Headroom), pct, 100*t.HeadroomRatio))
		case t.HeadroomBytes > 0 && f.Headroom < t.HeadroomBytes:
			parts = append(parts, fmt.Sprintf("headroom %s (%.1f%%) < %s", analysis.HumanBytes(f.Headroom), pct, analysis.HumanBytes(t.HeadroomBytes)))
		}
	}
	n := max(t.GrowthBatches, 1)
	grows := t.GrowthBytes > 0 && f.Growth*float64(n) >= float64(t.GrowthBytes)
	if len(parts) == 0 && !grows {
		return ""
	}
	switch {
	case grows:
		parts = append(parts, fmt.Sprintf("growing %s a batch (%s or more over %d batches)", analysis.HumanBytes(int64(f.Growth)), analysis.HumanBytes(t.GrowthBytes), n))
	case f.Growth > 0:
		parts = append(parts, fmt.Sprintf("growing %s a batch", analysis.HumanBytes(int64(f.Growth))))
	}
	return fmt.Sprintf("rank %d: %s", rank, strings.Join(parts, ", "))
}

// triggerPrefix begins the reason of every trigger window: "trigger: " and what
// Crossed said.
const triggerPrefix = "trigger: "

// TriggerRank reads a trigger window's reason back ("trigger: rank 5: headroom
// …"): the rank that crossed, and what it crossed ("headroom …").
func TriggerRank(reason string) (rank int, why string, ok bool) {
	rest, found := strings.CutPrefix(reason, triggerPrefix+"rank ")
	if !found {
		return 0, "", false
	}
	num, why, found := strings.Cut(rest, ": ")
	n, err := strconv.Atoi(num)
	if !found || err != nil || n < 0 || num != strconv.Itoa(n) {
		return 0, "", false
	}
	return n, why, true
}

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
	env.Body = &pb.Envelope_Request{Request: &pb.SnapshotRequest{Kind: pb.WindowKind_WINDOW_KIND_TRIGGER, Reason: triggerPrefix + why}}
	l.deliver(env)
}
