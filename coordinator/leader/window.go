package leader

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/retry"
	"github.com/memsnap/memsnap/internal/wait"
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/runlog"
)

// plan is one window to record.
type plan struct {
	kind     pb.WindowKind // a window or a trigger's window (unspecified: a window)
	length   int64
	minStart int64
	reason   string
	watchers []*pb.Envelope
	req      *pb.Envelope // the request it serves (served again if the leader's term was stale)
}

// failure is a rank's trainer failing, as a post-mortem records it.
type failure struct {
	cause string
	at    time.Time // on the leader's clock
}

// win is a window this leader runs: its state machine (coordinator/window), and
// what carrying out the machine's effects needs.
type win struct {
	m        *window.Window
	reason   string
	failed   map[int]failure // a post-mortem: the ranks that failed, how and when
	watchers []*pb.Envelope
	cmd      *pb.Envelope   // the plan or dump sent to every rank
	steps    []*pb.RankStep // ranks' steps not told to the watchers yet (while gathering)
	gather   bool           // it is collected: its ranks' steps are told gathered
	flushed  time.Time      // when they were last told
	manifest string         // its manifest's key: its commit point
	// pre receives a rank's input with its sidecar and analysis read and parsed
	// (merge.Preload), started when its result arrived
	pre    map[int]chan merge.Input
	preSem chan struct{}
	answer *pb.WindowResult // its answer, once committed
	res    *pb.WindowResult // how it ended, once it has (published or failed)
	retry  time.Duration    // a Retry's wait, not yet waited
	// outer is the window a post-mortem interrupted (nil: none); inbox holds
	// the ranks' messages about this window that came while a post-mortem
	// interrupted it, stepped once it resumes
	outer *win
	inbox []*pb.Envelope
}

func (w *win) id() uint64 { return w.m.ID }

// exit is why the leader stops running w: the machine's word (window.Exit).
func (w *win) exit() window.Exit { e, _ := w.m.Exit(); return e }

// running reports whether the leader still runs w.
func (w *win) running() bool { return w.exit() == window.Running }

func newWin(m *window.Window, reason string, watchers []*pb.Envelope, manifest string) *win {
	return &win{m: m, reason: reason, watchers: watchers, manifest: manifest, failed: map[int]failure{}, pre: map[int]chan merge.Input{}}
}

// While a window is collected its ranks' steps are told to its watchers
// gathered, every stepsEvery (the first after a quiet stepsEvery at once), in messages of at most stepsPerMessage steps and
// stepsBytes bytes of reasons (1,024 ranks acking within a few milliseconds, each
// ack a datagram to every watcher, overflowed a watching member's queues), and
// reliably: with the window's own steps, on the one ordered way the outbox keeps
// to each member, so a watcher hears the window's story complete and in order.
const (
	stepsEvery      = 100 * time.Millisecond
	stepsPerMessage = 512
	stepsBytes      = 256 << 10
)

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

// timers are the bounds the leader's windows run under.
func (l *Leader) timers() window.Timers {
	c := l.cfg
	return window.Timers{Ack: c.AckTimeout, Silence: c.CollectTimeout, Poll: c.StatusTimeout, Spool: c.PublishTimeout, Publish: c.PublishTimeout,
		Postmortem: c.PostmortemDeadline}
}

// agentsOf names the agents of ranks, for a plan (rank -> agent id).
func agentsOf(agents map[int]string, ranks []int) map[string]string {
	out := make(map[string]string, len(ranks))
	for _, r := range ranks {
		if a := agents[r]; a != "" {
			out[strconv.Itoa(r)] = a
		}
	}
	return out
}

// begin counts a window of kind in progress, until the function it returns is
// called: whether the leader is busy, and whether a trigger's window is in
// progress, are read from these.
func (l *Leader) begin(kind pb.WindowKind) (end func()) {
	if kind == pb.WindowKind_WINDOW_KIND_UNSPECIFIED {
		kind = pb.WindowKind_WINDOW_KIND_WINDOW
	}
	l.mu.Lock()
	l.running = append(l.running, kind)
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		if i := slices.Index(l.running, kind); i >= 0 {
			l.running = slices.Delete(l.running, i, i+1)
		}
		l.mu.Unlock()
	}
}

// window records one window and tells the members that asked for it how it
// ended. It returns how it ended, or nil when it has not (the request is served
// again, or the window was left for later).
func (l *Leader) window(ctx context.Context, p plan) *pb.WindowResult {
	defer l.begin(p.kind)()
	return l.record(ctx, p, false)
}

