package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/runlog"
)

// plan is one window to record.
type plan struct {
	length   int64
	minStart int64
	reason   string
	watchers []*pb.Envelope
	req      *pb.Envelope // the request it serves (served again if the leader's term was stale)
}

// rankState is where one rank stands in the window in progress.
type rankState struct {
	acked    bool
	state    pb.Step
	result   *pb.RankResult
	missing  string // why it is not merged ("" while it may still be)
	lastSign time.Time
	batch    int64
	retryAt  time.Time // when to send the command again (it saw another leader)
	leftOut  bool      // not in the window's plan: nothing of it is taken
	gone     string    // why it is missing if it shows no sign of life in time (else the silence is the reason)
	// pre receives the rank's input with its sidecar and analysis read and parsed
	// (merge.Preload), started when its result arrived; nil until then
	pre chan merge.Input
}

// failure is a rank's trainer failing, as a post-mortem records it.
type failure struct {
	cause string
	at    time.Time // on the leader's clock
}

// win is the window in progress: the collection registered before the plan is sent.
type win struct {
	id          uint64
	start, stop int64
	reason      string
	kind        pb.WindowKind
	failed      map[int]failure // a post-mortem: the ranks that failed, how and when
	ranks       map[int]*rankState
	preSem      chan struct{} // bounds the ranks' preloads (preload)
	hint        int           // a rank waiting found outstanding
	watchers    []*pb.Envelope
	world       int
	deadline    time.Time
	planned     time.Time      // when the window was planned (zero: unknown)
	cmd         *pb.Envelope   // the plan or dump sent to every rank
	steps       []*pb.RankStep // ranks' steps not told to the watchers yet (leaderRun.gathersSteps)
}

// A window of more than stepsGathered ranks tells its watchers the ranks' steps
// gathered, every stepsEvery, in messages of at most stepsPerMessage steps and
// stepsBytes bytes of reasons: 1,024 ranks acking within a few milliseconds, each
// ack a datagram to every watcher, overflowed a watching member's queues.
const (
	stepsGathered   = 64
	stepsEvery      = 100 * time.Millisecond
	stepsPerMessage = 512
	stepsBytes      = 256 << 10
)

// gathersSteps reports whether w's watchers are told its ranks' steps gathered.
func (l *leaderRun) gathersSteps(w *win) bool {
	n := l.c.cfg.stepsGathered
	if n == 0 {
		n = stepsGathered
	}
	return len(w.ranks) > n
}

// stepMessages cuts steps into messages of at most stepsPerMessage steps and about
// stepsBytes bytes of reasons (a message's limit is maxMessage).
func stepMessages(steps []*pb.RankStep) [][]*pb.RankStep {
	var out [][]*pb.RankStep
	for len(steps) > 0 {
		n, size := 0, 0
		for n < len(steps) && n < stepsPerMessage && size < stepsBytes {
			size += len(steps[n].Reason)
			n++
		}
		out = append(out, steps[:n:n])
		steps = steps[n:]
	}
	return out
}

func (w *win) postmortem() bool { return w.kind != pb.WindowKind_WINDOW_KIND_WINDOW }

// waiting reports whether a rank of w is outstanding, without listing them: the
// leader's loop asks after every message, and at 1,024 ranks listing and sorting
// them each time took most of the time the acks waited. The rank found last time
// is looked at first.
func (w *win) waiting() bool {
	if s := w.ranks[w.hint]; s != nil && s.missing == "" && s.result == nil {
		return true
	}
	for r, s := range w.ranks {
		if s.missing == "" && s.result == nil {
			w.hint = r
			return true
		}
	}
	return false
}

func (w *win) outstanding() []int {
	var out []int
	for r, s := range w.ranks {
		if s.missing == "" && s.result == nil {
			out = append(out, r)
		}
	}
	sort.Ints(out)
	return out
}

// first is the post-mortem's first failure.
func (w *win) first() (int, failure, bool) {
	best, ok := -1, false
	var f failure
	for r, x := range w.failed {
		if !ok || x.at.Before(f.at) || (x.at.Equal(f.at) && r < best) {
			best, f, ok = r, x, true
		}
	}
	return best, f, ok
}

type status struct {
	st   *pb.Status
	rtt  time.Duration
	when time.Time // when the answer arrived
}

// window records one window and tells the members that asked for it how it
// ended. It returns nil when the request is to be served again (this leader's
// term turned out stale).
func (l *leaderRun) window(ctx context.Context, p plan) *pb.WindowResult {
	l.mu.Lock()
	l.working++
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.working--
		l.mu.Unlock()
	}()
	w, res := l.record(ctx, p, false)
	if res == nil || ctx.Err() != nil {
		return res // served again, or the leader stopped: the watchers ask the next one
	}
	l.tellResult(res.Window, p.watchers, res)
	_ = w
	return res
}

