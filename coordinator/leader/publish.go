package leader

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/memsnap/memsnap/coordinator/commit"
	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/coordinator/view"
	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/coordinator/wire"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/retry"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/runlog"
)

// retryable reports whether a store or merge error may go away by itself (the
// store is unreachable, a connection broke), so the operation is retried within
// its bound; an error the store will give again (refused credentials, a bad name),
// a superseded term, or a rank's input that cannot be read as it is are not.
func retryable(err error) bool {
	if err == nil || errors.Is(err, runlog.ErrMalformed) || errors.Is(err, merge.ErrOtherInputs) || isSuperseded(err) {
		return false
	}
	if retry.Transient(err) {
		return true
	}
	if store.Permanent(err) {
		return false
	}
	var ie *merge.InputError
	return !errors.As(err, &ie)
}

// isSuperseded reports whether err says a newer term is in the run's log.
func isSuperseded(err error) bool {
	return errors.Is(err, runlog.ErrSuperseded) || errors.Is(err, publish.ErrNewerClaim)
}

// fence is what every commit of this leader asks first: no newer term may be in
// the run's log.
func (l *Leader) fence(ctx context.Context) error { return l.rl.Fence(ctx, l.term) }

// attempt names this leadership's publication.
func (l *Leader) attempt() string { return publish.AttemptOf(l.term) }

// held reads the commit another leader made under w's manifest, for a
// publication refused because of it.
func (l *Leader) held(ctx context.Context, w *win, cause error) window.Publication {
	m, err := publish.ReadManifest(ctx, l.st, w.manifest)
	if err != nil {
		return window.Publication{At: time.Now(), Err: fmt.Sprintf("%v (and its manifest cannot be read: %v)", cause, err), Retryable: true}
	}
	return window.Publication{At: time.Now(), Held: commit.Of(m)}
}

// publicationOf is what a merge's error means for the window.
func (l *Leader) publicationOf(ctx context.Context, w *win, inputs map[int]merge.Input, err error) window.Publication {
	now := time.Now()
	var ie *merge.InputError
	switch {
	case isSuperseded(err):
		return window.Publication{At: now, Superseded: true}
	case errors.Is(err, store.ErrExists) || errors.Is(err, merge.ErrOtherInputs) && w.m.Phase == window.Merging:
		return l.held(ctx, w, err)
	case errors.Is(err, merge.ErrOtherInputs):
		// another leader completes the answer with settings of its own: its
		// manifest says how it ends, and until it does, this leader tries again
		// (never an outcome of its own that contradicts the other's manifest)
		if m, rerr := publish.ReadManifest(ctx, l.st, w.manifest); rerr == nil && len(m.Pending) == 0 {
			return window.Publication{At: now, Held: commit.Of(m)}
		}
		return window.Publication{At: now, Err: err.Error(), Retryable: true}
	case errors.As(err, &ie) && !retryable(err) && inputs[ie.Rank].Source == ie.Source:
		l.log.Warn("a rank's snapshot cannot be merged; merging without it", "window", w.id(), "left_out", ie.Rank, "err", err)
		if ch := w.pre[ie.Rank]; ch != nil {
			delete(w.pre, ie.Rank)
		}
		return window.Publication{At: now, Unfit: map[int]string{ie.Rank: "its snapshot cannot be merged: " + err.Error()}}
	}
	return window.Publication{At: now, Err: err.Error(), Retryable: retryable(err)}
}

// publish merges the stored snapshots of the given ranks and commits the window:
// the answer first (the machine hears AnswerCommitted), then the rest.
func (l *Leader) publish(ctx context.Context, w *win, ranks []int) {
	if m, err := publish.ReadManifest(ctx, l.st, w.manifest); err == nil {
		// committed already (an earlier try of this leader's, or another leader)
		l.step(ctx, w, window.Publication{At: time.Now(), Held: commit.Of(m)})
		return
	} else if !errors.Is(err, store.ErrNotFound) {
		l.step(ctx, w, window.Publication{At: time.Now(), Err: err.Error(), Retryable: retryable(err)})
		return
	}
	inputs, unfit, err := l.inputs(ctx, w, ranks)
	switch {
	case err != nil:
		l.step(ctx, w, window.Publication{At: time.Now(), Err: err.Error(), Retryable: retryable(err)})
		return
	case len(unfit) > 0:
		l.step(ctx, w, window.Publication{At: time.Now(), Unfit: unfit})
		return
	}
	l.merge(ctx, w, inputs)
}

