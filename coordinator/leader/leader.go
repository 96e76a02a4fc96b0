package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/coordinator/commit"
	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/coordinator/view"
	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/retry"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/naming"
	"github.com/memsnap/memsnap/runlog"
)

// Leader is the leader's work, started when this member becomes leader and
// stopped (and waited for) when it stops being one.
//
// A leadership has a term, taken in the run's log (runlog) when it starts: terms
// only grow, over the run's whole life. Every command carries it and ranks refuse
// an older one, so a leader that wakes from a stall, or a partition's leader after
// the cut heals, never acts on stale state: it takes a new term first, and with it
// finishes whatever the log says is unfinished.
type Leader struct {
	m      Member
	cfg    *config.Config
	log    *slog.Logger
	msgs   chan *pb.Envelope
	wakeCh chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
	st     store.Store
	rl     *runlog.Log
	term   uint64
	renew  time.Time // when the term was last renewed

	mu       sync.Mutex
	next     int64 // the schedule's next window start (-1: the schedule is done)
	requests []*pb.Envelope
	running  []pb.WindowKind // the kinds of the windows in progress (a post-mortem may run inside a window)
	lastPM   time.Time       // when the last post-mortem started
	lastPMID uint64          // and its window
	// later are the windows of the run's log this leader finishes from it
	// later, by id: what outlives a try of one (each try's machine decides
	// it, and is given Planned from here).
	later   map[uint64]*parked
	orders  map[string]uint64 // the last Envelope.Order told each request (by its sender and seq)
	sweepAt time.Time         // when the next sweep of the log is due
	// lastTrigger is when the last trigger window was taken (trigger.go)
	lastTrigger time.Time
	// ctx is the leader loop's, once it took a term (nil before, and after it ends)
	ctx context.Context
	// deferred are post-mortems and trigger windows whose plans the run's log
	// could not take (a full or read-only store): served again when due. This
	// is only the quick way back: a store that refuses the plan refuses any
	// record of the request too, and what decides the window is durable
	// elsewhere. A post-mortem's evidence is the ranks' incident records (each
	// rank's upload job writes one, retried until the store takes it), which
	// any later leader's sweep takes a post-mortem of (orphanPostmortem) when
	// this one is gone; a trigger is crossed again from the live figures, and
	// its cooldown is read back from the plans in the log.
	deferred []deferredReq
}

// deferredReq is a request served again at due, for the tries-th time.
type deferredReq struct {
	req   *pb.Envelope
	due   time.Time
	tries int
}

// deferRequest serves req again later, with backoff: a post-mortem or a trigger
// window whose plan the run's log cannot take now is taken once it can, never
// dropped. One post-mortem waits at a time (the ranks of one incident all ask).
func (l *Leader) deferRequest(req *pb.Envelope, why error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	kind := req.GetRequest().GetKind()
	tries := 1
	for i, d := range l.deferred {
		if d.req == req || d.req.GetRequest().GetKind() == kind && kind != pb.WindowKind_WINDOW_KIND_WINDOW {
			tries = d.tries + 1
			l.deferred = append(l.deferred[:i], l.deferred[i+1:]...)
			break
		}
	}
	if len(l.deferred) >= maxQueued {
		l.log.Error("dropping a deferred window: too many wait", "from", req.Sender)
		return
	}
	wait := retry.After(tries, time.Second, 30*time.Second)
	l.deferred = append(l.deferred, deferredReq{req: req, due: time.Now().Add(wait), tries: tries})
	l.log.Warn("the run's log cannot take the window's plan now; it is taken once it can", "kind", kindName(kind), "reason", req.GetRequest().GetReason(),
		"retry_in", wait.Round(time.Millisecond), "err", why)
}

// undefer queues the deferred requests that are due, first.
func (l *Leader) undefer() {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	var due []*pb.Envelope
	keep := l.deferred[:0]
	for _, d := range l.deferred {
		if now.After(d.due) {
			due = append(due, d.req)
		} else {
			keep = append(keep, d)
		}
	}
	l.deferred = keep
	l.requests = append(due, l.requests...)
}

// postmortemQuiet is how long after a post-mortem further reports (other ranks
// failing in the same incident) start none of their own.
const postmortemQuiet = 30 * time.Second

// Busy reports whether the leader has a window in progress, queued or waited for.
func (l *Leader) Busy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.running) > 0 || len(l.requests) > 0 || len(l.msgs) > 0 || l.awaitedLocked()
}

