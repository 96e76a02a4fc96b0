package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/memsnap/memsnap/coordinator/cluster"
	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/coordinator/leader"
	"github.com/memsnap/memsnap/coordinator/rankside"
	"github.com/memsnap/memsnap/coordinator/transport"
	"github.com/memsnap/memsnap/coordinator/wire"
	"github.com/memsnap/memsnap/internal/pb"
)

// ErrStopped is returned by calls on a coordinator that has shut down, and by a
// Run after Shutdown.
var ErrStopped = errors.New("coordinator: stopped")

// Recorder is what the coordinator needs of the rank's agent (rankagent.Agent).
type Recorder = rankside.Recorder

// member is one member of the cluster as this member sees it.
type member struct {
	node *memberlist.Node
	meta *pb.NodeMeta
	addr string // node's host:port, formatted once
}

// life is where a Coordinator stands: New makes it, Run runs it once, Shutdown
// stops it for good (serf's alive/leaving/left/shutdown, in small).
type life int

const (
	lifeNew life = iota
	lifeRunning
	lifeStopped
)

// Coordinator is one member of the cluster.
type Coordinator struct {
	cfg   Config
	log   *slog.Logger
	rec   Recorder // nil for a client
	name  string
	agent string // this agent's own id, new at each start (NodeMeta.Agent)
	inbox chan []byte
	bc    *memberlist.TransmitLimitedQueue
	out   *outbox        // replies and reports, sent by workers off the dispatcher
	rs    *rankside.Rank // the rank side (a client's takes no command)

	metaMu sync.Mutex // held while gossiping new metadata
	lifeMu sync.Mutex // held by Leave and by Shutdown's call into memberlist

	// nmembers is len(members), read without mu by the broadcast queue, which
	// memberlist drives while it may hold its own locks
	nmembers atomic.Int64
	// nranksSeen is nranks, read without mu when answering a probe (pings)
	nranksSeen atomic.Int64
	pingJoin   pingJoins
	// nsilent is len(silent), read without mu on every message received
	nsilent  atomic.Int64
	silenced silences
	moves    moves       // members started again at another address (moved.go)
	watch    leaderWatch // the successor's watch of the leader (succession.go)

	// mu guards what follows. Lock order: memberlist calls memberChanged (which
	// takes mu) while it holds its node lock, so nothing may call into
	// memberlist while holding mu.
	mu         sync.Mutex
	state      life
	ml         *memberlist.Memberlist
	addr       string // the gossip address, host:port
	members    map[string]*member
	nranks     int                      // members that are ranks (meta.Rank >= 0), kept with members
	addrs      map[string]int           // members' addresses (host:port), kept with members
	lowest     string                   // the rank member of the lowest (rank, name), kept with members
	lowestOld  bool                     // lowest left or changed: electLocked looks again
	order      uint64                   // counts changes of the rank members' order and hosts, kept with members
	succ       succession               // the leader's successor, as of order (succession.go)
	seenAddrs  map[string]string        // every rank member ever seen: name -> address, to rejoin after a split
	gone       map[string]goneMember    // members memberlist took away, until they are back
	lastOther  string                   // the last member other than this one that it saw lead
	silent     map[string]*silentMember // members held silent (succession.go), until heard from or gone
	leaderName string
	lead       *leader.Leader // this member's leader loop, while it leads
	lastWindow uint64         // the newest window id seen
	term       uint64         // the newest leadership term the run's log holds, as far as this member knows (belief.go)
	claimed    uint64         // the newest term another member claims, looked up in the log
	claims     chan struct{}
	metaSent   metaKey            // what the gossiped metadata last said
	waiting    map[uint64]*waiter // replies a request waits for, by its random seq
	views      map[int]rankView   // every rank's last memory figures, as received (view.go)
	incidents  map[int]incident   // every rank's latest OOM or crash, as the leader heard of it (view.go)
	dropped    int
	refused    refusals
	changed    chan struct{}      // membership changed
	termBump   chan struct{}      // a newer term was seen
	leaderSig  chan struct{}      // the leader changed (for the clock loop)
	joined     bool               // joined the cluster (or had no one to join)
	stopRun    context.CancelFunc // ends Run's context, for Shutdown
	runDone    <-chan struct{}    // Run's context's Done (nil before Run)
	began      time.Time          // when Run started: agents of one job join within JoinGrace of each other
	down       chan struct{}      // closed once the first Shutdown is done
	wg         sync.WaitGroup
}

