package coordinator

import (
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/rankagent"
)

// TestSuccessorLeadsBeforeDeathIsDeclared: the leader is cut off from every
// other member (as a dead host is). Its successor, pinging it directly, holds it
// silent and leads, and the other rank follows at once, long before memberlist
// would declare the leader dead (here its suspicion takes a minute: the leader
// is still one of memberlist's members when the successor leads). A window
// asked for then is published by the successor. When the cut heals the old
// leader is heard from again and leads again: each rank counts the silence and
// that the leader lived.
func TestSuccessorLeadsBeforeDeathIsDeclared(t *testing.T) {
	p := &partition{group: map[string]int{}}
	tc := startCluster(t, 3, func(c *Config, a *rankagent.Config) {
		if !c.Client {
			group := 1
			if c.Identity.Rank == 0 {
				group = 0
			}
			c.Memberlist.Transport = newCutTransport(t, p, group)
			c.Memberlist.SuspicionMult = 120 // memberlist's own verdict: a minute after the cut
		}
	})
	tc.holding()
	old := tc.ranks[0].Coord
	testutil.Eventually(t, time.Minute, "rank 0 leading under a term every rank knows", func() bool {
		term := old.Term()
		return old.IsLeader() && term > 0 && tc.ranks[1].Coord.Term() == term && tc.ranks[2].Coord.Term() == term
	})
	term := old.Term()
	succ := tc.ranks[1].Coord
	// a client on the successor's side of the cut, there before it
	cfg := DefaultLocalConfig(rankagent.Identity{RunName: tc.run})
	cfg.Client, cfg.SecretKey, cfg.Logger = true, tc.key, testutil.Logger(t).With("member", "client")
	cfg.Memberlist.Transport = newCutTransport(t, p, 1)
	cfg.Memberlist.SuspicionMult = 120
	cfg.Join = []string{succ.Addr()}
	cl, stop := runMember(t, cfg)
	t.Cleanup(stop)
	testutil.Eventually(t, 30*time.Second, "the client to see rank 0 lead, and rank 1 to have heard rank 0 answer its pings", func() bool {
		l, ok := cl.Leader()
		return ok && l == 0 && succ.watch.heardIn(NodeName(tc.run, 0))
	})
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
	rank0 := NodeName(tc.run, 0)
	testutil.Eventually(t, 30*time.Second, "rank 1 leading under a newer term, rank 2 following it", func() bool {
		l, ok := tc.ranks[2].Coord.Leader()
		return succ.IsLeader() && succ.Term() > term && ok && l == 1
	})
	for r := 1; r < 3; r++ {
		c := tc.ranks[r].Coord
		if held, alive := c.Silences(); held != 1 || alive != 0 {
			t.Fatalf("rank %d held the leader silent %d times, heard from again %d", r, held, alive)
		}
		if !slices.ContainsFunc(c.memberlist().Members(), func(n *memberlist.Node) bool { return n.Name == rank0 }) {
			t.Fatalf("rank %d: memberlist declared rank 0 dead already: the successor's silence was not what elected", r)
		}
	}
	// the successor serves a window of the ranks it reaches
	testutil.Eventually(t, 30*time.Second, "the client to see rank 1 lead", func() bool { l, ok := cl.Leader(); return ok && l == 1 })
	res, err := cl.Snapshot(testutil.Context(t, 2*time.Minute), 2, nil, nil)
	if err != nil || res.State != pb.Outcome_OUTCOME_PUBLISHED || fmt.Sprint(res.Ranks) != "[1 2]" || res.Missing[0] == "" {
		t.Fatalf("a window asked of the successor: %+v %v", res, err)
	}
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
	testutil.Eventually(t, time.Minute, "rank 0 leading again, every rank following it", func() bool {
		for _, rk := range tc.ranks {
			if l, ok := rk.Coord.Leader(); !ok || l != 0 {
				return false
			}
		}
		return old.IsLeader() && !succ.IsLeader()
	})
	if _, alive := succ.Silences(); alive != 1 {
		t.Fatalf("rank 1 heard the silent leader again %d times", alive)
	}
}