// complete writes the merged pickles and the timeline of the answer the store
// holds, from the snapshots it names, whoever answered.
func (l *Leader) complete(ctx context.Context, w *win) {
	m, err := publish.ReadManifest(ctx, l.st, w.manifest)
	switch {
	case err != nil:
		l.step(ctx, w, window.Publication{At: time.Now(), Err: err.Error(), Retryable: retryable(err) || errors.Is(err, store.ErrNotFound)})
		return
	case len(m.Pending) == 0:
		l.step(ctx, w, window.Publication{At: time.Now(), Held: commit.Of(m)})
		return
	}
	l.log.Info("the window's answer is published with outputs pending; completing it", "window", w.id(), "manifest", w.manifest, "answered_by", m.Attempt)
	inputs := map[int]merge.Input{}
	for _, in := range merge.AnswerInputs(l.st, m) {
		inputs[in.Rank] = in
	}
	l.merge(ctx, w, inputs)
}

// merge runs the merge of inputs under this leader's fence and steps what came
// of it.
func (l *Leader) merge(ctx context.Context, w *win, inputs map[int]merge.Input) {
	cfg := l.mergeConfig(w, inputs)
	l.pointToHistory(ctx, w.id(), &cfg)
	cfg.OnAnswer = func(a merge.Answer) {
		ans := resultFromManifest(a.Manifest, a.M, l.st)
		ans.Window, ans.Kind, ans.Start, ans.Stop, ans.Pending = w.id(), w.m.Kind, w.m.Start, w.m.Stop, true
		w.answer = ans
		l.log.Info("window answered", "window", w.id(), "manifest", ans.Manifest, "ranks", len(ans.Ranks), "missing", len(ans.Missing))
		l.step(ctx, w, window.AnswerCommitted{At: time.Now()})
	}
	out, err := merge.Merge(ctx, cfg)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		ev := l.publicationOf(ctx, w, inputs, err)
		if ev.Err != "" {
			l.log.Warn("the window's publication failed", "window", w.id(), "err", err, "retryable", ev.Retryable)
		}
		l.step(ctx, w, ev)
		return
	}
	res := resultFromManifest(out.Outputs[publish.OutManifest], out.Manifest, l.st)
	res.Window, res.Kind, res.Start, res.Stop = w.id(), w.m.Kind, w.m.Start, w.m.Stop
	w.res = res
	l.log.Info("window published", "window", w.id(), "manifest", res.Manifest, "ranks", len(res.Ranks), "missing", len(res.Missing), "store", l.st.String())
	l.step(ctx, w, window.Publication{At: time.Now(), Done: true})
}

// commitFailure commits the window as failed: its manifest, created once and
// fenced by this leader's term.
func (l *Leader) commitFailure(ctx context.Context, w *win, e window.CommitFailure) {
	ev := window.FailureCommitted{At: time.Now()}
	if w.manifest == "" {
		// a plan of an earlier version names no manifest: its outcome is its commit
		_, err := l.rl.Finish(ctx, runlog.Outcome{ID: w.id(), Term: l.term, Kind: kindName(w.m.Kind), State: runlog.Failed, Error: e.Why, Leader: l.m.Name(), Missing: runlog.MissingOf(e.Missing)})
		if err != nil {
			ev.Superseded, ev.Err, ev.Retryable = isSuperseded(err), err.Error(), retryable(err)
		}
		l.step(ctx, w, ev)
		return
	}
	f := publish.FailedWindow{Error: e.Why, WorldSize: w.m.World, MissingReasons: e.Missing, Reason: w.reason, Kind: kindName(w.m.Kind), Attempt: l.attempt(),
		Window: &sidecar.WindowInfo{ID: w.id(), Start: w.m.Start, Stop: w.m.Stop}}
	held, err := publish.CommitFailed(ctx, l.st, w.manifest, f, l.fence)
	switch {
	case isSuperseded(err):
		ev.Superseded = true
	case err != nil:
		ev.Err, ev.Retryable = err.Error(), retryable(err)
	case !held.Failed() || held.Attempt != l.attempt():
		ev.Held = commit.Of(held) // another leader committed first: that is how it ended
	default:
		l.log.Error("window failed", "window", w.id(), "why", e.Why, "missing", len(e.Missing))
	}
	l.step(ctx, w, ev)
}