// metaKey is what the metadata says that others read; it is gossiped only when it changes.
type metaKey struct {
	window, term uint64
	gpu          string
}

// New checks the configuration and prepares a member; Run starts it. rec is the
// rank's agent; nil for a client.
func New(cfg Config, rec Recorder) (*Coordinator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Client && rec == nil {
		return nil, errors.New("coordinator: a rank needs its recorder")
	}
	c := &Coordinator{cfg: cfg, rec: rec, inbox: make(chan []byte, 4096), members: map[string]*member{}, seenAddrs: map[string]string{}, gone: map[string]goneMember{},
		waiting: map[uint64]*waiter{}, changed: make(chan struct{}, 1), termBump: make(chan struct{}, 1), claims: make(chan struct{}, 1),
		leaderSig: make(chan struct{}, 1), down: make(chan struct{})}
	if cfg.Client {
		var b [4]byte
		rand.Read(b[:])
		c.name = fmt.Sprintf("%s/client-%d-%s", cfg.Identity.RunName, os.Getpid(), hex.EncodeToString(b[:]))
		c.log = cfg.Logger.With("member", "client")
	} else {
		c.name = NodeName(cfg.Identity.RunName, cfg.Identity.Rank)
		c.log = cfg.Logger.With("rank", cfg.Identity.Rank)
	}
	var a [8]byte
	rand.Read(a[:])
	c.agent = hex.EncodeToString(a[:])
	c.bc = &memberlist.TransmitLimitedQueue{NumNodes: func() int { return max(1, c.numMembers()) }, RetransmitMult: 3}
	c.out = newOutbox(c)
	c.rs = rankside.New(&c.cfg, rec, roles{c}, c.log)
	return c, nil
}

// NodeName is a rank's member name: its run and rank.
func NodeName(run string, rank int) string { return config.NodeName(run, rank) }

func (c *Coordinator) rank() int32 {
	if c.cfg.Client {
		return -1
	}
	return int32(c.cfg.Identity.Rank)
}

func (c *Coordinator) numMembers() int { return int(c.nmembers.Load()) }

// NumMembers is how many members this one sees, itself included.
func (c *Coordinator) NumMembers() int { return c.numMembers() }

// Name is this member's name.
func (c *Coordinator) Name() string { return c.name }

