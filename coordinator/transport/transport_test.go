package transport

import (
	"bytes"
	"compress/lzw"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/memberlist"

	"github.com/memsnap/memsnap/coordinator/wire"
	"github.com/memsnap/memsnap/internal/testutil"
)

// runLabel is a run's gossip label, as coordinator.LabelFor makes it: the
// limits are sized for the longest.
func runLabel(run string) string { return "memsnap/" + run }

// largestMessage is the largest message a member sends.
const largestMessage = wire.MaxMessage

var floodBare = flag.Bool("flood.bare", false,
	"TestFloodTransport: flood memberlist's bare NetTransport, without limitTransport (the test then fails: that is the point)")

// --- header parsing ---------------------------------------------------------

// scriptConn is a net.Conn whose Read returns chunks in order, then end.
type scriptConn struct {
	chunks [][]byte
	end    error // after the chunks; io.EOF if nil
	closed atomic.Bool
}

func (c *scriptConn) Read(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	for len(c.chunks) > 0 && len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	if len(c.chunks) == 0 {
		if c.end != nil {
			return 0, c.end
		}
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	c.chunks[0] = c.chunks[0][n:]
	return n, nil
}
func (c *scriptConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *scriptConn) Close() error                     { c.closed.Store(true); return nil }
func (c *scriptConn) LocalAddr() net.Addr              { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }
func (c *scriptConn) RemoteAddr() net.Addr             { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2} }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

// chanTransport is an inner transport whose streams the test hands in.
type chanTransport struct {
	memberlist.NodeAwareTransport // nil: only StreamCh and Shutdown are used
	ch                            chan net.Conn
	shutdowns                     atomic.Int32
}

func (c *chanTransport) StreamCh() <-chan net.Conn { return c.ch }
func (c *chanTransport) Shutdown() error           { c.shutdowns.Add(1); return nil }

func newChanLimited(t *testing.T, lim streamLimits, log *slog.Logger) (*limitedTransport, *chanTransport) {
	t.Helper()
	inner := &chanTransport{ch: make(chan net.Conn)}
	tr := newLimitedTransport(inner, lim, log)
	t.Cleanup(func() { tr.Shutdown() })
	return tr, inner
}

// through hands conn to tr as the inner transport would and returns it as
// memberlist would receive it.
func through(t *testing.T, tr *limitedTransport, inner *chanTransport, conn net.Conn) net.Conn {
	t.Helper()
	timeout := time.After(5 * time.Second)
	select {
	case inner.ch <- conn:
	case <-timeout:
		t.Fatal("the wrapper did not take the stream")
	}
	select {
	case c := <-tr.StreamCh():
		return c
	case <-timeout:
		t.Fatal("the wrapper did not hand the stream on")
	}
	return nil
}

func labelHeader(l string) []byte { return append([]byte{mlHasLabelMsg, byte(len(l))}, l...) }

func encHeader(n uint32) []byte {
	b := []byte{mlEncryptMsg, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], n)
	return b
}

func joinBytes(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func testBody(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 1)
	}
	return b
}

// bytewise splits b into chunks of one byte.
func bytewise(b []byte) [][]byte {
	out := make([][]byte, len(b))
	for i := range b {
		out[i] = b[i : i+1]
	}
	return out
}

