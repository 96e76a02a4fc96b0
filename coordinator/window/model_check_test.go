package window_test

import (
	"bytes"
	"context"
	"slices"
	"strings"

	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/runlog"
)

// check tests the invariants against the store, after every step.
func (m *model) check() {
	m.t.Helper()
	m.checkManifest()
	m.checkReported()
	m.checkStale()
}

// checkManifest: the manifest's versions are an answer then its completion, or
// a failure; once. The log and the manifest agree.
func (m *model) checkManifest() {
	m.t.Helper()
	var first *publish.Manifest
	for i, b := range m.st.versions {
		mf, err := publish.ParseManifest(b)
		if err != nil {
			m.fatalf("manifest version %d does not parse: %v", i+1, err)
		}
		switch {
		case i == 0:
			first = mf
			if !mf.Failed() && len(mf.Pending) == 0 {
				m.fatalf("the first commit is published whole, not answered first")
			}
		case i == 1 && first.Failed():
			m.fatalf("a failed window's manifest was replaced")
		case i == 1:
			if mf.Failed() || len(mf.Pending) > 0 || mf.Claim != first.Claim || mf.Attempt != first.Attempt {
				m.fatalf("an answer (%s) was replaced by another set (%s, failed %v, pending %v)", first.Attempt, mf.Attempt, mf.Failed(), mf.Pending)
			}
		default:
			m.fatalf("the manifest was written %d times", len(m.st.versions))
		}
	}
	c, err := m.rawCommit()
	if err != nil {
		m.fatalf("reading the commit: %v", err)
	}
	o, err := m.raw.ReadOutcome(context.Background(), m.plan.ID)
	if err == nil && !window.Agrees(c, o.State) {
		m.fatalf("the log says %s, the manifest %+v", o.State, c)
	}
	if err == nil && c == nil {
		m.fatalf("an outcome (%s) with no commit", o.State)
	}
}

// checkReported is invariant (a), stored means reported: a rank's job that
// ended has its report in the log, and a snapshot in the store whose job ended
// is named by a report.
func (m *model) checkReported() {
	m.t.Helper()
	ctx := context.Background()
	reps, _, err := m.raw.Reports(ctx, m.plan.ID)
	if err != nil {
		m.fatalf("reading the reports: %v", err)
	}
	named := map[string]bool{}
	for _, rep := range reps {
		named[rep.Key] = true
	}
	for _, r := range m.ranks {
		for _, j := range r.ended {
			if rep := reps[r.id]; rep == nil || rep.Error != "" {
				m.fatalf("(a) rank %d's upload job of %s (%s) left its spool, and the log holds no report of it", r.id, j.key, j.reason)
			}
		}
	}
	objs, err := m.st.Store.List(ctx, modelRun+"/snapshots/")
	if err != nil {
		m.fatalf("listing the snapshots: %v", err)
	}
	for _, o := range objs {
		for _, r := range m.ranks {
			if slices.ContainsFunc(r.ended, func(j *mjob) bool { return j.key == o.Key }) && !named[o.Key] {
				m.fatalf("(a) %s is in the store, its job ended, and no report names it", o.Key)
			}
		}
	}
}

// checkDecision is invariant (b), at the moment leader l's commit is stored:
// a window failed for want of snapshots, or published without a rank, while
// the log held a report of a stored snapshot of that rank when l last read it.
// (A report written after l's last read is one l could not know of.)
func (m *model) checkDecision(l *mleader, mf *publish.Manifest) {
	m.t.Helper()
	if mf.Failed() && !strings.HasPrefix(mf.Error, "no rank stored") || !mf.Failed() && len(mf.Pending) == 0 {
		return
	}
	for _, r := range m.ranks {
		seq, ok := m.reportSeq[r.id]
		if !ok || seq >= l.lastRead[r.id] || slices.Contains(mf.RanksMerged, r.id) {
			continue
		}
		if mf.Failed() {
			m.fatalf("(b) leader %d (term %d) failed the window (%s) though the log held rank %d's report when it read it", l.n, l.term, mf.Error, r.id)
		}
		m.fatalf("(b) leader %d (term %d) publishes ranks %v without rank %d, whose report the log held when it read it", l.n, l.term, mf.RanksMerged, r.id)
	}
}

// checkStale is invariant (c): a record of the run's log written under a term
// older than the head's, after that term took over, is believed by none of
// the log's readers.
func (m *model) checkStale() {
	m.t.Helper()
	ctx := context.Background()
	ro := runlog.New(readOnly{m.st.Store}, modelRun)
	for _, s := range m.stale {
		if b, _, err := store.ReadObject(ctx, m.st.Store, s.key, 1<<20); err != nil || !bytes.Equal(b, s.body) {
			continue // replaced since
		}
		var believed []string
		switch s.kind {
		case "outcome":
			if _, err := ro.ReadOutcome(ctx, s.id); err == nil {
				believed = append(believed, "ReadOutcome")
			}
		case "schedule":
			if sc, err := ro.ReadSchedule(ctx); err == nil && sc.Term == s.term {
				believed = append(believed, "ReadSchedule")
			}
		case "manifest":
			if _, err := publish.ReadManifest(ctx, m.st.Store, s.key); err == nil {
				believed = append(believed, "ReadManifest")
			}
		case "plan":
			if _, err := ro.ReadPlan(ctx, s.id); err == nil {
				believed = append(believed, "ReadPlan")
			}
			if ps, err := ro.Latest(ctx, 100); err == nil && slices.ContainsFunc(ps, func(p *runlog.Plan) bool { return p.ID == s.id && p.Term == s.term }) {
				believed = append(believed, "Latest")
			}
			if ps, err := ro.Unfinished(ctx, 1<<52); err == nil && slices.ContainsFunc(ps, func(p *runlog.Plan) bool { return p.ID == s.id && p.Term == s.term }) {
				believed = append(believed, "Unfinished")
			}
		}
		if len(believed) > 0 {
			m.fatalf("(c) the %s %s, written under term %d after a newer term took over, is believed by %v", s.kind, s.key, s.term, believed)
		}
	}
}