// record plans a window, collects it, merges and publishes it. A rank past the
// start makes the leader plan once more with a longer lead; the second time the
// window goes on without it.
func (l *Leader) record(ctx context.Context, p plan, again bool) *pb.WindowResult {
	c := l.m
	cfg, expected, why := l.choose(ctx, p, again)
	if why != nil && ctx.Err() != nil {
		// this member stopped leading while it asked the ranks (their answers
		// never came because of that, not because they are gone): no failure is
		// told; the member that asked asks the new leader
		return nil
	}
	if why != nil {
		l.log.Warn("no window planned", "why", why.Error)
		l.tellResult(0, p.watchers, why, true)
		return why
	}
	rp := runlog.Plan{Kind: kindName(cfg.Kind), Reason: p.reason, Start: cfg.Start, Stop: cfg.Stop, Ranks: expected, Deadline: cfg.Deadline,
		Agents: agentsOf(l.m.RankAgents(), expected)}
	if p.req != nil {
		rp.Request = requestID(p.req)
	}
	pl, err := l.createPlan(ctx, rp)
	if err != nil {
		if isSuperseded(err) {
			// a newer term: this leader takes one and serves the request again
			l.m.BelieveTerm(ctx, l.rl)
			if p.req != nil {
				l.pushFront(p.req)
			}
			return nil
		}
		if ctx.Err() != nil {
			return nil // (no longer leading: as above)
		}
		if p.kind == pb.WindowKind_WINDOW_KIND_TRIGGER && p.req != nil {
			l.deferRequest(p.req, err) // (its cooldown is spent on the window it will be)
			return nil
		}
		res := &pb.WindowResult{State: pb.Outcome_OUTCOME_FAILED, Start: cfg.Start, Stop: cfg.Stop, Store: l.st.String(),
			Error: "the window's plan could not be recorded in the run's log: " + err.Error()}
		l.tellResult(0, p.watchers, res, true)
		return res
	}
	cfg.ID = pl.ID
	if rp.Request != "" {
		if err := l.rl.NoteRequest(ctx, rp.Request, pl.ID); err != nil {
			l.log.Warn("cannot note in the run's log which window serves the request; a later leader looks among the newest plans", "window", pl.ID, "err", err)
		}
	}
	w := newWin(window.New(cfg), p.reason, p.watchers, pl.Manifest)
	l.log.Info("window planned", "window", w.id(), "start", cfg.Start, "stop", cfg.Stop, "ranks", len(expected), "world_size", cfg.World,
		"reason", p.reason, "term", l.term, "deadline", cfg.Deadline.Format(time.RFC3339))
	l.tellPlanned(w, fmt.Sprintf("batches [%d, %d) on %d of %d ranks", cfg.Start, cfg.Stop, len(expected), cfg.World))

	ranks32 := make([]int32, len(expected))
	for i, r := range expected {
		ranks32[i] = int32(r)
	}
	ch, seq := c.ExpectRanks(4*len(expected) + 64)
	defer c.Forget(seq)
	w.cmd = c.Envelope(w.id())
	w.cmd.Seq, w.cmd.Term = seq, l.term
	w.cmd.Body = &pb.Envelope_Plan{Plan: &pb.Plan{Start: cfg.Start, Stop: cfg.Stop, Reason: p.reason, WorldSize: int32(cfg.World), Ranks: ranks32}}
	// the acks are collected while the plan still goes out: at 1,024 ranks the
	// first ranks have acked long before the last is sent to
	sent := l.sendAsync(w.cmd, expected)
	c.Gossip(w.cmd)
	l.collect(ctx, w, ch, sent)
	l.drive(ctx, w)
	return l.ended(ctx, w, p)
}

// noRankAnswered is why no window is planned when no rank answers the status
// request, statusTries times.
const (
	noRankAnswered = "no rank answered the leader"
	statusTries    = 3
)