// record plans a window, collects it, merges and publishes it. A rank past the
// start makes the leader plan once more with a longer lead; the second time the
// window goes on without it.
func (l *leaderRun) record(ctx context.Context, p plan, replanned bool) (*win, *pb.WindowResult) {
	c := l.c
	world := c.cfg.Identity.WorldSize
	// ranks still joining (agents start at different times) get a moment to arrive
	poll(ctx, c.cfg.JoinGrace, func() bool { return len(c.rankNodes()) >= world })
	nodes := c.rankNodes()
	ranks := make([]int, 0, len(nodes))
	for r := range nodes {
		if r < world {
			ranks = append(ranks, r)
		}
	}
	sort.Ints(ranks)
	sts := c.status(ctx, ranks)
	w := &win{reason: p.reason, kind: pb.WindowKind_WINDOW_KIND_WINDOW, ranks: map[int]*rankState{}, watchers: p.watchers, world: world}
	for r := 0; r < world; r++ {
		w.ranks[r] = &rankState{missing: "not a member of the cluster", leftOut: true}
	}
	rs := l.plausible(w, ranks, sts)
	if len(rs) == 0 {
		return w, &pb.WindowResult{State: pb.Outcome_OUTCOME_FAILED, Error: "no rank answered the leader with a plausible batch", Store: l.st.String()}
	}
	margin := c.cfg.LeadMargin
	if replanned {
		margin *= 3
	}
	w.start, w.stop = PlanWindow(rs, p.length, p.minStart, margin)
	w.deadline, w.planned = l.windowDeadline(rs, w.start, w.stop), time.Now()
	expected := make([]int, 0, len(rs))
	for _, r := range rs {
		expected = append(expected, r.Rank)
	}
	rp := runlog.Plan{Kind: runlog.KindWindow, Reason: p.reason, Start: w.start, Stop: w.stop, Ranks: expected, Deadline: w.deadline}
	if p.req != nil {
		rp.Request = requestID(p.req)
	}
	pl, err := l.createPlan(ctx, rp)
	if err != nil {
		return w, &pb.WindowResult{State: pb.Outcome_OUTCOME_FAILED, Start: w.start, Stop: w.stop, Store: l.st.String(),
			Error: "the window's plan could not be recorded in the run's log: " + err.Error()}
	}
	w.id = pl.ID
	log := l.log.With("window", w.id)
	log.Info("window planned", "start", w.start, "stop", w.stop, "ranks", len(rs), "world_size", world, "reason", p.reason, "term", l.term,
		"deadline", w.deadline.Format(time.RFC3339))
	l.tellPlanned(w, fmt.Sprintf("batches [%d, %d) on %d of %d ranks", w.start, w.stop, len(rs), world))

	ranks32 := make([]int32, len(expected))
	for i, r := range expected {
		ranks32[i] = int32(r)
	}
	ch, seq := c.expect(4*len(rs)+64, c.fromRanks())
	defer c.forget(seq)
	w.cmd = c.envelope(w.id)
	w.cmd.Seq, w.cmd.Term = seq, l.term
	w.cmd.Body = &pb.Envelope_Plan{Plan: &pb.Plan{Start: w.start, Stop: w.stop, Reason: p.reason, WorldSize: int32(world), Ranks: ranks32}}
	// the acks are collected while the plan still goes out: at 1,024 ranks the
	// first ranks have acked long before the last is sent to
	sent := l.sendAsync(w.cmd, expected)
	c.gossip(w.cmd)

	out := l.collect(ctx, w, ch, sent, !replanned)
	switch {
	case ctx.Err() != nil:
		// the leader stopped: the window stays unfinished in the log, and the next
		// leader finishes it
		return w, &pb.WindowResult{State: pb.Outcome_OUTCOME_FAILED, Error: "the leader stopped", Start: w.start, Stop: w.stop}
	case out.stale:
		log.Warn("a rank has seen a newer leadership term; this leader takes a new term and plans the window again")
		l.cancelWindow(w, "its leader's term was superseded")
		l.conclude(ctx, w, &pb.WindowResult{State: pb.Outcome_OUTCOME_FAILED, Start: w.start, Stop: w.stop,
			Error: "planned under a leadership term that was superseded; the request is planned again as a later window"}, true)
		if p.req != nil {
			l.pushFront(p.req)
		}
		return w, nil
	case len(out.passed) > 0 && !replanned:
		log.Warn("ranks were past the window's start; planning again with a longer lead", "ranks", out.passed)
		l.cancelWindow(w, "re-planned: some ranks were past the start")
		l.conclude(ctx, w, &pb.WindowResult{State: pb.Outcome_OUTCOME_FAILED, Start: w.start, Stop: w.stop,
			Error: fmt.Sprintf("ranks %v were past the start; planned again as a later window", out.passed)}, true)
		return l.record(ctx, p, true)
	}
	return w, l.finish(ctx, w)
}