// TestSuccessor: the successor is the lowest rank after the leader's; clients
// are never one.
func TestSuccessor(t *testing.T) {
	c := &Coordinator{members: map[string]*member{}}
	add := func(name string, rank int32) {
		c.members[name] = &member{node: &memberlist.Node{Name: name}, meta: &pb.NodeMeta{Rank: rank}}
	}
	add("r/rank0", 0)
	add("r/client", -1)
	if s := c.successorLocked("r/rank0"); s != "" {
		t.Fatalf("a lone rank's successor: %q", s)
	}
	add("r/rank5", 5)
	add("r/rank2", 2)
	add("r/rank3", 3)
	for leader, want := range map[string]string{"r/rank0": "r/rank2", "r/rank2": "r/rank3", "r/rank5": "", "r/gone": ""} {
		if s := c.successorLocked(leader); s != want {
			t.Errorf("the successor of %s: %q, want %q", leader, s, want)
		}
	}
}

// TestHostDiesWithItsLeader: the leader (rank 0) and its successor (rank 1)
// share a host, and that host is cut off from the other (as a host that dies
// is). The first rank on the other host watches the leader too: hearing
// nothing, and nothing from rank 1 either, it holds both silent and leads, and
// rank 3 follows at once, long before memberlist would declare them dead. A
// window asked for then is published by rank 2. When the cut heals, rank 0
// leads again and rank 1 is a member again; only the leader's silence is
// counted.
func TestHostDiesWithItsLeader(t *testing.T) {
	p := &partition{group: map[string]int{}}
	hostOf := func(rank int) int { return rank / 2 }
	tc := startCluster(t, 4, func(c *Config, a *rankagent.Config) {
		if !c.Client {
			h := hostOf(c.Identity.Rank)
			c.Memberlist.Transport = newCutTransportAt(t, p, h, fmt.Sprintf("127.0.0.%d", 11+h))
			c.Memberlist.SuspicionMult = 120 // memberlist's own verdict: a minute after the cut
		}
	})
	tc.holding()
	old := tc.ranks[0].Coord
	testutil.Eventually(t, time.Minute, "rank 0 leading under a term every rank knows", func() bool {
		term := old.Term()
		for _, r := range tc.ranks {
			if r.Coord.Term() != term {
				return false
			}
		}
		return old.IsLeader() && term > 0
	})
	term := old.Term()
	off := tc.ranks[2].Coord
	cfg := DefaultLocalConfig(rankagent.Identity{RunName: tc.run})
	cfg.Client, cfg.SecretKey, cfg.Logger = true, tc.key, testutil.Logger(t).With("member", "client")
	cfg.Memberlist.Transport = newCutTransportAt(t, p, 1, "127.0.0.12")
	cfg.Memberlist.SuspicionMult = 120
	cfg.Join = []string{off.Addr()}
	cl, stop := runMember(t, cfg)
	t.Cleanup(stop)
	rank0, rank1 := NodeName(tc.run, 0), NodeName(tc.run, 1)
	testutil.Eventually(t, 30*time.Second, "the client to see rank 0 lead, and rank 2 to have heard rank 0 answer its pings", func() bool {
		l, ok := cl.Leader()
		return ok && l == 0 && off.watch.heardIn(rank0)
	})
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
	testutil.Eventually(t, 30*time.Second, "rank 2 leading under a newer term, rank 3 following it", func() bool {
		l, ok := tc.ranks[3].Coord.Leader()
		return off.IsLeader() && off.Term() > term && ok && l == 2
	})
	for r := 2; r < 4; r++ {
		c := tc.ranks[r].Coord
		if held, alive := c.Silences(); held != 1 || alive != 0 {
			t.Fatalf("rank %d held the leader silent %d times, heard from again %d", r, held, alive)
		}
		for _, name := range []string{rank0, rank1} {
			if !slices.ContainsFunc(c.memberlist().Members(), func(n *memberlist.Node) bool { return n.Name == name }) {
				t.Fatalf("rank %d: memberlist declared %s dead already: the off-host watch was not what elected", r, name)
			}
		}
	}
	testutil.Eventually(t, 30*time.Second, "the client to see rank 2 lead", func() bool { l, ok := cl.Leader(); return ok && l == 2 })
	res, err := cl.Snapshot(testutil.Context(t, 2*time.Minute), 2, nil, nil)
	if err != nil || res.State != pb.Outcome_OUTCOME_PUBLISHED || fmt.Sprint(res.Ranks) != "[2 3]" || res.Missing[0] == "" || res.Missing[1] == "" {
		t.Fatalf("a window asked of rank 2: %+v %v", res, err)
	}
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
	testutil.Eventually(t, time.Minute, "rank 0 leading again, every rank following it and seeing rank 1", func() bool {
		for _, rk := range tc.ranks {
			if l, ok := rk.Coord.Leader(); !ok || l != 0 || len(rk.Coord.Members()) < 4 {
				return false
			}
		}
		return old.IsLeader()
	})
	if held, alive := off.Silences(); held != 1 || alive != 1 {
		t.Fatalf("rank 2 held the leader silent %d times, heard from again %d", held, alive)
	}
}

