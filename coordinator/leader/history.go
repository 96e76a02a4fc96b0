package leader

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/runlog"
)

// historyPlans bounds how many of the newest plans are read for the
// post-mortem that holds a rank's history.
const historyPlans = 64

// pointToHistory says, for a window taken for a rank that it does not merge
// (an alert's or trigger's rank that is gone: its trainer ran out of memory or
// stopped), where that rank's history is: the newest post-mortem that asked
// it, or else its incident snapshot in the store. The run's log is read; a
// read that fails leaves the window's answer as it is.
func (l *Leader) pointToHistory(ctx context.Context, id uint64, cfg *merge.Config) {
	f := cfg.Focus
	if f == nil || slices.ContainsFunc(cfg.Inputs, func(in merge.Input) bool { return in.Rank == f.Rank }) {
		return
	}
	plans, err := l.rl.Latest(ctx, historyPlans)
	if err != nil {
		l.log.Warn("cannot read the run's log for the post-mortem of the rank the window was taken for", "window", id, "rank", f.Rank, "err", err)
		return
	}
	if p := postmortemOf(plans, id, f.Rank); p != nil {
		f.Elsewhere = fmt.Sprintf("its history is in %s post-mortem window %d", p.Kind, p.ID)
		if p.FailedRank != nil && *p.FailedRank == f.Rank {
			f.Elsewhere += fmt.Sprintf(", which it failed first (%s)", p.Cause)
		}
		return
	}
	inc, _, err := l.rl.Incidents(ctx, f.Rank, time.Time{}, time.Now().Add(time.Minute))
	if err != nil || len(inc) == 0 {
		return
	}
	last := inc[len(inc)-1]
	f.Elsewhere = fmt.Sprintf("its %s snapshot of %s is stored (%s); no post-mortem holds it yet", last.Reason, last.At.UTC().Format(time.RFC3339), last.Key)
}

// postmortemOf is the newest post-mortem among plans (newest first), other than
// window id, that asked rank: one it failed first in comes before one it was
// only part of.
func postmortemOf(plans []*runlog.Plan, id uint64, rank int) *runlog.Plan {
	var part *runlog.Plan
	for _, p := range plans {
		if p.ID == id || p.Kind != "oom" && p.Kind != "crash" {
			continue
		}
		if p.FailedRank != nil && *p.FailedRank == rank {
			return p
		}
		if part == nil && slices.Contains(p.Ranks, rank) {
			part = p
		}
	}
	return part
}
