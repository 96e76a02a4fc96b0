package coordinator

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/rankagent"
)

// clockCounter is a rank's agent that counts the clock offsets its coordinator
// sets: one per measurement, every ClockInterval.
type clockCounter struct {
	*rankagent.Agent
	n atomic.Int64
}

func (c *clockCounter) SetClockOffset(offset, rtt time.Duration) {
	c.n.Add(1)
	c.Agent.SetClockOffset(offset, rtt)
}

// TestMetadataGossipedOnlyWhenItChanges: a member's metadata is gossiped
// (memberlist's UpdateNode, which every other member sees as a NotifyUpdate that
// replaces its record of that member) only when what it says changes. Over many
// clock intervals of a quiet cluster no member's record of another is replaced;
// when the leader goes and a new one takes a newer term, the new term reaches the
// others as an update of the leader's metadata, and of no other member's; then
// the cluster is quiet again.
func TestMetadataGossipedOnlyWhenItChanges(t *testing.T) {
	const intervals = 20
	counters := make([]*clockCounter, 3)
	tc := startClusterWith(t, 3, func(r int, a *rankagent.Agent) Recorder {
		counters[r] = &clockCounter{Agent: a}
		return counters[r]
	}, func(c *Config, _ *rankagent.Config) { c.ClockInterval = 50 * time.Millisecond })

	type pair struct{ observer, of int }
	// views is every live rank's record of every other live rank
	views := func(alive []int) map[pair]*member {
		out := map[pair]*member{}
		for _, o := range alive {
			c := tc.ranks[o].Coord
			c.mu.Lock()
			for _, x := range alive {
				if x != o {
					out[pair{o, x}] = c.members[NodeName(tc.run, x)]
				}
			}
			c.mu.Unlock()
		}
		return out
	}
	// settled: every rank knows the leader's term, the leader has gossiped it,
	// every rank has gossiped its GPU, and every other live rank's record of a
	// rank says what that rank last gossiped
	settled := func(alive []int, leader int) bool {
		v := views(alive)
		lt := tc.ranks[leader].Coord.Term()
		for _, x := range alive {
			c := tc.ranks[x].Coord
			c.mu.Lock()
			term, sent := c.term, c.metaSent
			c.mu.Unlock()
			// (the GPU is known once the trainer connected, and gossiped then)
			if term != lt || x == leader && sent.term != term || sent.gpu != tc.ranks[x].Agent.DeviceUUID() {
				return false
			}
			for _, o := range alive {
				if m := v[pair{o, x}]; o != x && (m == nil || m.meta.Term != sent.term || m.meta.LastWindow != sent.window || m.meta.GpuUuid != sent.gpu) {
					return false
				}
			}
		}
		return true
	}
	// updated lists the records replaced by newer metadata since base (a record
	// replaced by the same metadata is a member that flapped and rejoined, not
	// an update)
	updated := func(alive []int, base map[pair]*member) []string {
		var out []string
		for p, now := range views(alive) {
			old := base[p]
			if now != old && (now == nil || old == nil || !proto.Equal(now.meta, old.meta)) {
				out = append(out, fmt.Sprintf("rank %d's record of rank %d: %v -> %v", p.observer, p.of, metaOf(old), metaOf(now)))
			}
		}
		return out
	}
	// quiet waits for every live rank to measure its clock intervals more times
	quiet := func(alive []int) {
		t.Helper()
		base := map[int]int64{}
		for _, r := range alive {
			base[r] = counters[r].n.Load()
		}
		testutil.Eventually(t, time.Minute, fmt.Sprintf("every rank to measure its clock %d more times", intervals), func() bool {
			for _, r := range alive {
				if counters[r].n.Load() < base[r]+intervals {
					return false
				}
			}
			return true
		})
	}

	all := []int{0, 1, 2}
	var term uint64
	testutil.Eventually(t, 30*time.Second, "rank 0 to lead under a term every rank knows, and gossip to settle", func() bool {
		term = tc.ranks[0].Coord.Term()
		return tc.ranks[0].Coord.IsLeader() && term > 0 && settled(all, 0)
	})
	base := views(all)
	quiet(all)
	if u := updated(all, base); len(u) > 0 {
		t.Fatalf("metadata gossiped while nothing changed (%d updates): %v", len(u), u)
	}

	// a new leader, with a newer term: that is news
	tc.stops[0]()
	rest := []int{1, 2}
	base = views(rest)
	testutil.Eventually(t, time.Minute, "rank 1 to lead under a newer term, and rank 2 to hear it", func() bool {
		c := tc.ranks[1].Coord
		m := views(rest)[pair{2, 1}]
		return c.IsLeader() && c.Term() > term && m != nil && m.meta.Term == c.Term() && settled(rest, 1)
	})
	// the leader's record is the one update: rank 2 does not gossip the term
	// it heard of (at 1,024 members that would be a million updates a failover)
	if u := updated(rest, base); len(u) != 1 || !strings.HasPrefix(u[0], "rank 2's record of rank 1:") {
		t.Fatalf("the new term's updates: %v, want rank 2's record of rank 1 alone", u)
	} else {
		t.Logf("updates for the new term: %v", u)
	}
	base = views(rest)
	quiet(rest)
	if u := updated(rest, base); len(u) > 0 {
		t.Fatalf("metadata gossiped after the new term settled (%d updates): %v", len(u), u)
	}
}

func metaOf(m *member) string {
	if m == nil {
		return "gone"
	}
	return "{" + m.meta.String() + "}"
}
