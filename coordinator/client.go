package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/internal/pb"
)

// Update is one step of a requested window, as Snapshot reports it.
type Update struct {
	Window   uint64
	Rank     int // -1 for the window as a whole
	State    pb.Step
	Batch    int64
	Reason   string
	Leader   int
	Deadline time.Time // STEP_PLANNED: when the leader gives up on the window
	Received time.Time
	// Answer is the window's answer, published while its merged pickles and
	// timeline are still being written (Answer.Pending), for a caller that waits
	// for all of it.
	Answer *pb.WindowResult
}

// StepName is a step as people read it ("recording", "planned").
func StepName(s pb.Step) string { return stepName(s) }

var (
	// ErrNoLeader: no rank is alive to lead.
	ErrNoLeader = errors.New("coordinator: no leader")
	// ErrDetached: Snapshot stopped waiting because its caller said so.
	ErrDetached = errors.New("coordinator: stopped watching the window")
	// ErrRefused: the leader refused the request as asked.
	ErrRefused = errors.New("coordinator: the leader refused the request")
)

// rewatchAfter is how long Snapshot waits without a word about its window before
// it asks the leader about it again.
const rewatchAfter = 10 * time.Second

// unknownTries is how many times Snapshot asks again when a leader cannot tell
// how a window ended (its store is away) before it gives up.
const unknownTries = 5

// retryReachAfter is how long Snapshot waits before it asks again a leader it
// could not reach.
const retryReachAfter = time.Second

// Snapshot asks the cluster for a window of batches batches (0: the leader's
// default) now, reports every step through progress (which must not block for
// long), and returns how the window ended, once all of it is published. If the
// leader changes meanwhile, the new leader is asked about the same window. Closing
// detach makes it return at once with ErrDetached (the window goes on).
func (c *Coordinator) Snapshot(ctx context.Context, batches int64, progress func(Update), detach <-chan struct{}) (*pb.WindowResult, error) {
	return c.Request(ctx, batches, RequestOptions{Progress: progress, Detach: detach})
}

// RequestOptions are how Request waits.
type RequestOptions struct {
	Progress func(Update)
	Detach   <-chan struct{}
	// AnswerFirst returns as soon as the window's answer is published: the
	// result says Pending while its merged pickles and timeline are still being
	// written. Without it, the answer is reported through Progress (Update.Answer)
	// and the result comes once everything is published.
	AnswerFirst bool
	// Reason is why the window is asked for, for the manifest (default "request").
	Reason string
}

// Request is Snapshot with options.
func (c *Coordinator) Request(ctx context.Context, batches int64, opts RequestOptions) (*pb.WindowResult, error) {
	if batches < 0 || batches > MaxWindowBatches {
		return nil, fmt.Errorf("%w: a window of %d batches (1 to %d)", ErrRefused, batches, MaxWindowBatches)
	}
	ch, seq := c.expect(1<<16, c.fromRanks())
	defer c.forget(seq)
	q := &request{c: c, ctx: ctx, opts: opts, batches: batches, seq: seq, heard: time.Now(), answeredBy: -1}
	if err := q.try(); err != nil {
		return nil, err
	}
	check := time.NewTicker(500 * time.Millisecond)
	defer check.Stop()
	var in inOrder
	for {
		var res *pb.WindowResult
		var err error
		var heard []*pb.Envelope
		select {
		case <-ctx.Done():
			return q.gaveUp()
		case <-opts.Detach:
			return nil, ErrDetached
		case <-q.again:
			q.again = nil
			err = q.try()
		case <-check.C:
			err = q.check()
		case <-in.gap:
			heard = in.skip()
		case env := <-ch:
			heard = in.take(env)
		}
		for _, env := range heard {
			if res != nil || err != nil {
				break
			}
			res, err = q.onReply(env)
		}
		if res != nil || err != nil {
			return res, err
		}
	}
}

// orderWait is how long a leader's message that came before one told earlier
// (Envelope.Order) is held for the one it overtook.
const orderWait = 250 * time.Millisecond