func TestLimitHeaderParsing(t *testing.T) {
	const limit = 64
	lab := labelHeader("memsnap/run-1")
	pushPull, userMsg := byte(6), byte(8) // memberlist's pushPullMsg, userMsg
	cases := []struct {
		name   string
		chunks [][]byte
		end    error
		want   []byte // what memberlist reads
		err    error  // and the error that ends it (io.EOF: the stream ended)
		large  int64  // streams refused as too large
	}{
		{name: "encrypted, exact limit",
			chunks: [][]byte{joinBytes(encHeader(limit), testBody(limit))},
			want:   joinBytes(encHeader(limit), testBody(limit)), err: io.EOF},
		{name: "label, encrypted, exact limit",
			chunks: [][]byte{joinBytes(lab, encHeader(limit), testBody(limit))},
			want:   joinBytes(lab, encHeader(limit), testBody(limit)), err: io.EOF},
		{name: "encrypted, limit+1",
			chunks: [][]byte{joinBytes(encHeader(limit+1), testBody(limit+1))},
			err:    errStreamTooLarge, large: 1},
		{name: "label, encrypted, limit+1",
			chunks: [][]byte{joinBytes(lab, encHeader(limit+1), testBody(limit+1))},
			err:    errStreamTooLarge, large: 1},
		{name: "label, encrypted, 20 MiB declared",
			chunks: [][]byte{joinBytes(lab, encHeader(20<<20), testBody(100))},
			err:    errStreamTooLarge, large: 1},
		{name: "encrypted, no more than declared",
			chunks: [][]byte{joinBytes(encHeader(10), testBody(30))},
			want:   joinBytes(encHeader(10), testBody(10)), err: io.EOF},
		{name: "plaintext push-pull passes untouched",
			chunks: [][]byte{{pushPull}, testBody(40)},
			want:   joinBytes([]byte{pushPull}, testBody(40)), err: io.EOF},
		{name: "label, plaintext user message passes untouched",
			chunks: [][]byte{joinBytes(lab, []byte{userMsg}, testBody(limit))},
			want:   joinBytes(lab, []byte{userMsg}, testBody(limit)), err: io.EOF},
		{name: "plaintext, no more than the limit",
			chunks: [][]byte{joinBytes([]byte{userMsg}, testBody(3*limit))},
			want:   joinBytes([]byte{userMsg}, testBody(limit)), err: io.EOF},
		{name: "label, encrypted, exact limit, 1-byte writes",
			chunks: bytewise(joinBytes(lab, encHeader(limit), testBody(limit))),
			want:   joinBytes(lab, encHeader(limit), testBody(limit)), err: io.EOF},
		{name: "label, encrypted, limit+1, 1-byte writes",
			chunks: bytewise(joinBytes(lab, encHeader(limit+1), testBody(limit+1))),
			// everything before the last length byte reaches memberlist, which
			// allocates nothing before it has all four
			want: joinBytes(lab, encHeader(limit+1))[:len(lab)+4], err: errStreamTooLarge, large: 1},
		{name: "closes inside the label",
			chunks: [][]byte{lab[:5]},
			want:   lab[:5], err: io.EOF},
		{name: "closes inside the length",
			chunks: [][]byte{joinBytes(lab, encHeader(limit))[:len(lab)+3]},
			want:   joinBytes(lab, encHeader(limit))[:len(lab)+3], err: io.EOF},
		{name: "reset inside the header",
			chunks: [][]byte{lab}, end: net.ErrClosed,
			want: lab, err: net.ErrClosed},
		{name: "empty label passes (memberlist refuses it)",
			chunks: [][]byte{{mlHasLabelMsg, 0}, encHeader(limit + 1)},
			want:   joinBytes([]byte{mlHasLabelMsg, 0}, encHeader(limit+1)), err: io.EOF},
		{name: "empty stream",
			err: io.EOF},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr, inner := newChanLimited(t, streamLimits{Streams: 4, MessageBytes: limit, InflightBytes: 4 * limit}, testutil.Logger(t))
			sc := &scriptConn{chunks: c.chunks, end: c.end}
			conn := through(t, tr, inner, sc)
			got, err := readUntilError(conn)
			if !bytes.Equal(got, c.want) {
				t.Errorf("read %d bytes %v, want %d %v", len(got), headOf(got), len(c.want), headOf(c.want))
			}
			if !errors.Is(err, c.err) {
				t.Errorf("ended with %v, want %v", err, c.err)
			}
			if n := tr.tooLarge.Load(); n != c.large {
				t.Errorf("%d refused as too large, want %d", n, c.large)
			}
			if c.large > 0 && !sc.closed.Load() {
				t.Error("a refused stream is still open")
			}
			conn.Close() // as memberlist does
			if !sc.closed.Load() {
				t.Error("Close did not reach the connection")
			}
			checkIdle(t, tr)
		})
	}
}