// writeOutcome writes how the window ended into the run's log, as its commit
// says (the log is an index of the commits), retrying a failing store for up to
// 30 s (PublishTimeout when shorter); a later sweep writes one this could not.
func (l *Leader) writeOutcome(ctx context.Context, w *win, e window.WriteOutcome) {
	o := runlog.Outcome{ID: w.id(), Term: l.term, Kind: kindName(w.m.Kind), State: runlog.Published, Error: e.Why, Leader: l.m.Name(),
		Manifest: w.manifest, Missing: runlog.MissingOf(w.m.MissingReasons())}
	if e.Phase == window.Failed {
		o.State, o.Manifest = runlog.Failed, w.manifest
	}
	o.Ranks = w.m.Mergeable()
	give := time.Now().Add(min(l.cfg.PublishTimeout, 30*time.Second))
	wait := retry.Backoff{Min: 500 * time.Millisecond, Max: 10 * time.Second}
	for {
		got, err := l.rl.Finish(ctx, o)
		if err == nil {
			if got.Term != o.Term || got.State != o.State {
				l.log.Info("the window's outcome was written by another leader", "window", w.id(), "state", got.State, "leader", got.Leader)
			}
			return
		}
		if ctx.Err() != nil || !retryable(err) || time.Now().After(give) {
			l.log.Warn("cannot write the window's outcome into the run's log; a later sweep does", "window", w.id(), "err", err)
			return
		}
		if !wait.Wait(ctx) {
			return
		}
	}
}

// tellEnd tells every member waiting for w how it ended, from its commit.
func (l *Leader) tellEnd(ctx context.Context, w *win) {
	if w.res == nil || w.m.Phase != window.Published {
		w.res = l.resultOfCommit(ctx, w)
	}
	l.tellResult(w.id(), w.watchers, w.res, w.m.Final) // (the machine tells no end of a window abandoned)
	w.watchers = nil
}

// resultOfCommit is w's result as its commit says (the machine's word where the
// commit cannot be read).
func (l *Leader) resultOfCommit(ctx context.Context, w *win) *pb.WindowResult {
	m, err := publish.ReadManifest(ctx, l.st, w.manifest)
	if err == nil {
		res := l.resultOfManifest(w.manifest, m)
		res.Window, res.Kind = w.id(), w.m.Kind
		if res.Start == 0 && res.Stop == 0 {
			res.Start, res.Stop = w.m.Start, w.m.Stop
		}
		if res.Pending && w.m.Final {
			res.Error = w.m.Why // why the rest was not written
		}
		return res
	}
	res := &pb.WindowResult{State: pb.Outcome_OUTCOME_FAILED, Window: w.id(), Kind: w.m.Kind, Start: w.m.Start, Stop: w.m.Stop, Store: l.st.String(),
		Error: w.m.Why, Missing: map[int32]string{}}
	switch w.m.Phase {
	case window.Published, window.Answered:
		res = resultFromManifest(w.manifest, nil, l.st)
		res.Window, res.Kind, res.Start, res.Stop, res.Pending = w.id(), w.m.Kind, w.m.Start, w.m.Stop, w.m.Phase == window.Answered
	}
	for r, why := range w.m.MissingReasons() {
		res.Missing[int32(r)] = why
	}
	for _, r := range w.m.Mergeable() {
		res.Ranks = append(res.Ranks, int32(r))
	}
	return res
}

// resultOfManifest is a committed window's result: published (or answered), or
// failed with its reason.
func (l *Leader) resultOfManifest(key string, m *publish.Manifest) *pb.WindowResult {
	if !m.Failed() {
		return resultFromManifest(key, m, l.st)
	}
	res := &pb.WindowResult{State: pb.Outcome_OUTCOME_FAILED, Manifest: l.st.URL(key), Store: l.st.String(), Error: m.Error, Missing: map[int32]string{}, Kind: kindOf(m.Kind)}
	for r, why := range m.MissingReasons {
		if n, err := strconv.Atoi(r); err == nil {
			res.Missing[int32(n)] = why
		}
	}
	if m.Window != nil {
		res.Start, res.Stop, res.Window = m.Window.Start, m.Window.Stop, m.Window.ID
	}
	return res
}

