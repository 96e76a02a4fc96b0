package coordinator

import (
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/coordinator/wire"
	"github.com/memsnap/memsnap/internal/pb"
)

// A member's agent started again at another address (a restarted pod's new IP,
// a port the system picked) keeps its name, but memberlist gives the name the
// new address only once the old one is declared dead and DeadNodeReclaimTime
// has passed: until then it drops the new incarnation's news as a conflict,
// and every other member would send to, and ping, the old address. A
// successor watching a restarted leader there found it silent and led, and
// leadership went back and forth until memberlist caught up.
//
// So a conflict is checked: when the member at the new address answers a ping
// under its name and the old address answers neither of two, the member moved.
// This member then knows it at the new address (sends, pings, the watch of a
// leader) and passes over memberlist's news of the old incarnation (its agent
// at the old address: its death), while it pings the new address itself every
// moveCheckEvery. The move ends when memberlist gives news of any other
// incarnation (the new address taken up, or an agent started again at the old
// address), or when the new address answers no ping for memberlist's suspicion
// timeout (the member is gone, or back where memberlist has it). Two agents
// that both answer under one name are left to memberlist, and logged.
//
// A member learns of the new address when memberlist's gossip of it reaches it
// directly (the restarted agent's join and push-pull peers, and the few members
// each gossip message goes to: memberlist does not pass on news it found in
// conflict); the others learn it when memberlist does.
type moves struct {
	mu       sync.Mutex
	checking map[string]bool      // names with a check (or a follow) in flight
	last     map[string]time.Time // when each name was last checked
	from     map[string]moved     // members moved, until the move ends
	pulled   map[string]time.Time // when state was last exchanged to learn each name's address
	pinged   atomic.Uint64        // pings of moved members at their new address (followMove)
	gen      uint64               // moves made
	inFlight bool                 // a state exchange (pushPull) under way
	announce bool                 // this member's move is to be announced (announceMove found no one to tell)
}

// moved is a member's move: the incarnation it moved from, whose news is
// passed over, and the address it moved to.
type moved struct {
	addr  string // the old incarnation's address
	agent string // its agent's id ("" when its metadata did not say)
	to    string // the new address
	gen   uint64 // which move of the member (its follow ends when another replaces it)
}

// moveCheckEvery is the least time between two checks of one name (each
// refuted suspicion of the old address brings a conflict again), and how often
// a moved member is pinged at its new address.
const moveCheckEvery = time.Second

// conflicts is memberlist's ConflictDelegate.
type conflicts struct{ c *Coordinator }

var _ memberlist.ConflictDelegate = (*conflicts)(nil)

// NotifyConflict is called under memberlist's lock: it only starts a check.
func (d *conflicts) NotifyConflict(existing, other *memberlist.Node) {
	if existing == nil || other == nil || existing.Name != other.Name {
		return
	}
	if other.Name == d.c.name {
		d.c.announceMove() // (news of this member's old incarnation: the others have it)
		return
	}
	d.c.checkMove(*existing, *other)
}

// pullEvery is the least time between two state exchanges to learn one
// member's address.
const pullEvery = 5 * time.Second

// announceMove tells the members that most need this member's address that
// the cluster holds its name at another (this agent started again elsewhere):
// it exchanges state (memberlist's push-pull) with them, which brings them
// this address's news in conflict, and so their check (checkMove). A leader's
// are the members that watch it (its successor, and the first member after it
// on another host); any other member's, the leader.
func (c *Coordinator) announceMove() {
	c.mu.Lock()
	var to []string
	if c.leaderName == c.name {
		to = c.watchersLocked()
	} else if c.leaderName != "" {
		to = []string{c.leaderName}
	}
	var peers []peer
	for _, n := range to {
		if m := c.members[n]; m != nil {
			peers = append(peers, peer{n, m.node.Address()})
		}
	}
	c.mu.Unlock()
	c.moves.mu.Lock()
	c.moves.announce = len(peers) == 0 // (none known yet: at the next watch round)
	c.moves.mu.Unlock()
	c.pushPull(peers...)
}

// announceDue announces a move whose announcement found no one to tell
// (this member had not joined, or knew no leader yet); the watch calls it
// every round.
func (c *Coordinator) announceDue() {
	c.moves.mu.Lock()
	due := c.moves.announce
	c.moves.mu.Unlock()
	if due {
		c.announceMove()
	}
}

// watchersLocked is this member's successor and, when that shares this
// member's host, the first rank member after it on another host.
func (c *Coordinator) watchersLocked() []string {
	me := c.members[c.name]
	next := c.successorPastLocked(c.name, nil)
	if me == nil || next == "" {
		return nil
	}
	out := []string{next}
	if !c.members[next].node.Addr.Equal(me.node.Addr) {
		return out
	}
	off := ""
	for n, m := range c.members {
		if m.meta.Rank < 0 || m.node.Addr.Equal(me.node.Addr) || before(m.meta.Rank, n, me.meta.Rank, c.name) {
			continue
		}
		if off == "" || before(m.meta.Rank, n, c.members[off].meta.Rank, off) {
			off = n
		}
	}
	if off != "" {
		out = append(out, off)
	}
	return out
}

