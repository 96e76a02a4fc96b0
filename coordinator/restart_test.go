package coordinator

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/rankagent"
	"github.com/memsnap/memsnap/runlog"
)

// TestLeaderRestartedOnANewPort: the leader's agent is stopped and started
// again at once on another port (as a restarted pod or process is). Until
// memberlist gives its name the new address, every other member still has the
// old one; the successor must not take the leader for silent meanwhile: a
// window asked of the restarted leader is published with every rank (their
// answers go where it listens now), and terms are taken only
// by the restarted leader (and, at most, one by the successor before it).
func TestLeaderRestartedOnANewPort(t *testing.T) {
	tc := startCluster(t, 3)
	testutil.Eventually(t, time.Minute, "rank 0 to lead", func() bool { return tc.ranks[0].Coord.IsLeader() })
	old := tc.ranks[0].Coord.Term()
	was := tc.ranks[0].Coord.Addr()
	tc.ranks[0].Coord.Shutdown()
	tc.stops[0]()
	tc.startRank(0, 3)
	if tc.ranks[0].Coord.Addr() == was {
		t.Skipf("rank 0 was given its old address %s again", was)
	}
	testutil.Eventually(t, time.Minute, "the restarted rank 0 to lead under a newer term", func() bool {
		return tc.ranks[0].Coord.IsLeader() && tc.ranks[0].Coord.Term() > old
	})
	c := tc.client()
	res, err := c.Snapshot(testutil.Context(t, 2*time.Minute), 2, nil, nil)
	if err != nil || res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Missing) != 0 {
		t.Fatalf("a window asked of the restarted leader: %+v %v", res, err)
	}
	testutil.Eventually(t, time.Minute, "every rank to know the restarted rank 0's address", func() bool {
		addr, name := tc.ranks[0].Coord.Addr(), tc.ranks[0].Coord.Name()
		for _, r := range tc.ranks[1:] {
			ml := r.Coord.memberlist()
			if ml == nil {
				return false
			}
			known := false
			for _, n := range ml.Members() {
				known = known || n.Name == name && n.Address() == addr
			}
			if !known {
				return false
			}
		}
		return true
	})
	st, _ := store.OpenDir(tc.dir, false)
	terms, err := runlog.New(st, tc.run).Terms(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var after []uint64
	for _, x := range terms {
		if x > old {
			after = append(after, x)
		}
	}
	held, _ := tc.ranks[1].Coord.Silences()
	if len(after) > 2 || held > 1 || !tc.ranks[0].Coord.IsLeader() || tc.ranks[0].Coord.Term() != after[len(after)-1] {
		t.Fatalf("terms after %d: %v; rank 1 held its leader silent %d times; rank 0 leads %v under %d",
			old, after, held, tc.ranks[0].Coord.IsLeader(), tc.ranks[0].Coord.Term())
	}
}

// TestReplyToTheAskersAddress: a reply goes where its request says the asker
// listens, even when this member knows the asker elsewhere (an agent started
// again at another address); other messages go to the member as known.
func TestReplyToTheAskersAddress(t *testing.T) {
	c := &Coordinator{name: "r/rank1", members: map[string]*member{}}
	c.members["r/rank0"] = &member{node: &memberlist.Node{Name: "r/rank0", Addr: net.ParseIP("127.0.0.1"), Port: 7000}, meta: &pb.NodeMeta{Rank: 0}}
	for _, tc := range []struct{ to, addr, want string }{
		{"r/rank0", "", "127.0.0.1:7000"},
		{"r/rank0", "127.0.0.1:7100", "127.0.0.1:7100"},
		{"r/client-1", "127.0.0.2:7200", "127.0.0.2:7200"},
		{"r/rank0", "nonsense", ""},
		{"r/rank2", "", ""},
	} {
		n, err := c.target(tc.to, tc.addr)
		got := ""
		if err == nil {
			got = n.Address()
		}
		if got != tc.want {
			t.Errorf("target(%q, %q) = %q (%v), want %q", tc.to, tc.addr, got, err, tc.want)
		}
	}
}

// TestMovedNews: once a member is known at its new address, memberlist's news
// of the old one (its death) is passed over; news of another address ends the
// move (memberlist caught up).
func TestMovedNews(t *testing.T) {
	c := &Coordinator{}
	c.moves.from = map[string]string{"r/rank0": "127.0.0.1:7000"}
	old := &memberlist.Node{Name: "r/rank0", Addr: net.ParseIP("127.0.0.1"), Port: 7000}
	now := &memberlist.Node{Name: "r/rank0", Addr: net.ParseIP("127.0.0.1"), Port: 7100}
	other := &memberlist.Node{Name: "r/rank1", Addr: net.ParseIP("127.0.0.1"), Port: 7000}
	if !c.movedNews(old) {
		t.Fatal("news of the old address taken")
	}
	if c.movedNews(other) {
		t.Fatal("news of another member passed over")
	}
	if c.movedNews(now) || c.movedNews(old) {
		t.Fatal("the move outlived memberlist's news of the new address")
	}
}

// TestMovedMemberDies: a member started again at another address, known there
// by the others before memberlist gives its name the new address, then dies
// there. memberlist, which holds the old address dead already, never says so
// (its reclaim time is an hour here): the others find it gone by their own
// pings of the new address.
func TestMovedMemberDies(t *testing.T) {
	slow := func(c *Config, _ *rankagent.Config) { c.Memberlist.DeadNodeReclaimTime = time.Hour }
	tc := startCluster(t, 3, slow)
	tc.ranks[2].Coord.Shutdown()
	tc.stops[2]()
	tc.startRank(2, 3, slow)
	name, addr := tc.ranks[2].Coord.Name(), tc.ranks[2].Coord.Addr()
	knownAt := func(c *Coordinator) string {
		if n := c.node(name); n != nil {
			return n.Address()
		}
		return ""
	}
	testutil.Eventually(t, time.Minute, "ranks 0 and 1 to know rank 2 at its new address", func() bool {
		return knownAt(tc.ranks[0].Coord) == addr && knownAt(tc.ranks[1].Coord) == addr
	})
	tc.ranks[2].Coord.Shutdown()
	tc.stops[2]()
	testutil.Eventually(t, time.Minute, "ranks 0 and 1 to find rank 2 gone", func() bool {
		return knownAt(tc.ranks[0].Coord) == "" && knownAt(tc.ranks[1].Coord) == ""
	})
}
