package client

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

// UnknownTries is how many times Snapshot asks again when a leader cannot tell
// how a window ended (its store is away) before it gives up.
const UnknownTries = 5

// retryReachAfter is how long Snapshot waits before it asks again a leader it
// could not reach.
const retryReachAfter = time.Second

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

// Member is what a request needs of the member that asks: the coordinator.
type Member interface {
	// Expect registers a wait for the ranks' replies to a new request: the
	// channel they come on (with room for buf) and the request's seq.
	Expect(buf int) (<-chan *pb.Envelope, uint64)
	// Forget ends the wait for seq's replies.
	Forget(seq uint64)
	// Leader is the leader's member name now, "" while there is none.
	Leader() string
	// Envelope is a message from this member about window.
	Envelope(window uint64) *pb.Envelope
	// Send sends env to the member named to, over TCP (it arrives or the error
	// says so).
	Send(to string, env *pb.Envelope) error
	// Stopped reports whether err says the member has shut down.
	Stopped(err error) bool
}

// Request asks m's leader for a window of batches batches (0: the leader's
// default) now, reports every step through opts.Progress, and returns how the
// window ended (see Coordinator.Snapshot and Coordinator.Request).
func Request(ctx context.Context, m Member, batches int64, opts RequestOptions) (*pb.WindowResult, error) {
	ch, seq := m.Expect(1 << 16)
	defer m.Forget(seq)
	q := &request{m: m, ctx: ctx, opts: opts, batches: batches, seq: seq, heard: time.Now(), answeredBy: -1}
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

// request is one Request in progress: a member asking the leader for a window,
// asking again (a new leader, a silence), and hearing how it goes.
type request struct {
	m       Member
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
	name, err := waitLeader(q.ctx, q.m)
	if err != nil {
		return err
	}
	q.leader = name
	env := q.m.Envelope(q.window)
	env.Seq = q.seq
	req := &pb.SnapshotRequest{Batches: q.batches, Reason: q.opts.Reason, Watch: true, Kind: pb.WindowKind_WINDOW_KIND_WINDOW}
	if req.Reason == "" {
		req.Reason = "request"
	}
	if dl, ok := q.ctx.Deadline(); ok {
		req.ExpiresUs = dl.UnixMicro() // a leader that gets to it later does not plan it
	}
	env.Body = &pb.Envelope_Request{Request: req}
	return q.m.Send(name, env)
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
	case q.m.Stopped(err) || errors.Is(err, ErrNoLeader) || q.ctx.Err() != nil:
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
	now := q.m.Leader()
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
		if q.unknown++; q.unknown >= UnknownTries && q.answer == nil {
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
func waitLeader(ctx context.Context, m Member) (string, error) {
	for {
		name := m.Leader()
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
