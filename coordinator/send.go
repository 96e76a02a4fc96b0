package coordinator

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/coordinator/wire"
	"github.com/memsnap/memsnap/internal/pb"
)

// waiter is a request waiting for its replies: a random seq that a stranger cannot
// guess, and the members allowed to answer.
type waiter struct {
	ch   chan *pb.Envelope
	from func(*pb.Envelope) bool // nil: any member
}

// expect registers a wait for replies to a new request; from says who may answer.
func (c *Coordinator) expect(buf int, from func(*pb.Envelope) bool) (chan *pb.Envelope, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seq := wire.NewSeq()
	for c.waiting[seq] != nil {
		seq = wire.NewSeq()
	}
	ch := make(chan *pb.Envelope, buf)
	c.waiting[seq] = &waiter{ch: ch, from: from}
	return ch, seq
}

func (c *Coordinator) forget(seq uint64) {
	c.mu.Lock()
	delete(c.waiting, seq)
	c.mu.Unlock()
}

// fromName accepts replies from the member named name only.
func fromName(name string) func(*pb.Envelope) bool {
	return func(e *pb.Envelope) bool { return e.Sender == name }
}

// fromRanks accepts replies from ranks (members whose name is their rank's).
func (c *Coordinator) fromRanks() func(*pb.Envelope) bool {
	return c.isRankMember
}

// envelope is a message from this member about window.
func (c *Coordinator) envelope(window uint64) *pb.Envelope {
	c.mu.Lock()
	addr := c.addr
	c.mu.Unlock()
	return &pb.Envelope{SenderRank: c.rank(), WindowId: window, Sender: c.name, ReplyAddr: addr}
}

// target resolves a member to send to. addr is where a request's asker said it
// listens (a reply's; "" for other messages): the reply goes there, as the
// asker may have started again at another address that memberlist does not
// give its name yet (moved.go); without one, to the member as this one knows it.
func (c *Coordinator) target(to, addr string) (*memberlist.Node, error) {
	if addr == "" {
		if n := c.node(to); n != nil {
			return n, nil
		}
		return nil, fmt.Errorf("coordinator: %s is not a member", to)
	}
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %s's address %q: %w", to, addr, err)
	}
	ip := net.ParseIP(h)
	port, err := strconv.Atoi(p)
	if ip == nil || err != nil || port <= 0 || port > 65535 {
		return nil, fmt.Errorf("coordinator: %s's address %q is not ip:port", to, addr)
	}
	return &memberlist.Node{Name: to, Addr: ip, Port: uint16(port)}, nil
}

// send sends env to the member named to, now: over TCP when reliable (it arrives
// or the error says so), else as one UDP packet. It may wait up to memberlist's TCP
// timeout: callers on the dispatcher use post.
func (c *Coordinator) send(to string, env *pb.Envelope, reliable bool) error {
	return c.sendAddr(to, "", env, reliable)
}

func (c *Coordinator) sendAddr(to, addr string, env *pb.Envelope, reliable bool) error {
	if to == c.name {
		c.handleLocal(env)
		return nil
	}
	n, err := c.target(to, addr)
	if err != nil {
		return err
	}
	b, err := proto.Marshal(env)
	if err != nil {
		return err
	}
	return c.sendBytes(n, b, reliable)
}

// sendBytes sends a marshalled envelope to n, as send does.
func (c *Coordinator) sendBytes(n *memberlist.Node, b []byte, reliable bool) error {
	m := c.memberlist()
	if m == nil || c.stopped() {
		return ErrStopped
	}
	if reliable || len(b) > 1200 {
		return m.SendReliable(n, b)
	}
	return m.SendBestEffort(n, b)
}

