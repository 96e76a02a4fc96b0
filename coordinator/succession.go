package coordinator

import (
	"context"
	"net"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/memsnap/memsnap/coordinator/wire"
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
// A leader held silent that answers a ping again is a member again and leads
// again (a message under its name only has it pinged at once: anyone holding
// the key can send one in its name): it was only slow (a stalled process, a lost
// burst of packets). The run's log fences what the successor did meanwhile (its
// term is newer; the old leader takes a newer one still). Each member counts
// the leaders it held silent and those heard from again (Silences), so that a
// false suspicion is seen in production. memberlist's own verdict ends a
// silence: a member it declares dead is gone for good, one it never declares
// dead is pinged until it answers.

// silentMember is a member this one holds silent.
type silentMember struct {
	m      member // as last heard of (memberlist's news of it updates it)
	agent  string // its agent's id when it was held (a restarted agent's is new)
	leader bool   // held as the leader (not as a member of its host held with it)
	with   string // held with this leader (a member of its host)
	at     time.Time
	pinged time.Time // when it was last pinged (to be heard from again)
}

// silences counts the leaders this member held silent, and of those, the ones
// heard from again (alive after all).
type silences struct {
	mu          sync.Mutex
	held, alive uint64
	checked     uint64          // notices checked with pings of this member's own
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
	return c.successionLocked(leader).next
}

// succession is what the watch of a leader asks of the members every probe:
// its successor and, for this member, whether it watches the leader from
// another host (offHostLocked). Worked out once per change of the members'
// order or hosts: at 1,024 members a walk of them every probe, on every member,
// was most of an idle cluster's CPU.
type succession struct {
	order  uint64 // Coordinator.order when worked out (0: never)
	leader string
	next   string   // the successor
	ahead  []string // offHostLocked's (shared: read only)
	off    bool
}

// successionLocked is the succession of leader, from the cache while the
// members' order and hosts are unchanged.
func (c *Coordinator) successionLocked(leader string) succession {
	if c.succ.order == c.order && c.order != 0 && c.succ.leader == leader {
		return c.succ
	}
	s := succession{order: c.order, leader: leader, next: c.successorPastLocked(leader, nil)}
	s.ahead, s.off = c.offHostLocked(leader)
	c.succ = s
	return s
}

// successorPastLocked is the member that leads were the leader and the
// members skip names gone: the lowest rank member after the leader that skip
// does not name ("" when there is none).
func (c *Coordinator) successorPastLocked(leader string, skip map[string]bool) string {
	lm := c.members[leader]
	if lm == nil {
		return ""
	}
	next := ""
	for n, m := range c.members {
		if n == leader || skip[n] || m.meta.Rank < 0 || before(m.meta.Rank, n, lm.meta.Rank, leader) {
			continue
		}
		if next == "" || before(m.meta.Rank, n, c.members[next].meta.Rank, next) {
			next = n
		}
	}
	return next
}

// offHostLocked reports whether this member is the first member after the
// leader on another host (an address of another IP) while the successor is on
// the leader's host, and the members of the leader's host that come before it:
// a host that dies takes its successor with it, so this member watches the
// leader too. One pass over the members, none when this member shares the
// leader's host.
func (c *Coordinator) offHostLocked(leader string) (ahead []string, mine bool) {
	lm, me := c.members[leader], c.members[c.name]
	if lm == nil || me == nil || me.meta.Rank < 0 || me.node.Addr.Equal(lm.node.Addr) || before(me.meta.Rank, c.name, lm.meta.Rank, leader) {
		return nil, false
	}
	for n, m := range c.members {
		if n == leader || n == c.name || m.meta.Rank < 0 || before(m.meta.Rank, n, lm.meta.Rank, leader) || !before(m.meta.Rank, n, me.meta.Rank, c.name) {
			continue
		}
		if !m.node.Addr.Equal(lm.node.Addr) || len(ahead) == wire.MaxSilentAlso {
			return nil, false // (another host comes first, or too many to name)
		}
		ahead = append(ahead, n)
	}
	sort.Strings(ahead)
	return ahead, len(ahead) > 0
}

// leaderWatch is the successor's watch of one leader: a watch starts when
// this member becomes the leader's successor (or after it held the leader), and
// ping answers of an earlier watch count for nothing.
type leaderWatch struct {
	mu     sync.Mutex
	leader string    // the leader watched ("" when none)
	gen    uint64    // the watch's number
	heard  time.Time // when the leader last answered in this watch (zero: not yet)
	lost   int       // pings sent since then that found no answer
	// ahead are the members of the leader's host before this one (an
	// off-host watch), pinged with the leader: when the leader falls silent
	// this member knows already whether they did too
	ahead map[string]*pingTrack
}

// pingTrack is what the pings of one member found in a watch.
type pingTrack struct {
	heard time.Time // when it last answered (zero: not yet)
	lost  int       // pings since then that found no answer
}

// silentFor reports whether it answered none of at least two pings for
// silence, having answered before.
func (p *pingTrack) silentFor(silence time.Duration) bool {
	return !p.heard.IsZero() && p.lost >= 2 && time.Since(p.heard) >= silence
}

func (p *pingTrack) answered(ok bool) {
	switch {
	case ok:
		p.heard, p.lost = time.Now(), 0
	case !p.heard.IsZero():
		p.lost++
	}
}

// start begins a new watch of leader, unless it is the one watched.
func (w *leaderWatch) start(leader string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if leader != w.leader {
		w.leader, w.gen, w.heard, w.lost, w.ahead = leader, w.gen+1, time.Time{}, 0, nil
	}
}

// silent reports whether the leader watched has answered none of at least two
// pings for silence, having answered in this watch before: a leader this
// member never heard in the watch (one it cannot reach while others can, or
// one dead before the watch began) is left to memberlist's verdict.
func (w *leaderWatch) silent(silence time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return (&pingTrack{heard: w.heard, lost: w.lost}).silentFor(silence)
}

// aheadSilent says what the watch's pings found of the members ahead: known
// when every one of them answered in this watch, and then whether every one
// has been silent for silence too (the leader's host died).
func (w *leaderWatch) aheadSilent(ahead []string, silence time.Duration) (silent, known bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	silent = true
	for _, n := range ahead {
		p := w.ahead[n]
		if p == nil || p.heard.IsZero() {
			return false, false
		}
		silent = silent && p.silentFor(silence)
	}
	return silent, true
}

// heardIn reports whether the leader answered in the watch of it.
func (w *leaderWatch) heardIn(leader string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.leader == leader && !w.heard.IsZero()
}

// answered takes the result of a ping of the leader sent in watch gen.
func (w *leaderWatch) answered(gen uint64, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if gen == w.gen {
		p := pingTrack{heard: w.heard, lost: w.lost}
		p.answered(ok)
		w.heard, w.lost = p.heard, p.lost
	}
}

// answeredAhead takes the result of a ping of a member ahead, sent in watch gen.
func (w *leaderWatch) answeredAhead(gen uint64, name string, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if gen != w.gen {
		return
	}
	if w.ahead == nil {
		w.ahead = map[string]*pingTrack{}
	}
	p := w.ahead[name]
	if p == nil {
		p = &pingTrack{}
		w.ahead[name] = p
	}
	p.answered(ok)
}

// watchSuccession pings the leader while this member is its successor (or
// the first member on another host after it, when the successor shares the
// leader's host), and the members it holds silent until they answer; it runs
// until ctx ends.
func (c *Coordinator) watchSuccession(ctx context.Context) {
	every := c.cfg.LeaderProbe
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	w := &c.watch
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.pingSilent()
		c.announceDue()
		c.mu.Lock()
		leader := c.leaderName
		var ahead []string
		mine := false
		if leader != "" && leader != c.name {
			s := c.successionLocked(leader)
			if mine = s.next == c.name; !mine {
				ahead, mine = s.ahead, s.off
			}
		}
		m := c.members[leader]
		c.mu.Unlock()
		if !mine || m == nil {
			w.start("")
			continue
		}
		w.start(leader)
		if w.silent(c.cfg.LeaderSilence) && c.hostSilent(w, ahead) {
			c.declareSilent(leader, ahead)
			w.start("") // (a leader heard from again is watched anew)
			continue
		}
		w.mu.Lock()
		gen := w.gen
		w.mu.Unlock()
		node := *m.node
		c.spawn(func() { w.answered(gen, c.ping(node)) })
		c.pingAhead(w, gen, ahead)
	}
}