// TestOffHost: the first rank on another host after the leader watches it
// when the successor shares the leader's host, naming the ranks between.
func TestOffHost(t *testing.T) {
	c := &Coordinator{name: "r/rank2", members: map[string]*member{}}
	for r, ip := range []string{"10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"} {
		addRankAt(c, int32(r), ip)
	}
	if ahead, mine := c.offHostLocked("r/rank0"); !mine || fmt.Sprint(ahead) != "[r/rank1]" {
		t.Fatalf("rank 2 after rank 0's host: %v %v", ahead, mine)
	}
	c.name = "r/rank3"
	if _, mine := c.offHostLocked("r/rank0"); mine {
		t.Fatal("rank 3 watches rank 0: rank 2 comes first on its host")
	}
	c.name = "r/rank1"
	if _, mine := c.offHostLocked("r/rank0"); mine {
		t.Fatal("rank 1, on the leader's host, is its successor, not its off-host watcher")
	}
	// a successor on another host watches alone
	c.name = "r/rank2"
	delete(c.members, "r/rank1")
	if _, mine := c.offHostLocked("r/rank0"); mine {
		t.Fatal("rank 2 is the successor: no off-host watch")
	}
}

// TestSuccessionFollowsMembers: the succession the watch reads every probe is
// worked out once per change of the members, and again after each: a member
// that arrives, leaves, changes rank or moves to another host.
func TestSuccessionFollowsMembers(t *testing.T) {
	c := &Coordinator{name: "r/rank2", members: map[string]*member{}}
	set := func(name string, rank int32, ip string) {
		c.setMember(name, &member{node: &memberlist.Node{Name: name, Addr: net.ParseIP(ip)}, meta: &pb.NodeMeta{Rank: rank}})
	}
	check := func(what, next string, ahead []string) {
		t.Helper()
		s := c.successionLocked("r/rank0")
		if s.next != next || fmt.Sprint(s.ahead) != fmt.Sprint(ahead) || s.off != (len(ahead) > 0) {
			t.Fatalf("%s: successor %q, ahead %v (off-host %v); want %q, %v", what, s.next, s.ahead, s.off, next, ahead)
		}
	}
	set("r/rank0", 0, "10.0.0.1")
	set("r/rank2", 2, "10.0.0.2")
	check("two hosts, one rank each", "r/rank2", nil)
	set("r/rank1", 1, "10.0.0.1")
	check("rank 1 joins on the leader's host", "r/rank1", []string{"r/rank1"})
	set("r/rank1", 1, "10.0.0.3")
	check("rank 1 moves to a host of its own", "r/rank1", nil)
	set("r/rank1", 5, "10.0.0.3")
	check("rank 1's member comes back as rank 5", "r/rank2", nil)
	c.setMember("r/rank1", nil)
	set("r/rank3", 3, "10.0.0.2")
	c.setMember("r/rank2", nil)
	check("rank 2 leaves", "r/rank3", nil)
	if s := c.successionLocked("r/rank3"); s.next != "" {
		t.Fatalf("the last rank's successor: %q", s.next)
	}
}

