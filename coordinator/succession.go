package coordinator

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/memsnap/memsnap/internal/pb"
)

// The successor watches the leader. memberlist declares a member dead only after
// a failed probe and then its suspicion time (about 5 s on production's timers),
// and by then a job torn down with its leader has mostly exited. So the member
// that leads were the leader gone (the successor: the lowest rank after the
// leader's) pings the leader directly, every LeaderProbe, with memberlist's own
// ping (answered by memberlist's packet handler, not behind the leader's work).
// A leader that answers none of them for LeaderSilence is silent: the successor
// stops counting it as a member, which makes it the leader at once, and tells
// every rank. A rank told by the member it sees as the successor elects without
// the silent leader at once; told by another, it pings the leader itself first.
//
// A leader held silent that answers a ping again, or sends any message, is a
// member again and leads again: it was only slow (a stalled process, a lost
// burst of packets). The run's log fences what the successor did meanwhile (its
// term is newer; the old leader takes a newer one still). Each member counts
// the leaders it held silent and those heard from again (Silences), so that a
// false suspicion is seen in production. memberlist's own verdict ends a
// silence: a member it declares dead is gone for good, one it never declares
// dead is pinged until it answers.

// silentMember is a member this one holds silent.
type silentMember struct {
	m      member
	at     time.Time
	pinged time.Time // when it was last pinged (to be heard from again)
}

// silences counts the leaders this member held silent, and of those, the ones
// heard from again (alive after all).
type silences struct {
	mu          sync.Mutex
	held, alive uint64
	verifying   map[string]bool // silent notices being checked with a ping of our own
}

// Silences reports how many times this member held its leader silent, and how
// many of those leaders were heard from again (a false suspicion: the leader
// lived, and a term was taken while it did).
func (c *Coordinator) Silences() (held, alive uint64) {
	c.silenced.mu.Lock()
	defer c.silenced.mu.Unlock()
	return c.silenced.held, c.silenced.alive
}

// successorLocked is the member that leads were the leader gone: the lowest
// rank member after it ("" when there is none).
func (c *Coordinator) successorLocked(leader string) string {
	lm := c.members[leader]
	if lm == nil {
		return ""
	}
	next := ""
	for n, m := range c.members {
		if n == leader || m.meta.Rank < 0 || before(m.meta.Rank, n, lm.meta.Rank, leader) {
			continue
		}
		if next == "" || before(m.meta.Rank, n, c.members[next].meta.Rank, next) {
			next = n
		}
	}
	return next
}

// watchSuccession pings the leader while this member is its successor, and the
// members it holds silent until they answer; it runs until ctx ends.
func (c *Coordinator) watchSuccession(ctx context.Context) {
	every := c.cfg.LeaderProbe
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var (
		watched string    // the leader this member is the successor of
		heard   time.Time // when it last answered (or was first watched)
		lost    int       // pings sent since then that found no answer
		mu      sync.Mutex
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.pingSilent()
		c.mu.Lock()
		leader := c.leaderName
		mine := leader != "" && leader != c.name && c.successorLocked(leader) == c.name
		m := c.members[leader]
		c.mu.Unlock()
		mu.Lock()
		if !mine || m == nil {
			watched = ""
			mu.Unlock()
			continue
		}
		if leader != watched {
			watched, heard, lost = leader, time.Now(), 0
		}
		silent := lost >= 2 && time.Since(heard) >= c.cfg.LeaderSilence
		mu.Unlock()
		if silent {
			c.declareSilent(leader)
			continue
		}
		node := *m.node
		c.spawn(func() {
			ok := c.ping(node)
			mu.Lock()
			defer mu.Unlock()
			if watched != leader {
				return
			}
			if ok {
				heard, lost = time.Now(), 0
			} else {
				lost++
			}
		})
	}
}

// declareSilent holds the leader silent (this member, its successor, leads) and
// tells every member.
func (c *Coordinator) declareSilent(leader string) {
	if !c.hold(leader) {
		return
	}
	c.log.Warn("the leader answers no ping: leading in its place, until it is heard from again", "silent_leader", leader, "silence", c.cfg.LeaderSilence)
	env := c.envelope(0)
	env.Body = &pb.Envelope_LeaderSilent{LeaderSilent: &pb.LeaderSilent{Leader: leader}}
	c.mu.Lock()
	to := make([]string, 0, len(c.members))
	for n := range c.members {
		if n != c.name {
			to = append(to, n)
		}
	}
	c.mu.Unlock()
	for _, n := range to {
		c.post(n, "", env, false)
	}
}