// readUntilError reads as memberlist's bufio.Reader does, until an error.
func readUntilError(r io.Reader) ([]byte, error) {
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := r.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			return out, err
		}
	}
}

func headOf(b []byte) []byte { return b[:min(len(b), 12)] }

// checkIdle fails unless tr holds no stream and no reserved byte.
func checkIdle(t *testing.T, tr *limitedTransport) {
	t.Helper()
	tr.mu.Lock()
	open, inflight := len(tr.open), tr.inflight
	tr.mu.Unlock()
	if open != 0 || inflight != 0 {
		t.Errorf("%d streams open, %d bytes reserved after every stream closed", open, inflight)
	}
}

// logBuffer collects log lines from several goroutines.
type logBuffer struct{ testutil.SyncBuffer }

func (b *logBuffer) lines(substr string) []string {
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

func TestLimitStreamsInFlight(t *testing.T) {
	var logs logBuffer
	tr, inner := newChanLimited(t, streamLimits{Streams: 2, MessageBytes: 64}, slog.New(slog.NewTextHandler(&logs, nil)))
	var clock atomic.Int64 // seconds after an arbitrary start
	start := time.Now()
	tr.now = func() time.Time { return start.Add(time.Duration(clock.Load()) * time.Second) }

	// a and b speak (a byte at a time, in the clear) whenever the clock moves:
	// neither is idle, so nothing makes room for a third
	speaking := func() *scriptConn {
		sc := &scriptConn{}
		for i := 0; i < 8; i++ {
			sc.chunks = append(sc.chunks, []byte{'x'})
		}
		return sc
	}
	a := through(t, tr, inner, speaking())
	b := through(t, tr, inner, speaking())
	speak := func() {
		for _, c := range []net.Conn{a, b} {
			if _, err := c.Read(make([]byte, 1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	speak()
	// a third is closed at once, unread, and never reaches memberlist
	refuse := func() *scriptConn {
		t.Helper()
		sc := &scriptConn{chunks: [][]byte{encHeader(8)}}
		before := tr.refused.Load()
		inner.ch <- sc
		testutil.Eventually(t, 5*time.Second, "the stream refused", func() bool { return tr.refused.Load() == before+1 })
		if !sc.closed.Load() {
			t.Fatal("a refused stream is still open")
		}
		return sc
	}
	refuse()
	refuse()
	refuse()
	if got := logs.lines("refused_streams="); len(got) != 1 || !strings.Contains(got[0], "refused_streams=1 ") || !strings.Contains(got[0], "level=WARN") {
		t.Fatalf("want one warning for the first refusal, got %q", got)
	}
	clock.Add(9)
	speak()
	refuse()
	if got := logs.lines("refused_streams="); len(got) != 1 {
		t.Fatalf("warned again within 10 s: %q", got)
	}
	clock.Add(1)
	speak()
	refuse()
	if got := logs.lines("refused_streams="); len(got) != 2 || !strings.Contains(got[1], "refused_streams=4 ") {
		t.Fatalf("want a second warning counting the 4 refusals since the first, got %q", got)
	}
	// a stream counts until memberlist closes it: then another fits
	a.Close()
	a.Close() // twice frees one place only
	c := through(t, tr, inner, &scriptConn{})
	refuse()
	b.Close()
	c.Close()
	if n := tr.admitted.Load(); n != 3 {
		t.Errorf("%d streams admitted, want 3", n)
	}
	checkIdle(t, tr)
}

// TestIdleStreamsMakeRoom: with every place taken, a new stream takes the
// place of the one that has sent nothing for longest, once it has been quiet
// for idleEvict: connections that never speak (3,000 of them, from anyone who
// reaches the port) cannot shut out a member with a request to make. A stream
// that speaks keeps its place.
func TestIdleStreamsMakeRoom(t *testing.T) {
	tr, inner := newChanLimited(t, streamLimits{Streams: 2, MessageBytes: 64}, testutil.Logger(t))
	var clock atomic.Int64 // milliseconds after an arbitrary start
	start := time.Now()
	tr.now = func() time.Time { return start.Add(time.Duration(clock.Load()) * time.Millisecond) }
	quiet := &scriptConn{}
	through(t, tr, inner, quiet)
	clock.Add(500)
	talker := &scriptConn{chunks: [][]byte{{'x'}, {'x'}}}
	talking := through(t, tr, inner, talker)
	// not quiet for long enough yet: a third is refused
	sc := &scriptConn{}
	inner.ch <- sc
	testutil.Eventually(t, 5*time.Second, "the third stream refused", func() bool { return tr.refused.Load() == 1 })
	clock.Add(1000) // the first has now been quiet for 1.5 s, the talker for 1 s
	if _, err := talking.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	newcomer := through(t, tr, inner, &scriptConn{})
	testutil.Eventually(t, 5*time.Second, "the quiet stream closed", func() bool { return quiet.closed.Load() })
	if talker.closed.Load() || tr.evicted.Load() != 1 {
		t.Fatalf("the talking stream closed %v, %d evicted", talker.closed.Load(), tr.evicted.Load())
	}
	newcomer.Close()
	talking.Close()
	checkIdle(t, tr)
}

func TestLimitInflightBytes(t *testing.T) {
	const limit = 64
	tr, inner := newChanLimited(t, streamLimits{Streams: 8, MessageBytes: limit, InflightBytes: 2 * limit}, testutil.Logger(t))
	open := func(declared uint32) (net.Conn, error) {
		conn := through(t, tr, inner, &scriptConn{chunks: [][]byte{encHeader(declared), testBody(int(declared))}})
		_, err := conn.Read(make([]byte, 5)) // the header: admitted or refused here
		return conn, err
	}
	a, err := open(limit)
	if err != nil {
		t.Fatal(err)
	}
	b, err := open(limit)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open(1); !errors.Is(err, errStreamsBusy) {
		t.Fatalf("a third message beyond the bytes in flight: %v, want %v", err, errStreamsBusy)
	}
	a.Close()
	c, err := open(limit)
	if err != nil {
		t.Fatalf("once one closed: %v", err)
	}
	b.Close()
	c.Close()
	if n := tr.busy.Load(); n != 1 {
		t.Errorf("%d refused as busy, want 1", n)
	}
	checkIdle(t, tr)
}

// --- goroutines --------------------------------------------------------------

// forwarders counts the wrapper's forwarding goroutines in a stack dump.
func forwarders() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "transport.(*limitedTransport).forward(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// waitForwarders waits until at most n forwarding goroutines are left.
func waitForwarders(t *testing.T, n int) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, "the wrapper's goroutine to end", func() bool { return forwarders() <= n })
}

func newNetTransport(t *testing.T) *memberlist.NetTransport {
	t.Helper()
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{"127.0.0.1"},
		Logger:    slog.NewLogLogger(testutil.Logger(t).With("from", "transport").Handler(), slog.LevelDebug),
	})
	if err != nil {
		t.Fatal(err)
	}
	return nt
}

func TestLimitTransportShutdownEndsGoroutine(t *testing.T) {
	base := forwarders() // other tests' wrappers, if any still run
	nt := newNetTransport(t)
	tr := newLimitedTransport(nt, defaultStreamLimits(), testutil.Logger(t))
	addr := fmt.Sprintf("127.0.0.1:%d", nt.GetAutoBindPort())

	// one stream taken by "memberlist" and left open, then three that nobody
	// takes: the forwarder waits to hand one on, NetTransport's listener waits
	// to hand the next to the forwarder
	var peers []net.Conn
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		peers = append(peers, c)
		return c
	}
	dial()
	var taken net.Conn
	select {
	case taken = <-tr.StreamCh():
	case <-time.After(5 * time.Second):
		t.Fatal("no stream")
	}
	for range 3 {
		dial()
	}
	testutil.Eventually(t, 5*time.Second, "the streams accepted", func() bool { return tr.admitted.Load() >= 2 })
	if n := forwarders(); n != base+1 {
		t.Fatalf("%d forwarding goroutines, want %d", n, base+1)
	}

	done := make(chan error, 1)
	go func() { done <- tr.Shutdown() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown hangs")
	}
	if err := tr.Shutdown(); err != nil {
		t.Fatalf("a second Shutdown: %v", err)
	}
	waitForwarders(t, base)
	// every stream, the one memberlist held included, is closed
	for i, c := range peers {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("peer %d: stream still open after Shutdown (%v)", i, err)
		}
		c.Close()
	}
	if _, err := taken.Read(make([]byte, 1)); err == nil {
		t.Error("the stream memberlist held is still open")
	}
	checkIdle(t, tr)
}