// TestAsymmetricCutEndsInOneRound: the leader (rank 0) and its successor (rank
// 1) cannot reach each other, and rank 2 reaches both, so memberlist never
// declares rank 0 dead. The successor holds rank 0 silent and takes a term;
// rank 2 checks with pings of its own and keeps rank 0; rank 0 takes a newer
// term, and its news makes the successor take it back as leader. Then the
// successor, never hearing rank 0 in its new watch, can declare it silent no
// more: one round, not a war of terms.
func TestAsymmetricCutEndsInOneRound(t *testing.T) {
	p := &partition{group: map[string]int{}}
	tc := startCluster(t, 3, func(c *Config, a *rankagent.Config) {
		if !c.Client && c.Identity.Rank < 2 {
			c.Memberlist.Transport = newCutTransport(t, p, c.Identity.Rank)
		}
	})
	tc.holding()
	old, succ, third := tc.ranks[0].Coord, tc.ranks[1].Coord, tc.ranks[2].Coord
	rank0 := NodeName(tc.run, 0)
	testutil.Eventually(t, time.Minute, "rank 0 leading, heard by its successor", func() bool {
		return old.IsLeader() && old.Term() > 0 && succ.watch.heardIn(rank0)
	})
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
	testutil.Eventually(t, time.Minute, "the successor to hold rank 0 silent, then take it back", func() bool {
		held, alive := succ.Silences()
		l, ok := succ.Leader()
		return held == 1 && alive == 1 && ok && l == 0
	})
	testutil.Eventually(t, 30*time.Second, "rank 2 to check the successor's notice with its own pings", func() bool {
		third.silenced.mu.Lock()
		defer third.silenced.mu.Unlock()
		return third.silenced.checked >= 1
	})
	if held, alive := third.Silences(); held != alive {
		t.Fatalf("rank 2, which reaches rank 0, held it silent %d times and took it back %d", held, alive)
	}
	testutil.Eventually(t, 30*time.Second, "rank 2 following rank 0", func() bool { l, ok := third.Leader(); return ok && l == 0 })
	testutil.Eventually(t, 30*time.Second, "the successor watching rank 0 anew", func() bool {
		succ.watch.mu.Lock()
		defer succ.watch.mu.Unlock()
		return succ.watch.leader == rank0
	})
	if succ.watch.heardIn(rank0) || succ.watch.silent(0) {
		t.Fatal("the successor may declare rank 0 silent again without having heard it")
	}
	if held, _ := succ.Silences(); held != 1 {
		t.Fatalf("the successor held rank 0 silent %d times", held)
	}
}

// TestForgedSilenceNoticeElectsNobody: a member holding the key sends the ranks
// a notice that the leader is silent, in the successor's name: a rank follows
// it only until pings of its own find the leader, and takes the leader back;
// the successor refuses a notice in its own name and never leads.
func TestForgedSilenceNoticeElectsNobody(t *testing.T) {
	tc := startCluster(t, 3)
	tc.holding()
	c := tc.client()
	lead := tc.ranks[0].Coord
	testutil.Eventually(t, time.Minute, "rank 0 leading under a term", func() bool { return lead.IsLeader() && lead.Term() > 0 })
	rank0, rank1 := NodeName(tc.run, 0), NodeName(tc.run, 1)
	for _, to := range []string{rank1, NodeName(tc.run, 2)} {
		env := c.envelope(0)
		env.Sender, env.SenderRank = rank1, 1 // the successor's name
		env.Body = &pb.Envelope_LeaderSilent{LeaderSilent: &pb.LeaderSilent{Leader: rank0}}
		if err := c.send(to, env, true); err != nil {
			t.Fatal(err)
		}
	}
	third := tc.ranks[2].Coord
	testutil.Eventually(t, 30*time.Second, "rank 2 to check the notice with its own pings", func() bool {
		third.silenced.mu.Lock()
		defer third.silenced.mu.Unlock()
		return third.silenced.checked >= 1
	})
	barrier(t, c, rank1)
	// rank 2 followed the notice for the time of its check at most, and took
	// rank 0 back as soon as rank 0 answered; the successor took none
	if held, alive := third.Silences(); held != alive {
		t.Fatalf("rank 2 held the leader silent %d times, took it back %d", held, alive)
	}
	for r, rk := range tc.ranks {
		if l, ok := rk.Coord.Leader(); !ok || l != 0 {
			t.Fatalf("rank %d follows rank %d (%v)", r, l, ok)
		}
	}
	if held, _ := tc.ranks[1].Coord.Silences(); held != 0 || !lead.IsLeader() || tc.ranks[1].Coord.IsLeader() {
		t.Fatalf("the successor held the leader silent %d times on a notice in its own name", held)
	}
}