// choose picks a window's ranks and batches: the ranks that answer with a
// plausible batch (every rank of the world gets a moment to join first), and a
// start every one of them is still before when the plan reaches it. It returns
// the window's configuration (its id to come), the ranks asked, or, when no
// window can be planned, the result that says why.
func (l *Leader) choose(ctx context.Context, p plan, again bool) (window.Config, []int, *pb.WindowResult) {
	c := l.m
	world := l.cfg.Identity.WorldSize
	l.awaitRanks(ctx, p)
	nodes := c.RankNodes()
	ranks := make([]int, 0, len(nodes))
	for r := range nodes {
		if r < world {
			ranks = append(ranks, r)
		}
	}
	sort.Ints(ranks)
	rs, leftOut, why := l.plausible(ranks, l.m.Status(ctx, ranks))
	// no rank answered, not even this one: a stall (a loaded machine, a
	// dispatcher behind), not ranks gone; asked again before the request fails
	for try := 1; why == noRankAnswered && try < statusTries && ctx.Err() == nil; try++ {
		l.log.Warn("no rank answered the leader's status request; asking again", "try", try+1, "of", statusTries)
		rs, leftOut, why = l.plausible(ranks, l.m.Status(ctx, ranks))
	}
	if why != "" {
		res := &pb.WindowResult{State: pb.Outcome_OUTCOME_FAILED, Error: why, Store: l.st.String(), Missing: map[int32]string{}}
		for r, x := range leftOut {
			res.Missing[int32(r)] = x
		}
		return window.Config{}, nil, res
	}
	margin := l.cfg.LeadMargin
	if again {
		margin *= 3
	}
	start, stop := PlanWindow(rs, p.length, p.minStart, margin)
	asked := map[int]int64{}
	expected := make([]int, 0, len(rs))
	for _, r := range rs {
		asked[r.Rank] = r.Batch
		expected = append(expected, r.Rank)
	}
	kind := p.kind
	if kind == pb.WindowKind_WINDOW_KIND_UNSPECIFIED {
		kind = pb.WindowKind_WINDOW_KIND_WINDOW
	}
	return window.Config{Term: l.term, Kind: kind, Start: start, Stop: stop, World: world, Asked: asked, LeftOut: leftOut,
		Planned: time.Now(), Deadline: l.windowDeadline(rs, start, stop), Timers: l.timers(), CanReplan: !again}, expected, nil
}

// awaitRanks gives ranks of the world that are not members a moment to arrive
// (agents start at different times, and one may be restarting), saying what it
// awaits and until when: a rank that was a member, JoinGrace from when it went; a rank
// whose agent never joined this cluster, only while the cluster is young (up to
// JoinGrace after this member started; for a scheduled window, JoinGrace from
// now). A request made later is not held for a rank that never joined: waiting
// cannot help it.
func (l *Leader) awaitRanks(ctx context.Context, p plan) {
	c := l.m
	gone, never := c.AbsentRanks()
	if len(gone)+len(never) == 0 {
		return
	}
	if p.req != nil && urgent(p.req) {
		// a trigger's or an alert's window is planned at once: the OOM it is
		// about may be near, and a rank that is not a member now has its
		// post-mortem (or its crash's) in the run's log, if it had one
		l.tellRequest(p.watchers, fmt.Sprintf("ranks %s are not members now: planning without them at once (a trigger's or an alert's window)",
			analysis.RankRanges(append(append([]int(nil), gone...), never...))))
		return
	}
	now := time.Now()
	until := map[int]time.Time{}
	for _, r := range gone {
		// JoinGrace from when it went, not from now: a request served again (a
		// newer term took it back) does not wait for the same rank twice
		if t := c.GoneAt(config.NodeName(l.cfg.Identity.RunName, r), now).Add(l.cfg.JoinGrace); t.After(now) {
			until[r] = t
		}
	}
	young := c.Began().Add(l.cfg.JoinGrace)
	if p.req == nil {
		young = now.Add(l.cfg.JoinGrace)
	}
	var left []int
	for _, r := range never {
		if now.Before(young) {
			until[r] = young
		} else {
			left = append(left, r)
		}
	}
	if len(left) > 0 {
		l.tellRequest(p.watchers, fmt.Sprintf("ranks %s never joined this cluster: planning without them", analysis.RankRanges(left)))
	}
	if len(until) == 0 {
		return
	}
	var last time.Time
	for _, t := range until {
		if t.After(last) {
			last = t
		}
	}
	l.tellRequest(p.watchers, fmt.Sprintf("waiting for ranks %s to join (until %s UTC); the window is planned without those still absent then",
		analysis.RankRanges(sortedRanks(until)), last.UTC().Format(time.TimeOnly)))
	wait.Until(ctx, time.Until(last), func() bool {
		nodes := c.RankNodes()
		now := time.Now()
		for r, t := range until {
			if nodes[r] == nil && now.Before(t) {
				return false
			}
		}
		return true
	})
}