func TestLimitTransportInnerStreamChCloses(t *testing.T) {
	base := forwarders()
	inner := &chanTransport{ch: make(chan net.Conn)}
	tr := newLimitedTransport(inner, streamLimits{}, nil)
	if tr.lim != defaultStreamLimits() {
		t.Errorf("zero limits became %+v, want the defaults %+v", tr.lim, defaultStreamLimits())
	}
	close(inner.ch)
	waitForwarders(t, base)
	if err := tr.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if n := inner.shutdowns.Load(); n != 1 {
		t.Errorf("the inner transport was shut down %d times, want 1", n)
	}
}

// --- the flood ------------------------------------------------------------------

// floodSink is a memberlist delegate that keeps the user messages it receives.
type floodSink struct {
	mu   sync.Mutex
	msgs [][]byte
}

func (s *floodSink) NodeMeta(int) []byte { return nil }
func (s *floodSink) NotifyMsg(b []byte) {
	s.mu.Lock()
	s.msgs = append(s.msgs, bytes.Clone(b))
	s.mu.Unlock()
}
func (s *floodSink) GetBroadcasts(int, int) [][]byte { return nil }
func (s *floodSink) LocalState(bool) []byte          { return nil }
func (s *floodSink) MergeRemoteState([]byte, bool)   {}

