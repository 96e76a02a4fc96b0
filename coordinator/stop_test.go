package coordinator

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/rankagent"
)

// clientConfig is a client member's configuration on loopback, with its own key.
func clientConfig(t *testing.T, run string) Config {
	cfg := DefaultLocalConfig(rankagent.Identity{RunName: run})
	cfg.Client, cfg.SecretKey, cfg.Logger = true, newKey(t), testutil.Logger(t)
	return cfg
}

// portFree reports why addr cannot be bound for TCP and for UDP, or nil when it
// can: nothing listens there.
func portFree(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	ln.Close()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	pc.Close()
	return nil
}

// TestRunAfterShutdown: a member shut down before it ran never runs: Run returns
// ErrStopped at once and binds nothing (its gossip port can be bound, for TCP
// and UDP, while a member that does run holds it), and Shutdown is idempotent.
func TestRunAfterShutdown(t *testing.T) {
	port := testutil.FreePort(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cfg := clientConfig(t, "stopped")
	cfg.Memberlist.BindPort, cfg.Memberlist.AdvertisePort = port, port
	c, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := c.Shutdown(); err != nil {
			t.Fatalf("Shutdown %d of a member that never ran: %v", i+1, err)
		}
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	select {
	case err := <-ran:
		if !errors.Is(err, ErrStopped) {
			t.Fatalf("Run after Shutdown: %v, want ErrStopped", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run after Shutdown did not return")
	}
	if c.Addr() != "" || c.memberlist() != nil {
		t.Fatalf("Run after Shutdown started gossip on %q", c.Addr())
	}
	if err := portFree(addr); err != nil {
		t.Fatalf("Run after Shutdown holds its port: %v", err)
	}
	if err := c.Leave(time.Second); !errors.Is(err, ErrStopped) {
		t.Fatalf("Leave after Shutdown: %v, want ErrStopped", err)
	}
	if err := c.Shutdown(); err != nil {
		t.Fatal(err)
	}

	// the same configuration, run: it binds that port (so the check above can see one)
	other, stop := runMember(t, cfg)
	defer stop()
	testutil.Eventually(t, 10*time.Second, "the member that runs to listen", func() bool { return other.Addr() != "" })
	if other.Addr() != addr {
		t.Fatalf("the member listens on %s, want %s", other.Addr(), addr)
	}
	if err := portFree(addr); err == nil {
		t.Fatalf("%s could be bound while a member listens on it", addr)
	}
}

// TestSecondRunRefused: a second Run while the first runs returns an error at
// once and disturbs nothing (the first goes on serving: a member joins it, and it
// returns nil when its context ends); a Run after that returns ErrStopped.
func TestSecondRunRefused(t *testing.T) {
	cfg := clientConfig(t, "twice")
	c, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := make(chan error, 1)
	go func() { first <- c.Run(ctx) }()
	testutil.Eventually(t, 10*time.Second, "the first Run to listen", func() bool { return c.Addr() != "" })

	second := make(chan error, 1)
	go func() { second <- c.Run(context.Background()) }()
	select {
	case err := <-second:
		if err == nil || errors.Is(err, ErrStopped) {
			t.Fatalf("a second Run while the first runs: %v, want a refusal", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a second Run while the first runs did not return")
	}

	ocfg := cfg
	ocfg.Join = []string{c.Addr()}
	other, stopOther := runMember(t, ocfg)
	defer stopOther()
	testutil.Eventually(t, 20*time.Second, "a member to join the first Run's member", func() bool {
		return len(c.Members()) == 2 && len(other.Members()) == 2
	})

	cancel()
	select {
	case err := <-first:
		if err != nil {
			t.Fatalf("the first Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first Run did not return when its context ended")
	}
	if err := c.Run(context.Background()); !errors.Is(err, ErrStopped) {
		t.Fatalf("Run after the first ended: %v, want ErrStopped", err)
	}
}

// TestShutdownIsIdempotent: Shutdown of a running member stops it (Run returns
// nil, the port is free), and every later Shutdown returns nil and changes
// nothing.
func TestShutdownIsIdempotent(t *testing.T) {
	port := testutil.FreePort(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cfg := clientConfig(t, "idem")
	cfg.Memberlist.BindPort, cfg.Memberlist.AdvertisePort = port, port
	c, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	testutil.Eventually(t, 10*time.Second, "the member to listen", func() bool { return c.Addr() == addr })
	for i := 0; i < 3; i++ {
		if err := c.Shutdown(); err != nil {
			t.Fatalf("Shutdown %d: %v", i+1, err)
		}
		if i == 0 {
			select {
			case err := <-ran:
				if err != nil {
					t.Fatalf("Run after Shutdown: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return after Shutdown")
			}
		}
		if err := portFree(addr); err != nil {
			t.Fatalf("after Shutdown %d the port is held: %v", i+1, err)
		}
	}
	if err := c.Run(context.Background()); !errors.Is(err, ErrStopped) {
		t.Fatalf("Run after Shutdown: %v, want ErrStopped", err)
	}
}

// stuckClock is a rank's recorder whose first SetClockOffset (the clock loop's,
// a goroutine Run starts) blocks until release is closed.
type stuckClock struct {
	entered, release chan struct{}
	once             sync.Once
}

func (s *stuckClock) Arm(rankagent.Window) error       { return errors.New("test: no trainer") }
func (s *stuckClock) Cancel(uint64, string) error      { return nil }
func (s *stuckClock) Progress() (int64, time.Duration) { return -1, 0 }
func (s *stuckClock) Dump(uint64) error                { return errors.New("test: no trainer") }
func (s *stuckClock) SetClockOffset(offset, rtt time.Duration) {
	s.once.Do(func() { close(s.entered); <-s.release })
}
func (s *stuckClock) Current() (rankagent.Window, rankagent.WindowState, bool) {
	return rankagent.Window{}, "", false
}

// goroutineStacks returns every goroutine's stack, one string each (its first
// line says its state).
func goroutineStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// parkedIn reports whether some goroutine whose stack holds every one of in and
// none of out is parked (not running, not runnable) and not merely waiting for a
// mutex.
func parkedIn(in []string, out ...string) bool {
next:
	for _, g := range goroutineStacks() {
		head, _, _ := strings.Cut(g, "\n")
		if strings.Contains(head, "[running") || strings.Contains(head, "[runnable") || strings.Contains(g, "sync.(*Mutex).Lock") {
			continue
		}
		for _, s := range in {
			if !strings.Contains(g, s) {
				continue next
			}
		}
		for _, s := range out {
			if strings.Contains(g, s) {
				continue next
			}
		}
		return true
	}
	return false
}

// TestEveryShutdownWaits: while a goroutine Run started is still busy (the clock
// loop, inside the recorder), Shutdown called from outside does not return, and
// neither does Run, whose own Shutdown meets the one in progress: both wait
// until that goroutine has ended.
func TestEveryShutdownWaits(t *testing.T) {
	id := rankagent.Identity{RunName: "waits", WorldSize: 1, LocalWorldSize: 1}
	cfg := DefaultLocalConfig(id)
	cfg.SecretKey, cfg.Logger = newKey(t), testutil.Logger(t)
	dir := t.TempDir()
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(dir, true) }
	rec := &stuckClock{entered: make(chan struct{}), release: make(chan struct{})}
	var once sync.Once
	release := func() { once.Do(func() { close(rec.release) }) }
	t.Cleanup(release)
	c, err := New(cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	select {
	case <-rec.entered: // it leads itself, and measures its offset to itself
	case <-time.After(30 * time.Second):
		t.Fatal("the clock loop never set the offset")
	}
	shut := make(chan error, 1)
	go func() { shut <- c.Shutdown() }()
	// both are waiting, inside Shutdown, while the clock loop is still stuck
	testutil.Eventually(t, 30*time.Second, "Run and the outside Shutdown to wait for the clock loop", func() bool {
		select {
		case <-ran:
			t.Fatal("Run returned while the clock loop it started was still inside the recorder")
		case <-shut:
			t.Fatal("Shutdown returned while the clock loop was still inside the recorder")
		default:
		}
		run, shutdown := "coordinator.(*Coordinator).Run(", "coordinator.(*Coordinator).Shutdown("
		return parkedIn([]string{run, shutdown}) && parkedIn([]string{shutdown}, run)
	})
	release()
	for what, ch := range map[string]chan error{"Run": ran, "Shutdown": shut} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not return once the clock loop was released", what)
		}
	}
}