// awaitedLocked reports whether members wait for a window this leader
// finishes later; mu is held.
func (l *Leader) awaitedLocked() bool {
	for _, p := range l.later {
		if len(p.watchers) > 0 {
			return true
		}
	}
	return false
}

// New prepares the leader's work for the member m, under the member's
// configuration cfg (read only); Start runs it.
func New(m Member, cfg *config.Config, log *slog.Logger) *Leader {
	l := &Leader{m: m, cfg: cfg, log: log.With("role", "leader"), msgs: make(chan *pb.Envelope, 1<<14), wakeCh: make(chan struct{}, 1),
		done: make(chan struct{}), next: -1, later: map[uint64]*parked{}}
	if cfg.Schedule.Enabled {
		l.next = cfg.Schedule.Skip
	}
	return l
}

// Start runs the leader loop on a goroutine counted in wg; the member calls it
// under its own lock (so its Shutdown never finds the leader half started).
func (l *Leader) Start(ctx context.Context, wg *sync.WaitGroup) {
	ctx, l.cancel = context.WithCancel(ctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(l.done)
		l.run(ctx)
	}()
}

// Stop ends the leader's work and waits for it.
func (l *Leader) Stop() {
	l.cancel()
	<-l.done
}

// Wake makes the loop look again (a newer term was seen).
func (l *Leader) Wake() {
	select {
	case l.wakeCh <- struct{}{}:
	default:
	}
}

// WatchNow answers at once, on a goroutine of its own, a member asking how a
// window ended (a client re-asking a new leader): the log answers it, and it
// never waits behind a window this leader is planning. It reports false when
// the leader cannot yet (its store is not open): the message is delivered.
func (l *Leader) WatchNow(env *pb.Envelope) bool {
	r := env.GetRequest()
	if r == nil || env.WindowId == 0 || r.Kind == pb.WindowKind_WINDOW_KIND_OOM || r.Kind == pb.WindowKind_WINDOW_KIND_CRASH {
		return false
	}
	l.mu.Lock()
	ctx := l.ctx
	l.mu.Unlock()
	return ctx != nil && l.m.Spawn(func() { l.answerWatch(ctx, env) })
}

// Deliver hands a message to the leader; it never blocks.
func (l *Leader) Deliver(env *pb.Envelope) {
	select {
	case l.msgs <- env:
	default:
		l.log.Warn("dropping a message: the leader is behind", "from", env.Sender)
	}
}

func (l *Leader) run(ctx context.Context) {
	l.log.Info("leading")
	defer l.log.Info("no longer leading")
	st, err := l.openStore(ctx)
	if err != nil {
		return
	}
	l.st, l.rl = st, runlog.New(st, l.cfg.Identity.RunName)
	defer st.Close()
	defer func() {
		l.mu.Lock()
		l.ctx = nil
		l.mu.Unlock()
	}()
	tick := time.NewTicker(l.cfg.StatusTimeout)
	defer tick.Stop()
	for ctx.Err() == nil {
		if l.term == 0 || l.term < l.m.Term() {
			if !l.renewTerm(ctx) {
				return
			}
			continue
		}
		l.undefer()
		if req := l.pop(); req != nil {
			l.serveRequest(ctx, req)
			continue
		}
		if l.scheduleDue(ctx) {
			continue
		}
		if l.sweepDue() {
			l.sweep(ctx)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case env := <-l.msgs:
			l.idle(ctx, env)
		case <-tick.C:
		case <-l.wakeCh:
		}
	}
}

func (l *Leader) pop() *pb.Envelope {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.requests) == 0 {
		return nil
	}
	req := l.requests[0]
	l.requests = l.requests[1:]
	return req
}

// pushFront queues req to be served next.
func (l *Leader) pushFront(req *pb.Envelope) {
	l.mu.Lock()
	l.requests = append([]*pb.Envelope{req}, l.requests...)
	l.mu.Unlock()
}