func (s *floodSink) has(want []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.msgs {
		if bytes.Equal(m, want) {
			return true
		}
	}
	return false
}

// floodConfig is a member's configuration as start() builds it: a key and the
// run's label, the logs bridged to slog.
func floodConfig(t *testing.T, name string, key []byte, lab string) *memberlist.Config {
	cfg := memberlist.DefaultLocalConfig()
	cfg.Name = name
	cfg.BindAddr = "127.0.0.1"
	cfg.BindPort = 0
	cfg.AdvertisePort = 0
	cfg.SecretKey = key
	cfg.Label = lab
	cfg.LogOutput = nil
	cfg.Logger = slog.NewLogLogger(testutil.Logger(t).With("from", name).Handler(), slog.LevelDebug)
	return cfg
}

// heapInuse is the live heap, after a collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// floodAttackers are senders that know the label but not the key.
type floodAttackers struct {
	wg         sync.WaitGroup
	stop       chan struct{}
	mu         sync.Mutex
	conns      []net.Conn
	done, cut  atomic.Int64 // sent all they meant to / were cut off first
	dialFailed atomic.Int64
}

// startFlood starts n attackers: each opens a stream to addr, sends the label header
// and an encrypted-message header declaring declared bytes, then the body as
// fast as TCP takes it, all but its last byte, and holds the stream open so
// that memberlist keeps waiting for the rest (a slow trickle would only make the
// wait longer; the bytes already sent are the cost).
func startFlood(t *testing.T, addr, lab string, n int, declared uint32) *floodAttackers {
	a := &floodAttackers{stop: make(chan struct{})}
	t.Cleanup(a.finish)
	chunk := make([]byte, 64<<10) // shared, only read
	hdr := joinBytes(labelHeader(lab), encHeader(declared))
	for range n {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				a.dialFailed.Add(1)
				return
			}
			a.mu.Lock()
			a.conns = append(a.conns, conn)
			a.mu.Unlock()
			conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
			left := int64(declared) - 1
			_, err = conn.Write(hdr)
			for err == nil && left > 0 {
				var k int
				k, err = conn.Write(chunk[:min(int64(len(chunk)), left)])
				left -= int64(k)
			}
			if err != nil {
				a.cut.Add(1)
			} else {
				a.done.Add(1)
			}
			<-a.stop
		}()
	}
	return a
}