// heardAt takes the address a rank member's message says it listens at: when
// this member knows it (or holds it silent) at another, it exchanges state with
// that address, which brings the news of the address in conflict, and so its
// check (checkMove). (A member the conflict's gossip did not reach learns of a
// move so.)
func (c *Coordinator) heardAt(env *pb.Envelope) {
	if env.ReplyAddr == "" || env.SenderRank < 0 || env.Sender == c.name || env.Sender != NodeName(c.cfg.Identity.RunName, int(env.SenderRank)) {
		return
	}
	c.mu.Lock()
	known := ""
	if m := c.members[env.Sender]; m != nil {
		known = m.addr // (formatted once, by setMember: no allocation a message)
	} else if s := c.silent[env.Sender]; s != nil && s.m.node != nil {
		known = s.m.node.Address()
	} else {
		known = c.seenAddrs[env.Sender] // (one memberlist took away: its old address dead)
	}
	c.mu.Unlock()
	if known != "" && known != env.ReplyAddr {
		c.pushPull(peer{env.Sender, env.ReplyAddr})
	}
}

// peer is a member to exchange state with, by name and address.
type peer struct{ name, addr string }

// pushPull exchanges state with each peer (memberlist's join), each at most
// once per pullEvery, one exchange at a time (a call while one is under way
// does nothing), after a random wait of up to pullSpread: the members a
// restarted leader's first message reaches all at once do not all exchange
// state with it at once.
func (c *Coordinator) pushPull(peers ...peer) {
	c.mu.Lock()
	done := c.runDone
	c.mu.Unlock()
	mv := &c.moves
	mv.mu.Lock()
	if mv.inFlight {
		mv.mu.Unlock()
		return
	}
	var due []peer
	for _, p := range peers {
		if dueLocked(&mv.pulled, p.name, pullEvery) {
			due = append(due, p)
		}
	}
	mv.inFlight = len(due) > 0
	mv.mu.Unlock()
	if len(due) == 0 {
		return
	}
	started := c.spawn(func() {
		defer func() { mv.mu.Lock(); mv.inFlight = false; mv.mu.Unlock() }()
		select {
		case <-done:
			return
		case <-time.After(rand.N(pullSpread)):
		}
		for _, p := range due {
			if ml := c.memberlist(); ml != nil && !c.stopped() {
				_, err := ml.Join([]string{p.addr})
				c.log.Debug("exchanged state to learn a member's address", "name", p.name, "addr", p.addr, "err", err)
			}
		}
	})
	if !started {
		mv.mu.Lock()
		mv.inFlight = false
		mv.mu.Unlock()
	}
}

// pullSpread is the most a state exchange of pushPull waits before it starts.
const pullSpread = time.Second

// agentOf is the agent id n's metadata gives ("" when it does not read).
func agentOf(n *memberlist.Node) string {
	if m, err := wire.DecodeMeta(n.Meta); err == nil {
		return m.GetAgent()
	}
	return ""
}

// checkMove takes news of other, the name at another address than memberlist's
// (existing): for a member known there already, its metadata; else, when other
// answers a ping and existing neither of two, the member moved.
func (c *Coordinator) checkMove(existing, other memberlist.Node) {
	meta, err := wire.DecodeMeta(other.Meta)
	if err != nil || meta.Run != c.cfg.Identity.RunName || meta.Rank < 0 {
		return // (clients' names are new each time; a stranger's is refused by NotifyAlive)
	}
	mv := &c.moves
	name := other.Name
	mv.mu.Lock()
	if !dueLocked(&mv.last, name, moveCheckEvery) {
		mv.mu.Unlock()
		return
	}
	rec, moving := mv.from[name]
	if moving && rec.to == other.Address() {
		mv.mu.Unlock()
		c.memberNews(&other, false) // (the moved member's news: its term, its agent)
		return
	}
	if mv.checking[name] || !moving && len(mv.from) >= maxSeenAddrs {
		mv.mu.Unlock()
		return
	}
	if mv.checking == nil {
		mv.checking = map[string]bool{}
	}
	mv.checking[name] = true
	mv.mu.Unlock()
	// where the member is as this member knows it: memberlist's address, or
	// the one it moved to (a third address: checked the same way)
	cur := existing
	if moving {
		cur = other
		cur.Addr, cur.Port = nil, 0
		if h, p, err := net.SplitHostPort(rec.to); err == nil {
			port, _ := strconv.Atoi(p)
			cur.Addr, cur.Port = net.ParseIP(h), uint16(port)
		}
	}
	started := c.spawn(func() {
		ok := c.checkedMove(cur, other)
		mv.mu.Lock()
		delete(mv.checking, name)
		if ok {
			if mv.from == nil {
				mv.from = map[string]moved{}
			}
			mv.gen++
			rec = moved{addr: existing.Address(), agent: agentOf(&existing), to: other.Address(), gen: mv.gen}
			mv.from[name] = rec
		}
		mv.mu.Unlock()
		if !ok {
			return
		}
		c.log.Info("a member started again at another address: known there now", "moved", name,
			"addr", other.Address(), "old_addr", cur.Address())
		c.memberNews(&other, false)
		c.followMove(other, rec.gen)
	})
	if !started {
		mv.mu.Lock()
		delete(mv.checking, name)
		mv.mu.Unlock()
	}
}

