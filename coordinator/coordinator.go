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
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/rankagent"
)

// ErrStopped is returned by calls on a coordinator that has shut down.
var ErrStopped = errors.New("coordinator: stopped")

// Recorder is what the coordinator needs of the rank's agent (rankagent.Agent).
type Recorder interface {
	Arm(w rankagent.Window) error
	Cancel(id uint64, reason string) error
	Progress() (batch int64, step time.Duration)
	Current() (rankagent.Window, rankagent.WindowState, bool)
	SetClockOffset(offset, rtt time.Duration)
	// Dump asks the trainer for a snapshot now, under window id (a post-mortem).
	Dump(id uint64) error
}

// member is one member of the cluster as this member sees it.
type member struct {
	node *memberlist.Node
	meta *pb.NodeMeta
}

// Coordinator is one member of the cluster.
type Coordinator struct {
	cfg   Config
	log   *slog.Logger
	rec   Recorder // nil for a client
	name  string
	inbox chan []byte
	bc    *memberlist.TransmitLimitedQueue

	metaMu sync.Mutex // held while gossiping new metadata
	lifeMu sync.Mutex // held by Leave and by Shutdown's call into memberlist

	// nmembers is len(members), read without mu by the broadcast queue, which
	// memberlist drives while it may hold its own locks
	nmembers atomic.Int64

	// mu guards what follows. Lock order: memberlist calls memberChanged (which
	// takes mu) while it holds its node lock, so nothing may call into
	// memberlist while holding mu.
	mu         sync.Mutex
	ml         *memberlist.Memberlist
	addr       string // the gossip address, host:port
	members    map[string]*member
	leaderName string
	lead       *leaderRun // this member's leader loop, while it leads
	lastWindow uint64
	offset     clockState
	waiting    map[uint64]chan *pb.Envelope // replies a request waits for, by seq
	seq        uint64
	last       lastWindow     // the rank's latest window, for status answers
	oom        *pb.RankResult // this rank's latest OOM snapshot, once stored
	oomWindow  uint64         // the post-mortem waiting for it, with its leader
	oomLeader  string
	dropped    int
	changed    chan struct{}      // membership changed
	joined     bool               // joined the cluster (or had no one to join)
	stopRun    context.CancelFunc // ends Run's context, for Shutdown
	stopped    bool
	wg         sync.WaitGroup
}

// lastWindow is what a rank knows of its latest window.
type lastWindow struct {
	w      rankagent.Window
	state  string
	result *pb.RankResult
	leader string
}

type clockState struct {
	offset, rtt time.Duration
	ok          bool
	at          time.Time
}

// New checks the configuration and prepares a member; Run starts it. rec is the
// rank's agent; nil for a client.
func New(cfg Config, rec Recorder) (*Coordinator, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if !cfg.Client && rec == nil {
		return nil, errors.New("coordinator: a rank needs its recorder")
	}
	c := &Coordinator{cfg: cfg, rec: rec, inbox: make(chan []byte, 4096), members: map[string]*member{},
		waiting: map[uint64]chan *pb.Envelope{}, changed: make(chan struct{}, 1)}
	if cfg.Client {
		var b [4]byte
		rand.Read(b[:])
		c.name = fmt.Sprintf("%s/client-%d-%s", cfg.Identity.RunName, os.Getpid(), hex.EncodeToString(b[:]))
		c.log = cfg.Logger.With("member", "client")
	} else {
		c.name = NodeName(cfg.Identity.RunName, cfg.Identity.Rank)
		c.log = cfg.Logger.With("rank", cfg.Identity.Rank)
	}
	c.bc = &memberlist.TransmitLimitedQueue{NumNodes: func() int { return max(1, c.numMembers()) }, RetransmitMult: 3}
	return c, nil
}

// NodeName is a rank's member name: its run and rank.
func NodeName(run string, rank int) string { return run + "/rank" + strconv.Itoa(rank) }

func (c *Coordinator) rank() int32 {
	if c.cfg.Client {
		return -1
	}
	return int32(c.cfg.Identity.Rank)
}

func (c *Coordinator) numMembers() int { return int(c.nmembers.Load()) }