// hostSilent reports whether the members ahead (an off-host watch) are silent
// too, by the watch's own pings, or, for one it has not heard yet, by pinging
// them now; with none ahead, true. When one answers, the leader's host lives
// and its successor there watches the leader: this member pings on.
func (c *Coordinator) hostSilent(w *leaderWatch, ahead []string) bool {
	if len(ahead) == 0 {
		return true
	}
	if silent, known := w.aheadSilent(ahead, c.cfg.LeaderSilence); known {
		return silent
	}
	return !c.anyAnswers(ahead)
}

// pingAhead pings, in watch gen, each member ahead (an off-host watch: the
// members of the leader's host before this one).
func (c *Coordinator) pingAhead(w *leaderWatch, gen uint64, ahead []string) {
	if len(ahead) == 0 {
		return
	}
	c.mu.Lock()
	nodes := make([]memberlist.Node, 0, len(ahead))
	for _, n := range ahead {
		if m := c.members[n]; m != nil {
			nodes = append(nodes, *m.node)
		}
	}
	c.mu.Unlock()
	for _, n := range nodes {
		c.spawn(func() { w.answeredAhead(gen, n.Name, c.ping(n)) })
	}
}

// declareSilent holds the leader silent (this member, its successor, leads) and
// tells every member. ahead are the members of the leader's host before this
// one in the succession, found silent too (its host died with the leader).
func (c *Coordinator) declareSilent(leader string, ahead []string) {
	// (the members of its host first, the leader last: the election, woken by
	// each, never picks one of them for the leader)
	for _, n := range ahead {
		c.hold(n, false, leader)
	}
	if !c.hold(leader, true, "") {
		return
	}
	c.log.Warn("the leader answers no ping: leading in its place, until it is heard from again", "silent_leader", leader, "silent_on_its_host", ahead,
		"silence", c.cfg.LeaderSilence)
	c.noticeSilent(leader, ahead)
}