// queue queues req, unless the same request (a member asking again) is queued
// already; it reports whether it queued it.
func (l *Leader) queue(req *pb.Envelope) bool {
	l.mu.Lock()
	if req.Seq != 0 && watching(l.requests, req) {
		l.mu.Unlock()
		return false
	}
	var evicted *pb.Envelope
	if len(l.requests) >= maxQueued {
		if last := l.requests[len(l.requests)-1]; urgent(req) && !urgent(last) {
			evicted, l.requests = last, l.requests[:len(l.requests)-1]
		} else {
			l.mu.Unlock()
			l.log.Warn("dropping a request: too many are queued", "from", req.Sender)
			return false
		}
	}
	// a trigger's, an alert's and a post-mortem's window go before the asked
	// ones (in the order they came): they are about an OOM that may be near
	i := len(l.requests)
	if urgent(req) {
		i = 0
		for i < len(l.requests) && urgent(l.requests[i]) {
			i++
		}
	}
	l.requests = slices.Insert(l.requests, i, req)
	l.mu.Unlock()
	if evicted != nil {
		l.answer(evicted, pb.AckCode_ACK_ERROR, "the leader's queue is full of windows that go first (triggers, alerts, post-mortems): ask again later")
	}
	return true
}

// urgent reports whether req asks for a window about an OOM that happened or
// may be near: a post-mortem, a trigger's or an alert's window.
func urgent(req *pb.Envelope) bool {
	r := req.GetRequest()
	switch {
	case r == nil || req.WindowId != 0:
		return false
	case r.Kind == pb.WindowKind_WINDOW_KIND_OOM || r.Kind == pb.WindowKind_WINDOW_KIND_CRASH || r.Kind == pb.WindowKind_WINDOW_KIND_TRIGGER:
		return true
	}
	return strings.HasPrefix(r.Reason, runlog.ReasonTrigger) || strings.HasPrefix(r.Reason, runlog.ReasonAlert)
}

// triggerPendingLocked reports whether a trigger's window is queued or in
// progress (l.mu held): a rank that keeps crossing a trigger asks for no more
// meanwhile.
func (l *Leader) triggerPendingLocked() bool {
	if slices.Contains(l.running, pb.WindowKind_WINDOW_KIND_TRIGGER) {
		return true
	}
	for _, q := range l.requests {
		if r := q.GetRequest(); r != nil && r.Kind == pb.WindowKind_WINDOW_KIND_TRIGGER {
			return true
		}
	}
	for _, d := range l.deferred {
		if d.req.GetRequest().GetKind() == pb.WindowKind_WINDOW_KIND_TRIGGER {
			return true
		}
	}
	return false
}

// Deferred are the kinds of the windows waiting for the run's log to take
// their plans (deferRequest), the first due first.
func (l *Leader) Deferred() []pb.WindowKind {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []pb.WindowKind
	for _, d := range l.deferred {
		out = append(out, d.req.GetRequest().GetKind())
	}
	return out
}

// maxQueued bounds the requests a leader holds.
const maxQueued = 4096