func sortedRanks(m map[int]time.Time) []int {
	out := make([]int, 0, len(m))
	for r := range m {
		out = append(out, r)
	}
	sort.Ints(out)
	return out
}

// tellRequest tells the members waiting for a request what the leader does with
// it before it has a window.
func (l *Leader) tellRequest(watchers []*pb.Envelope, what string) {
	for _, wt := range watchers {
		if wt.Seq == 0 {
			continue
		}
		env := l.m.Envelope(0)
		env.Body = &pb.Envelope_Progress{Progress: &pb.Progress{State: pb.Step_STEP_UNSPECIFIED, Rank: -1, Batch: -1, Reason: what}}
		l.reply(wt, env, false)
	}
}

// ended carries out how the leader stopped running w: planned again, left to a
// newer term or for later, or ended (its members told).
func (l *Leader) ended(ctx context.Context, w *win, p plan) *pb.WindowResult {
	log := l.log.With("window", w.id())
	switch {
	case ctx.Err() != nil:
		// the leader stopped: the window stays unfinished in the log, and the next
		// leader finishes it
		return nil
	case w.exit() == window.Replanned:
		passed := w.m.Passed()
		log.Warn("ranks were past the window's start; planning again with a longer lead", "ranks", passed)
		l.cancelWindow(w, "re-planned: some ranks were past the start")
		l.step(ctx, w, window.Abandon{At: time.Now(), Quiet: true,
			Why: fmt.Sprintf("ranks %v were past the start; planned again as a later window", passed)})
		l.drive(ctx, w)
		return l.record(ctx, p, true)
	case w.exit() == window.SteppedDown:
		log.Warn("a newer leadership term is in the run's log; this leader leaves the window to it, and serves the request again under a new term")
		if p.req != nil && len(w.m.Mergeable()) == 0 {
			l.pushFront(p.req)
		} else {
			l.keepWaiting(w)
		}
		return nil
	case w.exit() == window.Deferred:
		l.keepWaiting(w)
		return nil
	}
	return w.res
}

// keepWaiting leaves w to the sweep that finishes it later, with the members
// waiting for it (a later leader's watchers re-ask it).
func (l *Leader) keepWaiting(w *win) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.later[w.id()]
	if p == nil {
		p = &parked{found: w.m.Planned, kept: time.Now()}
		l.later[w.id()] = p
	}
	for _, wt := range w.watchers {
		if !watching(p.watchers, wt) {
			p.watchers = append(p.watchers, wt)
		}
	}
	w.watchers = nil
	l.sweepAt = time.Now().Add(l.cfg.SweepInterval)
}

// parked is a window this leader finishes later: when it first found it, on
// its own clock (each try's machine is planned from then: a window taken over
// is given its planned duration from when this leader found it, never judged
// by another host's clock), and the members waiting for it.
type parked struct {
	found    time.Time
	kept     time.Time // when this entry was made (found may be earlier: a plan's own time)
	watchers []*pb.Envelope
}

// maxLater bounds the windows a leader keeps only for when it found them
// (found unfinished, no member waiting): past it such a window is given its
// time from each sweep that finds it again. A window members wait for is kept
// whatever the bound.
const maxLater = 1 << 16

// parkLocked is window id among the later ones, found now when it is not yet;
// mu is held.
func (l *Leader) parkLocked(id uint64) *parked {
	p := l.later[id]
	if p == nil {
		now := time.Now()
		p = &parked{found: now, kept: now}
		l.later[id] = p
	}
	return p
}

// waiting reports whether member req still waits for window id among the
// later ones (not told its result yet).
func (l *Leader) waiting(id uint64, req *pb.Envelope) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.later[id]
	return p != nil && watching(p.watchers, req)
}

// awaiting are the members waiting for window id among the later ones.
func (l *Leader) awaiting(id uint64) []*pb.Envelope {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.later[id]; p != nil {
		return slices.Clone(p.watchers)
	}
	return nil
}