// plausible turns the ranks' status answers into what PlanWindow needs, leaving
// out (and saying why) a rank that did not answer and one whose batch is far from
// the others' (a trainer reporting batch 10^9, or counting backwards, must not
// make a window that no healthy rank reaches).
func (l *leaderRun) plausible(w *win, ranks []int, sts map[int]status) []RankStatus {
	var batches []int64
	for _, r := range ranks {
		if s, ok := sts[r]; ok && s.st.Batch >= 0 {
			batches = append(batches, s.st.Batch)
		}
	}
	sort.Slice(batches, func(i, j int) bool { return batches[i] < batches[j] })
	med := int64(-1)
	if len(batches) > 0 {
		med = batches[len(batches)/2]
	}
	now := time.Now()
	var rs []RankStatus
	for _, r := range ranks {
		s, ok := sts[r]
		if !ok {
			w.ranks[r].missing = "did not answer the leader"
			continue
		}
		if b := s.st.Batch; b >= 0 && med >= 0 && (b > med+l.c.cfg.MaxBatchSpread || b < med-l.c.cfg.MaxBatchSpread) {
			w.ranks[r].missing = fmt.Sprintf("left out: its trainer reports batch %d, more than %d batches from the other ranks' (median %d)", b, l.c.cfg.MaxBatchSpread, med)
			l.log.Warn("a rank's progress is implausible; it is left out of the window", "left_out", r, "batch", b, "median", med)
			continue
		}
		w.ranks[r] = &rankState{lastSign: now, batch: s.st.Batch}
		rs = append(rs, RankStatus{Rank: r, Batch: s.st.Batch, Step: time.Duration(s.st.StepUs) * time.Microsecond, Delay: now.Sub(s.when) + s.rtt})
	}
	return rs
}

// windowDeadline is when the leader gives up on a window: time for the slowest
// rank to reach the stop at its measured step time (three times over), plus the
// collection time-out for its snapshot, and never past MaxWindowWait.
func (l *leaderRun) windowDeadline(rs []RankStatus, start, stop int64) time.Time {
	c := l.c
	limit := c.cfg.MaxWindowWait
	need := time.Duration(0)
	for _, r := range rs {
		if r.Step <= 0 {
			return time.Now().Add(limit)
		}
		n := stop - max(r.Batch, 0)
		if n > 0 && r.Step > limit/time.Duration(n) {
			return time.Now().Add(limit)
		}
		need = max(need, time.Duration(n)*r.Step)
	}
	d := 3*need + c.cfg.CollectTimeout + c.cfg.AckTimeout
	return time.Now().Add(min(d, limit))
}

// createPlan records a window's plan in the run's log, which gives it its id; a
// store that is away is retried for up to AckTimeout.
func (l *leaderRun) createPlan(ctx context.Context, p runlog.Plan) (runlog.Plan, error) {
	c := l.c
	p.Term, p.Leader, p.LeaderRank, p.WorldSize, p.Run = l.term, c.name, int(c.rank()), c.cfg.Identity.WorldSize, c.cfg.Identity.RunName
	c.mu.Lock()
	atLeast := c.lastWindow + 1
	c.mu.Unlock()
	deadline := time.Now().Add(c.cfg.AckTimeout)
	wait := 200 * time.Millisecond
	for {
		out, err := l.rl.CreatePlan(ctx, p, atLeast, func(id uint64) (string, error) { return l.manifestKey(id, p.Stop) })
		if err == nil {
			c.mu.Lock()
			c.lastWindow = max(c.lastWindow, out.ID)
			c.mu.Unlock()
			return out, nil
		}
		if ctx.Err() != nil || !retryable(err) || time.Now().After(deadline) {
			return runlog.Plan{}, err
		}
		l.log.Warn("cannot record the window's plan in the store yet; retrying", "err", err)
		if !backoff(ctx, &wait) {
			return runlog.Plan{}, ctx.Err()
		}
	}
}