func (l *Leader) openStore(ctx context.Context) (store.Store, error) {
	wait := retry.Backoff{Min: 500 * time.Millisecond, Max: 10 * time.Second}
	for {
		st, err := l.cfg.OpenStore(ctx)
		if err == nil {
			return st, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		l.log.Warn("the leader cannot open the store yet; retrying", "err", err)
		l.refuseWhileDown(ctx, err)
		if !wait.Wait(ctx) {
			return nil, ctx.Err()
		}
	}
}

// renewTerm takes a new term in the run's log, newer than every term seen, and
// finishes what the log says is unfinished. It retries a store that is away; it
// returns false once ctx ends.
func (l *Leader) renewTerm(ctx context.Context) bool {
	if d := time.Until(l.renew.Add(time.Second)); d > 0 { // two members that both think they lead must not race terms up
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
		}
	}
	wait := retry.Backoff{Min: 200 * time.Millisecond, Max: 10 * time.Second}
	for {
		t, err := l.rl.NewTerm(ctx, runlog.Term{Leader: l.m.Name(), Rank: int(l.m.Rank())}, l.m.Term()+1)
		if err == nil {
			prev := l.term
			l.term, l.renew = t.Term, time.Now()
			l.mu.Lock()
			l.ctx = ctx // (watches are answered at once from here on: watchNow)
			l.mu.Unlock()
			l.m.Believe(t.Term)
			l.m.UpdateMeta() // the cluster learns the term from its leader's metadata
			l.log.Info("leadership term taken", "term", t.Term, "previous", prev)
			l.loadSchedule(ctx)
			l.loadLastTrigger(ctx)
			l.sweep(ctx)
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		l.log.Warn("the leader cannot record its term in the store; retrying", "err", err)
		l.refuseWhileDown(ctx, err)
		if !wait.Wait(ctx) {
			return false
		}
	}
}

// refuseWhileDown answers the requests that arrive while the leader cannot reach
// the store: a window cannot be planned without it, and a member that asked must
// hear so now rather than wait.
func (l *Leader) refuseWhileDown(ctx context.Context, cause error) {
	var reqs []*pb.Envelope
	l.mu.Lock()
	reqs, l.requests = l.requests, nil
	l.mu.Unlock()
	for {
		select {
		case env := <-l.msgs:
			if env.GetRequest() != nil {
				reqs = append(reqs, env)
			}
			continue
		default:
		}
		break
	}
	for _, req := range reqs {
		r := req.GetRequest()
		if r.Kind == pb.WindowKind_WINDOW_KIND_CRASH || r.Kind == pb.WindowKind_WINDOW_KIND_OOM {
			l.queue(req) // a post-mortem is worth the wait: it is taken once the store answers
			continue
		}
		res := &pb.WindowResult{State: pb.Outcome_OUTCOME_FAILED, Window: req.WindowId, Error: "the leader cannot use the store: " + cause.Error()}
		if req.WindowId != 0 {
			res.State = pb.Outcome_OUTCOME_UNKNOWN
		}
		env := l.m.Envelope(req.WindowId)
		env.Body = &pb.Envelope_WindowResult{WindowResult: res}
		l.reply(req, env, true)
	}
}

// idle handles a message that arrives while no window is in progress.
func (l *Leader) idle(ctx context.Context, env *pb.Envelope) {
	r := env.GetRequest()
	switch {
	case r == nil:
	case env.WindowId != 0 && r.Kind != pb.WindowKind_WINDOW_KIND_OOM && r.Kind != pb.WindowKind_WINDOW_KIND_CRASH:
		// how a window ended: answered at once from the log, never queued behind
		// new windows
		if !l.m.Spawn(func() { l.answerWatch(ctx, env) }) {
			l.queue(env)
		}
	default:
		l.queue(env)
	}
}

func (l *Leader) serveRequest(ctx context.Context, req *pb.Envelope) {
	r := req.GetRequest()
	switch {
	case req.WindowId != 0: // how did window N end?
		l.answerWatch(ctx, req)
	case r.Kind == pb.WindowKind_WINDOW_KIND_OOM || r.Kind == pb.WindowKind_WINDOW_KIND_CRASH:
		l.postmortem(ctx, req, nil)
	case !l.m.IsRankMember(req) && req.SenderRank >= 0:
		l.answer(req, pb.AckCode_ACK_BAD_REQUEST, "a request naming a rank from a member that is not that rank")
	default:
		length := r.Batches
		if length == 0 {
			length = l.cfg.WindowBatches
		}
		if length < 0 || length > config.MaxWindowBatches {
			l.answer(req, pb.AckCode_ACK_BAD_REQUEST, fmt.Sprintf("a window of %d batches (1 to %d)", length, config.MaxWindowBatches))
			return
		}
		if r.ExpiresUs > 0 && time.Now().After(time.UnixMicro(r.ExpiresUs)) {
			l.log.Info("a request whose member stopped waiting is not planned", "from", req.Sender, "expired", time.UnixMicro(r.ExpiresUs).Format(time.RFC3339))
			l.answer(req, pb.AckCode_ACK_BAD_REQUEST, "the request expired before the leader got to it")
			return
		}
		// a request another leader served already (this one stalled with it, or
		// the member asked again): it is a watch of that window
		id, err := l.served(ctx, req)
		if err != nil { // (never "not served": it may have been)
			l.answer(req, pb.AckCode_ACK_ERROR, "the leader cannot read the run's log to tell whether the request was served: "+err.Error())
			return
		}
		if id != 0 {
			w := proto.Clone(req).(*pb.Envelope)
			w.WindowId = id
			l.log.Info("the request was served already; answering with its window", "from", req.Sender, "window", id)
			l.answerWatch(ctx, w)
			return
		}
		l.answer(req, pb.AckCode_ACK_OK, "")
		kind := pb.WindowKind_WINDOW_KIND_WINDOW
		if r.Kind == pb.WindowKind_WINDOW_KIND_TRIGGER && req.Sender == l.m.Name() {
			kind = r.Kind // (only this leader's own triggers plan one)
			if rank, _, ok := view.TriggerRank(r.Reason); ok && l.m.StillCrossing(rank) == "" {
				// it waited behind another window, and its rank no longer crosses
				// (it left, or ran out of memory meanwhile): no window for nothing
				l.log.Info("a trigger's rank no longer crosses it; no window", "rank", rank, "trigger", r.Reason)
				l.mu.Lock()
				l.lastTrigger = time.Time{} // (the cooldown is not spent on it)
				l.mu.Unlock()
				return
			}
			if l.cfg.Triggers.Dump {
				// the history that led here, every rank's, at once
				l.dumps(ctx, dumpPlan{kind: kind, reason: nonEmpty(r.Reason, "trigger"), failedRank: -1, req: req})
				return
			}
		}
		l.window(ctx, plan{kind: kind, length: length, reason: nonEmpty(r.Reason, "request"), watchers: []*pb.Envelope{req}, req: req})
	}
}

// requestID names a request for the run's log: its member and its random id.
func requestID(req *pb.Envelope) string { return fmt.Sprintf("%s#%016x", req.Sender, req.Seq) }

// served returns the window that already serves req, from the newest plans in
// the run's log (0: none; an error where the log could not be read).
func (l *Leader) served(ctx context.Context, req *pb.Envelope) (uint64, error) {
	if req.Seq == 0 {
		return 0, nil
	}
	id := requestID(req)
	recent, err := l.requestPlans(ctx, id)
	if err != nil {
		return 0, err
	}
	for _, p := range recent {
		if p.Request != id {
			continue
		}
		res, done, err := l.windowEnd(ctx, p)
		if err == nil && !done {
			// unfinished: finish it first (a window its dead leader never sent
			// to the ranks fails at once)
			l.recoverPlan(ctx, p)
			res, _, err = l.windowEnd(ctx, p)
		}
		if err == nil && res != nil && res.State == pb.Outcome_OUTCOME_FAILED && len(res.Ranks) == 0 {
			// nothing of it was recorded: the request is planned again
			l.log.Info("the request's window failed with no snapshot; planning the request again", "from", req.Sender, "window", p.ID, "why", res.Error)
			return 0, nil
		}
		return p.ID, nil
	}
	return 0, nil
}

// requestPlans are the plans that may serve request id: the one the log notes
// for it (whatever the windows planned since), else the newest plans (a log
// of an earlier version notes none).
func (l *Leader) requestPlans(ctx context.Context, id string) ([]*runlog.Plan, error) {
	w, err := l.rl.RequestWindow(ctx, id)
	if err != nil && !errors.Is(err, runlog.ErrMalformed) {
		return nil, err
	}
	if w != 0 {
		p, err := l.rl.ReadPlan(ctx, w)
		if err == nil {
			return []*runlog.Plan{p}, nil
		}
		if !errors.Is(err, runlog.ErrMalformed) && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, runlog.ErrVoid) {
			return nil, err
		}
	}
	return l.rl.Latest(ctx, 16)
}

