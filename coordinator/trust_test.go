package coordinator

import (
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/rankagent"
)

// bogus is a recorder whose trainer reports a batch far from every other
// rank's (10^9), as a trainer with a bug would.
type bogus struct{ *rankagent.Agent }

func (b *bogus) Progress() (int64, time.Duration) {
	_, step := b.Agent.Progress()
	return 1_000_000_000, step
}

// silent is a recorder that takes every plan and never records it, while its
// trainer trains on: its batch keeps advancing, so it never looks dead.
type silent struct{ *rankagent.Agent }

func (s *silent) Arm(w rankagent.Window) error { return nil }

// TestImplausibleProgressIsLeftOut: a rank whose trainer reports batch 10^9 does
// not make the leader plan a window no healthy rank reaches: it is left out, with
// the reason, and the window is published with the others.
func TestImplausibleProgressIsLeftOut(t *testing.T) {
	tc := startClusterWith(t, 3, func(r int, a *rankagent.Agent) Recorder {
		if r == 2 {
			return &bogus{a}
		}
		return a
	})
	testutil.Eventually(t, 30*time.Second, "ranks 0 and 1 holding", func() bool {
		return tc.ranks[0].Agent.Batch() == tc.holdAt-1 && tc.ranks[1].Agent.Batch() == tc.holdAt-1
	})
	c := tc.client()
	res, err := c.Snapshot(testutil.Context(t, time.Minute), 3, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != 2 || !strings.Contains(res.Missing[2], "batch 1000000000") || res.Start > 1000 {
		t.Fatalf("result %+v", res)
	}
}

// TestEveryWindowEnds: a rank that takes the plan and never records it, while its
// batch keeps advancing (so it never looks dead), cannot hold the window open
// past its deadline, which the member that asked is told when the window is
// planned; the window is published with the other ranks.
func TestEveryWindowEnds(t *testing.T) {
	tc := startClusterWith(t, 3, func(r int, a *rankagent.Agent) Recorder {
		if r == 2 {
			return &silent{a}
		}
		return a
	}, func(c *Config, a *rankagent.Config) {
		c.MaxWindowWait = 8 * time.Second
		c.CollectTimeout = time.Hour // only the deadline can end the window
	})
	tc.holding()
	c := tc.client()
	var deadline time.Time
	start := time.Now()
	res, err := c.Snapshot(testutil.Context(t, 2*time.Minute), 3, func(u Update) {
		if u.State == pb.Step_STEP_PLANNED {
			deadline = u.Deadline
		}
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if deadline.IsZero() || deadline.Before(start) || deadline.After(start.Add(10*time.Second)) {
		t.Fatalf("the client was told the window's deadline %v (asked at %v, bound 8s)", deadline, start)
	}
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != 2 || !strings.Contains(res.Missing[2], "deadline") {
		t.Fatalf("result %+v", res)
	}
}
