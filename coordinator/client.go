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
}

// Request is Snapshot with options.
func (c *Coordinator) Request(ctx context.Context, batches int64, opts RequestOptions) (*pb.WindowResult, error) {
	progress, detach := opts.Progress, opts.Detach
	if batches < 0 || batches > MaxWindowBatches {
		return nil, fmt.Errorf("%w: a window of %d batches (1 to %d)", ErrRefused, batches, MaxWindowBatches)
	}
	ch, seq := c.expect(1<<16, c.fromRanks())
	defer c.forget(seq)
	var window uint64
	leader := ""
	ask := func() error {
		name, err := c.waitLeader(ctx)
		if err != nil {
			return err
		}
		leader = name
		env := c.envelope(window)
		env.Seq = seq
		req := &pb.SnapshotRequest{Batches: batches, Reason: "request", Watch: true, Kind: pb.WindowKind_WINDOW_KIND_WINDOW}
		if dl, ok := ctx.Deadline(); ok {
			req.ExpiresUs = dl.UnixMicro() // a leader that gets to it later does not plan it
		}
		env.Body = &pb.Envelope_Request{Request: req}
		return c.send(name, env, true)
	}
	// A leader that cannot be reached (it is dying, and gossip has not yet said
	// so) is asked again until ctx ends: its successor takes the request over.
	var again <-chan time.Time
	var unreachable error // the last failure to reach the leader
	try := func() error {
		err := ask()
		switch {
		case err == nil:
			unreachable = nil
			return nil
		case errors.Is(err, ErrStopped) || errors.Is(err, ErrNoLeader) || ctx.Err() != nil:
			return err
		}
		if unreachable == nil && progress != nil {
			progress(Update{Window: window, Rank: -1, Reason: fmt.Sprintf("could not reach the leader (%v); asking again", err), Received: time.Now()})
		}
		unreachable = err
		again = time.After(retryReachAfter)
		return nil
	}
	if err := try(); err != nil {
		return nil, err
	}
	check := time.NewTicker(500 * time.Millisecond)
	defer check.Stop()
	unknown := 0
	var answer *pb.WindowResult // the answer, once published (its pickles still to come)
	lastWord := ""              // what the leader last said of a store it cannot use
	heard := time.Now()         // when the leader last said something about the window
	var answered uint64         // the window whose answer came (its pickles still being written)
	answeredBy := int32(-1)     // the rank of the leader that sent it
	for {
		select {
		case <-ctx.Done():
			if answer != nil {
				// the answer is out: that is what the window published so far
				res := proto.Clone(answer).(*pb.WindowResult)
				res.Error = "gave up waiting for the merged pickles and the timeline: " + ctx.Err().Error()
				if lastWord != "" {
					res.Error += " (the leader last said: " + lastWord + ")"
				}
				return res, nil
			}
			if unreachable != nil {
				return nil, fmt.Errorf("%w (the leader was last unreachable: %v)", ctx.Err(), unreachable)
			}
			return nil, ctx.Err()
		case <-detach:
			return nil, ErrDetached
		case <-again:
			again = nil
			if err := try(); err != nil {
				return nil, err
			}
		case <-check.C:
			c.mu.Lock()
			now := c.leaderName
			c.mu.Unlock()
			if now == leader && time.Since(heard) > rewatchAfter {
				// nothing heard for a while: ask again, the same request (a
				// message may have been lost, the leader's agent restarted with
				// the request queued, or the job was relaunched under the same
				// member names); a leader that has it already says so
				heard = time.Now()
				if err := try(); err != nil {
					return nil, err
				}
			}
			if now != leader && now != "" {
				if progress != nil {
					progress(Update{Window: window, Rank: -1, State: pb.Step_STEP_UNSPECIFIED, Reason: "the leader changed; asking the new one", Received: time.Now()})
				}
				if err := try(); err != nil {
					return nil, err
				}
			}
		case env := <-ch:
			heard = time.Now()
			if env.WindowId != 0 {
				window = env.WindowId
			}
			switch b := env.Body.(type) {
			case *pb.Envelope_Ack:
				switch {
				case b.Ack.Code == pb.AckCode_ACK_NOT_LEADER:
					again = time.After(100 * time.Millisecond) // membership is converging; ask again
				case !b.Ack.Ok:
					return nil, fmt.Errorf("%w: %s", ErrRefused, b.Ack.Message)
				}
			case *pb.Envelope_Progress:
				if progress == nil || overtaken(env, answered, answeredBy) {
					break // (overtaken: told before the answer, which came first: old news)
				}
				if len(b.Progress.Steps) > 0 {
					// many ranks' steps, gathered by the leader of a large window
					now := time.Now()
					for _, st := range b.Progress.Steps {
						progress(Update{Window: env.WindowId, Rank: int(st.Rank), State: st.State, Batch: st.Batch,
							Reason: st.Reason, Leader: int(env.SenderRank), Received: now})
					}
				} else {
					u := Update{Window: env.WindowId, Rank: int(b.Progress.Rank), State: b.Progress.State, Batch: b.Progress.Batch,
						Reason: b.Progress.Reason, Leader: int(env.SenderRank), Received: time.Now()}
					if b.Progress.DeadlineUs > 0 {
						u.Deadline = time.UnixMicro(b.Progress.DeadlineUs)
					}
					progress(u)
				}
			case *pb.Envelope_WindowResult:
				r := b.WindowResult
				if r.State == pb.Outcome_OUTCOME_UNKNOWN && window != 0 {
					// a leader that cannot tell yet (its store is away): ask again a
					// few times; with the answer out, until the rest comes or the
					// caller stops waiting (the answer is the truth so far)
					lastWord = r.Error
					if unknown++; unknown >= unknownTries && answer == nil {
						return r, nil
					}
					again = time.After(min(time.Duration(unknown)*time.Second, 10*time.Second))
					if progress != nil {
						progress(Update{Window: window, Rank: -1, Reason: "the leader cannot tell yet (" + r.Error + "); asking again", Received: time.Now()})
					}
					continue
				}
				if r.Window == 0 {
					r.Window = window
				}
				if r.Pending && r.State == pb.Outcome_OUTCOME_PUBLISHED && r.Error == "" && !opts.AnswerFirst {
					// the answer: the rest of the window is still being written
					answered, answeredBy, answer = r.Window, env.SenderRank, r
					if progress != nil {
						progress(Update{Window: r.Window, Rank: -1, State: pb.Step_STEP_PUBLISHING, Leader: int(env.SenderRank),
							Reason: "the answer is published; writing the merged pickles and the timeline", Received: time.Now(), Answer: r})
					}
					continue
				}
				return r, nil
			}
		}
	}
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