// inputs checks what the given ranks stored and returns what can be merged, and
// the ranks whose sidecars say their snapshots do not cover exactly the window's
// batches, with the reason. A store that cannot be read is an error (retried),
// not a missing rank. The sidecars are read coverageReaders at a time (at 1,024
// ranks, one after another, a store's latency alone would hold the answer for a
// second), and the merge takes the bytes read rather than reading them again.
func (l *Leader) inputs(ctx context.Context, w *win, ranks []int) (map[int]merge.Input, map[int]string, error) {
	inputs := map[int]merge.Input{}
	unfit := map[int]string{}
	var check []int
	for _, r := range ranks {
		if w.m.Dumps() {
			inputs[r] = l.input(w.m.Ranks[r].Result, r)
		} else {
			check = append(check, r)
		}
	}
	type checked struct {
		meta []byte
		why  string
		err  error
	}
	got := make([]checked, len(check))
	pre := make([]merge.Input, len(check))
	var wg sync.WaitGroup
	sem := make(chan struct{}, coverageReaders)
	for i, r := range check {
		if ch := w.pre[r]; ch != nil {
			// preloaded while the window was collected (preload)
			select {
			case in := <-ch:
				ch <- in // for a later try
				if m := in.Meta(); m != nil {
					pre[i] = in
					got[i].why = l.coverageOf(m, r, w)
					continue
				}
			case <-ctx.Done():
				wg.Wait()
				return nil, nil, ctx.Err()
			}
		}
		wg.Add(1)
		sem <- struct{}{}
		res := w.m.Ranks[r].Result
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			got[i].meta, got[i].why, got[i].err = l.checkCoverage(ctx, res, r, w)
		}()
	}
	wg.Wait()
	for i, r := range check {
		switch g := got[i]; {
		case g.err != nil:
			return nil, nil, g.err
		case g.why != "":
			unfit[r] = g.why
		case pre[i].Meta() != nil:
			inputs[r] = pre[i]
		default:
			inputs[r] = l.input(w.m.Ranks[r].Result, r).WithMeta(g.meta)
		}
	}
	return inputs, unfit, nil
}

// coverageReaders is how many ranks' sidecars the leader reads at once.
const coverageReaders = 32

// mergeConfig is the merge of w's inputs, published under this leader's attempt
// and fenced by its term.
func (l *Leader) mergeConfig(w *win, inputs map[int]merge.Input) merge.Config {
	var ins []merge.Input
	for _, in := range inputs {
		ins = append(ins, in)
	}
	sort.Slice(ins, func(i, j int) bool { return ins[i].Rank < ins[j].Rank })
	run := l.cfg.Identity.RunName
	id, start, stop := w.id(), w.m.Start, w.m.Stop
	cfg := merge.Config{Inputs: ins, Out: l.st, OutputBase: l.cfg.MergedName, Vars: l.vars(id, stop), WorldSize: w.m.World, Progressive: true,
		Align: merge.AlignOffsets, Title: fmt.Sprintf("%s, window %d (batches %d-%d)", run, id, start, stop-1),
		Window: &sidecar.WindowInfo{ID: id, Start: start, Stop: stop}, MissingReasons: w.m.MissingReasons(), Logger: l.log.With("window", id),
		Reason: w.reason, Kind: kindName(w.m.Kind), FromAnalyses: true, Supersede: true, Attempt: l.attempt(), Fence: l.fence, Partial: partialOf(w, inputs)}
	if rank, ok := runlog.AlertRank(w.reason); ok {
		cfg.Focus = &analysis.Focus{Rank: rank, Why: "alerted: " + strings.TrimPrefix(w.reason, runlog.ReasonAlert)}
	}
	// (a trigger that reached a new leader is planned as a window: its reason says)
	if rank, why, ok := view.TriggerRank(w.reason); ok {
		cfg.Focus = &analysis.Focus{Rank: rank, Why: "crossed a trigger: " + why}
		if w.m.Dump {
			cfg.Title = fmt.Sprintf("%s, trigger (window %d): every rank's history up to rank %d crossing", run, id, rank)
		}
	}
	if w.m.World > l.cfg.FullDetailRanks {
		cfg.Detail = merge.DetailDiff // the pickles hold the ranks the diff compares; the rest is in the summary and report
	}
	if w.m.Postmortem() {
		what := "OOM"
		if w.m.Kind == pb.WindowKind_WINDOW_KIND_CRASH {
			what = "crash"
		}
		if r, f, ok := w.first(); ok {
			cfg.Title = fmt.Sprintf("%s, %s post-mortem (window %d): rank %d failed first (%s)", run, what, id, r, f.cause)
			cfg.Reason = fmt.Sprintf("%s post-mortem: rank %d failed first (%s)", what, r, f.cause)
			cfg.Focus = &analysis.Focus{Rank: r, Why: "failed first: " + f.cause}
		} else {
			cfg.Title = fmt.Sprintf("%s, %s post-mortem (window %d)", run, what, id)
			cfg.Reason = what + " post-mortem"
		}
	}
	return cfg
}