// answer acks a request (ok, or refused with code).
func (l *Leader) answer(req *pb.Envelope, code pb.AckCode, why string) {
	if req.Seq == 0 {
		if code != pb.AckCode_ACK_OK {
			l.log.Warn("refused a request", "from", req.Sender, "why", why)
		}
		return
	}
	env := l.m.Envelope(req.WindowId)
	env.Body = &pb.Envelope_Ack{Ack: &pb.Ack{Ok: code == pb.AckCode_ACK_OK, Code: code, Message: why, Term: l.term}}
	l.reply(req, env, code != pb.AckCode_ACK_OK)
}

// answerWatch tells a member that asks about a window not in progress how it
// ended, from its commit in the store; a window the log holds unfinished is
// finished by this leader, which answers then.
func (l *Leader) answerWatch(ctx context.Context, req *pb.Envelope) {
	id := req.WindowId
	res := &pb.WindowResult{State: pb.Outcome_OUTCOME_UNKNOWN, Window: id, Store: l.st.String()}
	p, err := l.rl.ReadPlan(ctx, id)
	switch {
	case err == nil:
		got, done, err := l.windowEnd(ctx, p)
		switch {
		case err != nil:
			res.Error = "the run's log cannot be read: " + err.Error()
		case !done:
			l.mu.Lock()
			// (kept whatever the bound: a member acked waits to be told)
			if w := l.parkLocked(p.ID); !watching(w.watchers, req) {
				w.watchers = append(w.watchers, req)
			}
			l.sweepAt = time.Time{} // finish it now
			l.mu.Unlock()
			l.answer(req, pb.AckCode_ACK_OK, "")
			if got != nil && l.waiting(id, req) { // answered: the rest is to come
				env := l.m.Envelope(id)
				env.Body = &pb.Envelope_WindowResult{WindowResult: got}
				l.reply(req, env, false)
			}
			l.Wake()
			return
		default:
			res = got
		}
	case errors.Is(err, store.ErrNotFound):
		res.Error = fmt.Sprintf("the run's log holds no window %d", id)
	default:
		res.Error = "the run's log cannot be read: " + err.Error()
	}
	env := l.m.Envelope(id)
	env.Body = &pb.Envelope_WindowResult{WindowResult: res}
	l.reply(req, env, true)
}

