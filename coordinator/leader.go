package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/naming"
	"github.com/memsnap/memsnap/rankagent"
)

// leaderRun is the leader's work, started when this member becomes leader and
// stopped (and waited for) when it stops being one.
type leaderRun struct {
	c      *Coordinator
	log    *slog.Logger
	msgs   chan *pb.Envelope
	cancel context.CancelFunc
	done   chan struct{}
	st     store.Store

	mu       sync.Mutex
	next     int64 // the schedule's next window start (-1: the schedule is done)
	requests []*pb.Envelope
	working  bool      // a window is in progress
	lastPM   time.Time // when the last post-mortem started
}

// postmortemQuiet is how long after a post-mortem further OOM reports (other
// ranks failing in the same incident) start none of their own.
const postmortemQuiet = 30 * time.Second

func (l *leaderRun) busy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.working || len(l.requests) > 0 || len(l.msgs) > 0
}

func newLeader(c *Coordinator) *leaderRun {
	l := &leaderRun{c: c, log: c.log.With("role", "leader"), msgs: make(chan *pb.Envelope, 1<<14), done: make(chan struct{}), next: -1}
	if c.cfg.Schedule.Enabled {
		l.next = c.cfg.Schedule.Skip
	}
	return l
}

func (l *leaderRun) start(ctx context.Context) {
	ctx, l.cancel = context.WithCancel(ctx)
	l.c.wg.Add(1)
	go func() {
		defer l.c.wg.Done()
		defer close(l.done)
		l.run(ctx)
	}()
}

// stop ends the leader's work and waits for it.
func (l *leaderRun) stop() {
	l.cancel()
	<-l.done
}

// deliver hands a message to the leader; it never blocks.
func (l *leaderRun) deliver(env *pb.Envelope) {
	select {
	case l.msgs <- env:
	default:
		l.log.Warn("dropping a message: the leader is behind", "from", env.Sender)
	}
}

func (l *leaderRun) run(ctx context.Context) {
	l.log.Info("leading")
	defer l.log.Info("no longer leading")
	st, err := l.openStore(ctx)
	if err != nil {
		return
	}
	l.st = st
	l.recover(ctx)
	tick := time.NewTicker(l.c.cfg.StatusTimeout)
	defer tick.Stop()
	for {
		if ctx.Err() != nil {
			return
		}
		l.mu.Lock()
		var req *pb.Envelope
		if len(l.requests) > 0 {
			req, l.requests = l.requests[0], l.requests[1:]
		}
		l.mu.Unlock()
		if req != nil {
			l.serveRequest(ctx, req)
			continue
		}
		if l.scheduleDue(ctx) {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case env := <-l.msgs:
			l.idle(env)
		case <-tick.C:
		}
	}
}