// partialOf names the ranks of inputs whose snapshots of w say they are partial,
// with what each covers and why (a post-mortem's are what each rank had).
func partialOf(w *win, inputs map[int]merge.Input) map[int]string {
	if w.m.Dumps() {
		return nil
	}
	out := map[int]string{}
	for r := range inputs {
		if s := w.m.Ranks[r]; s != nil && s.Result != nil && s.Result.Partial != "" {
			out[r] = fmt.Sprintf("batches %d-%d: %s", s.Result.Start, s.Result.Stop-1, s.Result.Partial)
			if s.Result.Stop <= s.Result.Start {
				out[r] = "no whole batch: " + s.Result.Partial
			}
		}
	}
	return out
}

// input is rank r's stored snapshot as a merge input, with the rank's own
// analysis of it where it stored one (so the leader need not decode it).
func (l *Leader) input(res *pb.RankResult, r int) merge.Input {
	in := merge.StoreInput(l.st, res.Key, res.MetaKey, r)
	if res.AnalysisKey != "" {
		in = in.WithAnalysis(merge.StoreAnalysis(l.st, res.AnalysisKey))
	}
	return in
}

// checkCoverage reads a rank's sidecar and says why its batch marks are not
// exactly the window's batches ("" when they are, with the sidecar's bytes).
func (l *Leader) checkCoverage(ctx context.Context, r *pb.RankResult, rank int, w *win) ([]byte, string, error) {
	if r.MetaKey == "" {
		return nil, "its snapshot has no metadata", nil
	}
	b, _, err := store.ReadObject(ctx, l.st, r.MetaKey, sidecar.MaxMetaBytes)
	if err != nil {
		if retryable(err) {
			return nil, "", err
		}
		return nil, "its metadata cannot be read: " + err.Error(), nil
	}
	m, err := sidecar.ParseRankMeta(b)
	if err != nil {
		return nil, err.Error(), nil
	}
	if why := l.coverageOf(m, rank, w); why != "" {
		return nil, why, nil
	}
	return b, "", nil
}

// coverageOf says why a rank's sidecar is not its recording of the window,
// covering exactly the window's batches or, partial, a run of them ("" when it
// is).
func (l *Leader) coverageOf(m *sidecar.RankMeta, rank int, w *win) string {
	res := w.m.Ranks[rank].Result
	return m.Fits(rank, l.cfg.Identity.RunName, w.id(), w.m.Start, w.m.Stop, res != nil && res.Partial != "", false)
}

