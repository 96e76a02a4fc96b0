package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/runlog"
)

// retryable reports whether a store or merge error may go away by itself (the
// store is unreachable, a connection broke), so the operation is retried within
// its bound; an error the store will give again (refused credentials, a bad name)
// or a rank's input that cannot be read as it is are not.
func retryable(err error) bool {
	if err == nil || store.Permanent(err) || errors.Is(err, runlog.ErrMalformed) || errors.Is(err, merge.ErrOtherInputs) {
		return false
	}
	if errors.Is(err, store.ErrUnreachable) || errors.Is(err, store.ErrNoBucket) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var ie *merge.InputError
	return !errors.As(err, &ie)
}

// finish checks what the ranks stored and merges it: a rank whose snapshot does not
// cover exactly the window's batches is reported missing, never merged. A store
// that fails meanwhile is retried for up to PublishTimeout; a rank whose stored
// snapshot cannot be merged is left out with the reason.
func (l *leaderRun) finish(ctx context.Context, w *win) *pb.WindowResult {
	log := l.log.With("window", w.id)
	res := &pb.WindowResult{State: pb.Outcome_OUTCOME_FAILED, Window: w.id, Kind: w.kind, Start: w.start, Stop: w.stop, Store: l.st.String()}
	key, _ := l.manifestKey(w.id, w.stop)
	give := time.Now().Add(l.c.cfg.PublishTimeout)
	wait := 500 * time.Millisecond
	told, answered := false, false
	for attempt := 1; ; attempt++ {
		// an answer published with outputs pending (by this leader's earlier
		// try, or a leader that died or stalled) is completed from the
		// snapshots it names, whatever this leader collected
		var inputs map[int]merge.Input
		var err error
		completing := false
		if m, merr := merge.ReadManifest(ctx, l.st, key); merr == nil && len(m.Pending) > 0 {
			completing, inputs = true, map[int]merge.Input{}
			for _, in := range merge.AnswerInputs(l.st, m) {
				inputs[in.Rank] = in
			}
		} else {
			inputs, err = l.inputs(ctx, w)
		}
		if err == nil && len(inputs) == 0 && !completing {
			res.Error = "no rank stored a snapshot of the window"
			if w.postmortem() {
				res.Error = "no rank had a snapshot to give: every trainer was stopped with no allocator history recorded (--record-always keeps one for post-mortems)"
			}
			res.Missing = missingOf(w)
			log.Error(res.Error, "missing", len(res.Missing))
			l.conclude(ctx, w, res, false)
			return res
		}
		if err == nil {
			if !told {
				l.tell(w, -1, pb.Step_STEP_PUBLISHING, -1, fmt.Sprintf("merging %d ranks", len(inputs)))
				told = true
			}
			cfg := l.mergeConfig(w, inputs)
			cfg.OnAnswer = func(a merge.Answer) {
				if answered {
					return // the members waiting heard it from an earlier try
				}
				answered = true
				ans := resultFromManifest(a.Manifest, a.M, l.st)
				ans.Window, ans.Kind, ans.Start, ans.Stop, ans.Pending = w.id, w.kind, w.start, w.stop, true
				log.Info("window answered", "manifest", ans.Manifest, "ranks", len(ans.Ranks), "missing", len(ans.Missing), "attempt", attempt)
				l.tellAnswer(w.id, w.watchers, ans) // (a member waiting says the step itself)
			}
			var out *merge.Result
			if out, err = merge.Merge(ctx, cfg); err == nil {
				res = resultFromManifest(out.Outputs[merge.OutManifest], out.Manifest, l.st)
				res.Window, res.Kind, res.Start, res.Stop = w.id, w.kind, w.start, w.stop
				log.Info("window published", "manifest", res.Manifest, "ranks", len(res.Ranks), "missing", len(res.Missing), "store", l.st.String(), "attempt", attempt)
				break
			}
		}
		if ctx.Err() != nil {
			return &pb.WindowResult{State: pb.Outcome_OUTCOME_FAILED, Window: w.id, Error: "the leader stopped"}
		}
		// whoever published it, the manifest in the store is the truth; an
		// answer with outputs pending is finished by merging again, unless
		// that cannot succeed: then the answer is what the window published
		m, merr := merge.ReadManifest(ctx, l.st, key)
		if merr == nil && len(m.Pending) == 0 {
			log.Info("the window was published by another leader", "manifest", key)
			res = resultFromManifest(key, m, l.st)
			res.Window, res.Kind = w.id, w.kind
			break
		}
		// another attempt's claim or answer, stored first, is completed (or
		// superseded) by merging again
		retry := retryable(err) || errors.Is(err, store.ErrExists)
		if merr == nil && !completing && time.Now().Before(give) {
			log.Info("the window's answer is published with outputs pending; completing it", "manifest", key)
			continue
		}
		if merr == nil && !retry {
			log.Error("the window's answer is published, and its merged pickles and timeline cannot be written", "manifest", key, "err", err)
			res = resultFromManifest(key, m, l.st)
			res.Window, res.Kind, res.Pending = w.id, w.kind, true
			res.Error = "the answer is published; the merged pickles and the timeline were not written: " + err.Error()
			break
		}
		var ie *merge.InputError
		if errors.As(err, &ie) && !retry && inputs[ie.Rank].Source == ie.Source {
			log.Warn("a rank's snapshot cannot be merged; merging without it", "left_out", ie.Rank, "err", err)
			w.ranks[ie.Rank].result, w.ranks[ie.Rank].pre = nil, nil
			w.ranks[ie.Rank].missing = "its snapshot cannot be merged: " + err.Error()
			continue
		}
		if !retry {
			res.Error = err.Error()
			res.Missing = missingOf(w)
			log.Error("the merge failed", "err", err)
			l.conclude(ctx, w, res, false)
			return res
		}
		if time.Now().After(give) {
			res.Error = fmt.Sprintf("the store failed for %v while the window was published (%v); the window stays unfinished in the run's log, and the leader publishes it once the store is back", l.c.cfg.PublishTimeout, err)
			res.Missing = missingOf(w)
			if merr == nil {
				// its answer is out: that is what the window published so far
				res = resultFromManifest(key, m, l.st)
				res.Window, res.Kind, res.Start, res.Stop, res.Pending = w.id, w.kind, w.start, w.stop, true
				res.Error = fmt.Sprintf("the answer is published; the store failed for %v while the merged pickles and the timeline were written (%v): the leader writes them once the store is back", l.c.cfg.PublishTimeout, err)
			}
			log.Error("publication given up for now", "err", err)
			l.mu.Lock()
			l.sweepAt = time.Now().Add(l.c.cfg.SweepInterval)
			l.mu.Unlock()
			l.tellResult(w.id, w.watchers, res) // no outcome: a sweep publishes it later
			return res
		}
		log.Warn("the store failed while publishing the window; retrying", "err", err, "attempt", attempt)
		l.tell(w, -1, pb.Step_STEP_RETRYING, -1, err.Error())
		if !backoff(ctx, &wait) {
			return &pb.WindowResult{State: pb.Outcome_OUTCOME_FAILED, Window: w.id, Error: "the leader stopped"}
		}
	}
	l.conclude(ctx, w, res, false)
	return res
}

