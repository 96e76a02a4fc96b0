package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/memsnap/memsnap/coordinator/client"
	"github.com/memsnap/memsnap/coordinator/leader"
	"github.com/memsnap/memsnap/internal/pb"
)

// Update is one step of a requested window, as Snapshot reports it.
type Update = client.Update

// StepName is a step as people read it ("recording", "planned").
func StepName(s pb.Step) string { return pb.Name(s) }

var (
	// ErrNoLeader: no rank is alive to lead.
	ErrNoLeader = client.ErrNoLeader
	// ErrDetached: Snapshot stopped waiting because its caller said so.
	ErrDetached = client.ErrDetached
	// ErrRefused: the leader refused the request as asked.
	ErrRefused = client.ErrRefused
)

// Snapshot asks the cluster for a window of batches batches (0: the leader's
// default) now, reports every step through progress (which must not block for
// long), and returns how the window ended, once all of it is published. If the
// leader changes meanwhile, the new leader is asked about the same window. Closing
// detach makes it return at once with ErrDetached (the window goes on).
func (c *Coordinator) Snapshot(ctx context.Context, batches int64, progress func(Update), detach <-chan struct{}) (*pb.WindowResult, error) {
	return c.Request(ctx, batches, RequestOptions{Progress: progress, Detach: detach})
}

// RequestOptions are how Request waits.
type RequestOptions = client.RequestOptions

// Request is Snapshot with options.
func (c *Coordinator) Request(ctx context.Context, batches int64, opts RequestOptions) (*pb.WindowResult, error) {
	if batches < 0 || batches > MaxWindowBatches {
		return nil, fmt.Errorf("%w: a window of %d batches (1 to %d)", ErrRefused, batches, MaxWindowBatches)
	}
	return client.Request(ctx, clientSide{c}, batches, opts)
}

// clientSide is a coordinator as a request sees it (client.Member).
type clientSide struct{ c *Coordinator }

func (s clientSide) Expect(buf int) (<-chan *pb.Envelope, uint64) {
	return s.c.expect(buf, s.c.fromRanks())
}

func (s clientSide) Forget(seq uint64) { s.c.forget(seq) }

func (s clientSide) Leader() string {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.leaderName
}

func (s clientSide) Envelope(window uint64) *pb.Envelope { return s.c.envelope(window) }

func (s clientSide) Send(to string, env *pb.Envelope) error { return s.c.send(to, env, true) }

func (s clientSide) Stopped(err error) bool { return errors.Is(err, ErrStopped) }

// status asks the ranks for their status and waits up to StatusTimeout (asking
// again the ranks that have not answered, once).
func (c *Coordinator) status(ctx context.Context, ranks []int) map[int]leader.Status {
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
	out := map[int]leader.Status{}
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
			out[r] = leader.Status{St: s, RTT: now.Sub(sent[r]), When: now}
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
		out[r] = s.St.Batch
	}
	return out, len(out) > 0
}