// noticeSilent tells every member that leader (and the members ahead, of its
// host) answer no ping and this member leads in its place.
func (c *Coordinator) noticeSilent(leader string, ahead []string) {
	env := c.envelope(0)
	env.Body = &pb.Envelope_LeaderSilent{LeaderSilent: &pb.LeaderSilent{Leader: leader, Also: ahead}}
	c.mu.Lock()
	to := make([]string, 0, len(c.members))
	for n := range c.members {
		if n != c.name {
			to = append(to, n)
		}
	}
	c.mu.Unlock()
	// (as a datagram, to reach every member at once; sent again a probe later,
	// as one may be lost: a member that has it already ignores the second)
	for _, n := range to {
		c.post(n, "", env, false)
	}
	time.AfterFunc(c.cfg.LeaderProbe, func() {
		c.spawn(func() {
			if !c.holds(leader) && c.memberNamed(leader).node != nil {
				return // (heard from again meanwhile)
			}
			for _, n := range to {
				c.post(n, "", env, false)
			}
		})
	})
}

// anyAnswers pings each member named twice, all at once, and reports whether
// any answered (a member not known now counts as silent).
func (c *Coordinator) anyAnswers(names []string) bool {
	c.mu.Lock()
	var nodes []memberlist.Node
	for _, n := range names {
		if m := c.members[n]; m != nil {
			nodes = append(nodes, *m.node)
		}
	}
	c.mu.Unlock()
	answers := make(chan bool, len(nodes))
	for _, n := range nodes {
		if !c.spawn(func() { answers <- c.pingTwice(n) }) {
			return true // (stopping: no verdict)
		}
	}
	any := false
	for range nodes {
		any = <-answers || any
	}
	return any
}

// hold takes name out of the members as if memberlist had declared it gone,
// keeping it to put back when it is heard from; it reports whether it did. A
// leader held is counted (Silences); a member of its host held with it is not.
func (c *Coordinator) hold(name string, leader bool, with string) bool {
	c.mu.Lock()
	m := c.members[name]
	if m == nil || name == c.name {
		c.mu.Unlock()
		return false
	}
	if c.silent == nil {
		c.silent = map[string]*silentMember{}
	}
	c.silent[name] = &silentMember{m: *m, agent: m.meta.GetAgent(), leader: leader, with: with, at: time.Now(), pinged: time.Now()}
	if m.meta.Rank >= 0 && len(c.gone) < maxSeenAddrs {
		c.gone[name] = goneMember{at: time.Now(), members: len(c.members), silent: true}
	}
	c.setMember(name, nil)
	c.recountLocked()
	c.mu.Unlock()
	if leader {
		c.counted(1, 0)
	} else {
		c.counted(0, 0)
	}
	return true
}