// inputs checks what the ranks stored and returns what can be merged: a rank
// whose snapshot does not cover exactly the window's batches is missing, with the
// reason. A store that cannot be read is an error (retried), not a missing rank.
// The ranks' sidecars are read coverageReaders at a time (at 1,024 ranks, one
// after another, a store's latency alone would hold the answer for a second), and
// the merge takes the bytes read rather than reading them again.
func (l *leaderRun) inputs(ctx context.Context, w *win) (map[int]merge.Input, error) {
	inputs := map[int]merge.Input{}
	var check []int
	for r := 0; r < w.world; r++ {
		s := w.ranks[r]
		switch {
		case s.result == nil:
			if s.missing == "" {
				s.missing = "no snapshot"
			}
		case s.result.Error != "":
			s.missing = "its snapshot was not stored: " + s.result.Error
		case w.postmortem():
			inputs[r] = l.input(s.result, r)
		case s.result.Partial != "":
			s.missing = "its snapshot does not cover the window: " + s.result.Partial
		case s.result.Start != w.start || s.result.Stop != w.stop:
			s.missing = fmt.Sprintf("its snapshot covers [%d, %d), the window is [%d, %d)", s.result.Start, s.result.Stop, w.start, w.stop)
		default:
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
		s := w.ranks[r]
		if s.pre != nil {
			// preloaded while the window was collected (preload)
			select {
			case in := <-s.pre:
				s.pre <- in // for a later try
				if m := in.Meta(); m != nil {
					pre[i] = in
					got[i].why = l.coverageOf(m, r, w)
					continue
				}
			case <-ctx.Done():
				wg.Wait()
				return nil, ctx.Err()
			}
		}
		wg.Add(1)
		sem <- struct{}{}
		res := s.result
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
			return nil, g.err
		case g.why != "":
			w.ranks[r].missing = g.why
		case pre[i].Meta() != nil:
			inputs[r] = pre[i]
		default:
			inputs[r] = l.input(w.ranks[r].result, r).WithMeta(g.meta)
		}
	}
	return inputs, nil
}