// plausible turns the ranks' status answers into what PlanWindow needs, leaving
// out (and saying why) a rank that did not answer and one whose batch is far
// from a majority's. With no majority that agrees, it says why no window can be
// planned.
func (l *Leader) plausible(ranks []int, sts map[int]Status) ([]RankStatus, map[int]string, string) {
	batches := map[int]int64{}
	leftOut := map[int]string{}
	for _, r := range ranks {
		if s, ok := sts[r]; ok {
			batches[r] = s.St.Batch
		} else {
			leftOut[r] = "did not answer the leader"
		}
	}
	keep, far, ok, why := Plausible(batches, l.cfg.MaxBatchSpread)
	if !ok {
		return nil, leftOut, why
	}
	if len(keep) == 0 {
		return nil, leftOut, noRankAnswered
	}
	for r, x := range far {
		leftOut[r] = x
		l.log.Warn("a rank's progress is implausible; it is left out of the window", "left_out", r, "batch", batches[r], "why", x)
	}
	now := time.Now()
	rs := make([]RankStatus, 0, len(keep))
	for _, r := range keep {
		s := sts[r]
		rs = append(rs, RankStatus{Rank: r, Batch: s.St.Batch, Step: time.Duration(s.St.StepUs) * time.Microsecond, Delay: now.Sub(s.When) + s.RTT})
	}
	return rs, leftOut, ""
}

// windowDeadline is when the leader gives up on a window: time for the slowest
// rank to reach the stop at its measured step time (three times over), plus the
// collection time-out for its snapshot, and never past MaxWindowWait.
func (l *Leader) windowDeadline(rs []RankStatus, start, stop int64) time.Time {
	limit := l.cfg.MaxWindowWait
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
	d := 3*need + l.cfg.CollectTimeout + l.cfg.AckTimeout
	return time.Now().Add(min(d, limit))
}