// TestAheadSilent: an off-host watch knows the leader's host is silent only when
// every member ahead answered in the watch and then answered none of two pings
// for the silence; one never heard is not known; one that answers lately keeps
// the host alive; a new watch forgets them.
func TestAheadSilent(t *testing.T) {
	w := &leaderWatch{}
	w.start("r/rank0")
	gen := w.gen
	ahead := []string{"r/rank1", "r/rank2"}
	if _, known := w.aheadSilent(ahead, 0); known {
		t.Fatal("members never pinged are known")
	}
	w.answeredAhead(gen, "r/rank1", true)
	if _, known := w.aheadSilent(ahead, 0); known {
		t.Fatal("a member never heard is known")
	}
	w.answeredAhead(gen, "r/rank2", true)
	if silent, known := w.aheadSilent(ahead, 0); !known || silent {
		t.Fatalf("both answered: silent %v known %v", silent, known)
	}
	for range 2 {
		w.answeredAhead(gen, "r/rank1", false)
		w.answeredAhead(gen, "r/rank2", false)
	}
	w.answeredAhead(gen-1, "r/rank2", true) // (an earlier watch's answer counts for nothing)
	if silent, known := w.aheadSilent(ahead, 0); !known || !silent {
		t.Fatalf("both lost two pings: silent %v known %v", silent, known)
	}
	if silent, _ := w.aheadSilent(ahead, time.Hour); silent {
		t.Fatal("silent before the silence time")
	}
	w.answeredAhead(gen, "r/rank2", true)
	if silent, _ := w.aheadSilent(ahead, 0); silent {
		t.Fatal("a member that answers again is silent")
	}
	w.start("r/rank3")
	if _, known := w.aheadSilent(ahead, 0); known {
		t.Fatal("a new watch remembers the old one's pings")
	}
}

// TestStaleVerdictIsPinged: a member about to lead because memberlist took the
// leader away moments ago (news of an earlier incarnation under its name, as a
// member that outlived a relaunch gossips) pings it first, and does not lead
// while it answers; it leads in place of one that does not answer, of one the
// successor's watch held silent (pinged already), and of one gone long enough.
func TestStaleVerdictIsPinged(t *testing.T) {
	tc := startCluster(t, 2)
	c := tc.ranks[1].Coord
	rank0 := NodeName(tc.run, 0)
	testutil.Eventually(t, 30*time.Second, "rank 1 to know rank 0's address", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.seenAddrs[rank0] != ""
	})
	gone := func(g goneMember) {
		c.mu.Lock()
		c.gone[rank0] = g
		c.mu.Unlock()
	}
	gone(goneMember{at: time.Now()})
	if c.mayLead(rank0) {
		t.Fatal("rank 1 leads in place of a leader memberlist took away that answers a ping")
	}
	gone(goneMember{at: time.Now(), silent: true})
	if !c.mayLead(rank0) {
		t.Fatal("a leader held silent (pinged by the successor's watch already) is pinged again")
	}
	gone(goneMember{at: time.Now().Add(-staleVerdict)})
	if !c.mayLead(rank0) {
		t.Fatal("rank 1 waits past staleVerdict")
	}
	tc.stops[0]()
	gone(goneMember{at: time.Now()})
	if !c.mayLead(rank0) {
		t.Fatal("rank 1 does not lead in place of a leader that answers no ping")
	}
}

// addRankAt makes rank a member of c (of run "r") at ip.
func addRankAt(c *Coordinator, rank int32, ip string) {
	name := fmt.Sprintf("r/rank%d", rank)
	c.members[name] = &member{node: &memberlist.Node{Name: name, Addr: net.ParseIP(ip)}, meta: &pb.NodeMeta{Rank: rank}}
}