// coverageReaders is how many ranks' sidecars the leader reads at once.
const coverageReaders = 32

// mergeConfig is the merge of w's inputs, published under this leader's attempt.
func (l *leaderRun) mergeConfig(w *win, inputs map[int]merge.Input) merge.Config {
	var ins []merge.Input
	for _, in := range inputs {
		ins = append(ins, in)
	}
	sort.Slice(ins, func(i, j int) bool { return ins[i].Rank < ins[j].Rank })
	reasons := map[int]string{}
	for r, s := range w.ranks {
		if s.missing != "" {
			reasons[r] = s.missing
		}
	}
	run := l.c.cfg.Identity.RunName
	cfg := merge.Config{Inputs: ins, Out: l.st, OutputBase: l.c.cfg.MergedName, Vars: l.vars(w.id, w.stop), WorldSize: w.world, Progressive: true,
		Align: merge.AlignOffsets, Title: fmt.Sprintf("%s, window %d (batches %d-%d)", run, w.id, w.start, w.stop-1),
		Window: &merge.WindowInfo{ID: w.id, Start: w.start, Stop: w.stop}, MissingReasons: reasons, Logger: l.log.With("window", w.id),
		Reason: w.reason, Kind: kindName(w.kind), FromAnalyses: true, Supersede: true, Attempt: "t" + strconv.FormatUint(l.term, 10)}
	if w.world > l.c.cfg.FullDetailRanks {
		cfg.Detail = merge.DetailDiff // the pickles hold the ranks the diff compares; the rest is in the summary and report
	}
	if w.postmortem() {
		what := "OOM"
		if w.kind == pb.WindowKind_WINDOW_KIND_CRASH {
			what = "crash"
		}
		if r, f, ok := w.first(); ok {
			cfg.Title = fmt.Sprintf("%s, %s post-mortem (window %d): rank %d failed first (%s)", run, what, w.id, r, f.cause)
			cfg.Reason = fmt.Sprintf("%s post-mortem: rank %d failed first (%s)", what, r, f.cause)
		} else {
			cfg.Title = fmt.Sprintf("%s, %s post-mortem (window %d)", run, what, w.id)
			cfg.Reason = what + " post-mortem"
		}
	}
	return cfg
}

