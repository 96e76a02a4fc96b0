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