// finish closes every attacker's stream and waits for them.
func (a *floodAttackers) finish() {
	select {
	case <-a.stop:
		return
	default:
	}
	close(a.stop)
	a.mu.Lock()
	for _, c := range a.conns {
		c.Close()
	}
	a.mu.Unlock()
	a.wg.Wait()
}

// TestFloodTransport floods a real, encrypted and labelled memberlist behind
// limitTransport with senders that have the label but not the key, measures the
// heap while their streams are open, and checks that a member with the key
// still joins and sends a 1 MiB message.
//
// Without the wrapper (go test ./coordinator/transport -run TestFloodTransport/16_declaring_20
// -flood.bare, one case at a time: memberlist keeps a case's buffers until its
// TCPTimeout) the same floods grew the live heap, on the 2-core test machine, by:
//
//	16 streams declaring 20 MiB:  +640 MiB (930 MiB at the peak, 1.0 GB RSS)
//	64 streams declaring 20 MiB:  +2,560 MiB (3,255 MiB at the peak, 3.7 GB RSS)
//	16 streams declaring 4 MiB:   +80 MiB
//
// With it: +0.0, +0.1 and +20 MiB; the last is the four 4 MiB messages that
// InflightBytes admits, in memberlist's buffers.
func TestFloodTransport(t *testing.T) {
	lim := defaultStreamLimits()
	cases := []struct {
		name      string
		attackers int
		declared  uint32
	}{
		{"16 declaring 20 MiB", 16, 20 << 20},
		{"64 declaring 20 MiB", 64, 20 << 20},
		{"16 declaring the limit", 16, uint32(lim.MessageBytes)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { testFlood(t, lim, c.attackers, c.declared) })
	}
}

func testFlood(t *testing.T, lim streamLimits, n int, declared uint32) {
	key := make([]byte, 32)
	rand.Read(key)
	lab := runLabel("flood")
	v := startVictim(t, key, lab, lim)

	// what the wrapper lets memberlist hold: messages within the limit, up to
	// InflightBytes of them; memberlist keeps up to 3 times each (a doubling
	// buffer while reading, the plaintext while decrypting), plus about 20 KiB
	// per stream it reads (64 KiB allowed) and 16 MiB for everything else
	admitted := 0
	if int64(declared) <= int64(lim.MessageBytes) {
		admitted = min(n, int(lim.InflightBytes/int64(declared)))
	}
	bound := 3*int64(admitted)*int64(declared) + int64(n)*(64<<10) + 16<<20

	before := liveHeap()
	a := startFlood(t, v.addr, lab, n, declared)
	peak := v.waitFlood(t, a, n, admitted, declared)
	growth := int64(liveHeap()) - int64(before)
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	t.Logf("%d attackers declaring %d bytes: live heap grew by %.1f MiB (bound %.1f MiB), at most %.1f MiB while they sent",
		n, declared, mib(growth), mib(bound), mib(int64(peak)-int64(before)))
	if growth > bound {
		t.Errorf("the flood grew the heap by %d bytes, over %d", growth, bound)
	}
	if tr := v.tr; tr != nil {
		if got := tr.tooLarge.Load() + tr.busy.Load(); got != int64(n-admitted) {
			t.Errorf("%d streams closed unread, want %d", got, n-admitted)
		}
		if tr.refused.Load() != 0 {
			t.Errorf("%d streams refused as too many, want none (%d attackers, room for %d)", tr.refused.Load(), n, lim.Streams)
		}
	}

	// a member with the key still gets in: while the flood's streams are open
	// if they were closed unread; else once they end (the four admitted ones
	// hold every byte InflightBytes allows until memberlist's TCPTimeout, or, as
	// here, until the attacker goes)
	if admitted > 0 {
		a.finish()
		if tr := v.tr; tr != nil {
			testutil.Eventually(t, 5*time.Second, "the flood's streams to end", func() bool {
				tr.mu.Lock()
				defer tr.mu.Unlock()
				return len(tr.open) == 0
			})
		}
	}
	legitMemberGetsIn(t, key, lab, v)
}