// holds reports whether name is held silent.
func (c *Coordinator) holds(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.silent[name] != nil
}

// pingSoonLocked has name pinged at the next round if it is held silent, and
// the members held with it when it was held as a leader (c.mu held): a
// message under its name, or the leader's return, is news to check, not proof.
func (c *Coordinator) pingSoonLocked(name string) {
	s := c.silent[name]
	if s == nil {
		return
	}
	s.pinged = time.Time{}
	if s.leader {
		for _, o := range c.silent {
			if o.with == name {
				o.pinged = time.Time{}
			}
		}
	}
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

// onLeaderSilent takes a successor's notice that the leader is silent (and,
// when its host died, the members of its host before the sender): this member
// holds them silent too, and keeps each held only while it answers neither of
// two pings of its own. A notice is never taken on trust (a member holding the
// key may send one under any rank's name): at most it moves a member for the
// time of a ping's answer. One check at a time of each leader.
func (c *Coordinator) onLeaderSilent(env *pb.Envelope, s *pb.LeaderSilent) {
	switch {
	case c.cfg.LeaderProbe <= 0:
		return // (the watch is off)
	case env.Sender == c.name || slices.Contains(s.Also, c.name):
		c.refuse(env, "a silent leader's notice in this member's own name")
		return
	case !c.isRankMember(env):
		c.refuse(env, "a silent leader's notice from a member that is not a rank")
		return
	}
	c.mu.Lock()
	leader := c.leaderName
	m := c.members[s.Leader]
	also, ok := c.aheadOfLocked(s.Leader, env.Sender, s.Also)
	skip := map[string]bool{}
	for _, a := range also {
		skip[a.Name] = true
	}
	succ := c.successorPastLocked(leader, skip)
	c.mu.Unlock()
	if !ok {
		c.refuse(env, "a silent leader's notice naming members that do not come between the leader and its sender")
		return
	}
	if s.Leader != leader || s.Leader == c.name || m == nil || !c.verifying(s.Leader, true) {
		return // (elected past it already, or being checked)
	}
	// told by the member it sees as the successor (past the leader's host when
	// the notice says it died), a member follows it at once (its rank's results
	// go to the leader that will take them) and takes back each member held
	// that answers one of its pings; told by another, it pings first
	early := env.Sender == succ
	if early {
		for _, a := range also {
			c.hold(a.Name, false, s.Leader)
		}
		early = c.hold(s.Leader, true, "")
	}
	if early {
		c.log.Warn("the leader's successor hears nothing from the leader: electing without it, and checking", "silent_leader", s.Leader, "successor", succ,
			"silent_on_its_host", len(also))
	}
	node := *m.node
	c.spawn(func() {
		defer c.verifying(s.Leader, false)
		c.checkSilent(node, also, early, env.Sender)
	})
}

// aheadOfLocked is the members named that this member knows, each of which
// comes after leader and before sender in the succession; ok is false when
// one known does not.
func (c *Coordinator) aheadOfLocked(leader, sender string, names []string) (ahead []memberlist.Node, ok bool) {
	lm, sm := c.members[leader], c.members[sender]
	for _, n := range names {
		m := c.members[n]
		if m == nil {
			continue // (gone already, or held)
		}
		if lm == nil || sm == nil || before(m.meta.Rank, n, lm.meta.Rank, leader) || !before(m.meta.Rank, n, sm.meta.Rank, sender) ||
			!m.node.Addr.Equal(lm.node.Addr) {
			return nil, false
		}
		ahead = append(ahead, *m.node)
	}
	return ahead, true
}

// checkSilent pings the leader and the members of its host a notice named,
// each twice: held already (early), each that answers is taken back; not
// held, each that does not is held (the members of its host only with the
// leader).
func (c *Coordinator) checkSilent(leader memberlist.Node, also []memberlist.Node, early bool, from string) {
	nodes := append([]memberlist.Node{leader}, also...)
	answered := make([]bool, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		if !c.spawn(func() { defer wg.Done(); answered[i] = c.pingTwice(n) }) {
			wg.Done()
			answered[i] = true // (stopping: no verdict)
		}
	}
	wg.Wait()
	if early {
		for i, n := range nodes {
			if answered[i] {
				c.heardFrom(n.Name)
			}
		}
		return
	}
	if answered[0] {
		return // (the leader lives: nobody is held)
	}
	// the members of its host first, the leader last (the election, woken by
	// each hold, never picks one of them for the leader)
	for i, n := range nodes[1:] {
		if !answered[i+1] {
			c.hold(n.Name, false, leader.Name)
		}
	}
	if c.hold(leader.Name, true, "") {
		c.log.Warn("the leader answers no ping: electing without it", "silent_leader", leader.Name, "told_by", from)
	}
}

// verifying marks (on) or unmarks a check of leader; marking reports false
// when one is under way.
func (c *Coordinator) verifying(leader string, on bool) bool {
	c.silenced.mu.Lock()
	defer c.silenced.mu.Unlock()
	if !on {
		delete(c.silenced.verifying, leader)
		c.silenced.checked++
		return true
	}
	if c.silenced.verifying[leader] {
		return false
	}
	if c.silenced.verifying == nil {
		c.silenced.verifying = map[string]bool{}
	}
	c.silenced.verifying[leader] = true
	return true
}

// pingTwice pings n twice at once (each within memberlist's probe timeout);
// false only when neither is answered (a lost datagram is not a silence).
func (c *Coordinator) pingTwice(n memberlist.Node) bool {
	answered := make(chan bool, 2)
	for range 2 {
		if !c.spawn(func() { answered <- c.ping(n) }) {
			return true // (stopping: no verdict)
		}
	}
	return <-answered || <-answered
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

// heardFrom puts back a member held silent that answered a ping of this
// member's: it was alive all along (a message under its name only has it
// pinged soon: a member holding the key can send one in any name). The
// members held with a leader heard from are pinged soon too.
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
	c.pingSoonLocked(name) // (the members held with it)
	delete(c.silent, name)
	delete(c.gone, name)
	m := s.m
	c.setMember(name, &m)
	c.recountLocked()
	c.mu.Unlock()
	if m.meta.GetAgent() != s.agent {
		// an agent started again under its name: the leader held silent died
		c.log.Info("a leader held silent is back, started again", "silent_leader", name)
		c.counted(0, 0)
		return
	}
	if !s.leader {
		c.log.Warn("a member held silent with its host's leader is heard from again", "silent_member", name, "silent_for", time.Since(s.at).Round(time.Millisecond))
		c.counted(0, 0)
		return
	}
	c.log.Warn("a leader held silent is heard from again: it leads again (a term was taken while it lived)", "silent_leader", name, "silent_for", time.Since(s.at).Round(time.Millisecond))
	c.counted(0, 1)
}

// newsOfSilentLocked takes memberlist's news that a member held silent is alive
// (its metadata changed: c.mu held): the news may be older than its silence (a
// leader that gossiped a term just before it died), so the member stays held,
// as the news says it is, and is pinged now; it is a member again once it
// answers. It reports whether name is held silent.
//
// News of a term newer than any this member believes is another matter: the
// member took it in the run's log after it was held, so it lives and leads (a
// leader this member cannot reach while the others can): it is a member again
// at once, and the watch of it starts anew (never declared silent again before
// it answers a ping of this member's).
func (c *Coordinator) newsOfSilentLocked(name string, m *member) bool {
	s := c.silent[name]
	if s == nil {
		return false
	}
	if m.meta.Term > c.term {
		c.pingSoonLocked(name) // (the members held with it)
		delete(c.silent, name)
		c.recountLocked()
		c.silenced.mu.Lock()
		if s.leader {
			c.silenced.alive++
		}
		c.silenced.mu.Unlock()
		c.log.Warn("a leader held silent took a newer term: it lives and leads again", "silent_leader", name, "term", m.meta.Term)
		return false
	}
	s.m = *m
	s.pinged = time.Time{} // (pinged at the next round)
	return true
}

// unsilenceLocked forgets that name is held silent (c.mu held): memberlist
// declared it gone, which ends the silence.
func (c *Coordinator) unsilenceLocked(name string) {
	if _, ok := c.silent[name]; ok {
		delete(c.silent, name)
		c.recountLocked()
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
