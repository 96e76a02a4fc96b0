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
// under its name and the old address answers none, the member moved. This
// member then knows it at the new address (sends, pings, the watch of a
// leader), and takes memberlist's news of the old address (its death) for the
// old incarnation's, until memberlist gives the name the new address. Two
// agents that both answer under one name are left to memberlist, and logged.
type moves struct {
	mu       sync.Mutex
	checking map[string]bool      // names with a check in flight
	last     map[string]time.Time // when each name was last checked
	from     map[string]string    // members moved: name -> the old address, until memberlist catches up
}

// moveCheckEvery is the least time between two checks of one name: each
// refuted suspicion of the old address brings a conflict again.
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

// checkMove pings other (the name at its new address) and existing (memberlist's
// address for it) and, when only other answers, takes the member as moved.
func (c *Coordinator) checkMove(existing, other memberlist.Node) {
	meta, err := wire.DecodeMeta(other.Meta)
	if err != nil || meta.Run != c.cfg.Identity.RunName || meta.Rank < 0 {
		return // (clients' names are new each time; a stranger's is refused by NotifyAlive)
	}
	mv := &c.moves
	name := other.Name
	now := time.Now()
	mv.mu.Lock()
	if mv.checking[name] || now.Sub(mv.last[name]) < moveCheckEvery || mv.from[name] == "" && len(mv.from) >= maxSeenAddrs {
		mv.mu.Unlock()
		return
	}
	if mv.checking == nil || len(mv.last) >= maxSeenAddrs {
		mv.checking, mv.last = map[string]bool{}, map[string]time.Time{}
	}
	mv.checking[name], mv.last[name] = true, now
	mv.mu.Unlock()
	c.spawn(func() {
		defer func() { mv.mu.Lock(); delete(mv.checking, name); mv.mu.Unlock() }()
		c.mu.Lock()
		m := c.members[name]
		c.mu.Unlock()
		if m != nil && m.node.Address() == other.Address() {
			return // (known there already)
		}
		if !c.ping(other) {
			return
		}
		if c.ping(existing) {
			c.log.Warn("two agents answer under one member name, at two addresses: memberlist keeps the first",
				"name", name, "addr", existing.Address(), "other_addr", other.Address())
			return
		}
		mv.mu.Lock()
		if mv.from == nil {
			mv.from = map[string]string{}
		}
		mv.from[name] = existing.Address()
		mv.mu.Unlock()
		c.log.Info("a member started again at another address: known there now", "moved", name,
			"addr", other.Address(), "old_addr", existing.Address())
		c.memberNews(&other, false)
		c.followMove(other)
	})
}

// followMove pings a moved member at its new address, every moveCheckEvery,
// until memberlist gives its name an address of its own (the old address's
// death and DeadNodeReclaimTime past: it then follows the member itself). One
// that answers none of these pings for memberlist's suspicion timeout is gone:
// memberlist, which took its news for the old incarnation's, never would say so.
func (c *Coordinator) followMove(n memberlist.Node) {
	t := time.NewTicker(moveCheckEvery)
	defer t.Stop()
	heard := time.Now()
	for range t.C {
		if c.stopped() || !c.moved(n) {
			return
		}
		if c.ping(n) {
			heard = time.Now()
			continue
		}
		if time.Since(heard) < c.moveSilence() {
			continue
		}
		mv := &c.moves
		mv.mu.Lock()
		moved := mv.from[n.Name] != ""
		delete(mv.from, n.Name)
		mv.mu.Unlock()
		if moved {
			c.log.Warn("a member started again at another address answers no ping there: gone", "moved", n.Name, "addr", n.Address(),
				"silent_for", time.Since(heard).Round(time.Millisecond))
			c.memberNews(&n, true)
		}
		return
	}
}

// moved reports whether n is still known at its new address only (memberlist
// has not given the name an address of its own since, and it did not move on).
func (c *Coordinator) moved(n memberlist.Node) bool {
	c.mu.Lock()
	m := c.members[n.Name]
	c.mu.Unlock()
	c.moves.mu.Lock()
	defer c.moves.mu.Unlock()
	return c.moves.from[n.Name] != "" && m != nil && m.node.Address() == n.Address()
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
// address (to be ignored), and forgets the move once memberlist gives the name
// another address.
func (c *Coordinator) movedNews(n *memberlist.Node) bool {
	mv := &c.moves
	mv.mu.Lock()
	defer mv.mu.Unlock()
	from, ok := mv.from[n.Name]
	if !ok {
		return false
	}
	if from == n.Address() {
		return true
	}
	delete(mv.from, n.Name)
	return false
}