// Name is this member's name.
func (c *Coordinator) Name() string { return c.name }

// Run starts the member, joins the cluster (retrying until a member answers or ctx
// ends), and serves until ctx ends; then it leaves and shuts down, waits for every
// goroutine it started, and returns nil.
func (c *Coordinator) Run(ctx context.Context) error {
	if err := c.start(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.mu.Lock()
	c.stopRun = cancel
	c.mu.Unlock()
	defer c.Shutdown()
	c.wg.Add(2)
	go func() { defer c.wg.Done(); c.dispatch(ctx) }()
	go func() { defer c.wg.Done(); c.watchLeader(ctx) }()
	if !c.cfg.Client {
		c.wg.Add(1)
		go func() { defer c.wg.Done(); c.clockLoop(ctx) }()
	}
	if err := c.join(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	c.mu.Lock()
	c.joined = true
	c.mu.Unlock()
	c.memberChanged(nil, false)
	<-ctx.Done()
	c.Leave(2 * time.Second)
	return nil
}

// start creates the memberlist.
func (c *Coordinator) start() error {
	ml := *c.cfg.Memberlist
	ml.Name = c.name
	ml.Delegate = &delegate{c}
	ml.Events = &events{c}
	ml.Ping = nil
	ml.Alive = &alive{c}
	ml.Label = LabelFor(c.cfg.Identity.RunName)
	ml.SecretKey = c.cfg.SecretKey
	ml.LogOutput = nil
	ml.Logger = slog.NewLogLogger(c.log.With("from", "memberlist").Handler(), slog.LevelDebug)
	if len(c.cfg.SecretKey) == 0 {
		c.log.Warn("gossip is NOT encrypted or authenticated (--insecure): anyone who reaches the gossip port can join and send windows")
	}
	m, err := memberlist.Create(&ml)
	if err != nil {
		return fmt.Errorf("coordinator: starting gossip on %s:%d: %w", ml.BindAddr, ml.BindPort, err)
	}
	// LocalNode returns memberlist's own record, which it rewrites (under its lock)
	// whenever the metadata changes: it is read once, here, before this member
	// has joined anyone or gossiped new metadata
	n := m.LocalNode()
	addr := net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
	c.mu.Lock()
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

func (c *Coordinator) join(ctx context.Context) error {
	if len(c.cfg.Join) == 0 {
		return nil
	}
	wait := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		c.mu.Lock()
		m := c.ml
		c.mu.Unlock()
		n, err := m.Join(c.cfg.Join)
		if n > 0 {
			c.log.Info("joined the cluster", "via", c.cfg.Join, "members", m.NumMembers())
			return nil
		}
		if attempt == 1 || attempt%10 == 0 {
			c.log.Info("no member answered yet; retrying", "join", c.cfg.Join, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(wait*2, 5*time.Second)
	}
}

// Leave announces that this member leaves; Shutdown stops it.
func (c *Coordinator) Leave(timeout time.Duration) error {
	c.lifeMu.Lock() // memberlist panics on a Leave after its Shutdown
	defer c.lifeMu.Unlock()
	c.mu.Lock()
	m, stopped := c.ml, c.stopped
	c.mu.Unlock()
	if m == nil {
		return nil
	}
	if stopped {
		return ErrStopped
	}
	return m.Leave(timeout)
}

// Shutdown stops gossip and every goroutine the member started; it is idempotent.
func (c *Coordinator) Shutdown() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	m := c.ml
	lead := c.lead
	c.lead = nil
	stopRun := c.stopRun
	c.mu.Unlock()
	if stopRun != nil {
		stopRun() // Run's goroutines end with its context
	}
	if lead != nil {
		lead.stop()
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
	c.mu.Unlock()
	return l != nil && l.busy()
}

// IsLeader reports whether this member leads.
func (c *Coordinator) IsLeader() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leaderName == c.name
}

// ClockOffset returns this host's clock minus the leader's and the round trip it
// was measured over, once measured.
func (c *Coordinator) ClockOffset() (offset, rtt time.Duration, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.offset.offset, c.offset.rtt, c.offset.ok
}

// --- membership ---------------------------------------------------------------

func (c *Coordinator) meta() *pb.NodeMeta {
	id := c.cfg.Identity
	h, _ := os.Hostname()
	m := &pb.NodeMeta{Version: 1, Run: id.RunName, Rank: c.rank(), LocalRank: int32(id.LocalRank), NodeRank: int32(id.NodeRank),
		WorldSize: int32(id.WorldSize), Hostname: h}
	c.mu.Lock()
	m.LastWindow = c.lastWindow
	c.mu.Unlock()
	m.Batch = -1
	if c.rec != nil {
		b, step := c.rec.Progress()
		m.Batch, m.StepUs = b, step.Microseconds()
		if g, ok := c.rec.(interface{ DeviceUUID() string }); ok {
			m.GpuUuid = g.DeviceUUID()
			if len(m.GpuUuid) > 64 {
				m.GpuUuid = m.GpuUuid[:64]
			}
		}
	}
	if len(h) > 64 {
		m.Hostname = h[:64]
	}
	return m
}

// memberChanged records a member's arrival, update or departure.
func (c *Coordinator) memberChanged(n *memberlist.Node, gone bool) {
	c.mu.Lock()
	if n == nil {
		// nothing changed but whether this member may lead
	} else if gone {
		delete(c.members, n.Name)
	} else if meta, err := decodeMeta(n.Meta); err == nil && meta.Run == c.cfg.Identity.RunName {
		nn := *n
		c.members[n.Name] = &member{node: &nn, meta: meta}
		c.lastWindow = max(c.lastWindow, meta.LastWindow)
	}
	c.nmembers.Store(int64(len(c.members)))
	c.mu.Unlock()
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// electLocked picks the lowest alive rank; a member that has not joined yet knows
// of no one to elect.
func (c *Coordinator) electLocked() string {
	if !c.joined {
		return ""
	}
	best, name := int32(-1), ""
	for n, m := range c.members {
		if m.meta.Rank < 0 {
			continue
		}
		if best < 0 || m.meta.Rank < best {
			best, name = m.meta.Rank, n
		}
	}
	return name
}

// watchLeader re-elects on every membership change and starts or stops this
// member's leader loop with its leadership.
func (c *Coordinator) watchLeader(ctx context.Context) {
	for {
		c.mu.Lock()
		prev := c.leaderName
		c.leaderName = c.electLocked()
		now := c.leaderName
		var stop *leaderRun
		start := false
		if now != prev {
			if c.lead != nil && now != c.name {
				stop, c.lead = c.lead, nil
			}
			if now == c.name && c.lead == nil && !c.stopped && !c.cfg.Client {
				start = true
			}
		}
		c.mu.Unlock()
		if now != prev {
			if m := c.memberMeta(now); m != nil {
				c.log.Info("leader", "rank", m.Rank, "me", now == c.name)
			} else {
				c.log.Info("no leader: no rank is alive")
			}
		}
		if stop != nil {
			stop.stop()
		}
		if start {
			l := newLeader(c)
			c.mu.Lock()
			if c.stopped || c.leaderName != c.name {
				c.mu.Unlock()
			} else {
				// started under mu, so Shutdown never finds a leader half started
				c.lead = l
				l.start(ctx)
				c.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-c.changed:
		}
	}
}

func (c *Coordinator) memberMeta(name string) *pb.NodeMeta {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.members[name]; m != nil {
		return m.meta
	}
	return nil
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

func (c *Coordinator) node(name string) *memberlist.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.members[name]; m != nil {
		return m.node
	}
	return nil
}

// --- messages -----------------------------------------------------------------

func (c *Coordinator) envelope(window uint64) *pb.Envelope {
	return &pb.Envelope{SenderRank: c.rank(), WindowId: window, Sender: c.name}
}

// send sends env to the member named to: over TCP when reliable (it arrives or
// the error says so), else as one UDP packet.
func (c *Coordinator) send(to string, env *pb.Envelope, reliable bool) error {
	if to == c.name {
		c.handleLocal(env)
		return nil
	}
	n := c.node(to)
	if n == nil {
		return fmt.Errorf("coordinator: %s is not a member", to)
	}
	b, err := proto.Marshal(env)
	if err != nil {
		return err
	}
	c.mu.Lock()
	m := c.ml
	c.mu.Unlock()
	if m == nil {
		return ErrStopped
	}
	if reliable || len(b) > 1200 {
		return m.SendReliable(n, b)
	}
	return m.SendBestEffort(n, b)
}

// request sends env and waits for the reply carrying its seq, until ctx ends.
func (c *Coordinator) request(ctx context.Context, to string, env *pb.Envelope, reliable bool) (*pb.Envelope, error) {
	ch, seq := c.expect(1)
	defer c.forget(seq)
	env.Seq = seq
	if err := c.send(to, env, reliable); err != nil {
		return nil, err
	}
	select {
	case r := <-ch:
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// expect registers a wait for replies to a new seq.
func (c *Coordinator) expect(buf int) (chan *pb.Envelope, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	ch := make(chan *pb.Envelope, buf)
	c.waiting[c.seq] = ch
	return ch, c.seq
}

func (c *Coordinator) forget(seq uint64) {
	c.mu.Lock()
	delete(c.waiting, seq)
	c.mu.Unlock()
}

// reply answers req with env.
func (c *Coordinator) reply(req *pb.Envelope, env *pb.Envelope, reliable bool) {
	env.Seq = req.Seq
	if err := c.send(req.Sender, env, reliable); err != nil {
		c.log.Debug("could not reply", "to", req.Sender, "err", err)
	}
}

// enqueue hands a message to the dispatcher; it never blocks (memberlist's
// receive loop calls it).
func (c *Coordinator) enqueue(b []byte) {
	cp := append([]byte(nil), b...)
	select {
	case c.inbox <- cp:
	default:
		c.mu.Lock()
		c.dropped++
		d := c.dropped
		c.mu.Unlock()
		if d == 1 || d%1000 == 0 {
			c.log.Warn("dropping cluster messages: the dispatcher is behind", "dropped", d)
		}
	}
}

// dispatch handles queued messages one at a time.
func (c *Coordinator) dispatch(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case b := <-c.inbox:
			env, err := decodeEnvelope(b)
			if err != nil {
				c.log.Warn("dropped a malformed cluster message", "err", err, "bytes", len(b))
				continue
			}
			c.handle(ctx, env)
		}
	}
}

// isReply reports whether env answers a request (and goes to whoever waits for its
// seq) rather than asking something itself.
func isReply(env *pb.Envelope) bool {
	switch env.Body.(type) {
	case *pb.Envelope_Status, *pb.Envelope_Ack, *pb.Envelope_ClockReply, *pb.Envelope_Progress, *pb.Envelope_WindowResult:
		return true
	}
	return false
}

func (c *Coordinator) handle(ctx context.Context, env *pb.Envelope) {
	// a reply somebody waits for
	if env.Seq != 0 {
		c.mu.Lock()
		ch := c.waiting[env.Seq]
		c.mu.Unlock()
		if ch != nil && isReply(env) {
			select {
			case ch <- env:
			default:
			}
			return
		}
	}
	switch b := env.Body.(type) {
	case *pb.Envelope_StatusRequest:
		c.answerStatus(env)
	case *pb.Envelope_Plan:
		c.onPlan(env, b.Plan)
	case *pb.Envelope_Cancel:
		c.onCancel(env, b.Cancel)
	case *pb.Envelope_Dump:
		c.onDump(env, b.Dump)
	case *pb.Envelope_ClockProbe:
		c.reply(env, &pb.Envelope{SenderRank: c.rank(), Sender: c.name, Body: &pb.Envelope_ClockReply{ClockReply: &pb.ClockReply{T0Us: b.ClockProbe.T0Us, TUs: c.cfg.Now().UnixMicro()}}}, false)
	case *pb.Envelope_Ack, *pb.Envelope_Progress, *pb.Envelope_Result, *pb.Envelope_Request, *pb.Envelope_WindowResult:
		c.mu.Lock()
		l := c.lead
		c.mu.Unlock()
		if l != nil {
			l.deliver(env)
			return
		}
		if r, ok := env.Body.(*pb.Envelope_Request); ok && env.Seq != 0 {
			// asked of a member that does not lead: say who does
			c.mu.Lock()
			leader := c.leaderName
			c.mu.Unlock()
			c.reply(env, &pb.Envelope{SenderRank: c.rank(), Sender: c.name, Body: &pb.Envelope_Ack{Ack: &pb.Ack{Code: "not_leader", Message: leader}}}, true)
			_ = r
		}
	}
}

// --- the rank's side --------------------------------------------------------------

func (c *Coordinator) answerStatus(req *pb.Envelope) {
	st := &pb.Status{Batch: -1, TimeUs: c.cfg.Now().UnixMicro()}
	if c.rec != nil {
		b, step := c.rec.Progress()
		st.Batch, st.StepUs, st.Trainer = b, step.Microseconds(), b >= 0
	}
	c.mu.Lock()
	l := c.last
	st.Seen = c.lastWindow
	c.mu.Unlock()
	if l.w.ID != 0 {
		st.Window, st.Start, st.Stop, st.State, st.Result = l.w.ID, l.w.Start, l.w.Stop, l.state, l.result
	}
	c.reply(req, &pb.Envelope{SenderRank: c.rank(), Sender: c.name, WindowId: st.Window, Body: &pb.Envelope_Status{Status: st}}, true)
}

func (c *Coordinator) onPlan(env *pb.Envelope, p *pb.Plan) {
	if c.rec == nil || env.WindowId == 0 {
		return
	}
	w := rankagent.Window{ID: env.WindowId, Start: p.Start, Stop: p.Stop}
	batch, _ := c.rec.Progress()
	ack := &pb.Ack{Ok: true, Batch: batch}
	err := c.rec.Arm(w)
	if errors.Is(err, rankagent.ErrStale) {
		c.mu.Lock()
		again := c.last.w == w
		c.mu.Unlock()
		if again {
			// the plan comes directly and through gossip: a copy that arrives after
			// the window ended here is the window this rank took, not a stale one
			err = nil
		}
	}
	switch {
	case err == nil:
		c.mu.Lock()
		if c.last.w.ID != w.ID {
			c.last = lastWindow{w: w, state: string(rankagent.WindowQueued), leader: env.Sender}
		}
		// the window id is not gossiped from here: a metadata update by every rank
		// for every window costs the cluster O(n^2) messages (at 1,024 ranks, a
		// million packets a window); a new leader learns the newest id from the
		// leader's metadata, its own plans and the ranks' status answers
		bump := w.ID > c.lastWindow
		c.lastWindow = max(c.lastWindow, w.ID)
		c.mu.Unlock()
		if bump {
			c.log.Info("window planned", "window", w.ID, "start", w.Start, "stop", w.Stop, "batch", batch, "reason", p.Reason)
		}
	case errors.Is(err, rankagent.ErrPassed):
		ack.Ok, ack.Code, ack.Message = false, "passed", err.Error()
	case errors.Is(err, rankagent.ErrBusy):
		ack.Ok, ack.Code, ack.Message = false, "busy", err.Error()
	case errors.Is(err, rankagent.ErrStale):
		ack.Ok, ack.Code, ack.Message = false, "stale", err.Error()
	default:
		ack.Ok, ack.Code, ack.Message = false, "error", err.Error()
	}
	if !ack.Ok {
		c.log.Warn("window refused", "window", w.ID, "code", ack.Code, "err", err)
	}
	c.reply(env, &pb.Envelope{SenderRank: c.rank(), Sender: c.name, WindowId: w.ID, Body: &pb.Envelope_Ack{Ack: ack}}, true)
}

func (c *Coordinator) onCancel(env *pb.Envelope, x *pb.Cancel) {
	if c.rec == nil {
		return
	}
	c.rec.Cancel(env.WindowId, x.Reason)
	c.mu.Lock()
	if c.last.w.ID == env.WindowId && !terminal(c.last.state) {
		c.last.state = string(rankagent.WindowCancelled)
	}
	c.lastWindow = max(c.lastWindow, env.WindowId)
	c.mu.Unlock()
}

// onDump answers a post-mortem: this rank's snapshot now, or, for the rank whose
// OOM it is, the snapshot its trainer took at the OOM.
func (c *Coordinator) onDump(env *pb.Envelope, d *pb.Dump) {
	if c.rec == nil || env.WindowId == 0 {
		return
	}
	ack := &pb.Ack{Ok: true}
	w := rankagent.Window{ID: env.WindowId}
	c.mu.Lock()
	dup := c.last.w.ID == w.ID
	if !dup {
		c.last = lastWindow{w: w, state: string(rankagent.WindowQueued), leader: env.Sender}
		c.lastWindow = max(c.lastWindow, w.ID)
	}
	mine := d.OomRank == c.rank()
	var have *pb.RankResult
	if mine && !dup {
		if c.oom != nil {
			have = proto.Clone(c.oom).(*pb.RankResult)
			c.last.result, c.last.state = have, string(rankagent.WindowUploaded)
		} else {
			c.oomWindow, c.oomLeader = w.ID, env.Sender
		}
	}
	c.mu.Unlock()
	if !mine && !dup {
		if err := c.rec.Dump(w.ID); err != nil {
			ack.Ok, ack.Code, ack.Message = false, "error", err.Error()
		}
	}
	c.reply(env, &pb.Envelope{SenderRank: c.rank(), Sender: c.name, WindowId: w.ID, Body: &pb.Envelope_Ack{Ack: ack}}, true)
	if have != nil {
		res := c.envelope(w.ID)
		res.Body = &pb.Envelope_Result{Result: have}
		c.send(env.Sender, res, true)
	}
}

func terminal(state string) bool {
	switch rankagent.WindowState(state) {
	case rankagent.WindowUploaded, rankagent.WindowMissed, rankagent.WindowFailed, rankagent.WindowCancelled:
		return true
	}
	return false
}

// updateMeta gossips this member's new metadata (its newest window).
func (c *Coordinator) updateMeta() {
	c.mu.Lock()
	m := c.ml
	c.mu.Unlock()
	if m != nil {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			// memberlist's UpdateNode reads the local node's state unlocked while
			// another call writes it: one at a time
			c.metaMu.Lock()
			defer c.metaMu.Unlock()
			m.UpdateNode(time.Second)
		}()
	}
}

// Observe takes the agent's window events (rankagent.Config.OnWindow) and tells the
// leader: every step as progress, and the stored snapshot as the rank's result.
func (c *Coordinator) Observe(ev rankagent.WindowEvent) {
	if ev.Window.ID == 0 {
		c.observeOOM(ev)
		return
	}
	c.mu.Lock()
	if c.last.w.ID == ev.Window.ID || ev.Window.ID > c.last.w.ID {
		if c.last.w.ID != ev.Window.ID {
			c.last = lastWindow{w: ev.Window}
		}
		c.last.state = string(ev.State)
		if ev.Upload != nil {
			c.last.result = resultOf(ev.Upload)
		}
	}
	l := c.last
	leader := c.leaderName
	c.mu.Unlock()
	if leader == "" {
		return
	}
	env := c.envelope(ev.Window.ID)
	if ev.Upload != nil {
		env.Body = &pb.Envelope_Result{Result: l.result}
	} else {
		env.Body = &pb.Envelope_Progress{Progress: &pb.Progress{State: string(ev.State), Batch: ev.Batch, Reason: ev.Reason, Rank: c.rank()}}
	}
	reliable := ev.Upload != nil || terminal(string(ev.State)) || ev.State == rankagent.WindowPartial
	if leader == c.name {
		c.handleLocal(env)
		return
	}
	if err := c.send(leader, env, reliable); err != nil {
		c.log.Warn("could not tell the leader", "state", ev.State, "err", err)
	}
}

// observeOOM tells the leader that this rank's trainer hit an OOM (so it can ask
// every rank for a post-mortem), and hands the OOM snapshot to the post-mortem
// once it is stored.
func (c *Coordinator) observeOOM(ev rankagent.WindowEvent) {
	c.mu.Lock()
	leader := c.leaderName
	var send *pb.Envelope
	to := ""
	switch {
	case ev.State == rankagent.WindowOOM:
		c.oom = nil
	case ev.Upload != nil && ev.Upload.Reason == "oom" && ev.Upload.Err == nil:
		c.oom = resultOf(ev.Upload)
		if c.oomWindow != 0 {
			r := proto.Clone(c.oom).(*pb.RankResult)
			if c.last.w.ID == c.oomWindow {
				c.last.result, c.last.state = r, string(rankagent.WindowUploaded)
			}
			send, to = c.envelope(c.oomWindow), c.oomLeader
			send.Body = &pb.Envelope_Result{Result: r}
			c.oomWindow = 0
		}
	}
	c.mu.Unlock()
	if send != nil {
		if err := c.send(to, send, true); err != nil {
			c.log.Warn("could not hand the OOM snapshot to the post-mortem", "err", err)
		}
		return
	}
	if ev.State == rankagent.WindowOOM && leader != "" {
		c.log.Warn("the trainer hit an OOM; asking the leader for a post-mortem of every rank", "batch", ev.Batch)
		env := c.envelope(0)
		env.Body = &pb.Envelope_Request{Request: &pb.SnapshotRequest{Reason: "oom", OomRank: c.rank()}}
		if err := c.send(leader, env, true); err != nil {
			c.log.Warn("could not tell the leader of the OOM", "err", err)
		}
	}
}

// handleLocal delivers a message this member sends to itself.
func (c *Coordinator) handleLocal(env *pb.Envelope) {
	b, err := proto.Marshal(env)
	if err == nil {
		c.enqueue(b)
	}
}

func resultOf(u *rankagent.UploadResult) *pb.RankResult {
	r := &pb.RankResult{Key: u.Key, MetaKey: u.MetaKey, AnalysisKey: u.AnalysisKey, Size: u.Size, Sha256: u.SHA256, Events: int64(u.Events),
		Partial: u.Partial, Start: u.Window.Start, Stop: u.Window.Stop, Reason: u.Reason}
	if u.Err != nil {
		r.Error = u.Err.Error()
	}
	return r
}

// --- clocks -------------------------------------------------------------------

// clockLoop measures this host's clock against the leader's every ClockInterval:
// a few probes, keeping the one with the shortest round trip.
func (c *Coordinator) clockLoop(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.measureClock(ctx)
		c.updateMeta() // the trainer's batch and step time, for members that look
		t.Reset(c.cfg.ClockInterval)
	}
}

func (c *Coordinator) measureClock(ctx context.Context) {
	c.mu.Lock()
	leader := c.leaderName
	c.mu.Unlock()
	if leader == "" {
		return
	}
	if leader == c.name {
		c.setOffset(0, 0)
		return
	}
	best := time.Duration(-1)
	var off time.Duration
	for i := 0; i < 5; i++ {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		t0 := c.cfg.Now()
		r, err := c.request(pctx, leader, &pb.Envelope{SenderRank: c.rank(), Sender: c.name, Body: &pb.Envelope_ClockProbe{ClockProbe: &pb.ClockProbe{T0Us: t0.UnixMicro()}}}, false)
		t1 := c.cfg.Now()
		cancel()
		if err != nil || r.GetClockReply() == nil || r.GetClockReply().T0Us != t0.UnixMicro() {
			continue
		}
		rtt := t1.Sub(t0)
		if best < 0 || rtt < best {
			mid := t0.Add(rtt / 2)
			best = rtt
			// this host's clock minus the leader's
			off = mid.Sub(time.UnixMicro(r.GetClockReply().TUs))
		}
	}
	if best >= 0 {
		c.setOffset(off, best)
	}
}

func (c *Coordinator) setOffset(off, rtt time.Duration) {
	c.mu.Lock()
	c.offset = clockState{offset: off, rtt: rtt, ok: true, at: time.Now()}
	c.mu.Unlock()
	if c.rec != nil {
		c.rec.SetClockOffset(off, rtt)
	}
}
