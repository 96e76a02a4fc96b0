package coordinator

import (
	"fmt"
	"maps"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/rankagent"
)

// TestLastHeard: a member taken away was last heard from memberlist's shortest
// suspicion timeout before (so the grace a successor gives it counts from then),
// never later than now.
func TestLastHeard(t *testing.T) {
	ml := DefaultConfig(rankagent.Identity{}).Memberlist // a probe a second, multiplier 2
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		g    goneMember
		now  time.Time
		want time.Time
	}{
		{goneMember{at: at, members: 1024}, at.Add(time.Second), at.Add(-6020 * time.Millisecond)}, // 2 x log10(1024) probes
		{goneMember{at: at, members: 4}, at, at.Add(-2 * time.Second)},                             // the scale is at least 1
		{goneMember{at: at.Add(time.Minute), members: 8}, at, at},                                  // never after now
	} {
		if got := c.g.lastHeard(ml, c.now); !got.Equal(c.want) {
			t.Errorf("%+v at %v: last heard %v, want %v", c.g, c.now, got, c.want)
		}
	}
}

// TestGoneRemembersRanksOnly: what is remembered of members gone is bounded by
// the ranks, not by every client that ever came and went (each `memsnap
// snapshot` is one): 2^16 clients leaving must not stop a rank's death from
// being remembered (its grace would then count from now again).
func TestGoneRemembersRanksOnly(t *testing.T) {
	c := &Coordinator{cfg: DefaultLocalConfig(rankagent.Identity{RunName: "g"}), members: map[string]*member{},
		gone: map[string]goneMember{}, seenAddrs: map[string]string{}, changed: make(chan struct{}, 1)}
	for i := range maxSeenAddrs + 1 {
		n := &memberlist.Node{Name: fmt.Sprintf("g/client-%d", i)}
		c.members[n.Name] = &member{node: n, meta: &pb.NodeMeta{Run: "g", Rank: -1}}
		c.memberChanged(n, true)
	}
	c.memberChanged(&memberlist.Node{Name: "g/rank9"}, true) // never a member here: nothing to remember
	rank := &memberlist.Node{Name: NodeName("g", 3)}
	c.members[rank.Name] = &member{node: rank, meta: &pb.NodeMeta{Run: "g", Rank: 3}}
	c.memberChanged(rank, true)
	now := time.Now().Add(time.Second)
	if got := c.lastHeard(rank.Name, now); !got.Before(now) {
		t.Fatalf("a rank gone after many clients left: last heard %v, now %v", got, now)
	}
	if len(c.gone) != 1 {
		t.Fatalf("%d members remembered as gone, want the one rank", len(c.gone))
	}
}

// TestKeptWithMembers: what is kept with the members so that nothing walks them
// on every update (the count of ranks the rejoin loop reads, the addresses
// joinTargets leaves out, the candidate leader) follows arrivals, updates (a
// member that becomes a rank or stops being one, moves, or claims another rank)
// and departures, and counts neither clients nor another run's members.
func TestKeptWithMembers(t *testing.T) {
	c := &Coordinator{cfg: DefaultLocalConfig(rankagent.Identity{RunName: "n"}), members: map[string]*member{},
		gone: map[string]goneMember{}, seenAddrs: map[string]string{}, changed: make(chan struct{}, 1), joined: true}
	node := func(name, run string, rank int32, port uint16) *memberlist.Node {
		b, err := proto.Marshal(&pb.NodeMeta{Version: 1, Run: run, Rank: rank, WorldSize: 8})
		if err != nil {
			t.Fatal(err)
		}
		return &memberlist.Node{Name: name, Meta: b, Addr: net.IPv4(127, 0, 0, 1), Port: port}
	}
	steps := []struct {
		n       *memberlist.Node
		gone    bool
		members int // members of this run after the step
	}{
		{node("n/rank3", "n", 3, 7003), false, 1},
		{node("n/rank1", "n", 1, 7001), false, 2},
		{node("n/rank1", "n", 1, 7001), false, 2},  // an update: still one rank, still the leader
		{node("c", "n", -1, 7100), false, 3},       // a client
		{node("m/rank0", "m", 0, 7200), false, 3},  // another run's rank
		{node("c", "n", 2, 7100), false, 3},        // a member that becomes a rank
		{node("x", "n", 1, 7300), false, 4},        // another member claiming rank 1: the lower name wins
		{node("n/rank1", "n", -1, 7001), false, 4}, // the leader stops being a rank
		{node("c", "n", 0, 7101), false, 4},        // a member that moves and claims rank 0
		{node("c", "n", 5, 7101), false, 4},        // the leader's rank grows past others'
		{node("n/rank0", "n", 0, 7000), false, 5},
		{node("n/rank0", "n", 0, 7000), true, 4},
		{node("n/rank0", "n", 0, 7000), true, 4}, // gone twice
		{node("c", "n", 2, 7101), true, 3},
		{node("x", "n", 1, 7300), true, 2},
		{node("n/rank1", "n", -1, 7001), true, 1},
		{node("n/rank3", "n", 3, 7003), true, 0},
	}
	for i, s := range steps {
		c.memberChanged(s.n, s.gone)
		if len(c.members) != s.members {
			t.Fatalf("step %d (%s, gone %v): %d members, want %d", i, s.n.Name, s.gone, len(c.members), s.members)
		}
		ranks, addrs, lowest := 0, map[string]int{}, ""
		for name, m := range c.members {
			addrs[m.node.Address()]++
			if m.meta.Rank < 0 {
				continue
			}
			ranks++
			if l := c.members[lowest]; lowest == "" || m.meta.Rank < l.meta.Rank || m.meta.Rank == l.meta.Rank && name < lowest {
				lowest = name
			}
		}
		if c.nranks != ranks {
			t.Fatalf("step %d (%s, gone %v): %d ranks counted, %d among the members", i, s.n.Name, s.gone, c.nranks, ranks)
		}
		if !maps.Equal(c.addrs, addrs) {
			t.Fatalf("step %d (%s, gone %v): addresses kept %v, the members' %v", i, s.n.Name, s.gone, c.addrs, addrs)
		}
		if got := c.electLocked(); got != lowest {
			t.Fatalf("step %d (%s, gone %v): elected %q, want %q", i, s.n.Name, s.gone, got, lowest)
		}
	}
}