// inOrder puts a leader's messages about a request back in the order it told
// them (each travels on a stream of its own, and may overtake the one before).
// A message is never lost: one whose predecessor does not come within orderWait
// goes on without it, and one older than expected (late, or from a leader that
// restarted and counts anew) is passed on at once.
type inOrder struct {
	next map[string]uint64                  // by sender: the order expected next
	held map[string]map[uint64]*pb.Envelope // by sender and order
	gap  <-chan time.Time                   // fires orderWait after a message is held
}

func (o *inOrder) take(env *pb.Envelope) []*pb.Envelope {
	if env.Order == 0 {
		return []*pb.Envelope{env}
	}
	if o.next == nil {
		o.next, o.held = map[string]uint64{}, map[string]map[uint64]*pb.Envelope{}
	}
	from := env.Sender
	next := max(o.next[from], 1)
	switch {
	case env.Order == 1 && next > 1: // a leader that counts anew
		o.next[from], o.held[from] = 2, nil
		o.arm()
		return []*pb.Envelope{env}
	case env.Order < next:
		return []*pb.Envelope{env}
	case env.Order > next:
		if o.held[from] == nil {
			o.held[from] = map[uint64]*pb.Envelope{}
		}
		if len(o.held[from]) < 1<<16 {
			o.held[from][env.Order] = env
		}
		o.arm()
		return nil
	}
	o.next[from] = next
	return o.release(from, []*pb.Envelope{env})
}

// release passes on from's message at o.next[from] (out holds it) and those held
// after it without a gap.
func (o *inOrder) release(from string, out []*pb.Envelope) []*pb.Envelope {
	n := o.next[from] + 1
	for {
		env, ok := o.held[from][n]
		if !ok {
			break
		}
		out = append(out, env)
		delete(o.held[from], n)
		n++
	}
	o.next[from] = n
	o.arm()
	return out
}

// arm keeps the gap timer running while a message is held, and only then.
func (o *inOrder) arm() {
	for _, held := range o.held {
		if len(held) > 0 {
			if o.gap == nil {
				o.gap = time.After(orderWait)
			}
			return
		}
	}
	o.gap = nil
}

// skip gives up waiting for the messages held ones overtook.
func (o *inOrder) skip() []*pb.Envelope {
	o.gap = nil // (release arms it again while anything is still held)
	var out []*pb.Envelope
	for from, held := range o.held {
		if len(held) == 0 {
			continue
		}
		first := uint64(0)
		for n := range held {
			if first == 0 || n < first {
				first = n
			}
		}
		o.next[from] = first
		env := held[first]
		delete(held, first)
		out = o.release(from, append(out, env))
	}
	return out
}

// request is one Request in progress: a member asking the leader for a window,
// asking again (a new leader, a silence), and hearing how it goes.
type request struct {
	c       *Coordinator
	ctx     context.Context
	opts    RequestOptions
	batches int64
	seq     uint64
	window  uint64 // the window it serves, once the leader said
	leader  string // the member last asked
	again   <-chan time.Time
	// unreachable is the last failure to reach the leader
	unreachable error
	unknown     int              // answers that the leader cannot tell yet
	answer      *pb.WindowResult // the answer, once published (its pickles still to come)
	lastWord    string           // what the leader last said of a store it cannot use
	heard       time.Time        // when the leader last said something about the window
	answered    uint64           // the window whose answer came (its pickles still being written)
	answeredBy  int32            // the rank of the leader that sent it
}

func (q *request) progress(u Update) {
	if q.opts.Progress != nil {
		q.opts.Progress(u)
	}
}

// ask sends the request (a watch of its window once it has one) to the leader.
func (q *request) ask() error {
	name, err := q.c.waitLeader(q.ctx)
	if err != nil {
		return err
	}
	q.leader = name
	env := q.c.envelope(q.window)
	env.Seq = q.seq
	req := &pb.SnapshotRequest{Batches: q.batches, Reason: q.opts.Reason, Watch: true, Kind: pb.WindowKind_WINDOW_KIND_WINDOW}
	if req.Reason == "" {
		req.Reason = "request"
	}
	if dl, ok := q.ctx.Deadline(); ok {
		req.ExpiresUs = dl.UnixMicro() // a leader that gets to it later does not plan it
	}
	env.Body = &pb.Envelope_Request{Request: req}
	return q.c.send(name, env, true)
}

