package rankagent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
)

// runBare starts an agent with no trainer and returns it, the cancel of Run's
// context, and where Run's result arrives; at the end of the test Run must have
// returned.
func runBare(t *testing.T) (a *Agent, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	cfg := DefaultConfig(testID(0))
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(t.TempDir(), true) }
	cfg.Socket, cfg.Spool, cfg.Logger = shortSocket(t), t.TempDir(), testutil.Logger(t)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch, returned := make(chan error, 1), make(chan struct{})
	go func() { ch <- a.Run(ctx); close(returned) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-returned:
		case <-time.After(20 * time.Second):
			t.Error("Run did not return at the end of the test")
		}
	})
	testutil.Eventually(t, 10*time.Second, "the agent's socket", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.ln != nil
	})
	return a, cancel, ch
}

func openConns(a *Agent) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.conns)
}

// closedByAgent reads c until the agent closes it: nil when it did (the read
// ends with EOF), else what the read ended with (a time-out after wait).
func closedByAgent(c net.Conn, wait time.Duration) error {
	c.SetReadDeadline(time.Now().Add(wait))
	_, err := io.Copy(io.Discard, c) // nil at EOF
	if errors.Is(err, syscall.ECONNRESET) {
		// closed too: a Unix socket closed with bytes it had not read yet (half
		// a hello line) resets its peer instead of ending the stream
		return nil
	}
	return err
}

// TestRunClosesSilentConnections: connections that never say hello (one that
// sends nothing, one stuck in the middle of its hello line) do not keep Run from
// returning when its context ends: the agent closes every connection at once,
// well before the hello deadline would, and Run returns nil.
func TestRunClosesSilentConnections(t *testing.T) {
	a, cancel, done := runBare(t)
	silent, err := net.Dial("unix", a.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	half, err := net.Dial("unix", a.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	half.Write([]byte(`{"v":1,"type":"hel`))
	testutil.Eventually(t, 10*time.Second, "the agent to hold both connections", func() bool { return openConns(a) == 2 })

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(helloTimeout / 2):
		t.Fatalf("Run did not return within %v of its context ending, with two silent connections open", helloTimeout/2)
	}
	for name, c := range map[string]net.Conn{"silent": silent, "half a hello": half} {
		if err := closedByAgent(c, 5*time.Second); err != nil {
			t.Fatalf("the %s connection was not closed by the agent: %v", name, err)
		}
	}
	if n := openConns(a); n != 0 {
		t.Fatalf("the agent still holds %d connections after Run returned", n)
	}
}

// TestSilentConnectionDroppedAtHelloDeadline: a connection that says nothing is
// closed by the agent once the hello deadline (helloTimeout) passes, not before,
// and the agent forgets it; a trainer that says hello afterwards is welcomed.
func TestSilentConnectionDroppedAtHelloDeadline(t *testing.T) {
	if testing.Short() {
		t.Skipf("waits for the hello deadline (%v)", helloTimeout)
	}
	a, _, _ := runBare(t)
	c, err := net.Dial("unix", a.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testutil.Eventually(t, 10*time.Second, "the agent to hold the connection", func() bool { return openConns(a) == 1 })
	start := time.Now()
	if err := closedByAgent(c, helloTimeout+10*time.Second); err != nil {
		t.Fatalf("a silent connection was not dropped at the hello deadline: %v", err)
	}
	// the agent set the deadline before it was seen holding the connection: the
	// drop comes no sooner than the deadline less the poll that saw it
	if took := time.Since(start); took < helloTimeout-time.Second {
		t.Fatalf("a silent connection was dropped after %v, before the hello deadline of %v", took, helloTimeout)
	}
	testutil.Eventually(t, 10*time.Second, "the agent to forget the connection", func() bool { return openConns(a) == 0 })

	tr, err := net.Dial("unix", a.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	tr.Write(encodeMessage(&Message{V: 1, Type: "hello", PID: 1}))
	tr.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(tr).ReadBytes('\n')
	if err != nil {
		t.Fatalf("no welcome after the silent connection was dropped: %v", err)
	}
	var m Message
	if err := json.Unmarshal(line, &m); err != nil || m.Type != "welcome" {
		t.Fatalf("want a welcome, got %q (%v)", line, err)
	}
}