// Run starts the member, joins the cluster (retrying until a member answers or ctx
// ends), and serves until ctx ends; then it leaves and shuts down, waits for every
// goroutine it started, and returns nil. A Coordinator runs once: a second Run is
// refused, and a Run after Shutdown returns ErrStopped.
func (c *Coordinator) Run(ctx context.Context) error {
	c.mu.Lock()
	switch c.state {
	case lifeStopped:
		c.mu.Unlock()
		return ErrStopped
	case lifeRunning:
		c.mu.Unlock()
		return errors.New("coordinator: Run called twice")
	}
	c.state = lifeRunning
	c.began = time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.stopRun, c.runDone = cancel, ctx.Done()
	c.mu.Unlock()
	defer c.Shutdown()
	if err := c.start(); err != nil {
		return err
	}
	c.spawn(func() { c.dispatch(ctx) })
	c.spawn(func() { c.watchLeader(ctx) })
	c.out.start(ctx)
	c.spawn(func() { c.watchSuccession(ctx) })
	if !c.cfg.Client {
		c.spawn(func() { c.verifyTerms(ctx) })
		c.spawn(func() { c.rs.ClockLoop(ctx, c.leaderSig) })
		c.spawn(func() { c.rs.RunReporter(ctx) })
		c.spawn(func() { c.rs.IncidentLoop(ctx) })
		c.spawn(func() { c.figuresLoop(ctx) })
	}
	if err := c.join(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	c.mu.Lock()
	c.joined = true
	c.mu.Unlock()
	c.memberChanged(nil, false)
	c.spawn(func() { c.rejoinLoop(ctx) })
	<-ctx.Done()
	c.Leave(2 * time.Second)
	return nil
}

// spawn starts f as a goroutine Shutdown waits for, unless the member has
// stopped (Shutdown may be waiting already: nothing starts after it).
func (c *Coordinator) spawn(f func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == lifeStopped {
		return false
	}
	c.wg.Add(1)
	go func() { defer c.wg.Done(); f() }()
	return true
}

// start creates the memberlist, unless the member was shut down meanwhile.
func (c *Coordinator) start() error {
	c.mu.Lock()
	ml := *c.cfg.Memberlist
	c.mu.Unlock()
	ml.Name = c.name
	ml.Delegate = &delegate{c}
	ml.Events = &events{c}
	ml.Ping = &pings{c}
	ml.Alive = &alive{c}
	ml.Conflict = &conflicts{c}
	ml.Label = LabelFor(c.cfg.Identity.RunName)
	ml.SecretKey = c.cfg.SecretKey
	ml.LogOutput = nil
	ml.Logger = cluster.MemberlistLogger(c.log)
	if len(c.cfg.SecretKey) == 0 {
		c.log.Warn("gossip is NOT encrypted or authenticated (--insecure): anyone who reaches the gossip port can join and send windows")
	}
	if ml.Transport == nil {
		t, err := transport.New(&ml, c.log)
		if err != nil {
			return err
		}
		ml.Transport = t
	}
	m, err := memberlist.Create(&ml)
	if err != nil {
		ml.Transport.Shutdown()
		return fmt.Errorf("coordinator: starting gossip on %s:%d: %w", ml.BindAddr, ml.BindPort, err)
	}
	// LocalNode returns memberlist's own record, which it rewrites (under its lock)
	// whenever the metadata changes: it is read once, here, before this member
	// has joined anyone or gossiped new metadata
	n := m.LocalNode()
	addr := net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
	c.mu.Lock()
	if c.state == lifeStopped {
		c.mu.Unlock()
		m.Shutdown()
		return ErrStopped
	}
	c.ml, c.addr = m, addr
	c.mu.Unlock()
	c.log.Info("gossip started", "name", c.name, "addr", addr, "encrypted", len(c.cfg.SecretKey) > 0)
	return nil
}

// Addr is this member's gossip address (host:port), once it has started.
func (c *Coordinator) Addr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.addr
}

func (c *Coordinator) memberlist() *memberlist.Memberlist {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ml
}

// Leave announces that this member leaves; Shutdown stops it.
func (c *Coordinator) Leave(timeout time.Duration) error {
	c.lifeMu.Lock() // memberlist panics on a Leave after its Shutdown
	defer c.lifeMu.Unlock()
	c.mu.Lock()
	m, stopped := c.ml, c.state == lifeStopped
	c.mu.Unlock()
	if stopped {
		return ErrStopped
	}
	if m == nil {
		return nil
	}
	return m.Leave(timeout)
}

// Shutdown stops gossip and every goroutine the member started; it is idempotent,
// and a member shut down never runs again.
func (c *Coordinator) Shutdown() error {
	c.mu.Lock()
	if c.state == lifeStopped {
		c.mu.Unlock()
		<-c.down // another Shutdown is under way: return once it is done
		return nil
	}
	defer close(c.down)
	c.state = lifeStopped
	m := c.ml
	lead := c.lead
	c.lead = nil
	stopRun := c.stopRun
	c.mu.Unlock()
	if stopRun != nil {
		stopRun() // Run's goroutines end with its context
	}
	if lead != nil {
		lead.Stop()
	}
	var err error
	if m != nil {
		c.lifeMu.Lock()
		err = m.Shutdown()
		c.lifeMu.Unlock()
	}
	c.wg.Wait()
	return err
}

func (c *Coordinator) stopped() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state == lifeStopped
}

// Members returns the live members' metadata, ranks first in order, then clients.
func (c *Coordinator) Members() []*pb.NodeMeta {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*pb.NodeMeta, 0, len(c.members))
	for _, m := range c.members {
		out = append(out, m.meta)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Rank, out[j].Rank
		if (a < 0) != (b < 0) {
			return a >= 0
		}
		return a < b
	})
	return out
}

// Leader returns the current leader's rank, or ok=false when no rank is alive.
func (c *Coordinator) Leader() (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.members[c.leaderName]
	if m == nil {
		return 0, false
	}
	return int(m.meta.Rank), true
}

