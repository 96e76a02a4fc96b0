package coordinator

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

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
	testutil.Eventually(t, time.Minute, "every rank to know the restarted rank 0's address", func() bool { return tc.memberlistKnows(0) })
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
// of its old incarnation (its agent at the old address: its death) is passed
// over; news of any other incarnation (another agent at the old address, or
// the new address) ends the move.
func TestMovedNews(t *testing.T) {
	meta := func(agent string) []byte {
		b, err := proto.Marshal(&pb.NodeMeta{Version: 1, Run: "r", Rank: 0, WorldSize: 2, Agent: agent})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	node := func(name string, port uint16, agent string) *memberlist.Node {
		return &memberlist.Node{Name: name, Addr: net.ParseIP("127.0.0.1"), Port: port, Meta: meta(agent)}
	}
	c := &Coordinator{}
	move := func() { c.moves.from = map[string]moved{"r/rank0": {addr: "127.0.0.1:7000", agent: "aa"}} }
	move()
	if !c.movedNews(node("r/rank0", 7000, "aa")) || !c.movedNews(node("r/rank0", 7000, "aa")) {
		t.Fatal("news of the old incarnation taken")
	}
	if c.movedNews(node("r/rank1", 7000, "aa")) {
		t.Fatal("news of another member passed over")
	}
	for _, n := range []*memberlist.Node{node("r/rank0", 7100, "bb"), node("r/rank0", 7000, "cc"), node("r/rank0", 7100, "aa")} {
		move()
		if c.movedNews(n) || c.movedNews(node("r/rank0", 7000, "aa")) {
			t.Fatalf("the move outlived memberlist's news of %s, agent %s", n.Address(), agentOf(n))
		}
	}
}

// knownAt is where c knows name ("" when not a member).
func knownAt(c *Coordinator, name string) string {
	if n := c.node(name); n != nil {
		return n.Address()
	}
	return ""
}

// restartElsewhere stops rank r and starts it again on another port (opts
// given to the new agent), and waits until ranks a and b know it at the new
// address. It returns the old address.
func restartElsewhere(t *testing.T, tc *testCluster, r, a, b int, opts ...clusterOpt) string {
	was, name := tc.ranks[r].Coord.Addr(), tc.ranks[r].Coord.Name()
	tc.ranks[r].Coord.Shutdown()
	tc.stops[r]()
	tc.startRank(r, len(tc.ranks), opts...)
	now := tc.ranks[r].Coord.Addr()
	if now == was {
		t.Skipf("rank %d was given its old address %s again", r, was)
	}
	testutil.Eventually(t, time.Minute, fmt.Sprintf("ranks %d and %d to know rank %d at its new address", a, b, r), func() bool {
		return knownAt(tc.ranks[a].Coord, name) == now && knownAt(tc.ranks[b].Coord, name) == now
	})
	return was
}

// slowReclaim keeps memberlist from giving a name a new address for an hour:
// the members know a restarted one there only through a move.
func slowReclaim(c *Config, _ *rankagent.Config) {
	c.Memberlist.DeadNodeReclaimTime, c.Memberlist.GossipToTheDeadTime = time.Hour, time.Hour
}

// movesOf is c's members moved (name -> the move).
func movesOf(c *Coordinator) map[string]moved {
	c.moves.mu.Lock()
	defer c.moves.mu.Unlock()
	out := map[string]moved{}
	for k, v := range c.moves.from {
		out[k] = v
	}
	return out
}

// TestHeldMovedMemberDies: a member known at its new address through a move
// is held silent for a moment (as a member of its leader's host is, with the
// leader, on a blip) and heard from again; then it dies at its new address.
// The pings of the move went on while it was held: it is found gone.
func TestHeldMovedMemberDies(t *testing.T) {
	p := &partition{group: map[string]int{}}
	cut := func(c *Config, _ *rankagent.Config) {
		g := 0
		if c.Identity.Rank == 2 {
			g = 1
		}
		c.Memberlist.Transport = newCutTransport(t, p, g)
	}
	tc := startCluster(t, 3, slowReclaim, cut)
	restartElsewhere(t, tc, 2, 0, 1, slowReclaim, cut)
	name, b := tc.ranks[2].Coord.Name(), tc.ranks[2].Coord.Addr()
	c0 := tc.ranks[0].Coord
	setCut := func(on bool) { p.mu.Lock(); p.cut = on; p.mu.Unlock() }
	setCut(true)
	if !c0.hold(name, false, "r/blip") {
		t.Fatal("rank 2 not held")
	}
	pinged := c0.moves.pinged.Load()
	testutil.Eventually(t, time.Minute, "rank 0 to ping rank 2 at its new address while it holds it", func() bool { return c0.moves.pinged.Load() > pinged })
	setCut(false)
	testutil.Eventually(t, time.Minute, "rank 0 to hear rank 2 at its new address again", func() bool { return knownAt(c0, name) == b })
	tc.ranks[2].Coord.Shutdown()
	tc.stops[2]()
	testutil.Eventually(t, time.Minute, "rank 0 to find rank 2 gone", func() bool { return knownAt(c0, name) == "" && !c0.holds(name) })
}

// TestLeaderMovedTwice: the leader moves from A to B, dies there (its
// successor holds it silent and leads), and is started again at a third
// address C. The move to B ends once B is silent, and the others know the
// leader at C as they knew it at B: it leads again, and its successor does not.
func TestLeaderMovedTwice(t *testing.T) {
	fast := func(c *Config, _ *rankagent.Config) {
		c.LeaderProbe, c.LeaderSilence = 100*time.Millisecond, 400*time.Millisecond
	}
	tc := startCluster(t, 3, slowReclaim, fast)
	testutil.Eventually(t, time.Minute, "rank 0 to lead", func() bool { return tc.ranks[0].Coord.IsLeader() })
	restartElsewhere(t, tc, 0, 1, 2, slowReclaim, fast)
	name, b := tc.ranks[0].Coord.Name(), tc.ranks[0].Coord.Addr()
	testutil.Eventually(t, time.Minute, "rank 0 to lead at B, heard there by its successor", func() bool {
		return tc.ranks[0].Coord.IsLeader() && !tc.ranks[1].Coord.IsLeader() && tc.ranks[1].Coord.watch.heardIn(name)
	})
	tc.ranks[0].Coord.Shutdown()
	tc.stops[0]()
	testutil.Eventually(t, time.Minute, "ranks 1 and 2 to end the move to B and rank 1 to lead", func() bool {
		return len(movesOf(tc.ranks[1].Coord)) == 0 && len(movesOf(tc.ranks[2].Coord)) == 0 && tc.ranks[1].Coord.IsLeader()
	})
	tc.startRank(0, 3, slowReclaim, fast)
	c := tc.ranks[0].Coord.Addr()
	if c == b {
		t.Skipf("rank 0 was given B (%s) again", b)
	}
	testutil.Eventually(t, time.Minute, "ranks 1 and 2 to know rank 0 at C, and rank 0 alone to lead", func() bool {
		return knownAt(tc.ranks[1].Coord, name) == c && knownAt(tc.ranks[2].Coord, name) == c &&
			tc.ranks[0].Coord.IsLeader() && !tc.ranks[1].Coord.IsLeader()
	})
}

// TestMovedMemberDies: a member started again at another address, known there
// by the others through a move, then dies there. memberlist, which holds the
// old address dead already, never says so: the others find it gone by their
// own pings of the new address.
func TestMovedMemberDies(t *testing.T) {
	tc := startCluster(t, 3, slowReclaim)
	restartElsewhere(t, tc, 2, 0, 1, slowReclaim)
	name := tc.ranks[2].Coord.Name()
	tc.ranks[2].Coord.Shutdown()
	tc.stops[2]()
	testutil.Eventually(t, time.Minute, "ranks 0 and 1 to find rank 2 gone", func() bool {
		return knownAt(tc.ranks[0].Coord, name) == "" && knownAt(tc.ranks[1].Coord, name) == ""
	})
}

// TestMovedBack: a member moves from A to B, and its agent is started again at
// A while the others know it at B through a move. memberlist's news of the
// agent at A is not the old incarnation's: the others know it at A again, and
// a window records every rank. The same of the leader: once it leads at A, its
// successor leads in its place only after it dies there.
func TestMovedBack(t *testing.T) {
	for _, r := range []int{2, 0} {
		t.Run(fmt.Sprintf("rank%d", r), func(t *testing.T) {
			tc := startCluster(t, 3, slowReclaim)
			testutil.Eventually(t, time.Minute, "rank 0 to lead", func() bool { return tc.ranks[0].Coord.IsLeader() })
			a, b := 0, 1
			if r == 0 {
				a, b = 1, 2
			}
			was := restartElsewhere(t, tc, r, a, b, slowReclaim)
			name := tc.ranks[r].Coord.Name()
			tc.ranks[r].Coord.Shutdown()
			tc.stops[r]()
			_, p, _ := net.SplitHostPort(was)
			port, _ := strconv.Atoi(p)
			tc.startRank(r, 3, slowReclaim, func(c *Config, _ *rankagent.Config) { c.Memberlist.BindPort, c.Memberlist.AdvertisePort = port, port })
			if got := tc.ranks[r].Coord.Addr(); got != was {
				t.Skipf("rank %d was given %s, not its first address %s", r, got, was)
			}
			testutil.Eventually(t, time.Minute, "the others to know it at its first address again, and rank 0 to lead", func() bool {
				return knownAt(tc.ranks[a].Coord, name) == was && knownAt(tc.ranks[b].Coord, name) == was &&
					tc.ranks[0].Coord.IsLeader() && !tc.ranks[1].Coord.IsLeader()
			})
			c := tc.client()
			res, err := c.Snapshot(testutil.Context(t, 2*time.Minute), 2, nil, nil)
			if err != nil || res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Missing) != 0 {
				t.Fatalf("a window asked after rank %d came back: %+v %v", r, res, err)
			}
			if r != 0 {
				return
			}
			tc.ranks[0].Coord.Shutdown()
			tc.stops[0]()
			testutil.Eventually(t, time.Minute, "rank 1 to lead once rank 0 died at its first address", func() bool { return tc.ranks[1].Coord.IsLeader() })
		})
	}
}