// postmortem asks every rank for its allocator state now, for a rank's OOM or for
// a job being stopped (the failing rank's own snapshot is the one its trainer took
// when it failed), and merges them. Reports of the same incident that arrive
// meanwhile (every rank of a job torn down reports) join it. It runs on its own,
// or inside the collection of a window the failure interrupted, which goes on
// afterwards.
func (l *leaderRun) postmortem(ctx context.Context, req *pb.Envelope) {
	c := l.c
	r := req.GetRequest()
	failedRank := int(r.FailedRank)
	if r.Kind == pb.WindowKind_WINDOW_KIND_OOM && !c.cfg.OnOOM {
		l.log.Info("a rank hit an OOM; post-mortems are off", "failed_rank", failedRank)
		l.answer(req, pb.AckCode_ACK_BAD_REQUEST, "post-mortems are off (--no-postmortem)")
		return
	}
	l.mu.Lock()
	if time.Since(l.lastPM) < postmortemQuiet {
		id := l.lastPMID
		l.mu.Unlock()
		l.log.Info("a rank failed during a recent post-mortem; no new one", "failed_rank", failedRank, "cause", r.Cause, "postmortem", id)
		l.answer(req, pb.AckCode_ACK_BAD_REQUEST, fmt.Sprintf("part of post-mortem window %d", id))
		return
	}
	l.mu.Unlock()
	// a post-mortem another leader took of the same incident moments ago (the
	// leader of a job torn down rank by rank is stopped too): this one is part of it
	if recent, err := l.rl.Latest(ctx, 4); err == nil {
		for _, p := range recent {
			if (p.Kind == runlog.KindCrash || p.Kind == runlog.KindOOM) && time.Since(p.Created) < postmortemQuiet {
				l.mu.Lock()
				l.lastPM, l.lastPMID = p.Created, p.ID
				l.mu.Unlock()
				l.log.Info("a rank failed during a recent post-mortem of another leader; no new one", "failed_rank", failedRank, "cause", r.Cause, "postmortem", p.ID)
				l.answer(req, pb.AckCode_ACK_BAD_REQUEST, fmt.Sprintf("part of post-mortem window %d", p.ID))
				return
			}
		}
	}
	l.mu.Lock()
	l.lastPM = time.Now()
	l.working++
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.working--
		l.mu.Unlock()
	}()
	world := c.cfg.Identity.WorldSize
	w := &win{kind: r.Kind, reason: r.Cause, ranks: map[int]*rankState{}, world: world, failed: map[int]failure{}}
	if failedRank >= 0 && failedRank < world {
		w.failed[failedRank] = failure{cause: r.Cause, at: failureTime(r.AtUs)}
	}
	nodes := c.rankNodes()
	var ranks []int
	now := time.Now()
	for rk := 0; rk < world; rk++ {
		if _, ok := nodes[rk]; ok || rk == failedRank {
			w.ranks[rk] = &rankState{lastSign: now}
			ranks = append(ranks, rk)
		} else {
			w.ranks[rk] = &rankState{missing: "not a member of the cluster", leftOut: true}
		}
	}
	w.deadline = now.Add(c.cfg.PostmortemDeadline)
	fr := failedRank
	pl, err := l.createPlan(ctx, runlog.Plan{Kind: kindName(r.Kind), Reason: r.Cause, Ranks: ranks, Deadline: w.deadline, FailedRank: &fr, Cause: r.Cause})
	if err != nil {
		l.log.Error("cannot record the post-mortem's plan in the run's log; no post-mortem", "failed_rank", failedRank, "err", err)
		return
	}
	w.id = pl.ID
	l.mu.Lock()
	l.lastPMID = w.id
	l.mu.Unlock()
	l.log.Warn("post-mortem: asking every rank for its allocator state", "window", w.id, "kind", kindName(r.Kind), "failed_rank", failedRank,
		"cause", r.Cause, "ranks", len(ranks))
	ch, seq := c.expect(4*len(ranks)+64, c.fromRanks())
	defer c.forget(seq)
	w.cmd = c.envelope(w.id)
	w.cmd.Seq, w.cmd.Term = seq, l.term
	w.cmd.Body = &pb.Envelope_Dump{Dump: &pb.Dump{Reason: r.Cause, FailedRank: int32(failedRank), Kind: r.Kind}}
	sent := l.sendAsync(w.cmd, ranks)
	// the rank that failed may be gone: its snapshot is in the store already, or
	// arrives when its agent uploads it
	l.collect(ctx, w, ch, sent, false)
	if ctx.Err() != nil {
		return
	}
	l.finish(ctx, w)
}

// failureTime reads a failure's time (the leader's clock, microseconds).
func failureTime(us int64) time.Time {
	if us <= 0 {
		return time.Now()
	}
	return time.UnixMicro(us)
}

// planSenders is how many ranks sendAll sends to at once. Each send opens a
// stream of its own: over TCP a connection's round trip, and for a rank that
// cannot be reached memberlist's TCP timeout, for which it holds its sender; 256
// keep a few such ranks from holding up the plan to the others. The acks come
// back on streams of their own, which the leader's transport admits up to its
// stream limit (1,024, defaultStreamLimits).
const planSenders = 256

// sendAll sends the window's command to each rank directly (over TCP, planSenders
// at a time) and returns once every send is done; a rank it cannot reach is
// missing.
func (l *leaderRun) sendAll(w *win, ranks []int) {
	for _, f := range l.send(w.cmd, ranks) {
		l.unreachable(w, f)
	}
}

// sendFailure is a rank a command could not be sent to.
type sendFailure struct {
	rank int
	err  error
}

// unreachable marks the rank of f missing, unless it is in already.
func (l *leaderRun) unreachable(w *win, f sendFailure) {
	if s := w.ranks[f.rank]; s != nil && s.missing == "" && s.result == nil {
		s.missing = "unreachable: " + f.err.Error()
	}
}