// Busy reports whether this member leads a window in progress (or has one queued).
func (c *Coordinator) Busy() bool {
	c.mu.Lock()
	l := c.lead
	n := len(c.inbox)
	c.mu.Unlock()
	return n > 0 || (l != nil && l.Busy())
}

// Unfinished says what this member leaves undone were it stopped now, for the
// agent's last words ("" when nothing): the leader's window in progress or being
// published, or reports to the leader not yet sent.
func (c *Coordinator) Unfinished() string {
	c.mu.Lock()
	l, w := c.lead, c.lastWindow
	c.mu.Unlock()
	var out []string
	if l != nil && l.Busy() {
		out = append(out, fmt.Sprintf("this agent led, and its work on window %d (or a request it held) was not finished: the next leader, or this agent started again, finishes it from the run's log", w))
	}
	if !c.rs.Settled() {
		out = append(out, "reports to the leader not all sent (what was stored is in the run's log)")
	}
	return strings.Join(out, "; ")
}

// IsLeader reports whether this member leads.
func (c *Coordinator) IsLeader() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leaderName == c.name
}

// Term is the newest leadership term this member has seen.
func (c *Coordinator) Term() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.term
}

// ClockOffset returns this host's clock minus the leader's and the round trip it
// was measured over, once measured.
func (c *Coordinator) ClockOffset() (offset, rtt time.Duration, ok bool) {
	return c.rs.ClockOffset()
}

// --- membership ---------------------------------------------------------------

func (c *Coordinator) meta() *pb.NodeMeta {
	id := c.cfg.Identity
	h, _ := os.Hostname()
	if len(h) > 64 {
		h = h[:64]
	}
	m := &pb.NodeMeta{Version: 1, Run: id.RunName, Rank: c.rank(), LocalRank: int32(id.LocalRank), NodeRank: int32(id.NodeRank),
		WorldSize: int32(id.WorldSize), Hostname: h, Agent: c.agent}
	if g, ok := c.rec.(interface{ DeviceUUID() string }); ok && c.rec != nil {
		m.GpuUuid = g.DeviceUUID()
		if len(m.GpuUuid) > 64 {
			m.GpuUuid = m.GpuUuid[:64]
		}
	}
	c.mu.Lock()
	m.LastWindow, m.Term = c.lastWindow, c.term
	c.metaSent = metaKey{window: m.LastWindow, term: m.Term, gpu: m.GpuUuid}
	c.mu.Unlock()
	return m
}

// setMember records m as the member named name (nil: gone), keeping what is kept
// with the members: the count of ranks, their addresses, and the candidate
// leader; mu is held. Every member sees every member's metadata updates, and a
// new term is one update by every member: at 1,024 members each of them is a
// million calls here across the cluster, so none of it walks the members.
func (c *Coordinator) setMember(name string, m *member) {
	if c.addrs == nil {
		c.addrs = map[string]int{}
	}
	old := c.members[name]
	if old == nil || m == nil || old.meta.Rank != m.meta.Rank || !old.node.Addr.Equal(m.node.Addr) {
		c.order++ // (the succession is worked out again: succession.go)
	}
	if old != nil {
		if old.meta.Rank >= 0 {
			c.nranks--
			c.nranksSeen.Store(int64(c.nranks))
		}
		if m != nil && old.node.Port == m.node.Port && old.node.Addr.Equal(m.node.Addr) {
			m.addr = old.addr
		}
		if c.addrs[old.addr]--; c.addrs[old.addr] <= 0 {
			delete(c.addrs, old.addr)
		}
	}
	if m == nil {
		delete(c.members, name)
		if name == c.lowest {
			c.lowestOld = true
		}
		return
	}
	if m.addr == "" {
		m.addr = m.node.Address()
	}
	c.members[name] = m
	c.addrs[m.addr]++
	if m.meta.Rank < 0 {
		if name == c.lowest {
			c.lowestOld = true
		}
		return
	}
	c.nranks++
	c.nranksSeen.Store(int64(c.nranks))
	switch {
	case c.lowestOld:
	case name == c.lowest && old != nil:
		c.lowestOld = m.meta.Rank > old.meta.Rank // (an update: old is its earlier self)
	case c.lowest == "" || before(m.meta.Rank, name, c.members[c.lowest].meta.Rank, c.lowest):
		c.lowest = name
	}
}