// TestFailedReplyHoldsNothingUp: a reply that failed to the address its
// request gave (an old incarnation's) does not mark the member down: messages
// to it where it is go on. A failed message to the member does.
func TestFailedReplyHoldsNothingUp(t *testing.T) {
	o := newOutbox(&Coordinator{})
	o.done(outMsg{to: "r/rank0", addr: "127.0.0.1:7000"}, true)
	o.put(outMsg{to: "r/rank0", env: &pb.Envelope{}})
	if o.queued != 1 {
		t.Fatalf("a message after a failed reply: %d queued, want 1", o.queued)
	}
	o.put(outMsg{to: "r/rank0", addr: "127.0.0.1:7000", env: &pb.Envelope{}})
	if o.queued != 1 {
		t.Fatalf("a reply to the address that failed: %d queued, want it dropped", o.queued)
	}
	o.done(outMsg{to: "r/rank1"}, true)
	o.put(outMsg{to: "r/rank1", env: &pb.Envelope{}})
	if o.queued != 1 {
		t.Fatalf("a message to a member whose send failed: %d queued, want it dropped", o.queued)
	}
}

// TestWatchers: the members a leader started again elsewhere tells first are
// its successor and, when that shares its host, the first member after it on
// another host.
func TestWatchers(t *testing.T) {
	c := &Coordinator{name: "r/rank0", members: map[string]*member{}}
	for r, ip := range []string{"10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"} {
		addRankAt(c, int32(r), ip)
	}
	if w := c.watchersLocked(); fmt.Sprint(w) != "[r/rank1 r/rank3]" {
		t.Fatalf("watchers of rank 0 %v, want [r/rank1 r/rank3]", w)
	}
	c.name = "r/rank2"
	if w := c.watchersLocked(); fmt.Sprint(w) != "[r/rank3]" {
		t.Fatalf("watchers of rank 2 %v, want [r/rank3]", w)
	}
}