// floodVictim is the member under attack.
type floodVictim struct {
	ml   *memberlist.Memberlist
	tr   *limitedTransport // nil under -flood.bare
	addr string // 127.0.0.1:port
	port int
	sink *floodSink
}

// startVictim starts a member as start() does, behind limitTransport (unless
// -flood.bare); the test's end shuts it down and checks that the wrapper let
// every stream and its goroutine go.
func startVictim(t *testing.T, key []byte, lab string, lim streamLimits) *floodVictim {
	base := forwarders()
	nt := newNetTransport(t)
	port := nt.GetAutoBindPort()
	v := &floodVictim{addr: fmt.Sprintf("127.0.0.1:%d", port), port: port, sink: &floodSink{}}
	cfg := floodConfig(t, "victim", key, lab)
	cfg.TCPTimeout = 10 * time.Second // production's (LAN) value: how long memberlist waits for a stream
	cfg.Delegate = v.sink
	if *floodBare {
		cfg.Transport = nt
	} else {
		v.tr = limitTransport(nt, lim, testutil.Logger(t).With("from", "limit")).(*limitedTransport)
		cfg.Transport = v.tr
	}
	ml, err := memberlist.Create(cfg)
	if err != nil {
		cfg.Transport.Shutdown()
		t.Fatal(err)
	}
	v.ml = ml
	t.Cleanup(func() {
		ml.Shutdown()
		if v.tr != nil {
			checkIdle(t, v.tr)
		}
		waitForwarders(t, base)
	})
	return v
}

// waitFlood waits until every attacker's stream was closed unread or admitted
// with all it sent delivered to memberlist (under -flood.bare: until every
// attacker has sent all it meant to), and returns the most heap in use
// meanwhile, garbage included.
func (v *floodVictim) waitFlood(t *testing.T, a *floodAttackers, n, admitted int, declared uint32) uint64 {
	t.Helper()
	wait := 8 * time.Second
	if *floodBare {
		wait = 2 * time.Minute // memberlist reads every byte: gigabytes for 64 attackers
	}
	var peak uint64
	testutil.Eventually(t, wait, "the flood to land", func() bool {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapInuse)
		if v.tr == nil {
			return a.done.Load()+a.cut.Load()+a.dialFailed.Load() == int64(n)
		}
		refused := v.tr.refused.Load() + v.tr.tooLarge.Load() + v.tr.busy.Load()
		return refused == int64(n-admitted) && v.tr.delivered.Load() == int64(admitted)*int64(declared-1)
	})
	return peak
}

// legitMemberGetsIn starts a member with the key, joins v and sends it the
// largest message memsnap sends, incompressible.
func legitMemberGetsIn(t *testing.T, key []byte, lab string, v *floodVictim) {
	t.Helper()
	legit, err := memberlist.Create(floodConfig(t, "legit", key, lab))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { legit.Shutdown() })
	if _, err := legit.Join([]string{v.addr}); err != nil {
		t.Fatalf("a member with the key cannot join: %v", err)
	}
	// (memberlist.Members returns memberlist's own records, whose address it
	// rewrites under its lock on news of the member: only the name is read from
	// them, and the message goes to a node of this test's own)
	known := false
	for _, m := range legit.Members() {
		known = known || m.Name == "victim"
	}
	if !known {
		t.Fatal("joined, but the victim is not a member")
	}
	to := &memberlist.Node{Name: "victim", Addr: net.IPv4(127, 0, 0, 1), Port: uint16(v.port)}
	msg := make([]byte, largestMessage)
	rand.Read(msg)
	if err := legit.SendReliable(to, msg); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 8*time.Second, "the 1 MiB message", func() bool { return v.sink.has(msg) })
}

