package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
)

// Update is one step of a requested window, as Snapshot reports it.
type Update struct {
	Window   uint64
	Rank     int // -1 for the window as a whole
	State    string
	Batch    int64
	Reason   string
	Leader   int
	Received time.Time
}

var (
	// ErrNoLeader: no rank is alive to lead.
	ErrNoLeader = errors.New("coordinator: no leader")
	// ErrDetached: Snapshot stopped waiting because its caller said so.
	ErrDetached = errors.New("coordinator: stopped watching the window")
)

// Snapshot asks the cluster for a window of batches batches (0: the leader's
// default) now, reports every step through progress (which must not block for
// long), and returns how the window ended. If the leader changes meanwhile, the new
// leader is asked about the same window. Closing detach makes it return at once
// with ErrDetached (the window goes on).
func (c *Coordinator) Snapshot(ctx context.Context, batches int64, progress func(Update), detach <-chan struct{}) (*pb.WindowResult, error) {
	ch, seq := c.expect(1 << 16)
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
		reason := "request"
		if window != 0 {
			reason = "watch"
		}
		env.Body = &pb.Envelope_Request{Request: &pb.SnapshotRequest{Batches: batches, Reason: reason, Watch: true}}
		return c.send(name, env, true)
	}
	if err := ask(); err != nil {
		return nil, err
	}
	check := time.NewTicker(500 * time.Millisecond)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-detach:
			return nil, ErrDetached
		case <-check.C:
			c.mu.Lock()
			now := c.leaderName
			c.mu.Unlock()
			if now != leader {
				if progress != nil {
					progress(Update{Window: window, Rank: -1, State: "leader changed", Received: time.Now()})
				}
				if err := ask(); err != nil {
					return nil, err
				}
			}
		case env := <-ch:
			if env.WindowId != 0 {
				window = env.WindowId
			}
			switch b := env.Body.(type) {
			case *pb.Envelope_Ack:
				if b.Ack.Code == "not_leader" {
					time.Sleep(100 * time.Millisecond) // membership is converging; ask again
					if err := ask(); err != nil {
						return nil, err
					}
				} else if !b.Ack.Ok {
					return nil, fmt.Errorf("coordinator: the leader refused: %s", b.Ack.Message)
				}
			case *pb.Envelope_Progress:
				if progress != nil {
					progress(Update{Window: env.WindowId, Rank: int(b.Progress.Rank), State: b.Progress.State, Batch: b.Progress.Batch,
						Reason: b.Progress.Reason, Leader: int(env.SenderRank), Received: time.Now()})
				}
			case *pb.Envelope_WindowResult:
				if b.WindowResult.State == "unknown" && window != 0 {
					continue // a leader that does not know the window yet; it will
				}
				return b.WindowResult, nil
			}
		}
	}
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
	ch, seq := c.expect(len(ranks) + 16)
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
		if err := c.send(n.Name, env, false); err != nil {
			c.log.Debug("status request not sent", "rank", r, "err", err)
		}
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