// try asks; a leader that cannot be reached (it is dying, and gossip has not
// yet said so) is asked again until the context ends: its successor takes the
// request over.
func (q *request) try() error {
	err := q.ask()
	switch {
	case err == nil:
		q.unreachable = nil
		return nil
	case errors.Is(err, ErrStopped) || errors.Is(err, ErrNoLeader) || q.ctx.Err() != nil:
		return err
	}
	if q.unreachable == nil {
		q.progress(Update{Window: q.window, Rank: -1, Reason: fmt.Sprintf("could not reach the leader (%v); asking again", err), Received: time.Now()})
	}
	q.unreachable = err
	q.again = time.After(retryReachAfter)
	return nil
}

// check asks again after a silence, and asks a new leader.
func (q *request) check() error {
	q.c.mu.Lock()
	now := q.c.leaderName
	q.c.mu.Unlock()
	if now == q.leader && time.Since(q.heard) > rewatchAfter {
		// nothing heard for a while: ask again, the same request (a message may
		// have been lost, the leader's agent restarted with the request queued,
		// or the job was relaunched under the same member names); a leader that
		// has it already says so
		q.heard = time.Now()
		return q.try()
	}
	if now != q.leader && now != "" {
		q.progress(Update{Window: q.window, Rank: -1, State: pb.Step_STEP_UNSPECIFIED, Reason: "the leader changed; asking the new one", Received: time.Now()})
		return q.try()
	}
	return nil
}

// gaveUp is what the request ends with when its context ends: the answer, when
// it is out (that is what the window published so far), else the context's error.
func (q *request) gaveUp() (*pb.WindowResult, error) {
	err := q.ctx.Err()
	if q.answer != nil {
		res := proto.Clone(q.answer).(*pb.WindowResult)
		res.Error = "gave up waiting for the merged pickles and the timeline: " + err.Error()
		if q.lastWord != "" {
			res.Error += " (the leader last said: " + q.lastWord + ")"
		}
		return res, nil
	}
	if q.unreachable != nil {
		return nil, fmt.Errorf("%w (the leader was last unreachable: %v)", err, q.unreachable)
	}
	return nil, err
}

// onReply takes the leader's word: an ack, a step, or a result (which ends the
// request, unless it is the answer of a window whose rest is awaited).
func (q *request) onReply(env *pb.Envelope) (*pb.WindowResult, error) {
	q.heard = time.Now()
	if env.WindowId != 0 {
		q.window = env.WindowId
	}
	switch b := env.Body.(type) {
	case *pb.Envelope_Ack:
		switch {
		case b.Ack.Code == pb.AckCode_ACK_NOT_LEADER:
			q.again = time.After(100 * time.Millisecond) // membership is converging; ask again
		case !b.Ack.Ok:
			return nil, fmt.Errorf("%w: %s", ErrRefused, b.Ack.Message)
		}
	case *pb.Envelope_Progress:
		q.onProgress(env, b.Progress)
	case *pb.Envelope_WindowResult:
		return q.onResult(env, b.WindowResult), nil
	}
	return nil, nil
}

func (q *request) onProgress(env *pb.Envelope, p *pb.Progress) {
	if q.opts.Progress == nil || overtaken(env, q.answered, q.answeredBy) {
		return // (overtaken: told before the answer, which came first: old news)
	}
	now := time.Now()
	if len(p.Steps) > 0 {
		// many ranks' steps, gathered by the leader of a large window
		for _, st := range p.Steps {
			q.progress(Update{Window: env.WindowId, Rank: int(st.Rank), State: st.State, Batch: st.Batch,
				Reason: st.Reason, Leader: int(env.SenderRank), Received: now})
		}
		return
	}
	u := Update{Window: env.WindowId, Rank: int(p.Rank), State: p.State, Batch: p.Batch, Reason: p.Reason, Leader: int(env.SenderRank), Received: now}
	if p.DeadlineUs > 0 {
		u.Deadline = time.UnixMicro(p.DeadlineUs)
	}
	q.progress(u)
}