// hold takes name out of the members as if memberlist had declared it gone,
// keeping it to put back when it is heard from; it reports whether it did.
func (c *Coordinator) hold(name string) bool {
	c.mu.Lock()
	m := c.members[name]
	if m == nil || name == c.name {
		c.mu.Unlock()
		return false
	}
	if c.silent == nil {
		c.silent = map[string]*silentMember{}
	}
	c.silent[name] = &silentMember{m: *m, at: time.Now(), pinged: time.Now()}
	if m.meta.Rank >= 0 && len(c.gone) < maxSeenAddrs {
		c.gone[name] = goneMember{at: time.Now(), members: len(c.members), silent: true}
	}
	c.setMember(name, nil)
	c.recountLocked()
	c.mu.Unlock()
	c.counted(1, 0)
	return true
}

// recountLocked keeps the counts read without mu (c.mu held).
func (c *Coordinator) recountLocked() {
	c.nmembers.Store(int64(len(c.members)))
	c.nsilent.Store(int64(len(c.silent)))
}

// counted adds to the silences counted (held, and heard from again), and wakes
// the election.
func (c *Coordinator) counted(held, alive uint64) {
	c.silenced.mu.Lock()
	c.silenced.held += held
	c.silenced.alive += alive
	c.silenced.mu.Unlock()
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// onLeaderSilent takes a successor's notice that the leader is silent.
func (c *Coordinator) onLeaderSilent(env *pb.Envelope, s *pb.LeaderSilent) {
	if !c.isRankMember(env) {
		c.refuse(env, "a silent leader's notice from a member that is not a rank")
		return
	}
	c.mu.Lock()
	leader := c.leaderName
	succ := c.successorLocked(leader)
	m := c.members[s.Leader]
	c.mu.Unlock()
	if s.Leader != leader || m == nil {
		return // (elected past it already)
	}
	if env.Sender == succ {
		if c.hold(s.Leader) {
			c.log.Warn("the leader's successor hears nothing from the leader: electing without it", "silent_leader", s.Leader, "successor", succ)
		}
		return
	}
	c.silenced.mu.Lock()
	if c.silenced.verifying[s.Leader] {
		c.silenced.mu.Unlock()
		return
	}
	if c.silenced.verifying == nil {
		c.silenced.verifying = map[string]bool{}
	}
	c.silenced.verifying[s.Leader] = true
	c.silenced.mu.Unlock()
	node := *m.node
	c.spawn(func() {
		defer func() {
			c.silenced.mu.Lock()
			delete(c.silenced.verifying, s.Leader)
			c.silenced.mu.Unlock()
		}()
		if !c.ping(node) && c.hold(s.Leader) {
			c.log.Warn("the leader answers no ping: electing without it", "silent_leader", s.Leader, "told_by", env.Sender)
		}
	})
}

// pingSilent pings, about once every LeaderSilence, each member held silent.
func (c *Coordinator) pingSilent() {
	if c.nsilent.Load() == 0 {
		return
	}
	now := time.Now()
	var due []silentMember
	c.mu.Lock()
	for _, s := range c.silent {
		if now.Sub(s.pinged) >= c.cfg.LeaderSilence {
			s.pinged = now
			due = append(due, *s)
		}
	}
	c.mu.Unlock()
	for _, s := range due {
		node := *s.m.node
		c.spawn(func() {
			if c.ping(node) {
				c.heardFrom(node.Name)
			}
		})
	}
}

// heardFrom puts back a member held silent that answered or sent a message: it
// was alive all along.
func (c *Coordinator) heardFrom(name string) {
	if c.nsilent.Load() == 0 {
		return
	}
	c.mu.Lock()
	s := c.silent[name]
	if s == nil || c.members[name] != nil {
		delete(c.silent, name)
		c.recountLocked()
		c.mu.Unlock()
		return
	}
	delete(c.silent, name)
	delete(c.gone, name)
	m := s.m
	c.setMember(name, &m)
	c.recountLocked()
	c.mu.Unlock()
	c.log.Warn("a leader held silent is heard from again: it leads again (a term was taken while it lived)", "silent_leader", name, "silent_for", time.Since(s.at).Round(time.Millisecond))
	c.counted(0, 1)
}

// unsilenceLocked forgets that name is held silent (c.mu held): memberlist has
// news of it, alive (counted as heard from again) or gone, which ends the silence.
func (c *Coordinator) unsilenceLocked(name string, alive bool) {
	if _, ok := c.silent[name]; !ok {
		return
	}
	delete(c.silent, name)
	c.recountLocked()
	if alive {
		c.silenced.mu.Lock()
		c.silenced.alive++
		c.silenced.mu.Unlock()
		c.log.Warn("a leader held silent is alive after all: it leads again (a term was taken while it lived)", "silent_leader", name)
	}
}

// ping pings the member n directly (memberlist's ping); false when it did not
// answer within memberlist's probe timeout.
func (c *Coordinator) ping(n memberlist.Node) bool {
	ml := c.memberlist()
	if ml == nil {
		return false
	}
	_, err := ml.Ping(n.Name, &net.UDPAddr{IP: n.Addr, Port: int(n.Port)})
	return err == nil
}