// before orders candidate leaders: the lower rank, then the lower name.
func before(r1 int32, n1 string, r2 int32, n2 string) bool {
	return r1 < r2 || r1 == r2 && n1 < n2
}

// memberChanged records a member's arrival, update or departure.
func (c *Coordinator) memberChanged(n *memberlist.Node, gone bool) {
	if n != nil && c.movedNews(n) {
		return // (of a moved member's old incarnation: moved.go)
	}
	c.memberNews(n, gone)
}

// memberNews takes news of n (memberChanged's, or of a member moved).
func (c *Coordinator) memberNews(n *memberlist.Node, gone bool) {
	claim := uint64(0)
	c.mu.Lock()
	if n == nil {
		// nothing changed but whether this member may lead
	} else if gone {
		// only ranks are waited for: clients come and go (each `memsnap
		// snapshot` is one) and would fill what is remembered
		if m := c.members[n.Name]; m != nil && m.meta.Rank >= 0 && len(c.gone) < maxSeenAddrs {
			c.gone[n.Name] = goneMember{at: time.Now(), members: len(c.members)}
		}
		c.setMember(n.Name, nil)
		c.unsilenceLocked(n.Name) // memberlist's verdict: gone
	} else if meta, err := wire.DecodeMeta(n.Meta); err == nil && meta.Run == c.cfg.Identity.RunName {
		nn := *n
		// (a member held silent stays held until it answers a ping: pingSilent)
		if !c.newsOfSilentLocked(n.Name, &member{node: &nn, meta: meta, addr: nn.Address()}) {
			delete(c.gone, n.Name)
			c.setMember(n.Name, &member{node: &nn, meta: meta})
		}
		c.lastWindow = max(c.lastWindow, meta.LastWindow)
		claim = meta.Term
		if meta.Rank >= 0 && len(c.seenAddrs) < maxSeenAddrs {
			c.seenAddrs[n.Name] = nn.Address()
		}
	}
	c.nmembers.Store(int64(len(c.members)))
	c.mu.Unlock()
	select {
	case c.changed <- struct{}{}:
	default:
	}
	if claim > 0 {
		c.claimTerm(claim)
	}
}

// maxSeenAddrs bounds the addresses remembered for rejoining (and the members
// remembered as gone).
const maxSeenAddrs = 1 << 16

// goneMember is when memberlist took a member away.
type goneMember struct {
	at      time.Time
	members int  // the cluster's size then, which memberlist's suspicion scales with
	silent  bool // held silent (succession.go), not declared dead by memberlist
}

// lastHeard is when a member gone from the cluster was last heard from, as far
// as failure detection tells: one declared dead had not answered for at least
// memberlist's shortest suspicion timeout before (a live agent, or one restarted
// under its name, refutes a suspicion within it). memberlist does not tell its
// events delegate a death from an announced leave (the node's State it passes is
// not set), so a member that left is taken to have gone as quietly: its grace is
// shorter by the suspicion timeout (at most MaxSuspicion, 4 s, on production's
// timers: 1 s of production's RejoinGrace of 5 s is left for an agent stopped
// and restarted under its name). A member never seen to go was heard from now, for all we
// know.
func (c *Coordinator) lastHeard(name string, now time.Time) time.Time {
	c.mu.Lock()
	g, ok := c.gone[name]
	ml := c.cfg.Memberlist // (readvertise replaces it)
	c.mu.Unlock()
	if !ok {
		return now
	}
	if g.silent {
		// a leader held silent answered no ping for LeaderSilence: a window it was
		// a rank of waits for it no longer (an agent restarted under its name has
		// no recording of the window; one only slow is heard from again, and a
		// member again, before the window is published or not at all)
		if t := g.at.Add(-c.cfg.RejoinGrace); t.Before(now) {
			return t
		}
		return now
	}
	return g.lastHeard(ml, now)
}

// goneAt is when memberlist took the member name away (now when it was never
// seen to go).
func (c *Coordinator) goneAt(name string, now time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g, ok := c.gone[name]; ok {
		return g.at
	}
	return now
}