// onResult is how the window ended, or nil while the request waits on.
func (q *request) onResult(env *pb.Envelope, r *pb.WindowResult) *pb.WindowResult {
	if r.State == pb.Outcome_OUTCOME_UNKNOWN && q.window != 0 {
		// a leader that cannot tell yet (its store is away): ask again a few
		// times; with the answer out, until the rest comes or the caller stops
		// waiting (the answer is the truth so far)
		q.lastWord = r.Error
		if q.unknown++; q.unknown >= unknownTries && q.answer == nil {
			return r
		}
		q.again = time.After(min(time.Duration(q.unknown)*time.Second, 10*time.Second))
		q.progress(Update{Window: q.window, Rank: -1, Reason: "the leader cannot tell yet (" + r.Error + "); asking again", Received: time.Now()})
		return nil
	}
	if r.Window == 0 {
		r.Window = q.window
	}
	if r.Pending && r.State == pb.Outcome_OUTCOME_PUBLISHED && r.Error == "" && !q.opts.AnswerFirst {
		// the answer: the rest of the window is still being written
		q.answered, q.answeredBy, q.answer = r.Window, env.SenderRank, r
		q.progress(Update{Window: r.Window, Rank: -1, State: pb.Step_STEP_PUBLISHING, Leader: int(env.SenderRank),
			Reason: "the answer is published; writing the merged pickles and the timeline", Received: time.Now(), Answer: r})
		return nil
	}
	return r
}

// overtaken reports whether env, a leader's progress of a window, was told before
// the window's answer and overtaken by it (each travels on a stream of its own):
// its word that it merges the ranks, or the ranks' steps it gathered. Window
// answered's answer came from the leader of rank by; every rank's step was in by
// then. A successor that finishes the window says it is merging, and that is
// told.
func overtaken(env *pb.Envelope, answered uint64, by int32) bool {
	p := env.GetProgress()
	if answered == 0 || p == nil || env.WindowId != answered || env.SenderRank != by {
		return false
	}
	return len(p.Steps) > 0 || p.Rank < 0 && p.State == pb.Step_STEP_PUBLISHING
}

// waitLeader returns the leader's member name once there is one.
func (c *Coordinator) waitLeader(ctx context.Context) (string, error) {
	for {
		c.mu.Lock()
		name := c.leaderName
		c.mu.Unlock()
		if name != "" {
			return name, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%w: %w", ErrNoLeader, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// status asks the ranks for their status and waits up to StatusTimeout (asking
// again the ranks that have not answered, once).
func (c *Coordinator) status(ctx context.Context, ranks []int) map[int]status {
	nodes := c.rankNodes()
	ch, seq := c.expect(len(ranks)+16, c.fromRanks())
	defer c.forget(seq)
	sent := map[int]time.Time{}
	ask := func(r int) {
		n := nodes[r]
		if n == nil {
			return
		}
		env := c.envelope(0)
		env.Body = &pb.Envelope_StatusRequest{StatusRequest: &pb.StatusRequest{}}
		env.Seq = seq
		sent[r] = time.Now()
		if int32(r) == c.rank() {
			c.handleLocal(env)
			return
		}
		c.post(n.Name, "", env, false)
	}
	for _, r := range ranks {
		ask(r)
	}
	out := map[int]status{}
	deadline := time.NewTimer(c.cfg.StatusTimeout)
	defer deadline.Stop()
	retry := time.NewTimer(c.cfg.StatusTimeout / 3)
	defer retry.Stop()
	for len(out) < len(sent) {
		select {
		case <-ctx.Done():
			return out
		case <-deadline.C:
			return out
		case <-retry.C:
			for _, r := range ranks {
				if _, ok := out[r]; !ok {
					ask(r)
				}
			}
		case env := <-ch:
			s := env.GetStatus()
			if s == nil || env.SenderRank < 0 {
				continue
			}
			r := int(env.SenderRank)
			if _, ok := out[r]; ok {
				continue
			}
			now := time.Now()
			out[r] = status{st: s, rtt: now.Sub(sent[r]), when: now}
		}
	}
	return out
}

// Batches asks every rank for its trainer's current batch; ok is false when no
// rank answered.
func (c *Coordinator) Batches(ctx context.Context) (map[int]int64, bool) {
	nodes := c.rankNodes()
	ranks := make([]int, 0, len(nodes))
	for r := range nodes {
		ranks = append(ranks, r)
	}
	out := map[int]int64{}
	for r, s := range c.status(ctx, ranks) {
		out[r] = s.st.Batch
	}
	return out, len(out) > 0
}