// checkedMove reports whether the member moved from cur to other: other
// answers a ping under its name, and cur neither of two.
func (c *Coordinator) checkedMove(cur, other memberlist.Node) bool {
	if cur.Addr == nil || !c.ping(other) {
		return false
	}
	if c.pingTwice(cur) {
		c.log.Warn("two agents answer under one member name, at two addresses: this member keeps the first",
			"name", other.Name, "addr", cur.Address(), "other_addr", other.Address())
		return false
	}
	return true
}

// followMove pings a moved member at its new address every moveCheckEvery
// while the move lasts (held silent or not). One that answers none of these
// pings for memberlist's suspicion timeout has gone from there: the move ends,
// and the member is gone (memberlist's news of any other incarnation of it, an
// agent started again at the old address, would have ended the move first).
func (c *Coordinator) followMove(n memberlist.Node, gen uint64) {
	t := time.NewTicker(moveCheckEvery)
	defer t.Stop()
	heard := time.Now()
	for range t.C {
		if c.stopped() || !c.stillMoved(n, gen) {
			return
		}
		c.moves.pinged.Add(1)
		if c.ping(n) {
			heard = time.Now()
			continue
		}
		if time.Since(heard) < c.moveSilence() {
			continue
		}
		if !c.endMove(n, gen) {
			return // (ended meanwhile by memberlist's news, or moved on)
		}
		c.mu.Lock()
		m, s := c.members[n.Name], c.silent[n.Name]
		elsewhere := m != nil && m.node.Address() != n.Address() || m == nil && s == nil
		c.mu.Unlock()
		if elsewhere {
			return // (known elsewhere meanwhile, or gone already)
		}
		c.log.Warn("a member started again at another address answers no ping there: gone", "moved", n.Name,
			"addr", n.Address(), "silent_for", time.Since(heard).Round(time.Millisecond))
		c.memberNews(&n, true)
		return
	}
}

// stillMoved reports whether n's member's move gen lasts.
func (c *Coordinator) stillMoved(n memberlist.Node, gen uint64) bool {
	c.moves.mu.Lock()
	defer c.moves.mu.Unlock()
	rec, ok := c.moves.from[n.Name]
	return ok && rec.gen == gen
}

// endMove ends n's member's move gen; false when it has ended.
func (c *Coordinator) endMove(n memberlist.Node, gen uint64) bool {
	c.moves.mu.Lock()
	defer c.moves.mu.Unlock()
	rec, ok := c.moves.from[n.Name]
	if !ok || rec.gen != gen {
		return false
	}
	delete(c.moves.from, n.Name)
	return true
}

// moveSilence is how long a moved member may answer no ping before it is gone:
// memberlist's suspicion timeout for the cluster's size, at least two checks.
func (c *Coordinator) moveSilence() time.Duration {
	c.mu.Lock()
	ml, members := c.cfg.Memberlist, len(c.members)
	c.mu.Unlock()
	d := 2 * moveCheckEvery
	if ml != nil {
		d = max(d, config.SuspicionTimeout(ml.SuspicionMult, members, ml.ProbeInterval))
	}
	return d
}

// movedNews reports whether memberlist's news of n is of a moved member's old
// incarnation (to be passed over); news of any other incarnation ends the move.
func (c *Coordinator) movedNews(n *memberlist.Node) bool {
	mv := &c.moves
	mv.mu.Lock()
	defer mv.mu.Unlock()
	from, ok := mv.from[n.Name]
	if !ok {
		return false
	}
	if from.addr == n.Address() && from.agent == agentOf(n) {
		return true
	}
	delete(mv.from, n.Name)
	return false
}

// dueLocked reports whether every has passed since name's time in *times, and
// if so sets it to now (moves.mu held; the map is bounded by maxSeenAddrs,
// emptied when full).
func dueLocked(times *map[string]time.Time, name string, every time.Duration) bool {
	now := time.Now()
	if now.Sub((*times)[name]) < every {
		return false
	}
	if *times == nil || len(*times) >= maxSeenAddrs {
		*times = map[string]time.Time{}
	}
	(*times)[name] = now
	return true
}