func (g goneMember) lastHeard(ml *memberlist.Config, now time.Time) time.Time {
	t := g.at
	if ml != nil {
		t = t.Add(-config.SuspicionTimeout(ml.SuspicionMult, g.members, ml.ProbeInterval))
	}
	if t.After(now) {
		return now
	}
	return t
}

// termBumped wakes the leader loop (a leader with an older term renews it). Only
// the leader gossips the term it takes (leaderRun.renewTerm, updateMeta): at
// 1,024 members every member gossiping each new term it heard of kept a
// simulated cluster's cores busy for a minute after each failover.
func (c *Coordinator) termBumped() {
	select {
	case c.termBump <- struct{}{}:
	default:
	}
}

// electLocked picks the lowest alive rank (of two members claiming one rank, the
// lower name); a member that has not joined yet knows of no one to elect. It
// walks the members only when the candidate kept with them left or changed.
func (c *Coordinator) electLocked() string {
	if !c.joined {
		return ""
	}
	if c.lowestOld {
		c.lowest, c.lowestOld = "", false
		for n, m := range c.members {
			if m.meta.Rank >= 0 && (c.lowest == "" || before(m.meta.Rank, n, c.members[c.lowest].meta.Rank, c.lowest)) {
				c.lowest = n
			}
		}
	}
	return c.lowest
}

// watchLeader re-elects on every membership change and starts or stops this
// member's leader loop with its leadership.
func (c *Coordinator) watchLeader(ctx context.Context) {
	for {
		c.mu.Lock()
		prev := c.leaderName
		c.leaderName = c.electLocked()
		now := c.leaderName
		var stop *leader.Leader
		start := false
		if now != prev && c.lead != nil && now != c.name {
			stop, c.lead = c.lead, nil
		}
		if now == c.name && c.lead == nil && c.state != lifeStopped && !c.cfg.Client {
			start = true
		}
		if prev != "" && prev != c.name {
			c.lastOther = prev
		}
		before := c.lastOther
		c.mu.Unlock()
		if start && !c.mayLead(before) {
			start = false
		}
		if now != prev {
			select {
			case c.leaderSig <- struct{}{}:
			default:
			}
			c.rs.ReaskPostmortem()
			if m := c.memberMeta(now); m != nil {
				c.log.Info("leader", "leader_rank", m.Rank, "me", now == c.name)
			} else {
				c.log.Info("no leader: no rank is alive")
			}
		}
		if stop != nil {
			stop.Stop()
		}
		if start {
			l := leader.New(roles{c}, &c.cfg, c.log)
			c.mu.Lock()
			if c.state == lifeStopped || c.leaderName != c.name {
				c.mu.Unlock()
			} else {
				// started under mu, so Shutdown never finds a leader half started
				c.lead = l
				l.Start(ctx, &c.wg)
				g, gone := c.gone[before]
				c.mu.Unlock()
				if gone && !g.silent && c.cfg.LeaderProbe > 0 { // (one held silent: the watch's notice, naming its host, went out)
					// memberlist took the leader away here; a member whose own
					// verdict lags would refuse this leader's commands until it
					// comes: it is told, and checks with pings of its own
					c.noticeSilent(before, nil)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-c.changed:
		case <-c.termBump:
			c.mu.Lock()
			l := c.lead
			c.mu.Unlock()
			if l != nil {
				l.Wake()
			}
		}
	}
}

// staleVerdict bounds how long after memberlist took a leader away a member
// about to lead in its place pings it first.
const staleVerdict = 2 * time.Second

// mayLead reports whether this member, elected, may start leading in place of
// before, the leader it saw last. A leader memberlist took away moments ago
// (not one held silent: the successor's watch pinged that one already) is
// pinged first: news of an earlier incarnation under its name (gossiped by a
// member that outlived a relaunch of the job) takes a live leader away for a
// moment, and a term taken meanwhile would supersede it. While it answers,
// this member waits (at most staleVerdict from its departure) for memberlist
// to bring it back.
func (c *Coordinator) mayLead(before string) bool {
	c.mu.Lock()
	g, gone := c.gone[before]
	addr := c.seenAddrs[before]
	c.mu.Unlock()
	left := time.Since(g.at)
	if before == "" || !gone || g.silent || left >= staleVerdict || addr == "" {
		return true
	}
	host, port, err := net.SplitHostPort(addr)
	pn, perr := strconv.Atoi(port)
	ip := net.ParseIP(host)
	if err != nil || perr != nil || ip == nil || !c.ping(memberlist.Node{Name: before, Addr: ip, Port: uint16(pn)}) {
		return true
	}
	c.log.Warn("the leader memberlist took away answers a ping: waiting for it to come back before leading in its place", "leader", before,
		"gone_for", left.Round(time.Millisecond))
	time.AfterFunc(staleVerdict-left, func() { // (elect again then)
		select {
		case c.changed <- struct{}{}:
		default:
		}
	})
	return false
}

// memberNamed returns a copy of the member named name (zero when there is none).
func (c *Coordinator) memberNamed(name string) member {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.members[name]; m != nil {
		return *m
	}
	return member{}
}

func (c *Coordinator) memberMeta(name string) *pb.NodeMeta { return c.memberNamed(name).meta }

// absentRanks lists the ranks of the world that are not members now: those
// this member saw as members before (gone, perhaps restarting), and those it
// never saw (their agents never joined this cluster).
func (c *Coordinator) absentRanks() (gone, never []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	present := map[int]bool{}
	for _, m := range c.members {
		if m.meta.Rank >= 0 {
			present[int(m.meta.Rank)] = true
		}
	}
	for r := 0; r < c.cfg.Identity.WorldSize; r++ {
		if present[r] {
			continue
		}
		if _, seen := c.seenAddrs[NodeName(c.cfg.Identity.RunName, r)]; seen {
			gone = append(gone, r)
		} else {
			never = append(never, r)
		}
	}
	return gone, never
}

// rankNodes returns the live ranks' nodes by rank.
func (c *Coordinator) rankNodes() map[int]*memberlist.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[int]*memberlist.Node{}
	for _, m := range c.members {
		if m.meta.Rank >= 0 {
			out[int(m.meta.Rank)] = m.node
		}
	}
	return out
}

// rankAgents is each member rank's agent id (this member's own included).
func (c *Coordinator) rankAgents() map[int]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[int]string{}
	for _, m := range c.members {
		if m.meta.Rank >= 0 && m.meta.Agent != "" {
			out[int(m.meta.Rank)] = m.meta.Agent
		}
	}
	if r := c.rank(); r >= 0 {
		out[int(r)] = c.agent
	}
	return out
}