// send sends cmd to each rank directly (over TCP, planSenders at a time), this
// member's own rank included, and returns the ranks it could not reach. It
// touches no window: the leader's loop may collect the acks meanwhile.
func (l *leaderRun) send(cmd *pb.Envelope, ranks []int) []sendFailure {
	c := l.c
	nodes := c.rankNodes()
	b, err := proto.Marshal(cmd) // once: at 1,024 ranks a plan names them all
	if err != nil {
		l.log.Error("a window's command cannot be encoded", "window", cmd.WindowId, "err", err)
		var failed []sendFailure
		for _, r := range ranks {
			failed = append(failed, sendFailure{r, fmt.Errorf("the window's command cannot be encoded: %w", err)})
		}
		return failed
	}
	var mu sync.Mutex
	var failed []sendFailure
	var wg sync.WaitGroup
	sem := make(chan struct{}, planSenders)
	for _, r := range ranks {
		if int32(r) == c.rank() {
			c.handleLocal(cmd)
			continue
		}
		n := nodes[r]
		if n == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if now := c.node(n.Name); now != nil {
				n = now // it may have come back at another address since the snapshot
			}
			err := c.sendBytes(n, b, true)
			if err != nil {
				mu.Lock()
				failed = append(failed, sendFailure{r, err})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failed
}

// sendAsync sends cmd to the ranks as send does, without waiting: the failures
// arrive on the channel returned, which collect takes.
func (l *leaderRun) sendAsync(cmd *pb.Envelope, ranks []int) <-chan []sendFailure {
	ch := make(chan []sendFailure, 1)
	if !l.c.spawn(func() { ch <- l.send(cmd, ranks) }) {
		ch <- nil
	}
	return ch
}

// cancelWindow withdraws w from every rank.
func (l *leaderRun) cancelWindow(w *win, reason string) {
	env := l.c.envelope(w.id)
	env.Term = l.term
	env.Body = &pb.Envelope_Cancel{Cancel: &pb.Cancel{Reason: reason}}
	var ranks []int
	for r := range w.ranks {
		ranks = append(ranks, r)
	}
	l.sendAll(&win{ranks: map[int]*rankState{}, cmd: env}, ranks)
	l.c.gossip(env)
}

// collectOut is how a collection ended early.
type collectOut struct {
	passed []int // ranks past the window's start (it may be planned again)
	stale  bool  // a rank has seen a newer term than this leader's
}

// collect waits until every rank of w has stored its snapshot or is missing: a
// rank that shows no sign of life (no progress, no batch advancing) for
// CollectTimeout is missing, and so is every rank not in by the window's
// deadline. With canReplan, it returns as soon as a rank says it is past the
// window's start, naming those ranks.
func (l *leaderRun) collect(ctx context.Context, w *win, acks chan *pb.Envelope, sent <-chan []sendFailure, canReplan bool) collectOut {
	c := l.c
	tick := time.NewTicker(min(c.cfg.StatusTimeout, 500*time.Millisecond))
	defer tick.Stop()
	lastPoll := time.Now()
	ackDeadline := time.Now().Add(c.cfg.AckTimeout)
	deadline := time.NewTimer(time.Until(w.deadline))
	defer deadline.Stop()
	var out collectOut
	var flush <-chan time.Time
	if l.gathersSteps(w) {
		t := time.NewTicker(stepsEvery)
		defer t.Stop()
		flush = t.C
	}
	defer l.flushSteps(w)
	defer func() {
		// the command has gone out to every rank before the window is given up,
		// planned again or merged: a cancel must not overtake it
		if sent != nil {
			select {
			case fs := <-sent:
				for _, f := range fs {
					l.unreachable(w, f)
				}
			case <-ctx.Done():
			}
		}
	}()
	allAcked := func() bool {
		for _, s := range w.ranks {
			if s.missing == "" && !s.acked && s.result == nil {
				return false
			}
		}
		return true
	}
	for w.waiting() && !out.stale {
		if canReplan && len(out.passed) > 0 && (allAcked() || time.Now().After(ackDeadline)) {
			return out
		}
		select {
		case <-ctx.Done():
			return out
		case <-deadline.C:
			why := fmt.Sprintf("not in by the window's deadline (%s)", w.deadline.Format(time.TimeOnly))
			if !w.planned.IsZero() {
				why = fmt.Sprintf("not in by the window's deadline (%s, %v after it was planned)", w.deadline.Format(time.TimeOnly), w.deadline.Sub(w.planned).Round(time.Second))
			}
			if w.postmortem() {
				why = fmt.Sprintf("no snapshot within the post-mortem's deadline of %v", c.cfg.PostmortemDeadline)
			}
			// a result that never reached this leader may be in the run's log
			l.reportedAll(ctx, w, w.outstanding())
			for _, r := range w.outstanding() {
				w.ranks[r].missing = why
				l.tell(w, r, pb.Step_STEP_MISSING, w.ranks[r].batch, why)
			}
			return out
		case <-flush:
			l.flushSteps(w)
		case fs := <-sent:
			for _, f := range fs {
				l.unreachable(w, f)
			}
			sent = nil
			// at 1,024 ranks the plan takes a moment to go out: the ranks have
			// AckTimeout from the moment it has
			ackDeadline = time.Now().Add(c.cfg.AckTimeout)
		case env := <-acks:
			if a := env.GetAck(); a != nil && env.WindowId == w.id {
				l.onAck(w, env, a, &out, ackDeadline)
			}
			l.preload(ctx, w, int(env.SenderRank))
		case env := <-l.msgs:
			if env.GetRequest() != nil {
				if l.onRequestDuring(w, env) {
					// a post-mortem now, while the window goes on: every rank's
					// state at the failure, not when the window ends (in a
					// synchronous job the other ranks hang in their next collective)
					l.postmortem(ctx, env)
					if ctx.Err() != nil {
						return out
					}
					l.unstash(w, &out)
				}
				continue
			}
			if env.WindowId == w.id {
				l.onRankMessage(w, env, &out)
				l.preload(ctx, w, int(env.SenderRank))
			} else if a := env.GetAck(); a != nil && a.Code == pb.AckCode_ACK_STALE_TERM {
				l.c.noteTerm(a.Term)
				out.stale = true
			} else if w.postmortem() {
				l.stash = append(l.stash, env) // for the window this post-mortem interrupted
			}
		case <-tick.C:
			l.resend(w, ackDeadline)
			// ranks are asked every StatusTimeout; a silence's end (a rank gone
			// from the cluster, whose grace ends) is seen at the next tick
			poll := time.Since(lastPoll) >= c.cfg.StatusTimeout
			if poll {
				lastPoll = time.Now()
			}
			l.checkAlive(ctx, w, poll)
			for r := range w.ranks {
				l.preload(ctx, w, r)
			}
		}
	}
	return out
}

// preloaders is how many ranks' sidecars and analyses a leader reads at once
// while it collects.
const preloaders = 16

// preload starts reading and parsing rank r's sidecar and analysis once its
// result is in, preloaders at a time, while the other ranks still record and
// upload: at 1,024 ranks the answer then waits for none of it (merge.Preload).
// What cannot be read now is read again when the window is merged.
func (l *leaderRun) preload(ctx context.Context, w *win, r int) {
	s := w.ranks[r]
	if s == nil || s.pre != nil || s.result == nil || s.result.Error != "" || s.result.MetaKey == "" || w.postmortem() ||
		s.result.Partial != "" || s.result.Start != w.start || s.result.Stop != w.stop { // inputs drops these
		return
	}
	if w.preSem == nil {
		w.preSem = make(chan struct{}, preloaders)
	}
	ch, in, sem := make(chan merge.Input, 1), l.input(s.result, r), w.preSem
	s.pre = ch
	if !l.c.spawn(func() {
		select {
		case sem <- struct{}{}:
			defer func() { <-sem }()
			in = merge.Preload(ctx, in)
		case <-ctx.Done():
		}
		ch <- in
	}) {
		ch <- in
	}
}

// unstash handles what arrived for w while a post-mortem interrupted it.
func (l *leaderRun) unstash(w *win, out *collectOut) {
	var keep []*pb.Envelope
	for _, env := range l.stash {
		if env.WindowId == w.id {
			if a := env.GetAck(); a != nil {
				l.onAck(w, env, a, out, time.Now().Add(time.Hour))
			} else {
				l.onRankMessage(w, env, out)
			}
		} else {
			keep = append(keep, env)
		}
	}
	l.stash = keep
	if len(l.stash) > 1<<16 {
		l.stash = nil
	}
}

// resend sends the window's command again to the ranks that saw another leader
// when it first arrived (their membership had not caught up yet). A rank that is
// not a member at this moment (gossip of a relaunched job's previous agents can
// take a rank away for a moment) is asked again at a later tick: sendAll would
// skip it, and nothing would ever ask it again.
func (l *leaderRun) resend(w *win, ackDeadline time.Time) {
	now := time.Now()
	var again []int
	var nodes map[int]*memberlist.Node
	for r, s := range w.ranks {
		if s.retryAt.IsZero() || now.Before(s.retryAt) || s.missing != "" || s.result != nil {
			continue
		}
		s.retryAt = time.Time{}
		if now.After(ackDeadline) {
			s.missing = "refused the window: it sees another member as leader"
			l.tell(w, r, pb.Step_STEP_REFUSED, s.batch, s.missing)
			continue
		}
		if nodes == nil {
			nodes = l.c.rankNodes()
		}
		if nodes[r] == nil && int32(r) != l.c.rank() {
			s.retryAt = now.Add(200 * time.Millisecond)
			continue
		}
		again = append(again, r)
	}
	if len(again) > 0 {
		l.sendAll(w, again)
	}
}

func (l *leaderRun) onAck(w *win, env *pb.Envelope, a *pb.Ack, out *collectOut, ackDeadline time.Time) {
	r := int(env.SenderRank)
	s := w.ranks[r]
	if s == nil || s.missing != "" {
		return
	}
	s.lastSign = time.Now()
	switch {
	case a.Ok && s.acked:
	case a.Ok:
		s.acked = true
		l.tell(w, r, pb.Step_STEP_ACKED, a.Batch, "")
	case a.Code == pb.AckCode_ACK_PASSED:
		out.passed = append(out.passed, r)
		s.missing = "past the window's start: " + a.Message
		l.tell(w, r, pb.Step_STEP_PASSED, a.Batch, a.Message)
	case a.Code == pb.AckCode_ACK_NOT_LEADER && time.Now().Before(ackDeadline):
		s.retryAt = time.Now().Add(200 * time.Millisecond)
	case a.Code == pb.AckCode_ACK_STALE_TERM:
		l.c.noteTerm(a.Term)
		out.stale = true
	default:
		s.missing = fmt.Sprintf("refused the window (%s): %s", ackName(a.Code), a.Message)
		l.tell(w, r, pb.Step_STEP_REFUSED, a.Batch, a.Message)
	}
}

func ackName(c pb.AckCode) string {
	switch c {
	case pb.AckCode_ACK_PASSED:
		return "passed"
	case pb.AckCode_ACK_BUSY:
		return "busy"
	case pb.AckCode_ACK_STALE:
		return "stale"
	case pb.AckCode_ACK_NOT_LEADER:
		return "not the leader"
	case pb.AckCode_ACK_STALE_TERM:
		return "stale term"
	case pb.AckCode_ACK_BAD_REQUEST:
		return "bad request"
	}
	return "error"
}

func (l *leaderRun) onRankMessage(w *win, env *pb.Envelope, out *collectOut) {
	r := int(env.SenderRank)
	s := w.ranks[r]
	if s == nil || s.leftOut {
		return // a rank the plan left out took it from gossip: nothing of it is merged
	}
	s.lastSign = time.Now()
	if res := env.GetResult(); res != nil {
		if s.result == nil {
			s.result = res
			s.missing = ""
			state, why := pb.Step_STEP_UPLOADED, res.Partial
			if res.Error != "" {
				state, why = pb.Step_STEP_FAILED, res.Error
			}
			l.tell(w, r, state, -1, why)
		}
		return
	}
	p := env.GetProgress()
	if p == nil || s.result != nil {
		return
	}
	s.state = p.State
	s.batch = max(s.batch, p.Batch)
	switch p.State {
	case pb.Step_STEP_MISSED:
		if s.missing == "" {
			out.passed = append(out.passed, r)
			s.missing = "past the window's start: " + p.Reason
		}
	case pb.Step_STEP_FAILED:
		s.missing = "failed: " + p.Reason
	case pb.Step_STEP_CANCELLED:
		s.missing = "cancelled: " + p.Reason
	}
	l.tell(w, r, p.State, p.Batch, p.Reason)
}

// onRequestDuring answers a request that arrives while w records: a watch of w
// joins its watchers; a rank's OOM or crash during a window asks for a
// post-mortem now (it reports true), and during a post-mortem joins it as
// another failure of the same incident; anything else waits its turn.
func (l *leaderRun) onRequestDuring(w *win, env *pb.Envelope) bool {
	r := env.GetRequest()
	incident := r.Kind == pb.WindowKind_WINDOW_KIND_CRASH || r.Kind == pb.WindowKind_WINDOW_KIND_OOM
	switch {
	case env.WindowId == w.id:
		if !watching(w.watchers, env) {
			w.watchers = append(w.watchers, env)
		}
		l.answer(env, pb.AckCode_ACK_OK, "")
		return false
	case incident && w.postmortem():
		rk := int(r.FailedRank)
		if rk >= 0 && rk < w.world && l.c.isRankMember(env) {
			if _, ok := w.failed[rk]; !ok {
				w.failed[rk] = failure{cause: r.Cause, at: failureTime(r.AtUs)}
			}
			if s := w.ranks[rk]; s != nil && s.result == nil {
				// its snapshot of the failure is its part of this post-mortem:
				// ask again, so it hands that over
				s.missing, s.lastSign = "", time.Now()
				l.sendAll(w, []int{rk})
				return false
			}
		}
		l.answer(env, pb.AckCode_ACK_BAD_REQUEST, fmt.Sprintf("part of post-mortem window %d", w.id))
		return false
	case incident:
		return true
	}
	l.queue(env)
	l.tellQueued(w, env)
	return false
}

// tellQueued tells a member whose request waits for window w to end why it
// hears nothing yet (a window being finished by a new leader may wait for its
// deadline).
func (l *leaderRun) tellQueued(w *win, req *pb.Envelope) {
	if req.Seq == 0 {
		return
	}
	r := l.c.envelope(0) // not about the request's window, which it has not yet
	r.Seq = req.Seq
	r.Body = &pb.Envelope_Progress{Progress: &pb.Progress{State: pb.Step_STEP_UNSPECIFIED, Rank: -1, Batch: -1,
		Reason: fmt.Sprintf("waiting: window %d is in progress (the leader gives up on it at %s); this request is planned after it",
			w.id, w.deadline.Format(time.TimeOnly))}}
	l.c.post(req.Sender, req.ReplyAddr, r, true)
}

// checkAlive asks the outstanding ranks where they stand (with poll): a result
// that never arrived is taken from the answer, a batch that advanced is a sign of
// life; and a rank silent for CollectTimeout is missing. Without poll only ranks
// that are not members can be missing: a member may have advanced since the last
// poll, and only the next one can say (a rank gone from the cluster, whose grace
// ends, is seen at once; one that came back is asked first).
func (l *leaderRun) checkAlive(ctx context.Context, w *win, poll bool) {
	out := w.outstanding()
	if len(out) == 0 {
		return
	}
	var sts map[int]status
	var nodes map[int]*memberlist.Node
	if poll {
		sts = l.c.status(ctx, out)
	} else {
		nodes = l.c.rankNodes()
	}
	now := time.Now()
	lost := map[int]string{} // ranks to call missing, and why, unless the run's log has their report
	for _, r := range out {
		s := w.ranks[r]
		if !poll && nodes[r] != nil {
			continue // a member: the next poll says whether it lives
		}
		if st, ok := sts[r]; ok {
			if st.st.Term > l.term {
				l.c.noteTerm(st.st.Term)
			}
			if st.st.Window == w.id && st.st.Result != nil && s.result == nil {
				s.result = st.st.Result
				l.tell(w, r, pb.Step_STEP_UPLOADED, st.st.Batch, st.st.Result.Partial)
				continue
			}
			if st.st.Window > w.id && !w.postmortem() {
				s.missing = fmt.Sprintf("moved on to window %d", st.st.Window)
				continue
			}
			if s.acked && st.st.Window < w.id && !w.postmortem() && !slices.Contains(st.st.Spooled, w.id) {
				// it took the window, and its agent no longer knows it: the agent
				// was restarted (its trainer's batches are no sign of this window's
				// life). What it stored before is in the run's log.
				lost[r] = "its agent was restarted and has no record of the window (no snapshot of it in the run's log or the rank's spool)"
				continue
			}
			if st.st.Batch > s.batch || st.st.State != s.state {
				s.batch, s.state, s.lastSign = st.st.Batch, st.st.State, now
			}
		}
		if now.Sub(s.lastSign) > l.c.cfg.CollectTimeout && !w.postmortem() { // a post-mortem has its own short deadline
			lost[r] = nonEmpty(s.gone, fmt.Sprintf("no sign of life for %v", l.c.cfg.CollectTimeout))
		}
	}
	if len(lost) == 0 {
		return
	}
	// a result that never reached this leader (the rank was not a member then,
	// say) is in the run's log. A log that cannot be read (the store is away)
	// does not keep a silent rank in: the window would wait for its deadline, and
	// its publication waits for the store anyway
	ranks := make([]int, 0, len(lost))
	for r := range lost {
		ranks = append(ranks, r)
	}
	sort.Ints(ranks)
	l.reportedAll(ctx, w, ranks)
	for _, r := range ranks {
		if s := w.ranks[r]; s.result == nil {
			s.missing = lost[r]
			l.tell(w, r, pb.Step_STEP_MISSING, s.batch, s.missing)
		}
	}
}

// reportedAll takes the results of ranks from their reports in the run's log,
// where they wrote one: a result may never have reached this leader (a leader
// restarted under its old name took a moment to find the cluster again, and
// refused the results of ranks it did not yet see as members). A few ranks' reports
// are read one by one, more by one listing. It reports false when the log could
// not be read.
func (l *leaderRun) reportedAll(ctx context.Context, w *win, ranks []int) bool {
	if l.rl == nil || len(ranks) == 0 {
		return true
	}
	take := func(r int, rep *runlog.Report) {
		s := w.ranks[r]
		s.result, s.missing = resultOfReport(rep), ""
		l.tell(w, r, pb.Step_STEP_UPLOADED, s.batch, s.result.Partial)
	}
	if len(ranks) <= 8 {
		ok := true
		for _, r := range ranks {
			rep, err := l.rl.Report(ctx, w.id, r)
			switch {
			case err == nil:
				take(r, rep)
			case !errors.Is(err, store.ErrNotFound):
				l.log.Warn("cannot read a rank's report from the run's log", "window", w.id, "of_rank", r, "err", err)
				ok = false
			}
		}
		return ok
	}
	reps, _, err := l.rl.Reports(ctx, w.id)
	if err != nil {
		l.log.Warn("cannot read the ranks' reports from the run's log", "window", w.id, "err", err)
		return false
	}
	for _, r := range ranks {
		if rep := reps[r]; rep != nil {
			take(r, rep)
		}
	}
	return true
}

// tell logs a step of the window and passes it on to the members watching it
// (rank steps as datagrams: a lost one is shown by the next).
func (l *leaderRun) tell(w *win, rank int, state pb.Step, batch int64, reason string) {
	l.log.Debug("window progress", "window", w.id, "of_rank", rank, "state", stepName(state), "batch", batch, "reason", reason)
	watchers := l.watchersOf(w)
	if len(watchers) == 0 {
		return
	}
	if rank >= 0 && l.gathersSteps(w) {
		w.steps = append(w.steps, &pb.RankStep{Rank: int32(rank), State: state, Batch: batch, Reason: reason})
		return
	}
	l.flushSteps(w) // the ranks' steps come before the window's
	for _, wt := range watchers {
		env := l.c.envelope(w.id)
		env.Body = &pb.Envelope_Progress{Progress: &pb.Progress{State: state, Batch: batch, Reason: reason, Rank: int32(rank)}}
		env.Seq = wt.Seq
		l.c.post(wt.Sender, wt.ReplyAddr, env, rank < 0)
	}
}

func (l *leaderRun) watchersOf(w *win) []*pb.Envelope {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append(append([]*pb.Envelope(nil), w.watchers...), l.pending[w.id]...)
}

// flushSteps tells the watchers of w the ranks' steps gathered since the last
// time, over TCP (one message holds many ranks' steps).
func (l *leaderRun) flushSteps(w *win) {
	if len(w.steps) == 0 {
		return
	}
	steps := w.steps
	w.steps = nil
	watchers := l.watchersOf(w)
	for _, part := range stepMessages(steps) {
		for _, wt := range watchers {
			env := l.c.envelope(w.id)
			env.Body = &pb.Envelope_Progress{Progress: &pb.Progress{Rank: -1, Batch: -1, Steps: part}}
			env.Seq = wt.Seq
			l.c.post(wt.Sender, wt.ReplyAddr, env, true)
		}
	}
}

// tellPlanned says the window is planned, with the time the leader gives up on it.
func (l *leaderRun) tellPlanned(w *win, what string) {
	for _, wt := range w.watchers {
		env := l.c.envelope(w.id)
		env.Body = &pb.Envelope_Progress{Progress: &pb.Progress{State: pb.Step_STEP_PLANNED, Batch: -1, Reason: what, Rank: -1, DeadlineUs: w.deadline.UnixMicro()}}
		env.Seq = wt.Seq
		l.c.post(wt.Sender, wt.ReplyAddr, env, true)
	}
}

// watching reports whether env's sender already watches (by its request).
func watching(ws []*pb.Envelope, env *pb.Envelope) bool {
	for _, w := range ws {
		if w.Sender == env.Sender && w.Seq == env.Seq {
			return true
		}
	}
	return false
}

func missingOf(w *win) map[int32]string {
	out := map[int32]string{}
	for r, s := range w.ranks {
		if s.missing != "" {
			out[int32(r)] = s.missing
		}
	}
	return out
}