// createPlan records a window's plan in the run's log, which gives it its id
// (the log alone decides ids: one a member announces is never taken on trust);
// a store that is away is retried for up to AckTimeout.
func (l *Leader) createPlan(ctx context.Context, p runlog.Plan) (runlog.Plan, error) {
	c := l.m
	p.Term, p.Leader, p.LeaderRank, p.WorldSize, p.Run = l.term, c.Name(), int(c.Rank()), l.cfg.Identity.WorldSize, l.cfg.Identity.RunName
	deadline := time.Now().Add(l.cfg.AckTimeout)
	wait := retry.Backoff{Min: 200 * time.Millisecond, Max: 10 * time.Second}
	for {
		out, err := l.rl.CreatePlan(ctx, p, 0, func(id uint64) (string, error) { return l.manifestKey(id, p.Stop) })
		if err == nil {
			c.SawWindow(out.ID)
			return out, nil
		}
		if ctx.Err() != nil || !retryable(err) || time.Now().After(deadline) {
			return runlog.Plan{}, err
		}
		l.log.Warn("cannot record the window's plan in the store yet; retrying", "err", err)
		if !wait.Wait(ctx) {
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
func (l *Leader) postmortem(ctx context.Context, req *pb.Envelope, outer *win) {
	r := req.GetRequest()
	if l.declined(ctx, req) {
		return
	}
	l.dumps(ctx, dumpPlan{kind: r.Kind, reason: r.Cause, failedRank: int(r.FailedRank), cause: r.Cause, at: failureTime(r.AtUs), req: req, outer: outer})
}

// dumpPlan is a window of dumps: every rank gives what its trainer holds now.
type dumpPlan struct {
	kind   pb.WindowKind
	reason string
	// failedRank is a post-mortem's failed rank, asked whether a member or not,
	// with how (cause) and when (at); -1 for a trigger's dumps.
	failedRank int
	cause      string
	at         time.Time
	// req is the request the dumps serve: served again later when the run's
	// log cannot take their plan now
	req *pb.Envelope
	// outer is the window the dumps interrupted (nil: none): what reaches the
	// leader for it meanwhile waits in its inbox
	outer *win
}

// dumps plans a window of dumps, asks every member rank for its trainer's
// snapshot now, and collects, merges and publishes them.
func (l *Leader) dumps(ctx context.Context, d dumpPlan) {
	c := l.m
	defer l.begin(d.kind)()
	world := l.cfg.Identity.WorldSize
	nodes := c.RankNodes()
	var ranks []int
	asked := map[int]int64{}
	now := time.Now()
	pm := d.kind == pb.WindowKind_WINDOW_KIND_OOM || d.kind == pb.WindowKind_WINDOW_KIND_CRASH
	for rk := 0; rk < world; rk++ {
		// a post-mortem asks every rank: one that is gone may have stored the
		// snapshot of its own failure, which the run's log holds
		if _, ok := nodes[rk]; ok || rk == d.failedRank || pm {
			asked[rk] = -1
			ranks = append(ranks, rk)
		}
	}
	deadline := now.Add(l.cfg.PostmortemDeadline)
	rp := runlog.Plan{Kind: kindName(d.kind), Reason: d.reason, Ranks: ranks, Deadline: deadline, Cause: d.cause}
	if pm {
		fr := d.failedRank
		rp.FailedRank = &fr
	} else {
		rp.Dump = true
	}
	pl, ok := l.planDumps(ctx, d, rp)
	if !ok {
		return
	}
	if pm {
		// (a post-mortem not taken starts no quiet time: reports of the same
		// incident would be declined as part of a window that does not exist)
		l.mu.Lock()
		l.lastPM = time.Now()
		l.mu.Unlock()
	}
	m := window.New(window.Config{ID: pl.ID, Term: l.term, Kind: d.kind, World: world, Asked: asked, Planned: now, Deadline: deadline, Timers: l.timers(), Dump: !pm})
	w := newWin(m, d.reason, nil, pl.Manifest)
	w.outer = d.outer
	if d.failedRank >= 0 && d.failedRank < world {
		w.failed[d.failedRank] = failure{cause: d.cause, at: d.at}
	}
	if pm {
		l.mu.Lock()
		l.lastPMID = w.id()
		l.mu.Unlock()
	}
	msg := "post-mortem: asking every rank for its allocator state"
	if !pm {
		msg = "asking every rank for its allocator history now"
	}
	l.log.Warn(msg, "window", w.id(), "kind", kindName(d.kind), "failed_rank", d.failedRank, "reason", d.reason, "ranks", len(ranks))
	ch, seq := c.ExpectRanks(4*len(ranks) + 64)
	defer c.Forget(seq)
	w.cmd = c.Envelope(w.id())
	w.cmd.Seq, w.cmd.Term = seq, l.term
	w.cmd.Body = &pb.Envelope_Dump{Dump: &pb.Dump{Reason: d.reason, FailedRank: int32(d.failedRank), Kind: d.kind}}
	sent := l.sendAsync(w.cmd, ranks)
	// the rank that failed may be gone: its snapshot is in the store already, or
	// arrives when its agent uploads it
	l.collect(ctx, w, ch, sent)
	l.drive(ctx, w)
	if w.exit() == window.Deferred {
		l.keepWaiting(w)
	}
}

// planDumps records the plan of dumps d in the run's log; a plan the log
// cannot take now is served again later (a newer term: under this leader's next
// term; a store that refuses it: once it takes it), never dropped.
func (l *Leader) planDumps(ctx context.Context, d dumpPlan, rp runlog.Plan) (runlog.Plan, bool) {
	pl, err := l.createPlan(ctx, rp)
	switch {
	case err == nil:
		return pl, true
	case isSuperseded(err):
		l.m.BelieveTerm(ctx, l.rl)
		if d.req != nil {
			l.pushFront(d.req)
		}
	case d.req != nil && ctx.Err() == nil:
		l.deferRequest(d.req, err)
	default:
		l.log.Error("cannot record the plan of the dumps in the run's log; none taken", "kind", kindName(d.kind), "failed_rank", d.failedRank, "err", err)
	}
	return runlog.Plan{}, false
}

// declined answers a request for a post-mortem that is not taken: post-mortems
// are off, or the failure is part of one taken moments ago (by this leader, or
// another: the leader of a job torn down rank by rank is stopped too).
func (l *Leader) declined(ctx context.Context, req *pb.Envelope) bool {
	r := req.GetRequest()
	failedRank := int(r.FailedRank)
	if r.Kind == pb.WindowKind_WINDOW_KIND_OOM && !l.cfg.OnOOM {
		l.log.Info("a rank hit an OOM; post-mortems are off", "failed_rank", failedRank)
		l.answer(req, pb.AckCode_ACK_BAD_REQUEST, "post-mortems are off (--no-postmortem)")
		return true
	}
	l.mu.Lock()
	if time.Since(l.lastPM) < postmortemQuiet {
		id := l.lastPMID
		l.mu.Unlock()
		l.log.Info("a rank failed during a recent post-mortem; no new one", "failed_rank", failedRank, "cause", r.Cause, "postmortem", id)
		l.answer(req, pb.AckCode_ACK_BAD_REQUEST, fmt.Sprintf("part of post-mortem window %d", id))
		return true
	}
	l.mu.Unlock()
	// (every plan of the quiet time is read, however many windows came after)
	p, err := l.rl.NewestOf(ctx, time.Now().Add(-postmortemQuiet), runlog.KindCrash, runlog.KindOOM)
	if err != nil || p == nil {
		return false // (unknown: a post-mortem too many, rather than none)
	}
	l.mu.Lock()
	l.lastPM, l.lastPMID = p.Created, p.ID
	l.mu.Unlock()
	l.log.Info("a rank failed during a recent post-mortem of another leader; no new one", "failed_rank", failedRank, "cause", r.Cause, "postmortem", p.ID)
	l.answer(req, pb.AckCode_ACK_BAD_REQUEST, fmt.Sprintf("part of post-mortem window %d", p.ID))
	return true
}

// failureTime reads a failure's time (the leader's clock, microseconds).
func failureTime(us int64) time.Time {
	if us <= 0 {
		return time.Now()
	}
	return time.UnixMicro(us)
}

// planSenders is how many ranks send sends to at once. Each send opens a
// stream of its own: over TCP a connection's round trip, and for a rank that
// cannot be reached memberlist's TCP timeout, for which it holds its sender; 256
// keep a few such ranks from holding up the plan to the others. The acks come
// back on streams of their own, which the leader's transport admits up to its
// stream limit (1,024, defaultStreamLimits).
const planSenders = 256

// sendFailure is a rank a command could not be sent to.
type sendFailure struct {
	rank int
	err  error
}

func unreachableOf(fs []sendFailure) map[int]string {
	out := map[int]string{}
	for _, f := range fs {
		out[f.rank] = f.err.Error()
	}
	return out
}

// send sends cmd to each rank directly (over TCP, planSenders at a time), this
// member's own rank included, and returns the ranks it could not reach. It
// touches no window: the leader's loop may collect the acks meanwhile.
func (l *Leader) send(cmd *pb.Envelope, ranks []int) []sendFailure {
	c := l.m
	nodes := c.RankNodes()
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
		if int32(r) == c.Rank() {
			c.HandleLocal(cmd)
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
			if now := c.Node(n.Name); now != nil {
				n = now // it may have come back at another address since the snapshot
			}
			err := c.SendBytes(n, b, true)
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
func (l *Leader) sendAsync(cmd *pb.Envelope, ranks []int) <-chan []sendFailure {
	ch := make(chan []sendFailure, 1)
	if !l.m.Spawn(func() { ch <- l.send(cmd, ranks) }) {
		ch <- nil
	}
	return ch
}

// cancelWindow withdraws w from every rank.
func (l *Leader) cancelWindow(w *win, reason string) {
	env := l.m.Envelope(w.id())
	env.Term = l.term
	env.Body = &pb.Envelope_Cancel{Cancel: &pb.Cancel{Reason: reason}}
	ranks := make([]int, 0, w.m.World)
	for r := 0; r < w.m.World; r++ {
		ranks = append(ranks, r)
	}
	l.send(env, ranks)
	l.m.Gossip(env)
}

// onRequestDuring answers a request that arrives while w records: a watch of w,
// or a request w serves asked again, joins its watchers; a watch of another
// window is answered from the run's log at once; a rank's OOM or crash during a
// window asks for a post-mortem now (it reports true), and during a post-mortem
// joins it as another failure of the same incident; anything else waits its turn.
func (l *Leader) onRequestDuring(ctx context.Context, w *win, env *pb.Envelope) bool {
	r := env.GetRequest()
	incident := r.Kind == pb.WindowKind_WINDOW_KIND_CRASH || r.Kind == pb.WindowKind_WINDOW_KIND_OOM
	switch {
	case env.WindowId == w.id() || env.WindowId == 0 && env.Seq != 0 && slices.ContainsFunc(w.watchers, func(x *pb.Envelope) bool { return x.Sender == env.Sender && x.Seq == env.Seq }):
		if !watching(w.watchers, env) {
			w.watchers = append(w.watchers, env)
		}
		l.answer(env, pb.AckCode_ACK_OK, "")
		if env.WindowId == 0 {
			l.tellPlanned(&win{m: w.m, watchers: []*pb.Envelope{env}}, fmt.Sprintf("batches [%d, %d) (asked again)", w.m.Start, w.m.Stop))
		}
		return false
	case env.WindowId != 0 && !incident:
		// how another window ended: the log says, at once
		if !l.m.Spawn(func() { l.answerWatch(ctx, env) }) {
			l.queue(env)
		}
		return false
	case incident && w.m.Postmortem():
		rk := int(r.FailedRank)
		if rk >= 0 && rk < w.m.World && l.m.IsRankMember(env) {
			if _, ok := w.failed[rk]; !ok {
				w.failed[rk] = failure{cause: r.Cause, at: failureTime(r.AtUs)}
			}
			if s := w.m.Ranks[rk]; s != nil && s.Result == nil && s.Phase != window.LeftOut {
				// its snapshot of the failure is its part of this post-mortem:
				// ask again, so it hands that over
				l.step(ctx, w, window.Rejoined{Rank: rk, At: time.Now()})
				return false
			}
		}
		l.answer(env, pb.AckCode_ACK_BAD_REQUEST, fmt.Sprintf("part of post-mortem window %d", w.id()))
		return false
	case incident:
		return true
	}
	if l.queue(env) {
		l.tellQueued(w, env)
	}
	return false
}

// tellQueued tells a member whose request waits for window w to end why it
// hears nothing yet (a window being finished by a new leader may wait for its
// deadline).
func (l *Leader) tellQueued(w *win, req *pb.Envelope) {
	if req.Seq == 0 {
		return
	}
	r := l.m.Envelope(0) // not about the request's window, which it has not yet
	r.Body = &pb.Envelope_Progress{Progress: &pb.Progress{State: pb.Step_STEP_UNSPECIFIED, Rank: -1, Batch: -1,
		Reason: fmt.Sprintf("waiting: window %d is in progress (the leader gives up on it at %s); this request is planned after it",
			w.id(), w.m.Deadline.Format(time.TimeOnly))}}
	l.reply(req, r, false)
}

// tell logs a step of the window and passes it on to the members watching it
// (rank steps as datagrams: a lost one is shown by the next).
func (l *Leader) tell(w *win, rank int, state pb.Step, batch int64, reason string) {
	l.log.Debug("window progress", "window", w.id(), "of_rank", rank, "state", window.StepName(state), "batch", batch, "reason", reason)
	watchers := l.watchersOf(w)
	if len(watchers) == 0 {
		return
	}
	if rank >= 0 && w.gather {
		w.steps = append(w.steps, &pb.RankStep{Rank: int32(rank), State: state, Batch: batch, Reason: reason})
		if time.Since(w.flushed) >= stepsEvery {
			l.flushSteps(w) // the first of a burst goes at once; the rest every stepsEvery
		}
		return
	}
	l.flushSteps(w) // the ranks' steps come before the window's
	for _, wt := range watchers {
		env := l.m.Envelope(w.id())
		env.Body = &pb.Envelope_Progress{Progress: &pb.Progress{State: state, Batch: batch, Reason: reason, Rank: int32(rank)}}
		l.reply(wt, env, false)
	}
}

func (l *Leader) watchersOf(w *win) []*pb.Envelope {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := append([]*pb.Envelope(nil), w.watchers...)
	if p := l.later[w.id()]; p != nil {
		out = append(out, p.watchers...)
	}
	return out
}

// flushSteps tells the watchers of w the ranks' steps gathered since the last
// time, over TCP (one message holds many ranks' steps).
func (l *Leader) flushSteps(w *win) {
	if len(w.steps) == 0 {
		return
	}
	steps := w.steps
	w.steps, w.flushed = nil, time.Now()
	watchers := l.watchersOf(w)
	for _, part := range stepMessages(steps) {
		for _, wt := range watchers {
			env := l.m.Envelope(w.id())
			env.Body = &pb.Envelope_Progress{Progress: &pb.Progress{Rank: -1, Batch: -1, Steps: part}}
			l.reply(wt, env, false)
		}
	}
}

// tellPlanned says the window is planned, with the time the leader gives up on it.
func (l *Leader) tellPlanned(w *win, what string) {
	for _, wt := range w.watchers {
		env := l.m.Envelope(w.id())
		env.Body = &pb.Envelope_Progress{Progress: &pb.Progress{State: pb.Step_STEP_PLANNED, Batch: -1, Reason: what, Rank: -1, DeadlineUs: w.m.Deadline.UnixMicro()}}
		l.reply(wt, env, false)
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