// windowEnd is how window p stands as its commit and outcome say: done when it
// ended (res says how), or not yet (res is its answer when it has one).
func (l *Leader) windowEnd(ctx context.Context, p *runlog.Plan) (res *pb.WindowResult, done bool, err error) {
	var c *window.Commit
	var m *publish.Manifest
	if p.Manifest != "" {
		m, err = publish.ReadManifest(ctx, l.st, p.Manifest)
		switch {
		case err == nil:
			c = commit.Of(m)
		case errors.Is(err, store.ErrNotFound):
		default:
			return nil, false, err
		}
	}
	o, err := l.rl.ReadOutcome(ctx, p.ID)
	state := ""
	switch {
	case err == nil:
		state = o.State
	case errors.Is(err, store.ErrNotFound):
	default:
		return nil, false, err
	}
	phase, final := window.Derive(c, state)
	switch {
	case m != nil:
		res = l.resultOfManifest(p.Manifest, m)
		res.Window = p.ID
		if res.Start == 0 && res.Stop == 0 {
			res.Start, res.Stop = p.Start, p.Stop
		}
		if res.Pending && final && o != nil {
			res.Error = o.Error // why the rest was not written
		}
	case o != nil:
		res = l.resultOfOutcome(ctx, o)
	}
	return res, phase.Ended() || final, nil
}

// resultOfOutcome is a window's result as its outcome alone says (a log of an
// earlier version, or a plan no leader could read).
func (l *Leader) resultOfOutcome(ctx context.Context, o *runlog.Outcome) *pb.WindowResult {
	res := &pb.WindowResult{State: pb.Outcome_OUTCOME_FAILED, Window: o.ID, Error: o.Error, Store: l.st.String(), Missing: map[int32]string{}, Kind: kindOf(o.Kind)}
	if o.State == runlog.Published {
		res.State = pb.Outcome_OUTCOME_PUBLISHED
		if o.Manifest != "" {
			res.Manifest = l.st.URL(o.Manifest)
		}
	}
	for _, r := range o.Ranks {
		res.Ranks = append(res.Ranks, int32(r))
	}
	for r, why := range o.Missing {
		var n int32
		fmt.Sscan(r, &n)
		res.Missing[n] = why
	}
	if p, err := l.rl.ReadPlan(ctx, o.ID); err == nil {
		res.Start, res.Stop = p.Start, p.Stop
	}
	return res
}

// scheduleDue starts the scheduled window when every rank's trainer runs; it
// reports whether it did.
func (l *Leader) scheduleDue(ctx context.Context) bool {
	l.mu.Lock()
	next := l.next
	l.mu.Unlock()
	if next < 0 {
		return false
	}
	ranks := l.m.RankNodes()
	world := l.cfg.Identity.WorldSize
	if len(ranks) < world {
		return false // wait for every rank to join
	}
	rl := make([]int, 0, len(ranks))
	for r := range ranks {
		rl = append(rl, r)
	}
	sts := l.m.Status(ctx, rl)
	if len(sts) < world {
		return false
	}
	for _, s := range sts {
		if !s.St.Trainer {
			return false
		}
	}
	res := l.window(ctx, plan{length: l.cfg.WindowBatches, minStart: next, reason: "schedule"})
	if res == nil {
		return true // left for later, or served again once the leader renewed its term
	}
	l.mu.Lock()
	l.next = l.scheduleAfter(res.Stop, next)
	next = l.next
	l.mu.Unlock()
	// the run's log keeps where the schedule stands, for a leader that starts later
	if err := l.rl.PutSchedule(ctx, runlog.Schedule{Next: next, Term: l.term}); err != nil && ctx.Err() == nil {
		l.log.Warn("cannot record where the schedule stands in the run's log", "next", next, "err", err)
	}
	return true
}

// scheduleAfter is the schedule's next start after a scheduled window that
// ends at stop, planned from next: on the grid Skip + k*Every after it, or -1
// when the schedule is once-only.
func (l *Leader) scheduleAfter(stop, next int64) int64 {
	sch := l.cfg.Schedule
	if sch.Every <= 0 {
		return -1
	}
	after := max(stop, next+1)
	k := (after - sch.Skip + sch.Every - 1) / sch.Every
	return sch.Skip + k*sch.Every
}