// request sends env and waits for the reply carrying its seq from the member
// asked, until ctx ends.
func (c *Coordinator) request(ctx context.Context, to string, env *pb.Envelope, reliable bool) (*pb.Envelope, error) {
	ch, seq := c.expect(1, fromName(to))
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

// reply answers req with env, through the outbox.
func (c *Coordinator) reply(req *pb.Envelope, env *pb.Envelope, reliable bool) {
	env.Seq = req.Seq
	c.post(req.Sender, req.ReplyAddr, env, reliable)
}

// post queues env for the outbox's workers; it never blocks.
func (c *Coordinator) post(to, addr string, env *pb.Envelope, reliable bool) {
	if to == c.name {
		c.handleLocal(env)
		return
	}
	c.out.put(outMsg{to: to, addr: addr, env: env, reliable: reliable})
}

// outbox sends messages on a few workers, so that the dispatcher (and the leader's
// loop) never waits on the network: one slow or vanished member delays only the
// messages to it, and after a failure messages to it are dropped for a moment
// rather than queued behind its time-out. Messages to one member go in the order
// they were posted, one at a time (a window's progress is its story: told in
// order); messages to different members go in parallel.
type outbox struct {
	c      *Coordinator
	mu     sync.Mutex
	more   *sync.Cond
	queues map[string][]outMsg // by destination, oldest first
	ready  []string            // destinations with messages and no worker on them
	busy   map[string]bool     // destinations a worker sends to now
	queued int
	closed bool
	down   map[string]time.Time // members a send to failed, until when they are skipped
	drop   int
}

type outMsg struct {
	to, addr string
	env      *pb.Envelope
	reliable bool
}

func (m outMsg) dest() string {
	if m.to != "" {
		return m.to
	}
	return m.addr
}

// downKey is what a failed send marks down: the member, or for a reply the
// member at the address its request gave (a reply to an old incarnation's
// address that fails does not hold up messages to the member where it is).
func (m outMsg) downKey() string {
	if m.addr != "" {
		return m.to + "@" + m.addr
	}
	return m.to
}

const (
	outboxWorkers = 8
	outboxQueue   = 1 << 14
	downFor       = 2 * time.Second
	maxDown       = 4096 // destinations marked down at once, at most
)

func newOutbox(c *Coordinator) *outbox {
	o := &outbox{c: c, queues: map[string][]outMsg{}, busy: map[string]bool{}, down: map[string]time.Time{}}
	o.more = sync.NewCond(&o.mu)
	return o
}

func (o *outbox) start(ctx context.Context) {
	for i := 0; i < outboxWorkers; i++ {
		o.c.spawn(func() { o.work() })
	}
	o.c.spawn(func() {
		<-ctx.Done()
		o.mu.Lock()
		o.closed = true
		o.mu.Unlock()
		o.more.Broadcast()
	})
}

func (o *outbox) put(m outMsg) {
	o.mu.Lock()
	defer o.mu.Unlock()
	until, down := o.down[m.downKey()]
	if down && time.Now().After(until) {
		delete(o.down, m.downKey())
		down = false
	}
	if down && !m.reliable || o.closed {
		return
	}
	if o.queued >= outboxQueue {
		o.drop++
		if o.drop == 1 || o.drop%1000 == 0 {
			o.c.log.Warn("dropping outgoing cluster messages: the outbox is full", "dropped", o.drop)
		}
		return
	}
	d := m.dest()
	o.queues[d] = append(o.queues[d], m)
	o.queued++
	if len(o.queues[d]) == 1 && !o.busy[d] {
		o.ready = append(o.ready, d)
		o.more.Signal()
	}
}

// next takes the oldest message of a destination no other worker sends to, and
// marks that destination busy; ok is false once the outbox is closed.
func (o *outbox) next() (m outMsg, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for len(o.ready) == 0 && !o.closed {
		o.more.Wait()
	}
	if o.closed {
		return outMsg{}, false
	}
	d := o.ready[0]
	o.ready = o.ready[1:]
	q := o.queues[d]
	m = q[0]
	if len(q) == 1 {
		delete(o.queues, d)
	} else {
		q[0] = outMsg{}
		o.queues[d] = q[1:]
	}
	o.queued--
	o.busy[d] = true
	return m, true
}

// done ends a worker's send of m: its destination's next message, if any, is
// ready.
func (o *outbox) done(m outMsg, failed bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	d := m.dest()
	delete(o.busy, d)
	if failed {
		now := time.Now()
		if len(o.down) >= maxDown {
			for k, until := range o.down { // (bounded: expired ones go)
				if now.After(until) {
					delete(o.down, k)
				}
			}
		}
		if len(o.down) < maxDown {
			o.down[m.downKey()] = now.Add(downFor)
		}
	}
	if len(o.queues[d]) > 0 {
		o.ready = append(o.ready, d)
		o.more.Signal()
	}
}

func (o *outbox) work() {
	for {
		m, ok := o.next()
		if !ok {
			return
		}
		o.mu.Lock()
		until, down := o.down[m.downKey()]
		o.mu.Unlock()
		if down && time.Now().Before(until) {
			o.done(m, false) // it failed a moment ago: do not wait on it again
			continue
		}
		err := o.c.sendAddr(m.to, m.addr, m.env, m.reliable)
		if err != nil {
			o.c.log.Debug("could not send", "to", m.to, "addr", m.addr, "err", err)
		}
		o.done(m, err != nil && err != ErrStopped && m.to != "")
	}
}

// idle reports whether nothing waits to be sent.
func (o *outbox) idle() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.queued == 0
}
