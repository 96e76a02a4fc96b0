package coordinator

import (
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/coordinator/wire"
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
}

// moved is the incarnation a member moved from: its news is passed over.
type moved struct {
	addr  string // its address
	agent string // its agent's id ("" when its metadata did not say)
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
	if existing == nil || other == nil || other.Name == d.c.name || existing.Name != other.Name {
		return // (this member's own old incarnation: the others check)
	}
	d.c.checkMove(*existing, *other)
}

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
	now := time.Now()
	mv.mu.Lock()
	if now.Sub(mv.last[name]) < moveCheckEvery {
		mv.mu.Unlock()
		return
	}
	if mv.last == nil || len(mv.last) >= maxSeenAddrs {
		mv.last = map[string]time.Time{}
	}
	mv.last[name] = now
	if _, ok := mv.from[name]; ok {
		mv.mu.Unlock()
		if c.knownAt(name, other.Address()) {
			c.memberNews(&other, false) // (the moved member's news: its term, its agent)
		}
		return
	}
	if mv.checking[name] || len(mv.from) >= maxSeenAddrs {
		mv.mu.Unlock()
		return
	}
	if mv.checking == nil {
		mv.checking = map[string]bool{}
	}
	mv.checking[name] = true
	mv.mu.Unlock()
	started := c.spawn(func() {
		defer func() { mv.mu.Lock(); delete(mv.checking, name); mv.mu.Unlock() }()
		if !c.ping(other) {
			return
		}
		if c.pingTwice(existing) {
			c.log.Warn("two agents answer under one member name, at two addresses: memberlist keeps the first",
				"name", name, "addr", existing.Address(), "other_addr", other.Address())
			return
		}
		mv.mu.Lock()
		if mv.from == nil {
			mv.from = map[string]moved{}
		}
		mv.from[name] = moved{addr: existing.Address(), agent: agentOf(&existing)}
		mv.mu.Unlock()
		c.log.Info("a member started again at another address: known there now", "moved", name,
			"addr", other.Address(), "old_addr", existing.Address())
		c.memberNews(&other, false)
		c.followMove(other)
	})
	if !started {
		mv.mu.Lock()
		delete(mv.checking, name)
		mv.mu.Unlock()
	}
}

// knownAt reports whether this member knows name at addr.
func (c *Coordinator) knownAt(name, addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.members[name]
	return m != nil && m.node.Address() == addr
}

// followMove pings a moved member at its new address every moveCheckEvery
// while the move lasts. One that answers none of these pings for memberlist's
// suspicion timeout has gone from there: the move ends, and this member takes
// memberlist's view of the name (gone, or where memberlist has it), which it
// passed over meanwhile.
func (c *Coordinator) followMove(n memberlist.Node) {
	t := time.NewTicker(moveCheckEvery)
	defer t.Stop()
	heard := time.Now()
	for range t.C {
		if c.stopped() || !c.stillMoved(n) {
			return
		}
		if c.ping(n) {
			heard = time.Now()
			continue
		}
		if time.Since(heard) < c.moveSilence() {
			continue
		}
		if !c.endMove(n.Name) {
			return // (ended meanwhile by memberlist's news)
		}
		c.log.Warn("a member started again at another address answers no ping there: taking memberlist's view of it", "moved", n.Name,
			"addr", n.Address(), "silent_for", time.Since(heard).Round(time.Millisecond))
		if now := c.memberlistNode(n.Name); now != nil && now.Address() != n.Address() {
			c.memberNews(now, false) // (memberlist news of it that was passed over)
		} else {
			c.memberNews(&n, true)
		}
		return
	}
}

// stillMoved reports whether the move to n lasts, and this member still knows
// the member at n.
func (c *Coordinator) stillMoved(n memberlist.Node) bool {
	c.moves.mu.Lock()
	_, ok := c.moves.from[n.Name]
	c.moves.mu.Unlock()
	return ok && c.knownAt(n.Name, n.Address())
}

// endMove ends name's move; false when there was none.
func (c *Coordinator) endMove(name string) bool {
	c.moves.mu.Lock()
	defer c.moves.mu.Unlock()
	_, ok := c.moves.from[name]
	delete(c.moves.from, name)
	return ok
}

// memberlistNode is memberlist's live node of name (nil: none).
func (c *Coordinator) memberlistNode(name string) *memberlist.Node {
	ml := c.memberlist()
	if ml == nil {
		return nil
	}
	for _, n := range ml.Members() {
		if n.Name == name {
			nn := *n
			return &nn
		}
	}
	return nil
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
