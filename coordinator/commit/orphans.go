package commit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/runlog"
)

// Orphans lists the incidents in the run's log, stored before before, that no
// post-mortem's plan covers (a post-mortem covers the incidents stored from
// IncidentSpan before its plan to IncidentSpan after its deadline), oldest
// first: ranks that stored the snapshot of their OOM or crash when no leader
// was there to take a post-mortem (the job was torn down with its leader).
func Orphans(ctx context.Context, rl *runlog.Log, before time.Time) ([]*runlog.Report, error) {
	incs, _, err := rl.AllIncidents(ctx, time.Time{}, before)
	if err != nil || len(incs) == 0 {
		return nil, err
	}
	ids, err := rl.PlanIDs(ctx)
	if err != nil {
		return nil, err
	}
	oldest := incs[0].At.Add(-IncidentSpan)
	for i := len(ids) - 1; i >= 0 && len(incs) > 0; i-- {
		p, err := rl.ReadPlan(ctx, ids[i])
		if errors.Is(err, runlog.ErrMalformed) || errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if p.Kind == runlog.KindOOM || p.Kind == runlog.KindCrash {
			incs = uncovered(incs, p)
		}
		if p.Created.Before(oldest) && p.Deadline.Before(oldest) {
			break // plans are older from here on
		}
	}
	return incs, nil
}

func uncovered(incs []*runlog.Report, p *runlog.Plan) []*runlog.Report {
	var out []*runlog.Report
	for _, in := range incs {
		if in.At.Before(p.Created.Add(-IncidentSpan)) || in.At.After(p.Deadline.Add(IncidentSpan)) {
			out = append(out, in)
		}
	}
	return out
}

// PostmortemPlan is the plan of a post-mortem of the incidents found in the
// run's log (Orphans), for a world of world ranks: an OOM's if any incident is
// one, else a crash's, its failed rank the first incident's, planned when that
// incident was stored so that it covers them all.
func PostmortemPlan(incs []*runlog.Report, world int) runlog.Plan {
	first, last := incs[0], incs[len(incs)-1]
	kind, cause := runlog.KindCrash, first.Cause
	for _, in := range incs {
		if in.Reason == "oom" {
			kind, first, cause = runlog.KindOOM, in, "out of memory"
			break
		}
	}
	if cause == "" {
		cause = "stopped"
	}
	ranks := make([]int, 0, world)
	for r := 0; r < world; r++ {
		ranks = append(ranks, r)
	}
	fr := first.Rank
	return runlog.Plan{Kind: kind, Reason: fmt.Sprintf("post-mortem of %d ranks' snapshots found in the run's log", len(incs)), Ranks: ranks,
		WorldSize: world, Created: incs[0].At, Deadline: last.At.Add(time.Second), FailedRank: &fr, Cause: cause}
}