// outputURLs lists a merge's outputs (the HTML report first, then by name),
// leaving out the claim and the manifest.
func outputURLs(st store.Store, outputs map[string]string) []string {
	var keys []string
	for kind, k := range outputs {
		if kind != publish.OutInputs && kind != publish.OutManifest && kind != publish.OutHTML && k != "" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	if k := outputs[publish.OutHTML]; k != "" {
		keys = append([]string{k}, keys...)
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = st.URL(k)
	}
	return out
}

// resultFromManifest is a published window's result; m nil when only the
// manifest's key is known.
func resultFromManifest(key string, m *publish.Manifest, st store.Store) *pb.WindowResult {
	res := &pb.WindowResult{State: pb.Outcome_OUTCOME_PUBLISHED, Manifest: st.URL(key), Store: st.String(), Missing: map[int32]string{}}
	if m == nil {
		return res
	}
	res.Pending = len(m.Pending) > 0
	p := publish.Published{Key: key, Manifest: m}
	keys := map[string]string{}
	for kind := range m.Outputs {
		keys[kind], _ = p.OutputKey(kind)
	}
	res.Outputs = outputURLs(st, keys)
	for _, r := range m.RanksMerged {
		res.Ranks = append(res.Ranks, int32(r))
	}
	for r, why := range m.MissingReasons {
		if n, err := strconv.Atoi(r); err == nil {
			res.Missing[int32(n)] = why
		}
	}
	if m.Window != nil {
		res.Start, res.Stop, res.Window = m.Window.Start, m.Window.Stop, m.Window.ID
	}
	res.Kind = kindOf(m.Kind)
	res.Findings = m.Findings
	return res
}

// recoverPlan finishes a window the run's log holds unfinished: from its commit,
// when it has one and its outcome was never written; else from the ranks'
// reports in the log and the live ranks' status, waiting for ranks that still
// record it (until its deadline, counted on this leader's clock from when it
// found the window).
func (l *Leader) recoverPlan(ctx context.Context, p *runlog.Plan) {
	c := l.m
	log := l.log.With("window", p.ID)
	found := l.firstSeen(p)
	asked := map[int]int64{}
	for _, r := range p.Ranks {
		if r >= 0 && r < p.WorldSize {
			asked[r] = -1
		}
	}
	cfg := window.Config{ID: p.ID, Term: l.term, Kind: kindOf(p.Kind), Start: p.Start, Stop: p.Stop, World: p.WorldSize, Asked: asked,
		Planned: found, Deadline: found.Add(max(p.Deadline.Sub(p.Created), 0)), Timers: l.timers(), Dump: p.Dump}
	mk := func(m *window.Window) *win {
		w := newWin(m, nonEmpty(p.Reason, "recovered"), nil, p.Manifest)
		if p.FailedRank != nil {
			w.failed[*p.FailedRank] = failure{cause: p.Cause, at: found}
		}
		return w
	}
	if p.Manifest != "" {
		m, err := publish.ReadManifest(ctx, l.st, p.Manifest)
		switch {
		case err == nil:
			// committed, and its outcome never written (or its answer's detail is to come)
			log.Info("taking over a committed window", "manifest", p.Manifest, "failed", m.Failed(), "pending", m.Pending, "planned_by", p.Leader, "term", p.Term)
			w := mk(window.Recover(window.Resume{Config: cfg, At: time.Now()}))
			l.step(ctx, w, window.Publication{At: time.Now(), Held: commit.Of(m)})
			l.drive(ctx, w)
			l.finishRecovery(w)
			return
		case !errors.Is(err, store.ErrNotFound):
			log.Warn("cannot read the window's manifest; trying again later", "err", err)
			return
		}
	}
	if !l.mayRecover(p, cfg.Deadline) {
		log.Debug("an unfinished window of another leader whose ranks this member cannot reach; left to it until its deadline", "deadline", cfg.Deadline)
		return
	}
	reports, bad, err := l.rl.Reports(ctx, p.ID)
	if err != nil {
		log.Warn("cannot read the ranks' reports; trying again later", "err", err)
		return
	}
	for _, e := range bad {
		log.Warn("a rank's report in the run's log is malformed; ignored", "err", e)
	}
	if p.Kind == runlog.KindOOM || p.Kind == runlog.KindCrash {
		if !l.incidentReports(ctx, p, reports, asked) {
			log.Warn("cannot read the ranks' incidents; trying again later")
			return
		}
	}
	fs := l.found(ctx, p, reports, asked)
	now := time.Now()
	w := mk(window.Recover(window.Resume{Config: cfg, Found: fs, At: now, RejoinGrace: l.cfg.RejoinGrace}))
	pending := len(w.m.Outstanding()) > 0
	log.Info("finishing a window an earlier leader left unfinished", "kind", p.Kind, "start", p.Start, "stop", p.Stop, "reports", len(reports),
		"waiting", pending, "planned_by", p.Leader, "term", p.Term)
	ch, seq := c.ExpectRanks(4*len(asked) + 16)
	if !w.m.Dumps() {
		// the command, for a rank that never heard of the window (its leader
		// died before the command reached it): it is sent again
		w.cmd = c.Envelope(w.id())
		w.cmd.Seq, w.cmd.Term = seq, l.term
		ranks := make([]int32, 0, len(asked))
		for _, r := range slices.Sorted(maps.Keys(asked)) {
			ranks = append(ranks, int32(r))
		}
		w.cmd.Body = &pb.Envelope_Plan{Plan: &pb.Plan{Start: p.Start, Stop: p.Stop, Reason: nonEmpty(p.Reason, "recovered"), WorldSize: int32(p.WorldSize), Ranks: ranks}}
	}
	l.collect(ctx, w, ch, nil)
	c.Forget(seq)
	l.drive(ctx, w)
	l.finishRecovery(w)
	if pending && !w.m.Dumps() && w.exit() != window.SteppedDown {
		l.cancelWindow(w, "finished by a later leader")
	}
}

// incidentReports adds to reports, for the ranks asked of post-mortem p with no
// report of it, the incident each stored around p's time (addIncidents).
func (l *Leader) incidentReports(ctx context.Context, p *runlog.Plan, reports map[int]*runlog.Report, asked map[int]int64) bool {
	reps := map[int]*pb.RankResult{}
	var ranks []int
	for r := range asked {
		if reports[r] == nil {
			ranks = append(ranks, r)
		}
	}
	if !l.addIncidents(ctx, reps, ranks, p.Created, p.Created.Add(max(p.Deadline.Sub(p.Created), 0))) {
		return false
	}
	for r, res := range reps {
		rep := wire.ReportOf(p.ID, r, res)
		reports[r] = &rep
	}
	return true
}

// found is what a leader taking window p over finds of each rank asked: its
// report in the run's log, and its answer to a poll (or when it was last heard
// of, for one that is not a member now).
func (l *Leader) found(ctx context.Context, p *runlog.Plan, reports map[int]*runlog.Report, asked map[int]int64) map[int]window.Found {
	c := l.m
	var live []int
	for r := range c.RankNodes() {
		if r < p.WorldSize {
			live = append(live, r)
		}
	}
	sts := statusesOf(c.Status(ctx, live), p.ID)
	agents := c.RankAgents()
	now := time.Now()
	fs := map[int]window.Found{}
	for r := range asked {
		f := window.Found{}
		if rep := reports[r]; rep != nil {
			f.Report = wire.ResultOfReport(rep)
		}
		if planned, now := p.Agents[strconv.Itoa(r)], agents[r]; planned != "" && now != "" && now != planned {
			f.OtherAgent = true // (restarted since, or a later launch of the run)
		}
		if st, ok := sts[r]; ok {
			f.Status = &st
		} else {
			f.LastHeard = c.LastHeard(config.NodeName(l.cfg.Identity.RunName, r), now)
		}
		fs[r] = f
	}
	return fs
}

// finishRecovery hands over what a taken-over window leaves: its members
// waiting keep waiting for a later try when it did not end here.
func (l *Leader) finishRecovery(w *win) {
	if w.exit() == window.Ended {
		l.mu.Lock()
		if p := l.later[w.id()]; p != nil && len(p.watchers) == 0 {
			delete(l.later, w.id()) // (one that came after its end is told by the sweep)
		}
		l.mu.Unlock()
		return
	}
	l.keepWaiting(w)
}

// firstSeen is when this leader first found window p unfinished, on its own
// clock: a window taken over is given its planned duration from then, never
// judged by comparing another host's clock with this one's.
func (l *Leader) firstSeen(p *runlog.Plan) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.Term == l.term && p.Leader == l.m.Name() {
		// its own window, planned under this term: planned on this clock
		return p.Created
	}
	if _, ok := l.later[p.ID]; ok || len(l.later) < maxLater {
		return l.parkLocked(p.ID).found
	}
	return time.Now()
}

// mayRecover says whether this leader finishes plan p now: its own, or one whose
// leader or ranks it can reach (a dead leader's, a stale leader's), or one whose
// deadline (on this leader's clock) has passed. A window of another leader none
// of whose ranks is a member here is being recorded on the other side of a
// partition: it is left to its leader until its deadline.
func (l *Leader) mayRecover(p *runlog.Plan, deadline time.Time) bool {
	if p.Term == l.term || time.Now().After(deadline.Add(l.cfg.CollectTimeout)) {
		return true
	}
	if l.m.Node(p.Leader) != nil {
		return true
	}
	nodes := l.m.RankNodes()
	for _, r := range p.Ranks {
		if nodes[r] != nil {
			return true
		}
	}
	return false
}

func stepName(s pb.Step) string { return pb.Name(s) }