func (l *leaderRun) openStore(ctx context.Context) (store.Store, error) {
	wait := 500 * time.Millisecond
	for {
		st, err := l.c.cfg.OpenStore(ctx)
		if err == nil {
			return st, nil
		}
		l.log.Warn("the leader cannot open the store yet; retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// idle handles a message that arrives while no window is in progress.
func (l *leaderRun) idle(env *pb.Envelope) {
	if env.GetRequest() != nil {
		l.mu.Lock()
		l.requests = append(l.requests, env)
		l.mu.Unlock()
	}
}

func (l *leaderRun) serveRequest(ctx context.Context, req *pb.Envelope) {
	r := req.GetRequest()
	length := r.Batches
	if length == 0 {
		length = l.c.cfg.WindowBatches
	}
	if req.WindowId != 0 { // watch a window
		l.answerWatch(ctx, req)
		return
	}
	if r.Reason == "oom" {
		l.postmortem(ctx, int(r.OomRank))
		return
	}
	ack := l.c.envelope(0)
	ack.Body = &pb.Envelope_Ack{Ack: &pb.Ack{Ok: true}}
	l.c.reply(req, ack, true)
	l.window(ctx, plan{length: length, reason: nonEmpty(r.Reason, "request"), watchers: []*pb.Envelope{req}})
}

// answerWatch tells a member that asks about a window that is not in progress how
// it ended, from its manifest.
func (l *leaderRun) answerWatch(ctx context.Context, req *pb.Envelope) {
	res := &pb.WindowResult{State: "unknown", Error: fmt.Sprintf("window %d is not in progress", req.WindowId), Store: l.st.String()}
	if key, err := l.manifestKey(req.WindowId, 0); err == nil {
		if m, err := merge.ReadManifest(ctx, l.st, key); err == nil {
			res = resultFromManifest(key, m, l.st)
		}
	}
	env := l.c.envelope(req.WindowId)
	env.Body = &pb.Envelope_WindowResult{WindowResult: res}
	l.c.reply(req, env, true)
}

// scheduleDue starts the scheduled window when every rank's trainer runs; it
// reports whether it did.
func (l *leaderRun) scheduleDue(ctx context.Context) bool {
	l.mu.Lock()
	next := l.next
	l.mu.Unlock()
	if next < 0 {
		return false
	}
	ranks := l.c.rankNodes()
	world := l.c.cfg.Identity.WorldSize
	if len(ranks) < world {
		return false // wait for every rank to join
	}
	rl := make([]int, 0, len(ranks))
	for r := range ranks {
		rl = append(rl, r)
	}
	sts := l.status(ctx, rl)
	if len(sts) < world {
		return false
	}
	for _, s := range sts {
		if !s.st.Trainer {
			return false
		}
	}
	res := l.window(ctx, plan{length: l.c.cfg.WindowBatches, minStart: next, reason: "schedule"})
	l.mu.Lock()
	if sch := l.c.cfg.Schedule; sch.Every > 0 {
		// the next start on the grid Skip + k*Every after this window
		after := max(res.Stop, next+1)
		k := (after - sch.Skip + sch.Every - 1) / sch.Every
		l.next = sch.Skip + k*sch.Every
	} else {
		l.next = -1
	}
	l.mu.Unlock()
	return true
}

// plan is one window to record.
type plan struct {
	length   int64
	minStart int64
	reason   string
	watchers []*pb.Envelope
}

// rankState is where one rank stands in the window in progress.
type rankState struct {
	acked    bool
	state    string
	result   *pb.RankResult
	missing  string // why it is not merged ("" while it may still be)
	lastSign time.Time
	batch    int64
}

// win is the window in progress: the collection registered before the plan is sent.
type win struct {
	id          uint64
	start, stop int64
	reason      string
	postmortem  bool // every rank's snapshot now, for rank oomRank's OOM
	oomRank     int
	ranks       map[int]*rankState
	watchers    []*pb.Envelope
	world       int
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

// nextID is a window id newer than every one any member has seen.
func (l *leaderRun) nextID() uint64 {
	c := l.c
	c.mu.Lock()
	for _, m := range c.members {
		c.lastWindow = max(c.lastWindow, m.meta.LastWindow)
	}
	c.lastWindow++
	id := c.lastWindow
	c.mu.Unlock()
	c.updateMeta()
	return id
}

type status struct {
	st   *pb.Status
	rtt  time.Duration
	when time.Time // when the answer arrived
}

// status asks the ranks for their status (see Coordinator.status).
func (l *leaderRun) status(ctx context.Context, ranks []int) map[int]status {
	return l.c.status(ctx, ranks)
}

// window records one window and tells the members that asked for it how it ended.
func (l *leaderRun) window(ctx context.Context, p plan) *pb.WindowResult {
	l.mu.Lock()
	l.working = true
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.working = false
		l.mu.Unlock()
	}()
	res := l.record(ctx, p, false)
	if ctx.Err() != nil {
		return res // the leader stopped: the watchers ask the next one
	}
	for _, w := range p.watchers {
		env := l.c.envelope(0)
		env.Body = &pb.Envelope_WindowResult{WindowResult: res}
		l.c.reply(w, env, true)
	}
	return res
}

// record plans a window, collects it, merges and publishes it. A rank past the
// start makes the leader plan once more with a longer lead; the second time the
// window goes on without it.
func (l *leaderRun) record(ctx context.Context, p plan, replanned bool) *pb.WindowResult {
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
	sts := l.status(ctx, ranks)
	w := &win{id: l.nextID(), reason: p.reason, ranks: map[int]*rankState{}, watchers: p.watchers, world: world}
	for r := 0; r < world; r++ {
		w.ranks[r] = &rankState{missing: "not a member of the cluster"}
	}
	var rs []RankStatus
	now := time.Now()
	for _, r := range ranks {
		s, ok := sts[r]
		if !ok {
			w.ranks[r].missing = "did not answer the leader"
			continue
		}
		w.ranks[r] = &rankState{lastSign: now, batch: s.st.Batch}
		rs = append(rs, RankStatus{Rank: r, Batch: s.st.Batch, Step: time.Duration(s.st.StepUs) * time.Microsecond, Delay: now.Sub(s.when) + s.rtt})
	}
	if len(rs) == 0 {
		return &pb.WindowResult{State: "failed", Error: "no rank answered the leader", Store: l.st.String()}
	}
	margin := c.cfg.LeadMargin
	if replanned {
		margin *= 3
	}
	w.start, w.stop = PlanWindow(rs, p.length, p.minStart, margin)
	log := l.log.With("window", w.id)
	log.Info("window planned", "start", w.start, "stop", w.stop, "ranks", len(rs), "world_size", world, "reason", p.reason)
	l.tell(w, -1, "planned", -1, fmt.Sprintf("batches [%d, %d) on %d of %d ranks", w.start, w.stop, len(rs), world))

	expected := make([]int32, 0, len(rs))
	for _, r := range rs {
		expected = append(expected, int32(r.Rank))
	}
	ch, seq := c.expect(4*len(rs) + 64)
	defer c.forget(seq)
	env := c.envelope(w.id)
	env.Seq = seq
	env.Body = &pb.Envelope_Plan{Plan: &pb.Plan{Start: w.start, Stop: w.stop, Reason: p.reason, WorldSize: int32(world), Ranks: expected}}
	l.sendAll(w, expected, env)
	c.gossip(env)

	passed := l.collect(ctx, w, ch, !replanned)
	if ctx.Err() != nil {
		return &pb.WindowResult{State: "failed", Error: "the leader stopped", Start: w.start, Stop: w.stop}
	}
	if len(passed) > 0 && !replanned {
		log.Warn("ranks were past the window's start; planning again with a longer lead", "ranks", passed)
		l.cancelWindow(w, "re-planned: some ranks were past the start")
		return l.record(ctx, p, true)
	}
	return l.finish(ctx, w)
}

// postmortem asks every rank for a snapshot now, for rank oomRank's OOM (whose own
// snapshot is the one its trainer took at the OOM), and merges them.
func (l *leaderRun) postmortem(ctx context.Context, oomRank int) {
	c := l.c
	if !c.cfg.OnOOM {
		l.log.Info("rank hit an OOM; post-mortems are off", "oom_rank", oomRank)
		return
	}
	l.mu.Lock()
	if time.Since(l.lastPM) < postmortemQuiet {
		l.mu.Unlock()
		l.log.Info("rank hit an OOM during a recent post-mortem; no new one", "oom_rank", oomRank)
		return
	}
	l.lastPM, l.working = time.Now(), true
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.working = false
		l.mu.Unlock()
	}()
	world := c.cfg.Identity.WorldSize
	w := &win{id: l.nextID(), reason: "oom", postmortem: true, oomRank: oomRank, ranks: map[int]*rankState{}, world: world}
	nodes := c.rankNodes()
	var ranks []int32
	now := time.Now()
	for r := 0; r < world; r++ {
		if _, ok := nodes[r]; ok || r == oomRank {
			w.ranks[r] = &rankState{lastSign: now}
			ranks = append(ranks, int32(r))
		} else {
			w.ranks[r] = &rankState{missing: "not a member of the cluster"}
		}
	}
	l.log.Warn("post-mortem: asking every rank for its allocator state", "window", w.id, "oom_rank", oomRank, "ranks", len(ranks))
	ch, seq := c.expect(4*len(ranks) + 64)
	defer c.forget(seq)
	env := c.envelope(w.id)
	env.Seq = seq
	env.Body = &pb.Envelope_Dump{Dump: &pb.Dump{Reason: "oom", OomRank: int32(oomRank)}}
	l.sendAll(w, ranks, env)
	// the rank that died may be gone: its OOM snapshot is in the store already, or
	// arrives when its agent uploads it
	l.collect(ctx, w, ch, false)
	if ctx.Err() != nil {
		return
	}
	l.finish(ctx, w)
}

// sendAll sends env to each rank directly (over TCP, a few at a time); a rank it
// cannot reach is missing.
func (l *leaderRun) sendAll(w *win, ranks []int32, env *pb.Envelope) {
	c := l.c
	nodes := c.rankNodes()
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for _, r := range ranks {
		r := int(r)
		if int32(r) == c.rank() {
			c.handleLocal(env)
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
			if err := c.send(n.Name, env, true); err != nil {
				mu.Lock()
				if s := w.ranks[r]; s != nil && s.missing == "" {
					s.missing = "unreachable: " + err.Error()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

// cancelWindow withdraws w from every rank.
func (l *leaderRun) cancelWindow(w *win, reason string) {
	env := l.c.envelope(w.id)
	env.Body = &pb.Envelope_Cancel{Cancel: &pb.Cancel{Reason: reason}}
	var ranks []int32
	for r := range w.ranks {
		ranks = append(ranks, int32(r))
	}
	l.sendAll(&win{ranks: map[int]*rankState{}}, ranks, env)
	l.c.gossip(env)
}

// collect waits until every rank of w has stored its snapshot or is missing: a
// rank that shows no sign of life (no progress, no batch advancing) for
// CollectTimeout is missing. With canReplan, it returns as soon as a rank says it
// is past the window's start, naming those ranks.
func (l *leaderRun) collect(ctx context.Context, w *win, acks chan *pb.Envelope, canReplan bool) []int {
	c := l.c
	poll := time.NewTicker(c.cfg.StatusTimeout)
	defer poll.Stop()
	ackDeadline := time.Now().Add(c.cfg.AckTimeout)
	var passed []int
	allAcked := func() bool {
		for _, s := range w.ranks {
			if s.missing == "" && !s.acked && s.result == nil {
				return false
			}
		}
		return true
	}
	for len(w.outstanding()) > 0 {
		if canReplan && len(passed) > 0 && (allAcked() || time.Now().After(ackDeadline)) {
			return passed
		}
		select {
		case <-ctx.Done():
			return nil
		case env := <-acks:
			if a := env.GetAck(); a != nil && env.WindowId == w.id {
				passed = l.onAck(w, env, a, passed)
			}
		case env := <-l.msgs:
			if env.GetRequest() != nil {
				l.onRequestDuring(w, env)
				continue
			}
			if env.WindowId != w.id || env.SenderRank < 0 {
				continue
			}
			passed = l.onRankMessage(w, env, passed)
		case <-poll.C:
			l.checkAlive(ctx, w)
		}
	}
	return passed
}

func (l *leaderRun) onAck(w *win, env *pb.Envelope, a *pb.Ack, passed []int) []int {
	r := int(env.SenderRank)
	s := w.ranks[r]
	if s == nil || s.missing != "" {
		return passed
	}
	s.lastSign = time.Now()
	switch {
	case a.Ok && s.acked:
	case a.Ok:
		s.acked = true
		l.tell(w, r, "acked", a.Batch, "")
	case a.Code == "passed":
		passed = append(passed, r)
		s.missing = "past the window's start: " + a.Message
		l.tell(w, r, "passed", a.Batch, a.Message)
	default:
		s.missing = fmt.Sprintf("refused the window (%s): %s", a.Code, a.Message)
		l.tell(w, r, "refused", a.Batch, a.Message)
	}
	return passed
}

func (l *leaderRun) onRankMessage(w *win, env *pb.Envelope, passed []int) []int {
	r := int(env.SenderRank)
	s := w.ranks[r]
	if s == nil {
		return passed
	}
	s.lastSign = time.Now()
	if res := env.GetResult(); res != nil {
		if s.result == nil {
			s.result = res
			s.missing = ""
			state, why := "uploaded", res.Partial
			if res.Error != "" {
				state, why = "failed", res.Error
			}
			l.tell(w, r, state, -1, why)
		}
		return passed
	}
	p := env.GetProgress()
	if p == nil || s.result != nil {
		return passed
	}
	s.state = p.State
	s.batch = max(s.batch, p.Batch)
	switch rankagent.WindowState(p.State) {
	case rankagent.WindowMissed:
		if s.missing == "" {
			passed = append(passed, r)
			s.missing = "past the window's start: " + p.Reason
		}
	case rankagent.WindowFailed:
		s.missing = "failed: " + p.Reason
	case rankagent.WindowCancelled:
		s.missing = "cancelled: " + p.Reason
	}
	l.tell(w, r, p.State, p.Batch, p.Reason)
	return passed
}

// onRequestDuring answers a request that arrives while w records: a watch of w
// joins its watchers, anything else waits its turn.
func (l *leaderRun) onRequestDuring(w *win, env *pb.Envelope) {
	if env.WindowId == w.id || (env.WindowId == 0 && env.GetRequest().Reason == "watch") {
		w.watchers = append(w.watchers, env)
		ack := l.c.envelope(w.id)
		ack.Body = &pb.Envelope_Ack{Ack: &pb.Ack{Ok: true}}
		l.c.reply(env, ack, true)
		return
	}
	l.mu.Lock()
	l.requests = append(l.requests, env)
	l.mu.Unlock()
}

// checkAlive asks the outstanding ranks where they stand: a result that never
// arrived is taken from the answer, a batch that advanced is a sign of life, and a
// rank silent for CollectTimeout is missing.
func (l *leaderRun) checkAlive(ctx context.Context, w *win) {
	out := w.outstanding()
	if len(out) == 0 {
		return
	}
	sts := l.status(ctx, out)
	now := time.Now()
	for _, r := range out {
		s := w.ranks[r]
		if st, ok := sts[r]; ok {
			if st.st.Window == w.id && st.st.Result != nil && s.result == nil {
				s.result = st.st.Result
				l.tell(w, r, "uploaded", st.st.Batch, st.st.Result.Partial)
				continue
			}
			if st.st.Window > w.id {
				s.missing = fmt.Sprintf("moved on to window %d", st.st.Window)
				continue
			}
			if st.st.Batch > s.batch || st.st.State != s.state {
				s.batch, s.state, s.lastSign = st.st.Batch, st.st.State, now
			}
		}
		if now.Sub(s.lastSign) > l.c.cfg.CollectTimeout {
			s.missing = fmt.Sprintf("no sign of life for %v", l.c.cfg.CollectTimeout)
			l.tell(w, r, "missing", s.batch, s.missing)
		}
	}
}

// tell logs a step of the window and passes it on to the members watching it.
func (l *leaderRun) tell(w *win, rank int, state string, batch int64, reason string) {
	l.log.Debug("window progress", "window", w.id, "rank", rank, "state", state, "batch", batch, "reason", reason)
	for _, wt := range w.watchers {
		env := l.c.envelope(w.id)
		env.Body = &pb.Envelope_Progress{Progress: &pb.Progress{State: state, Batch: batch, Reason: reason, Rank: int32(rank)}}
		env.Seq = wt.Seq
		if err := l.c.send(wt.Sender, env, false); err != nil {
			l.log.Debug("could not tell a watcher", "to", wt.Sender, "err", err)
		}
	}
}

// manifestKey renders the name of window id's manifest.
func (l *leaderRun) manifestKey(id uint64, stop int64) (string, error) {
	keys, err := merge.OutputKeys(l.c.cfg.MergedName, l.vars(id, stop))
	if err != nil {
		return "", err
	}
	return keys[merge.OutManifest], nil
}

func (l *leaderRun) vars(id uint64, stop int64) naming.Vars {
	return naming.Vars{"run_name": l.c.cfg.Identity.RunName, "window": int64(id), "batch": stop, "world_size": l.c.cfg.Identity.WorldSize}
}

// finish checks what the ranks stored and merges it: a rank whose snapshot does not
// cover exactly the window's batches is reported missing, never merged.
func (l *leaderRun) finish(ctx context.Context, w *win) *pb.WindowResult {
	log := l.log.With("window", w.id)
	res := &pb.WindowResult{State: "failed", Start: w.start, Stop: w.stop, Store: l.st.String(), Missing: map[int32]string{}}
	var inputs []merge.Input
	for r := 0; r < w.world; r++ {
		s := w.ranks[r]
		switch {
		case s.result == nil:
			if s.missing == "" {
				s.missing = "no snapshot"
			}
		case s.result.Error != "":
			s.missing = "its snapshot was not stored: " + s.result.Error
		case w.postmortem:
			inputs = append(inputs, l.input(s.result, r))
		case s.result.Partial != "":
			s.missing = "its snapshot does not cover the window: " + s.result.Partial
		case s.result.Start != w.start || s.result.Stop != w.stop:
			s.missing = fmt.Sprintf("its snapshot covers [%d, %d), the window is [%d, %d)", s.result.Start, s.result.Stop, w.start, w.stop)
		default:
			if why := l.checkCoverage(ctx, s.result, w); why != "" {
				s.missing = why
			} else {
				inputs = append(inputs, l.input(s.result, r))
			}
		}
		if s.missing != "" {
			res.Missing[int32(r)] = s.missing
		}
	}
	if len(res.Missing) > 0 {
		log.Warn("ranks missing from the window", "missing", len(res.Missing), "world_size", w.world)
	}
	if len(inputs) == 0 {
		res.Error = "no rank stored a snapshot of the window"
		log.Error(res.Error)
		return res
	}
	reasons := map[int]string{}
	for r, why := range res.Missing {
		reasons[int(r)] = why
	}
	cfg := merge.Config{Inputs: inputs, Out: l.st, OutputBase: l.c.cfg.MergedName, Vars: l.vars(w.id, w.stop), WorldSize: w.world,
		Align: merge.AlignOffsets, Title: fmt.Sprintf("%s, window %d (batches %d-%d)", l.c.cfg.Identity.RunName, w.id, w.start, w.stop-1),
		Window: &merge.WindowInfo{ID: w.id, Start: w.start, Stop: w.stop}, MissingReasons: reasons, Logger: log, Reason: w.reason,
		FromAnalyses: true}
	if w.world > l.c.cfg.FullDetailRanks {
		cfg.Detail = merge.DetailDiff // the pickles hold the ranks the diff compares; the rest is in the summary and report
	}
	if w.postmortem {
		cfg.Title = fmt.Sprintf("%s, post-mortem of rank %d's OOM (window %d)", l.c.cfg.Identity.RunName, w.oomRank, w.id)
		cfg.Reason = fmt.Sprintf("post-mortem of rank %d's OOM", w.oomRank)
	}
	out, err := merge.Merge(ctx, cfg)
	if errors.Is(err, store.ErrExists) {
		// another leader published this window (a predecessor that finished it):
		// report what it did. One that recorded other batches or none of these
		// ranks was another group's leader (a partition): that is a conflict.
		if key, kerr := l.manifestKey(w.id, w.stop); kerr == nil {
			if m, merr := merge.ReadManifest(ctx, l.st, key); merr == nil {
				if sameWindow(m, w, inputs) {
					log.Info("the window was published already", "manifest", key)
					return resultFromManifest(key, m, l.st)
				}
				err = fmt.Errorf("window %d was published by another leader with other ranks or batches (%v; a network partition?); this leader's merge is not published: %w", w.id, m.RanksMerged, err)
			}
		}
	}
	if err != nil {
		res.Error = err.Error()
		log.Error("the merge failed", "err", err)
		return res
	}
	res.State = "published"
	res.Manifest = l.st.URL(out.Outputs[merge.OutManifest])
	res.Outputs = outputURLs(l.st, out.Outputs)
	for _, r := range out.Summary.RanksMerged {
		res.Ranks = append(res.Ranks, int32(r))
	}
	log.Info("window published", "manifest", res.Manifest, "ranks", len(res.Ranks), "missing", len(res.Missing), "store", l.st.String())
	return res
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

// sameWindow reports whether a published manifest is w's: the same batches, and
// some of the same ranks.
func sameWindow(m *merge.Manifest, w *win, inputs []merge.Input) bool {
	if m.Window == nil || m.Window.ID != w.id || m.Window.Start != w.start || m.Window.Stop != w.stop {
		return false
	}
	for _, r := range m.RanksMerged {
		for _, in := range inputs {
			if in.Rank == r {
				return true
			}
		}
	}
	return false
}

// checkCoverage reads a rank's sidecar and says why its batch marks are not
// exactly the window's batches ("" when they are).
func (l *leaderRun) checkCoverage(ctx context.Context, r *pb.RankResult, w *win) string {
	if r.MetaKey == "" {
		return "its snapshot has no metadata"
	}
	b, err := store.ReadAll(ctx, l.st, r.MetaKey)
	if err != nil {
		return "its metadata cannot be read: " + err.Error()
	}
	m, err := merge.ParseRankMeta(b)
	if err != nil {
		return err.Error()
	}
	if m.Window == nil || m.Window.ID != w.id {
		return "its metadata names another window"
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

func resultFromManifest(key string, m *merge.Manifest, st store.Store) *pb.WindowResult {
	res := &pb.WindowResult{State: "published", Manifest: st.URL(key), Store: st.String(), Missing: map[int32]string{}}
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
		res.Start, res.Stop = m.Window.Start, m.Window.Stop
	}
	return res
}

// recover finishes the window a previous leader left in progress: the ranks'
// statuses say which window they armed and what they stored; unless its manifest
// exists, the window is collected and merged from there.
func (l *leaderRun) recover(ctx context.Context) {
	c := l.c
	nodes := c.rankNodes()
	ranks := make([]int, 0, len(nodes))
	for r := range nodes {
		ranks = append(ranks, r)
	}
	sts := l.status(ctx, ranks)
	var top, seen uint64
	var start, stop int64
	for _, s := range sts {
		if s.st.Window > top && s.st.Stop > s.st.Start {
			top, start, stop = s.st.Window, s.st.Start, s.st.Stop
		}
		seen = max(seen, s.st.Seen)
	}
	c.mu.Lock()
	c.lastWindow = max(c.lastWindow, top, seen)
	c.mu.Unlock()
	if top == 0 {
		return
	}
	if l.next >= 0 {
		l.mu.Lock()
		if l.c.cfg.Schedule.Every == 0 {
			l.next = -1 // the once-window happened under an earlier leader
		}
		l.mu.Unlock()
	}
	key, err := l.manifestKey(top, stop)
	if err != nil {
		return
	}
	if _, err := l.st.Stat(ctx, key); err == nil {
		return // published
	}
	w := &win{id: top, start: start, stop: stop, reason: "recovered", ranks: map[int]*rankState{}, world: c.cfg.Identity.WorldSize}
	pending := false
	now := time.Now()
	for r := 0; r < w.world; r++ {
		s, ok := sts[r]
		switch {
		case !ok:
			w.ranks[r] = &rankState{missing: "did not answer the new leader"}
		case s.st.Window != top:
			w.ranks[r] = &rankState{missing: "did not receive the plan"}
		case s.st.Result != nil:
			w.ranks[r] = &rankState{result: s.st.Result}
		case terminal(s.st.State):
			w.ranks[r] = &rankState{missing: "window " + s.st.State}
		default:
			w.ranks[r] = &rankState{lastSign: now, batch: s.st.Batch, state: s.st.State, acked: true}
			pending = true
		}
	}
	l.log.Info("finishing the window a previous leader left", "window", top, "start", start, "stop", stop, "waiting", pending)
	ch, seq := c.expect(16)
	defer c.forget(seq)
	l.collect(ctx, w, ch, false)
	if ctx.Err() != nil {
		return
	}
	res := l.finish(ctx, w)
	for _, wt := range w.watchers { // members that asked the previous leader
		env := c.envelope(w.id)
		env.Body = &pb.Envelope_WindowResult{WindowResult: res}
		c.reply(wt, env, true)
	}
}

func nonEmpty(s, dflt string) string {
	if strings.TrimSpace(s) == "" {
		return dflt
	}
	return s
}