// loadSchedule takes where the run's schedule stands from the run's log: a
// leader restarted, or a job relaunched, neither repeats a once-only window nor
// loses its place on the grid. Where the log holds no record of it yet (a
// leader stopped after its scheduled window's plan and before that record),
// the newest scheduled window's plan says it.
func (l *Leader) loadSchedule(ctx context.Context) {
	if !l.cfg.Schedule.Enabled {
		return
	}
	sc, err := l.rl.ReadSchedule(ctx)
	switch {
	case err == nil:
		l.mu.Lock()
		l.next = sc.Next
		l.mu.Unlock()
		if sc.Next < 0 {
			l.log.Info("the scheduled window was recorded already (the run's log says so); no schedule", "by_term", sc.Term)
		}
	case errors.Is(err, store.ErrNotFound):
		p, err := l.lastScheduled(ctx)
		if err != nil {
			l.log.Warn("cannot read the run's log for its scheduled windows", "err", err)
			return
		}
		if p != nil {
			next := l.scheduleAfter(p.Stop, p.Start)
			l.mu.Lock()
			l.next = next
			l.mu.Unlock()
			l.log.Info("the schedule goes on after the scheduled window the run's log holds", "window", p.ID, "next", next)
		}
	default:
		l.log.Warn("cannot read where the schedule stands from the run's log", "err", err)
	}
}

// lastScheduled is the newest plan of a scheduled window in the run's log (nil:
// none); a plan that does not read is passed over.
func (l *Leader) lastScheduled(ctx context.Context) (*runlog.Plan, error) {
	var last *runlog.Plan
	err := l.rl.Backwards(ctx, func(p *runlog.Plan) bool {
		if p.Reason == "schedule" {
			last = p
		}
		return last == nil
	})
	if err != nil {
		return nil, err
	}
	return last, nil
}

func (l *Leader) sweepDue() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Now().After(l.sweepAt)
}

// sweep finishes every window the run's log holds unfinished (oldest first): one
// an earlier leader planned and did not finish (it died, stalled, or the whole job
// was relaunched), or one whose publication the store interrupted.
func (l *Leader) sweep(ctx context.Context) {
	l.mu.Lock()
	l.sweepAt = time.Now().Add(l.cfg.SweepInterval)
	l.mu.Unlock()
	began := time.Now()
	plans, err := l.rl.Unfinished(ctx, l.term)
	if err != nil {
		if ctx.Err() == nil {
			l.log.Warn("cannot read the run's log for unfinished windows; trying again later", "err", err)
		}
		return
	}
	for _, p := range plans {
		if ctx.Err() != nil || l.term < l.m.Term() {
			return
		}
		if p.Kind == runlog.KindWindow && l.cfg.Schedule.Every == 0 {
			l.mu.Lock()
			l.next = -1 // the once-window happened under an earlier leader
			l.mu.Unlock()
		}
		l.recoverPlan(ctx, p)
	}
	if l.cfg.OnOOM && ctx.Err() == nil {
		l.orphanPostmortem(ctx)
	}
	// members waiting for windows that are not unfinished any more get the outcome
	l.mu.Lock()
	var ids []uint64
	for id, p := range l.later {
		if len(p.watchers) > 0 {
			ids = append(ids, id)
		}
	}
	l.mu.Unlock()
	for _, id := range ids {
		p, err := l.rl.ReadPlan(ctx, id)
		if err != nil {
			continue
		}
		if res, done, err := l.windowEnd(ctx, p); err == nil && done && res != nil {
			l.tellResult(id, nil, res, true)
		}
	}
	l.dropFinished(plans, began)
}