func (c *Coordinator) node(name string) *memberlist.Node { return c.memberNamed(name).node }

// isRankMember reports whether env comes, by its own account, from a rank that is
// a member: its name is its rank's.
func (c *Coordinator) isRankMember(env *pb.Envelope) bool {
	if env.SenderRank < 0 || env.Sender != NodeName(c.cfg.Identity.RunName, int(env.SenderRank)) {
		return false
	}
	return c.node(env.Sender) != nil || env.Sender == c.name
}

// updateMeta gossips this member's metadata when what others read of it changed:
// its GPU, and, for the leader, the newest window and its term. A metadata
// update is a broadcast to every member, so it is never sent for nothing, and a
// member that does not lead does not gossip the window or the term it heard of
// (the run's log keeps both rising, and every member hears them from the
// leader): were every member to, each window and each failover would be an
// update by every member, seen by every member, a million at 1,024 members.
func (c *Coordinator) updateMeta() {
	c.mu.Lock()
	m := c.ml
	want := metaKey{window: c.lastWindow, term: c.term, gpu: c.metaSent.gpu}
	same := want == c.metaSent
	if c.lead == nil {
		same = true // (unless its GPU changed, below)
	}
	stopped := c.state == lifeStopped
	c.mu.Unlock()
	if g, ok := c.rec.(interface{ DeviceUUID() string }); ok && c.rec != nil {
		if u := g.DeviceUUID(); u != want.gpu && len(u) <= 64 {
			same = false
		}
	}
	if m == nil || same || stopped {
		return
	}
	c.spawn(func() {
		// memberlist's UpdateNode reads the local node's state unlocked while
		// another call writes it: one at a time
		c.metaMu.Lock()
		defer c.metaMu.Unlock()
		m.UpdateNode(time.Second)
	})
}