// conclude writes how w ended into the run's log (once: another leader's outcome,
// when it wrote one first, is the truth) and tells every member waiting for it.
// With quiet, nobody is told (the window was planned again under another id).
func (l *leaderRun) conclude(ctx context.Context, w *win, res *pb.WindowResult, quiet bool) {
	o := runlog.Outcome{ID: w.id, Term: l.term, Kind: kindName(w.kind), State: runlog.Failed, Error: res.Error, Leader: l.c.name, Missing: map[string]string{},
		Manifest: manifestKeyOf(l, w)}
	if res.State == pb.Outcome_OUTCOME_PUBLISHED {
		o.State = runlog.Published
	}
	for _, r := range res.Ranks {
		o.Ranks = append(o.Ranks, int(r))
	}
	for r, why := range res.Missing {
		o.Missing[strconv.Itoa(int(r))] = why
	}
	// The members waiting for a published window hear it first; the log is
	// written after (a store that fails here leaves the window to a later sweep,
	// which finds the manifest). A failed window's outcome is written first: were
	// it not written, a later leader could finish the window again from what the
	// ranks stored, and a member told "failed" would have been told wrong; it is
	// then told that too.
	published := res.State == pb.Outcome_OUTCOME_PUBLISHED
	if !quiet && published {
		l.tellResult(w.id, w.watchers, res)
		w.watchers = nil
	}
	got, err := l.writeOutcome(ctx, w, o)
	if !quiet && !published {
		switch {
		case err != nil:
			res.Error = fmt.Sprintf("%s (this outcome could not be written into the run's log: %v; a later leader may still finish the window from what the ranks stored: memsnap ls shows how it ends)", res.Error, err)
		case got.State == runlog.Published:
			res = l.resultOfOutcome(ctx, &got) // another leader published it first: that is how it ended
		}
		l.tellResult(w.id, w.watchers, res)
		w.watchers = nil
	}
}

// writeOutcome writes o into the run's log, retrying a failing store for up to
// 30 s (PublishTimeout when shorter).
// It returns the outcome the log holds: another leader's, when it wrote one first.
func (l *leaderRun) writeOutcome(ctx context.Context, w *win, o runlog.Outcome) (runlog.Outcome, error) {
	give := time.Now().Add(min(l.c.cfg.PublishTimeout, 30*time.Second))
	wait := 500 * time.Millisecond
	for {
		got, err := l.rl.Finish(ctx, o)
		if err == nil {
			if got.Term != o.Term || got.State != o.State {
				l.log.Info("the window's outcome was written by another leader", "window", w.id, "state", got.State, "leader", got.Leader)
			}
			return got, nil
		}
		if ctx.Err() != nil || !retryable(err) || time.Now().After(give) {
			l.log.Warn("cannot write the window's outcome into the run's log; a later sweep does", "window", w.id, "err", err)
			return o, err
		}
		if !backoff(ctx, &wait) {
			return o, ctx.Err()
		}
	}
}

func manifestKeyOf(l *leaderRun, w *win) string {
	k, _ := l.manifestKey(w.id, w.stop)
	return k
}

// input is rank r's stored snapshot as a merge input, with the rank's own
// analysis of it where it stored one (so the leader need not decode it).
func (l *leaderRun) input(res *pb.RankResult, r int) merge.Input {
	in := merge.StoreInput(l.st, res.Key, res.MetaKey, r)
	if res.AnalysisKey != "" {
		in = in.WithAnalysis(merge.StoreAnalysis(l.st, res.AnalysisKey))
	}
	return in
}

// checkCoverage reads a rank's sidecar and says why its batch marks are not
// exactly the window's batches ("" when they are, with the sidecar's bytes).
func (l *leaderRun) checkCoverage(ctx context.Context, r *pb.RankResult, rank int, w *win) ([]byte, string, error) {
	if r.MetaKey == "" {
		return nil, "its snapshot has no metadata", nil
	}
	b, err := store.ReadAll(ctx, l.st, r.MetaKey)
	if err != nil {
		if retryable(err) {
			return nil, "", err
		}
		return nil, "its metadata cannot be read: " + err.Error(), nil
	}
	m, err := merge.ParseRankMeta(b)
	if err != nil {
		return nil, err.Error(), nil
	}
	if why := l.coverageOf(m, rank, w); why != "" {
		return nil, why, nil
	}
	return b, "", nil
}