// --- the limit's figure -------------------------------------------------------

// memberlist's wire types (net.go), encoded as memberlist encodes them.
type (
	mlPushPullHeader struct {
		Nodes        int
		UserStateLen int
		Join         bool
	}
	mlPushNodeState struct {
		Name        string
		Addr        []byte
		Port        uint16
		Meta        []byte
		Incarnation uint32
		State       int
		Vsn         []uint8
	}
	mlUserMsgHeader struct{ UserMsgLen int }
	mlCompress      struct {
		Algo uint8
		Buf  []byte
	}
)

// mlEncode is memberlist's encode: the type byte, then msgpack.
func mlEncode(t *testing.T, w *bytes.Buffer, v any) {
	t.Helper()
	hd := codec.MsgpackHandle{}
	hd.TimeNotBuiltin = true
	if err := codec.NewEncoder(w, &hd).Encode(v); err != nil {
		t.Fatal(err)
	}
}

// mlStreamLength is the length an encrypted stream declares for a message, as
// rawSendMsgStream sends it: LZW-compressed, wrapped, then encrypted (version 1:
// version byte, nonce, ciphertext, tag).
func mlStreamLength(t *testing.T, msg []byte) int {
	t.Helper()
	var comp bytes.Buffer
	w := lzw.NewWriter(&comp, lzw.LSB, 8)
	w.Write(msg)
	w.Close()
	var wrapped bytes.Buffer
	wrapped.WriteByte(9) // compressMsg
	mlEncode(t, &wrapped, &mlCompress{Algo: 0, Buf: comp.Bytes()})
	return 1 + 12 + wrapped.Len() + 16
}

func TestLimitFitsLargestMessages(t *testing.T) {
	const members = 1024
	// the longest name: a client of a run whose label is 255 bytes long
	run := strings.Repeat("r", 255-len(runLabel("")))

	var pp bytes.Buffer
	pp.WriteByte(6) // pushPullMsg
	mlEncode(t, &pp, &mlPushPullHeader{Nodes: members})
	longest := 0
	for i := range members {
		meta := make([]byte, memberlist.MetaMaxSize)
		rand.Read(meta)
		name := fmt.Sprintf("%s/client-%07d-%08x", run, 1<<22+i, uint32(i)*2654435761) // as New names a client
		longest = max(longest, len(name))
		mlEncode(t, &pp, &mlPushNodeState{Name: name, Addr: net.ParseIP("fd00::1"), Port: 65535, Meta: meta,
			Incarnation: 1<<32 - 1, State: 3, Vsn: []uint8{1, 5, 5, 2, 5, 5}})
	}
	pushPull := mlStreamLength(t, pp.Bytes())

	user := make([]byte, largestMessage)
	rand.Read(user)
	var um bytes.Buffer
	um.WriteByte(8) // userMsg
	mlEncode(t, &um, &mlUserMsgHeader{UserMsgLen: len(user)})
	um.Write(user)
	userMsg := mlStreamLength(t, um.Bytes())

	mib := func(n int) float64 { return float64(n) / (1 << 20) }
	lim := defaultStreamLimits()
	t.Logf("push-pull of %d members (names of %d bytes): %.2f MiB of msgpack, declares %.2f MiB; a %d-byte user message declares %.2f MiB; together %.2f MiB; limit %.2f MiB",
		members, longest, mib(pp.Len()), mib(pushPull), len(user), mib(userMsg), mib(pushPull+userMsg), mib(lim.MessageBytes))
	if pushPull+userMsg > lim.MessageBytes {
		t.Errorf("a push-pull of %d members (%d bytes) and the largest user message (%d) need more than MessageBytes (%d)",
			members, pushPull, userMsg, lim.MessageBytes)
	}
	if lim.InflightBytes < int64(lim.MessageBytes) {
		t.Errorf("InflightBytes %d below MessageBytes %d", lim.InflightBytes, lim.MessageBytes)
	}
}