// TestHeardAt: a rank member's message naming another address than the one
// this member knows it at brings a state exchange with that address (once per
// pullEvery); one naming the known address, or from a name not its rank's,
// none.
func TestHeardAt(t *testing.T) {
	c := &Coordinator{name: "r/rank1", members: map[string]*member{}}
	c.cfg.Identity.RunName = "r"
	c.members["r/rank0"] = &member{node: &memberlist.Node{Name: "r/rank0", Addr: net.ParseIP("127.0.0.1"), Port: 7000}, meta: &pb.NodeMeta{Rank: 0}, addr: "127.0.0.1:7000"}
	pulled := func() bool {
		c.moves.mu.Lock()
		defer c.moves.mu.Unlock()
		_, ok := c.moves.pulled["r/rank0"]
		return ok
	}
	for _, env := range []*pb.Envelope{
		{Sender: "r/rank0", SenderRank: 0, ReplyAddr: "127.0.0.1:7000"},
		{Sender: "r/rank0", SenderRank: 1, ReplyAddr: "127.0.0.1:7100"},
		{Sender: "r/rank0", SenderRank: 0},
	} {
		if c.heardAt(env); pulled() {
			t.Fatalf("a state exchange for %+v", env)
		}
	}
	if c.heardAt(&pb.Envelope{Sender: "r/rank0", SenderRank: 0, ReplyAddr: "127.0.0.1:7100"}); !pulled() {
		t.Fatal("no state exchange with a new address")
	}
	// and of a rank memberlist took away (its old address dead): known by the
	// address it was last seen at
	c.members, c.seenAddrs = map[string]*member{}, map[string]string{"r/rank2": "127.0.0.1:7200"}
	c.wg.Wait()
	c.moves.inFlight = false
	if c.heardAt(&pb.Envelope{Sender: "r/rank2", SenderRank: 2, ReplyAddr: "127.0.0.1:7300"}); !func() bool {
		c.moves.mu.Lock()
		defer c.moves.mu.Unlock()
		_, ok := c.moves.pulled["r/rank2"]
		return ok
	}() {
		t.Fatal("no state exchange for a rank taken away that speaks from a new address")
	}
}