// coverageOf says why a rank's sidecar does not cover exactly the window's
// batches ("" when it does).
func (l *leaderRun) coverageOf(m *merge.RankMeta, rank int, w *win) string {
	if m.Window == nil || m.Window.ID != w.id {
		return "its metadata names another window"
	}
	if m.Rank != rank || (m.RunName != "" && m.RunName != l.c.cfg.Identity.RunName) {
		return fmt.Sprintf("its metadata is rank %d's of run %q", m.Rank, m.RunName)
	}
	if len(m.Batches) != int(w.stop-w.start) {
		return fmt.Sprintf("it recorded %d batches, the window has %d", len(m.Batches), w.stop-w.start)
	}
	for i, bm := range m.Batches {
		if bm.Batch != w.start+int64(i) {
			return fmt.Sprintf("it recorded batch %d where batch %d belongs", bm.Batch, w.start+int64(i))
		}
	}
	return ""
}

// outputURLs lists a merge's outputs (the HTML report first, then by name),
// leaving out the claim and the manifest.
func outputURLs(st store.Store, outputs map[string]string) []string {
	var keys []string
	for kind, k := range outputs {
		if kind != merge.OutInputs && kind != merge.OutManifest && kind != merge.OutHTML && k != "" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	if k := outputs[merge.OutHTML]; k != "" {
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
func resultFromManifest(key string, m *merge.Manifest, st store.Store) *pb.WindowResult {
	res := &pb.WindowResult{State: pb.Outcome_OUTCOME_PUBLISHED, Manifest: st.URL(key), Store: st.String(), Missing: map[int32]string{}}
	if m == nil {
		return res
	}
	res.Pending = len(m.Pending) > 0
	p := merge.Published{Key: key, Manifest: m}
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

// recoverPlan finishes a window the run's log holds unfinished: from the
// manifest, when it was published and its outcome never written; else from the
// ranks' reports in the log and the live ranks' status, waiting for ranks that
// still record it (until its deadline).
func (l *leaderRun) recoverPlan(ctx context.Context, p *runlog.Plan) {
	c := l.c
	log := l.log.With("window", p.ID)
	w := &win{id: p.ID, start: p.Start, stop: p.Stop, reason: nonEmpty(p.Reason, "recovered"), kind: kindOf(p.Kind), ranks: map[int]*rankState{},
		world: p.WorldSize, failed: map[int]failure{}, deadline: p.Deadline, planned: p.Created}
	if p.FailedRank != nil {
		w.failed[*p.FailedRank] = failure{cause: p.Cause, at: p.Created}
	}
	if !l.mayRecover(p) {
		log.Debug("an unfinished window of another leader whose ranks this member cannot reach; left to it until its deadline", "deadline", p.Deadline)
		return
	}
	if m, err := merge.ReadManifest(ctx, l.st, p.Manifest); err == nil && len(m.Pending) == 0 {
		log.Info("the window was published; recording its outcome", "manifest", p.Manifest)
		res := resultFromManifest(p.Manifest, m, l.st)
		res.Window = p.ID
		l.conclude(ctx, w, res, false)
		return
	} else if err == nil {
		// its answer is out: the snapshots it names are all the rest needs
		log.Info("finishing a window whose answer an earlier leader published", "manifest", p.Manifest, "pending", m.Pending, "planned_by", p.Leader, "term", p.Term)
		l.finish(ctx, w)
		return
	} else if !errors.Is(err, store.ErrNotFound) {
		log.Warn("cannot read the window's manifest; trying again later", "err", err)
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
	asked := map[int]bool{}
	for _, r := range p.Ranks {
		asked[r] = true
	}
	nodes := c.rankNodes()
	var live []int
	for r := range nodes {
		if r < w.world {
			live = append(live, r)
		}
	}
	sts := c.status(ctx, live)
	pending := false
	now := time.Now()
	for r := 0; r < w.world; r++ {
		s := &rankState{}
		w.ranks[r] = s
		st, ok := sts[r]
		switch rep := reports[r]; {
		case !asked[r]:
			s.missing, s.leftOut = "not asked to record the window (its leader did not have it as a member)", true
		case rep != nil:
			s.result = resultOfReport(rep)
		case ok && st.st.Window == p.ID && st.st.Result != nil:
			s.result = st.st.Result
		case ok && slices.Contains(st.st.Spooled, p.ID):
			// its snapshot waits in its spool (the store was away): it comes
			s.lastSign, s.batch, s.acked = now, st.st.Batch, true
			pending = true
		case ok && st.st.Window == p.ID && !terminal(st.st.State) && time.Now().Before(p.Deadline.Add(c.cfg.CollectTimeout)):
			s.lastSign, s.batch, s.state, s.acked = now, st.st.Batch, st.st.State, true
			pending = true
		case ok && st.st.Window == p.ID:
			s.missing = "the window ended on the rank without a snapshot (" + stepName(st.st.State) + ")"
		case !ok && now.Before(p.Deadline):
			// not a member now, but it may be rejoining (a restarted member's
			// name is taken for dead a moment): it has RejoinGrace from when it was
			// last heard from to show up (the leader that died is one such: its
			// death took failure detection's suspicion timeout to be declared)
			heard := c.lastHeard(NodeName(c.cfg.Identity.RunName, r), now)
			s.lastSign, s.acked = heard.Add(min(c.cfg.RejoinGrace-c.cfg.CollectTimeout, 0)), true
			s.gone = "not a member now, and no snapshot of it in the run's log"
			pending = true
		case !ok:
			s.missing = "not a member now, and no snapshot of it in the run's log"
		default:
			s.missing = "no snapshot of it in the run's log or the rank's spool (the rank stopped before storing one)"
		}
	}
	log.Info("finishing a window an earlier leader left unfinished", "kind", p.Kind, "start", p.Start, "stop", p.Stop, "reports", len(reports),
		"waiting", pending, "planned_by", p.Leader, "term", p.Term)
	if pending {
		if dl := now.Add(c.cfg.StatusTimeout); w.deadline.Before(dl) {
			w.deadline = dl.Add(c.cfg.CollectTimeout)
		}
		ch, seq := c.expect(16, c.fromRanks())
		l.collect(ctx, w, ch, nil, false)
		c.forget(seq)
		if ctx.Err() != nil {
			return
		}
	}
	l.finish(ctx, w)
	if pending && w.kind == pb.WindowKind_WINDOW_KIND_WINDOW {
		l.cancelWindow(w, "finished by a later leader")
	}
}

// mayRecover says whether this leader finishes plan p now: its own, or one whose
// leader or ranks it can reach (a dead leader's, a stale leader's), or one whose
// deadline has passed. A window of another leader none of whose ranks is a member
// here is being recorded on the other side of a partition: it is left to its
// leader until its deadline.
func (l *leaderRun) mayRecover(p *runlog.Plan) bool {
	if p.Term == l.term || time.Now().After(p.Deadline.Add(l.c.cfg.CollectTimeout)) {
		return true
	}
	if l.c.node(p.Leader) != nil {
		return true
	}
	nodes := l.c.rankNodes()
	for _, r := range p.Ranks {
		if nodes[r] != nil {
			return true
		}
	}
	return false
}

func resultOfReport(r *runlog.Report) *pb.RankResult {
	return &pb.RankResult{Key: r.Key, MetaKey: r.MetaKey, AnalysisKey: r.AnalysisKey, Size: r.Size, Sha256: r.SHA256, Events: r.Events,
		Start: r.Start, Stop: r.Stop, Reason: r.Reason, Partial: r.Partial, Error: r.Error, Cause: r.Cause}
}

func stepName(s pb.Step) string {
	n := s.String()
	if len(n) > 5 && n[:5] == "STEP_" {
		n = n[5:]
	}
	return toLower(n)
}

func toLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
