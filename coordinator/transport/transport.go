package transport

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Bytes at the head of an inbound memberlist stream (memberlist v0.7.0, net.go
// and label.go; the values are part of memberlist's protocol):
//
//	[244 label header][label length: 1 byte][label]   optional (hasLabelMsg)
//	[10 encrypted message][length: uint32, big-endian] then length bytes (encryptMsg)
//
// memberlist reads the whole encrypted message into memory before it can check
// it (decryptRemoteState), for anyone who knows the label: the run name, which
// is not secret. Any other first byte is a message in the clear, which a member
// with a key refuses at once (GossipVerifyIncoming).
const (
	mlHasLabelMsg = 244
	mlEncryptMsg  = 10
)

// streamLimits bounds what inbound gossip streams can make memberlist hold.
// defaultStreamLimits gives the production values; a field of zero or less
// takes its default.
type streamLimits struct {
	// Streams is the most inbound streams in flight at once: a stream counts from
	// its accept until memberlist closes it. A stream beyond it is closed at once,
	// unread; the peer's SendReliable has already returned, so the message is lost
	// (the log says how many, at Warn, at most once per streamWarnEvery).
	Streams int
	// MessageBytes is the largest message one stream may carry: an encrypted
	// message that declares more is closed before memberlist reads it, and no
	// stream delivers more than its declared length (or, in the clear, more than
	// MessageBytes) after its header.
	MessageBytes int
	// InflightBytes bounds the declared lengths of all encrypted messages being
	// read at once; a stream whose message would go over it is closed unread.
	// memberlist holds up to about three times a message while it reads and
	// decrypts it (a doubling buffer, then the plaintext), so this is what bounds
	// memory whatever Streams is. Raised to MessageBytes if below it.
	InflightBytes int64
}

// defaultStreamLimits is what a rank agent uses.
//
// MessageBytes, 4 MiB: the largest streams memsnap's members send are a
// push-pull of the whole membership and a user message of up to
// wire.MaxMessage (1 MiB). As memberlist sends them (msgpack, LZW,
// encryption), a push-pull of 1,024 members, each with 512 bytes of random
// metadata, a 271-byte name (the longest a 255-byte label allows) and an IPv6
// address, declares 0.77 MiB (0.84 MiB of msgpack before LZW); a 1 MiB random
// user message declares 1.37 MiB (LZW expands random bytes); both together
// 2.13 MiB, so 4 MiB leaves nearly half for growth
// (TestLimitFitsLargestMessages computes these with memberlist's own
// encoding). memberlist's own limit is 20 MiB.
//
// InflightBytes, 16 MiB: four of the largest messages at once. Real push-pulls
// are rare (each member starts one every 30 s, less often in a large cluster)
// and most user messages are under a few KiB. memberlist holds up to about
// 3 × 16 = 48 MiB for them; 16 senders without the key, each declaring 4 MiB,
// grew the heap by 20 MiB (TestFloodTransport; 80 MiB without the limit, and
// 640 MiB for 16 declaring 20 MiB, which the limit keeps at 0).
//
// Streams, 1,024: a leader of 1,024 ranks receives every rank's ack, and later
// every rank's result, at about the same time, each on a stream of its own (a
// refused one is lost: SendReliable has returned). Legitimate streams last
// milliseconds; each costs memberlist a goroutine and two 4 KiB read buffers
// (about 20 KiB, 20 MiB for all), and InflightBytes bounds what they declare.
func defaultStreamLimits() streamLimits {
	return streamLimits{Streams: 1024, MessageBytes: 4 << 20, InflightBytes: 16 << 20}
}

func (l streamLimits) withDefaults() streamLimits {
	d := defaultStreamLimits()
	if l.Streams <= 0 {
		l.Streams = d.Streams
	}
	if l.MessageBytes <= 0 {
		l.MessageBytes = d.MessageBytes
	}
	if l.InflightBytes <= 0 {
		l.InflightBytes = d.InflightBytes
	}
	l.InflightBytes = max(l.InflightBytes, int64(l.MessageBytes))
	return l
}

// streamWarnEvery is the least time between two warnings about refused streams.
const streamWarnEvery = 10 * time.Second

// Why a stream was refused, as Read returns it to memberlist.
var (
	errStreamTooLarge = errors.New("coordinator: inbound stream declares a message over the limit")
	errStreamsBusy    = errors.New("coordinator: inbound streams hold too many bytes already")
)

// limitedTransport is memberlist's transport with bounded inbound streams; see
// limitTransport. Everything but StreamCh and Shutdown is the inner transport's.
type limitedTransport struct {
	memberlist.NodeAwareTransport // the inner transport

	lim   streamLimits
	log   *slog.Logger
	now   func() time.Time // tests move the clock of the warnings
	out   chan net.Conn    // StreamCh: never closed (memberlist would read nil conns)
	stop  chan struct{}    // closed when Shutdown starts: stop handing on streams
	inner chan struct{}    // closed once the inner transport has shut down
	wg    sync.WaitGroup   // the forwarding goroutine

	shutdownOnce sync.Once
	shutdownErr  error

	// counters: streams handed on, refused for each reason, and message bytes
	// delivered after the headers
	admitted, refused, tooLarge, busy, evicted, delivered atomic.Int64

	mu       sync.Mutex
	open     map[*limitedConn]struct{} // streams handed on and not yet closed
	stopping bool                      // Shutdown has started: nothing new is admitted
	inflight int64                     // declared bytes reserved by open streams
	lastWarn time.Time                 // when refusals were last logged
	pending  [nStreamRefusals]int64    // refusals since then, by reason
}

// streamRefusal is why a stream was closed unread.
type streamRefusal int

const (
	refusedMany  streamRefusal = iota // Streams are in flight already
	refusedLarge                      // it declares more than MessageBytes
	refusedBusy                       // it would take InflightBytes over
	refusedIdle                       // it sent nothing for idleEvict while every place was taken
	nStreamRefusals
)

var _ memberlist.NodeAwareTransport = (*limitedTransport)(nil)

// limitTransport wraps inner so that inbound streams cannot make memberlist
// buffer more than lim allows (see streamLimits): every stream inner accepts
// is handed on wrapped, counted until memberlist closes it, and refused (closed)
// beyond lim.Streams; its header is read as memberlist will read it, and an
// encrypted message that declares more than lim.MessageBytes, or more than is
// left of lim.InflightBytes, is closed before memberlist allocates for it. The
// wrapper reads no message body itself and allocates nothing per byte.
// Packets, dialing, addresses and outbound streams pass through untouched.
//
// It starts one goroutine, which ends when inner's StreamCh closes or on
// Shutdown; Shutdown shuts inner down, waits for that goroutine and closes the
// streams still open. inner must not be shut down on its own.
func limitTransport(inner memberlist.NodeAwareTransport, lim streamLimits, log *slog.Logger) memberlist.NodeAwareTransport {
	return newLimitedTransport(inner, lim, log)
}

func newLimitedTransport(inner memberlist.NodeAwareTransport, lim streamLimits, log *slog.Logger) *limitedTransport {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &limitedTransport{
		NodeAwareTransport: inner,
		lim:                lim.withDefaults(),
		log:                log,
		now:                time.Now,
		out:                make(chan net.Conn),
		stop:               make(chan struct{}),
		inner:              make(chan struct{}),
		open:               map[*limitedConn]struct{}{},
	}
	t.wg.Add(1)
	go t.forward(inner.StreamCh())
	return t
}

// StreamCh hands on inner's streams, wrapped.
func (t *limitedTransport) StreamCh() <-chan net.Conn { return t.out }

// Shutdown stops handing on streams, shuts the inner transport down, waits for
// the forwarding goroutine and closes every stream still open. It is idempotent.
func (t *limitedTransport) Shutdown() error {
	t.shutdownOnce.Do(func() {
		t.mu.Lock()
		t.stopping = true
		t.mu.Unlock()
		close(t.stop)
		// the forwarder keeps taking (and closing) what inner accepts meanwhile:
		// NetTransport's Shutdown waits for its listener, which may be sending one
		t.shutdownErr = t.NodeAwareTransport.Shutdown()
		close(t.inner)
		t.wg.Wait()
		t.mu.Lock()
		open := make([]*limitedConn, 0, len(t.open))
		for c := range t.open {
			open = append(open, c)
		}
		t.mu.Unlock()
		for _, c := range open {
			c.Close()
		}
	})
	return t.shutdownErr
}

// forward hands each inbound stream on, or refuses it, until in closes or the
// inner transport has shut down.
func (t *limitedTransport) forward(in <-chan net.Conn) {
	defer t.wg.Done()
	for {
		select {
		case conn, ok := <-in:
			if !ok {
				return
			}
			t.handOn(conn)
		case <-t.inner:
			for { // close what inner left behind, if its channel is buffered
				select {
				case conn, ok := <-in:
					if !ok {
						return
					}
					conn.Close()
				default:
					return
				}
			}
		}
	}
}

func (t *limitedTransport) handOn(conn net.Conn) {
	c := &limitedConn{Conn: conn, t: t}
	now := t.now()
	c.active.Store(now.UnixNano())
	t.mu.Lock()
	var idle *limitedConn
	switch {
	case t.stopping:
		t.mu.Unlock()
		conn.Close()
		return
	case len(t.open) >= t.lim.Streams:
		// every place is taken: the stream that has sent nothing for longest goes,
		// if it has been quiet for idleEvict (a flood of connections that never
		// speak must not shut out a member with something to say)
		idle = t.idlest(now)
		if idle == nil {
			t.mu.Unlock()
			conn.Close()
			t.noteRefusal(refusedMany)
			return
		}
		delete(t.open, idle)
		t.inflight -= idle.reserved
		idle.reserved = 0
	}
	t.open[c] = struct{}{}
	t.mu.Unlock()
	if idle != nil {
		idle.Close()
		t.noteRefusal(refusedIdle)
	}
	t.admitted.Add(1)
	select {
	case t.out <- c:
	case <-t.stop:
		c.Close()
	}
}

// idleEvict is how long a stream must have sent nothing before a new one may
// take its place when every place is taken.
const idleEvict = time.Second

// idlest is the open stream quiet for longest, if quiet for idleEvict; t.mu is
// held.
func (t *limitedTransport) idlest(now time.Time) *limitedConn {
	var best *limitedConn
	oldest := now.Add(-idleEvict).UnixNano()
	for c := range t.open {
		if a := c.active.Load(); a <= oldest {
			best, oldest = c, a
		}
	}
	return best
}

// reserve admits a stream whose header has been read, and returns how many
// bytes it may deliver after the header.
func (t *limitedTransport) reserve(c *limitedConn, h *streamHeader) (int64, error) {
	if !h.encrypted {
		return int64(t.lim.MessageBytes), nil
	}
	n := int64(h.length)
	if n > int64(t.lim.MessageBytes) {
		t.noteRefusal(refusedLarge)
		return 0, fmt.Errorf("%w: %d bytes, limit %d", errStreamTooLarge, n, t.lim.MessageBytes)
	}
	t.mu.Lock()
	if _, open := t.open[c]; !open {
		t.mu.Unlock()
		return 0, net.ErrClosed
	}
	if t.inflight+n > t.lim.InflightBytes {
		t.mu.Unlock()
		t.noteRefusal(refusedBusy)
		return 0, fmt.Errorf("%w: %d bytes would go over %d", errStreamsBusy, n, t.lim.InflightBytes)
	}
	t.inflight += n
	c.reserved = n
	t.mu.Unlock()
	return n, nil
}

// release forgets a closed stream and what it reserved.
func (t *limitedTransport) release(c *limitedConn) {
	t.mu.Lock()
	delete(t.open, c)
	t.inflight -= c.reserved
	c.reserved = 0
	t.mu.Unlock()
}

// noteRefusal logs the refusals since the last warning, this one included, at
// most once per streamWarnEvery (refusals after a warning wait for the next).
// It counts this one last, so that whoever sees the count sees the warning.
func (t *limitedTransport) noteRefusal(why streamRefusal) {
	defer [nStreamRefusals]*atomic.Int64{&t.refused, &t.tooLarge, &t.busy, &t.evicted}[why].Add(1)
	t.mu.Lock()
	t.pending[why]++
	now := t.now()
	if !t.lastWarn.IsZero() && now.Sub(t.lastWarn) < streamWarnEvery {
		t.mu.Unlock()
		return
	}
	p := t.pending
	t.pending = [nStreamRefusals]int64{}
	t.lastWarn = now
	t.mu.Unlock()
	t.log.Warn("closed inbound gossip streams unread: a burst of members, or a sender flooding the gossip port",
		"refused_streams", p[refusedMany], "too_large_streams", p[refusedLarge], "busy_streams", p[refusedBusy], "idle_streams_closed", p[refusedIdle],
		"max_streams", t.lim.Streams, "max_message_bytes", t.lim.MessageBytes, "max_inflight_bytes", t.lim.InflightBytes)
}

// limitedConn is one inbound stream. memberlist reads it from one goroutine;
// Close may come from another (Shutdown).
type limitedConn struct {
	net.Conn
	t *limitedTransport

	// touched only by Read
	hdr    streamHeader
	parsed bool  // the header has been read and the stream admitted
	left   int64 // bytes it may still deliver, once parsed
	err    error // why it was refused; every later Read returns it

	reserved int64        // declared bytes reserved by reserve; under t.mu
	active   atomic.Int64 // when it last delivered a byte (t.now, Unix nanoseconds)

	closeOnce sync.Once
	closeErr  error
}

// Read delivers the stream as it comes, reading its header on the way through;
// once the header is complete the stream is admitted or closed, and delivers at
// most the bytes it was allowed.
func (c *limitedConn) Read(p []byte) (n int, err error) {
	if c.err != nil {
		return 0, c.err
	}
	defer func() {
		if n > 0 {
			c.active.Store(c.t.now().UnixNano())
		}
	}()
	if c.parsed {
		if c.left <= 0 {
			return 0, io.EOF
		}
		if int64(len(p)) > c.left {
			p = p[:c.left]
		}
		n, err = c.Conn.Read(p)
		c.left -= int64(n)
		c.t.delivered.Add(int64(n))
		return n, err
	}
	n, err = c.Conn.Read(p)
	used, done := c.hdr.feed(p[:n])
	if !done {
		return n, err
	}
	c.parsed = true
	allowed, rerr := c.t.reserve(c, &c.hdr)
	if rerr != nil {
		c.err = rerr
		c.Close()
		return 0, rerr
	}
	if body := int64(n - used); body > allowed {
		n = used + int(allowed)
	}
	c.left = allowed - int64(n-used)
	c.t.delivered.Add(int64(n - used))
	return n, err
}

// Close closes the stream and frees its place (once).
func (c *limitedConn) Close() error {
	c.closeOnce.Do(func() {
		c.closeErr = c.Conn.Close()
		c.t.release(c)
	})
	return c.closeErr
}

// streamHeader reads the head of a memberlist stream (see mlHasLabelMsg) a
// chunk at a time, keeping no bytes but the length.
type streamHeader struct {
	state     headerState
	skip      int // label bytes still to pass
	lenBytes  int // bytes of the length seen
	length    uint32
	encrypted bool
}

type headerState uint8

const (
	hdrFirst    headerState = iota // the first byte: a label header or the message type
	hdrLabelLen                    // the label's length
	hdrLabel                       // the label
	hdrType                        // the message type, after a label
	hdrLength                      // an encrypted message's length
	hdrDone
)

// feed reads header bytes from b; it returns how many were header bytes and
// whether the header is complete (then length and encrypted are set).
func (h *streamHeader) feed(b []byte) (int, bool) {
	i := 0
	for i < len(b) && h.state != hdrDone {
		c := b[i]
		switch h.state {
		case hdrFirst, hdrType:
			switch {
			case h.state == hdrFirst && c == mlHasLabelMsg:
				h.state = hdrLabelLen
			case c == mlEncryptMsg:
				h.encrypted, h.state = true, hdrLength
			default: // a message in the clear (memberlist decides about it), or a label header after a label
				h.state = hdrDone
			}
			i++
		case hdrLabelLen:
			h.skip = int(c)
			h.state = hdrLabel
			if h.skip == 0 { // memberlist refuses an empty label itself
				h.state = hdrDone
			}
			i++
		case hdrLabel:
			k := min(h.skip, len(b)-i)
			h.skip -= k
			i += k
			if h.skip == 0 {
				h.state = hdrType
			}
		case hdrLength:
			h.length = h.length<<8 | uint32(c)
			h.lenBytes++
			if h.lenBytes == 4 {
				h.state = hdrDone
			}
			i++
		}
	}
	return i, h.state == hdrDone
}
