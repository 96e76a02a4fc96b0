package main

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/rankagent"
)

// TestReplayDefaultRunsUntilInterrupted: `memsnap replay` with no --batches keeps
// stepping well past the old default's last batch (19), so a user has time to ask
// for a window by hand, and SIGINT ends it with status 0.
func TestReplayDefaultRunsUntilInterrupted(t *testing.T) {
	dir, err := os.MkdirTemp("", "ms") // a short path: a socket's is limited
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd := memsnapCmd(t, "replay", "--socket", sock, "--snapshot", testutil.Snapshot(t, "ddp4/rank0.5.memory_snapshot.pickle"))
	out := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer cmd.Process.Kill()
	ln.(*net.UnixListener).SetDeadline(time.Now().Add(30 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(60 * time.Second))
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 4096), rankagent.MaxLine)
	const past = 40 // the old default ended after batch 19
	last := int64(-1)
	for last < past && sc.Scan() {
		var m rankagent.Message
		if json.Unmarshal(sc.Bytes(), &m) == nil && m.Type == "batch" && m.Batch != nil {
			last = *m.Batch
		}
	}
	if last < past {
		t.Fatalf("the replay stopped at batch %d (%v); it said:\n%s", last, sc.Err(), out)
	}
	// its help says so
	if _, _, stderr := runCLI(t, "replay", "-h"); !strings.Contains(stderr, "  --batches int\n") || !strings.Contains(stderr, "0, the default: until interrupted") {
		t.Errorf("memsnap replay -h does not say the default runs until interrupted:\n%s", stderr)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("after SIGINT: %v; it said:\n%s", err, out)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the replay did not end within 30s of SIGINT; it said:\n%s", out)
	}
}