// dropFinished forgets the windows kept since before at that the run's log no
// longer holds unfinished (another leader finished them) and no member waits
// for: nothing of them is left to judge or to tell. (A window kept since, such
// as a post-mortem this sweep planned and deferred, is not in the listing.)
func (l *Leader) dropFinished(unfinished []*runlog.Plan, at time.Time) {
	open := make(map[uint64]bool, len(unfinished))
	for _, p := range unfinished {
		open[p.ID] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, p := range l.later {
		if len(p.watchers) == 0 && !open[id] && p.kept.Before(at) {
			delete(l.later, id)
		}
	}
}

// orphanPostmortem takes a post-mortem of the incidents the run's log holds
// that no post-mortem covers (their ranks stored the snapshot of their OOM or
// crash when no leader was there: the job went down with its leader), once
// they are older than a live post-mortem would wait for.
func (l *Leader) orphanPostmortem(ctx context.Context) {
	incs, err := commit.Orphans(ctx, l.rl, time.Now().Add(-l.cfg.IncidentHold()))
	if err != nil {
		l.log.Warn("cannot read the run's log for incidents no post-mortem took; trying again later", "err", err)
		return
	}
	if len(incs) == 0 {
		return
	}
	rp := commit.PostmortemPlan(incs, l.cfg.Identity.WorldSize)
	pl, err := l.createPlan(ctx, rp)
	if err != nil {
		l.log.Warn("cannot record the plan of a post-mortem of the incidents in the run's log; trying again later", "incidents", len(incs), "err", err)
		return
	}
	l.log.Warn("post-mortem of snapshots ranks stored of their OOM or crash with no leader to take them", "window", pl.ID, "kind", pl.Kind,
		"failed_rank", *pl.FailedRank, "incidents", len(incs))
	l.recoverPlan(ctx, &pl)
}

// tellResult gives every member waiting for window id its result.
func (l *Leader) tellResult(id uint64, watchers []*pb.Envelope, res *pb.WindowResult, final bool) {
	l.mu.Lock()
	if p := l.later[id]; p != nil {
		watchers = append(watchers, p.watchers...)
		p.watchers = nil
		if final {
			// ended for good (published, failed, or answered with its detail
			// given up): a member that asks later is answered from the log
			// (taken in the same hold as its watchers: one parked after this is
			// kept for the sweep)
			delete(l.later, id)
		}
	}
	l.mu.Unlock()
	if len(watchers) == 0 {
		return
	}
	if res.Window != id {
		// a result may be on its way to other watchers already (the outbox
		// marshals it on another goroutine): change a copy, never it
		res = proto.Clone(res).(*pb.WindowResult)
		res.Window = id
	}
	for _, w := range watchers {
		env := l.m.Envelope(id)
		env.Body = &pb.Envelope_WindowResult{WindowResult: res}
		l.reply(w, env, true)
	}
}

// tellAnswer tells the members waiting for window id that its answer is
// published (res.Pending: the pickles are still being written); they stay
// waiting for its result.
func (l *Leader) tellAnswer(id uint64, watchers []*pb.Envelope, res *pb.WindowResult) {
	watchers = append(slices.Clip(watchers), l.awaiting(id)...)
	for _, w := range watchers {
		env := l.m.Envelope(id)
		env.Body = &pb.Envelope_WindowResult{WindowResult: res}
		l.reply(w, env, false)
	}
}

// reply sends env to the member that made request req, reliably, as the next
// message of what this leader tells it about req (Envelope.Order: each message
// travels on a stream of its own, and the member puts them back in order). The
// last, a request's result, forgets the count.
func (l *Leader) reply(req, env *pb.Envelope, last bool) {
	if req.Seq != 0 {
		key := req.Sender + "\x00" + strconv.FormatUint(req.Seq, 10)
		l.mu.Lock()
		if l.orders == nil {
			l.orders = map[string]uint64{}
		}
		l.orders[key]++
		env.Order = l.orders[key]
		if last {
			delete(l.orders, key)
		}
		l.mu.Unlock()
	}
	l.m.Reply(req, env, true)
}

// manifestKey renders the name of window id's manifest.
func (l *Leader) manifestKey(id uint64, stop int64) (string, error) {
	keys, err := publish.OutputKeys(l.cfg.MergedName, l.vars(id, stop))
	if err != nil {
		return "", err
	}
	return keys[publish.OutManifest], nil
}

func (l *Leader) vars(id uint64, stop int64) naming.Vars {
	return naming.Vars{"run_name": l.cfg.Identity.RunName, "window": int64(id), "batch": stop, "world_size": l.cfg.Identity.WorldSize}
}

func nonEmpty(s, dflt string) string {
	if strings.TrimSpace(s) == "" {
		return dflt
	}
	return s
}

// kindOf is a window kind as the run's log names it ("window", "oom", "crash").
func kindOf(k string) pb.WindowKind {
	kind, _ := pb.Parse[pb.WindowKind](k)
	return kind
}

// kindName is a kind as the run's log names it (a window where none is said).
func kindName(k pb.WindowKind) string {
	if k == pb.WindowKind_WINDOW_KIND_UNSPECIFIED {
		k = pb.WindowKind_WINDOW_KIND_WINDOW
	}
	return pb.Name(k)
}