// TestStaleNewsKeepsTheMove: a member moved twice (X, Y, then Z); late news of
// Y reaches a member that knows it at Z (a conflict with memberlist's X). Y
// answers no ping: the move to Z stands, and once the member dies at Z it is
// found gone.
func TestStaleNewsKeepsTheMove(t *testing.T) {
	tc := startCluster(t, 3, slowReclaim)
	name, c0 := tc.ranks[2].Coord.Name(), tc.ranks[0].Coord
	x := restartElsewhere(t, tc, 2, 0, 1, slowReclaim)
	y := *c0.node(name) // (Y as rank 0 knows it, its metadata with it)
	restartElsewhere(t, tc, 2, 0, 1, slowReclaim)
	z := tc.ranks[2].Coord.Addr()
	testutil.Eventually(t, time.Minute, "rank 0 to follow the move to Z", func() bool { return movesOf(c0)[name].to == z })
	h, p, _ := net.SplitHostPort(x)
	port, _ := strconv.Atoi(p)
	existing := memberlist.Node{Name: name, Addr: net.ParseIP(h), Port: uint16(port), Meta: y.Meta}
	c0.moves.mu.Lock()
	delete(c0.moves.last, name) // (a check is due)
	c0.moves.mu.Unlock()
	(&conflicts{c0}).NotifyConflict(&existing, &y) // (as memberlist calls it)
	testutil.Eventually(t, time.Minute, "rank 0's check of Y to end", func() bool {
		c0.moves.mu.Lock()
		defer c0.moves.mu.Unlock()
		return !c0.moves.checking[name]
	})
	if m := movesOf(c0)[name]; m.to != z || knownAt(c0, name) != z {
		t.Fatalf("after stale news of Y: rank 0's move %+v, knows rank 2 at %q; want Z %s", m, knownAt(c0, name), z)
	}
	tc.ranks[2].Coord.Shutdown()
	tc.stops[2]()
	testutil.Eventually(t, time.Minute, "rank 0 to find rank 2 gone", func() bool { return knownAt(c0, name) == "" && !c0.holds(name) })
}

// TestAnnounceMove: a leader started again elsewhere exchanges state with both
// its watchers; one that knows no leader yet (its join under way) announces
// once it does.
func TestAnnounceMove(t *testing.T) {
	c := &Coordinator{name: "r/rank0", members: map[string]*member{}}
	c.cfg.Identity.RunName = "r"
	for r, ip := range []string{"10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"} {
		addRankAt(c, int32(r), ip)
	}
	pulled := func() []string {
		c.wg.Wait()
		c.moves.mu.Lock()
		defer c.moves.mu.Unlock()
		var out []string
		for n := range c.moves.pulled {
			out = append(out, n)
		}
		slices.Sort(out)
		return out
	}
	c.announceMove() // (no leader known yet)
	if p := pulled(); len(p) != 0 || !c.moves.announce {
		t.Fatalf("with no leader known: pulled %v, announcement pending %v", p, c.moves.announce)
	}
	c.leaderName = c.name
	c.announceDue()
	if p := pulled(); fmt.Sprint(p) != "[r/rank1 r/rank3]" || c.moves.announce {
		t.Fatalf("once leading: pulled %v, want [r/rank1 r/rank3]; announcement pending %v", p, c.moves.announce)
	}
}
