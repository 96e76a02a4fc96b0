package rankagent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/snapshot"
)

func TestParseMessageStoppingAndCrash(t *testing.T) {
	long := strings.Repeat("é", MaxCause/2) // MaxCause bytes exactly
	cases := []struct {
		name, line string
		ok         bool
	}{
		{"stopping", `{"type":"stopping","cause":"SIGTERM","t_us":12,"batch":3}`, true},
		{"stopping without batch", `{"type":"stopping","cause":"exit","t_us":12}`, true},
		{"stopping at batch 0", `{"type":"stopping","cause":"exit","t_us":12,"batch":0}`, true},
		{"stopping with a cause of MaxCause bytes", `{"type":"stopping","cause":"` + long + `","t_us":1}`, true},
		{"stopping without cause", `{"type":"stopping","t_us":12}`, false},
		{"stopping with a cause too long", `{"type":"stopping","cause":"x` + long + `","t_us":1}`, false},
		{"stopping with negative time", `{"type":"stopping","cause":"SIGTERM","t_us":-1}`, false},
		{"stopping with negative batch", `{"type":"stopping","cause":"SIGTERM","t_us":1,"batch":-1}`, false},
		{"stopping with an unknown field", `{"type":"stopping","cause":"SIGTERM","t_us":1,"signal":15}`, false},
		{"crash in a window", `{"type":"snapshot","window":4,"reason":"crash","cause":"exception: RuntimeError: x","file":"rank0.crash4.1.pickle","start":2,"stop":9,"batches":[{"batch":2,"start_us":1,"end_us":2},{"batch":3,"start_us":3,"end_us":3}]}`, true},
		{"crash from record-always history", `{"type":"snapshot","window":0,"reason":"crash","cause":"SIGTERM","file":"rank0.crash0.1.pickle","batches":[]}`, true},
		{"crash without cause", `{"type":"snapshot","window":0,"reason":"crash","file":"rank0.crash0.1.pickle"}`, true},
		{"crash in a window without bounds", `{"type":"snapshot","window":4,"reason":"crash","cause":"SIGTERM","file":"a.pickle"}`, false},
		{"crash in an empty window", `{"type":"snapshot","window":4,"reason":"crash","cause":"SIGTERM","file":"a.pickle","start":5,"stop":5}`, false},
		{"crash with bounds but no window", `{"type":"snapshot","window":0,"reason":"crash","cause":"SIGTERM","file":"a.pickle","start":1,"stop":5}`, false},
		{"crash with a cause too long", `{"type":"snapshot","reason":"crash","cause":"x` + long + `","file":"a.pickle"}`, false},
		{"crash with a file outside the spool", `{"type":"snapshot","reason":"crash","cause":"SIGTERM","file":"../a.pickle"}`, false},
		{"crash with marks out of order", `{"type":"snapshot","window":1,"reason":"crash","cause":"SIGTERM","file":"a.pickle","start":1,"stop":5,"batches":[{"batch":3,"start_us":1,"end_us":2},{"batch":2,"start_us":3,"end_us":4}]}`, false},
		{"a cause on a window snapshot", `{"type":"snapshot","window":1,"reason":"window","cause":"SIGTERM","file":"a.pickle","start":1,"stop":2}`, false},
		{"a cause on a batch", `{"type":"batch","batch":1,"cause":"SIGTERM"}`, false},
		{"an unknown reason", `{"type":"snapshot","window":1,"reason":"kill","file":"a.pickle"}`, false},
		{"an unknown type", `{"type":"dying","cause":"SIGTERM"}`, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := ParseMessage([]byte(c.line))
			if c.ok != (err == nil) {
				t.Fatalf("ok=%v, got %+v, %v", c.ok, m, err)
			}
			if err != nil && !errors.Is(err, ErrProtocol) {
				t.Fatalf("the refusal does not wrap ErrProtocol: %v", err)
			}
		})
	}
	if got := clipCause(strings.Repeat("é", MaxCause)); len(got) != MaxCause || !strings.HasSuffix(got, "é") {
		t.Fatalf("a long cause clipped to %d bytes: %q", len(got), got[len(got)-4:])
	}
	if got := clipCause("a\xffb"); got != "a?b" {
		t.Fatalf("invalid UTF-8 kept: %q", got)
	}
}

// tap sits between a trainer and its agent on the trainer socket: it forwards every
// byte both ways, half-closes as its ends do, and keeps each line the trainer
// sends, calling see on it before the agent can read it.
type tap struct {
	path  string
	see   func(line []byte)
	mu    sync.Mutex
	lines [][]byte
}

func newTap(t *testing.T, agentSocket string, see func([]byte)) *tap {
	tp := &tap{path: shortSocket(t), see: see}
	ln, err := net.Listen("unix", tp.path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a, err := net.Dial("unix", agentSocket)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, a)
			mu.Unlock()
			wg.Add(2)
			go func() {
				defer wg.Done()
				io.Copy(c, a)
				c.(*net.UnixConn).CloseWrite()
			}()
			go func() {
				defer wg.Done()
				tp.forward(c, a)
				a.(*net.UnixConn).CloseWrite()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return tp
}

func (tp *tap) forward(from io.Reader, to io.Writer) {
	r := bufio.NewReader(from)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 && err == nil {
			l := bytes.TrimSuffix(line, []byte("\n"))
			tp.mu.Lock()
			tp.lines = append(tp.lines, l)
			tp.mu.Unlock()
			if tp.see != nil {
				tp.see(l)
			}
		}
		if len(line) > 0 {
			if _, werr := to.Write(line); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// sent returns the messages of the given types the trainer sent, in order, each
// parsed as the agent parses it.
func (tp *tap) sent(t *testing.T, types ...string) []*Message {
	t.Helper()
	tp.mu.Lock()
	defer tp.mu.Unlock()
	var out []*Message
	for _, l := range tp.lines {
		m, err := ParseMessage(l)
		if err != nil {
			t.Fatalf("the trainer sent a message the agent refuses: %v\n%s", err, l)
		}
		for _, typ := range types {
			if m.Type == typ {
				out = append(out, m)
			}
		}
	}
	return out
}

// slogTee logs to t.Log and to buf.
func slogTee(t *testing.T, buf io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(io.MultiWriter(testutil.LogWriter(t), buf), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// crashRig is a real agent (a folder store) with a tap in front of its socket and
// a replay trainer behind the tap. The tap copies every crash snapshot (NAME.pickle
// and NAME.json) out of the spool's incoming folder as its message goes by, before
// the agent takes the files.
type crashRig struct {
	h        *harness
	tap      *tap
	logs     *testutil.SyncBuffer
	incoming string

	mu    sync.Mutex
	files map[string][]byte // base name -> content, for crash snapshots
	err   error             // a crash snapshot's files were not in incoming/
}

func newCrashRig(t *testing.T, recordAlways bool) *crashRig {
	t.Helper()
	rig := &crashRig{logs: &testutil.SyncBuffer{}, files: map[string][]byte{}}
	dir := t.TempDir()
	cfg := DefaultConfig(testID(2))
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(dir, true) }
	cfg.RecordAlways = recordAlways
	h := &harness{done: make(chan error, 1), results: make(chan UploadResult, 16)}
	cfg.OnUpload = func(r UploadResult) {
		select {
		case h.results <- r:
		default:
		}
	}
	cfg.Logger = slogTee(t, rig.logs)
	rig.h = startWith(t, cfg, h)
	rig.incoming = filepath.Join(h.agent.Spool(), "incoming")
	rig.tap = newTap(t, h.agent.Socket(), rig.see)
	return rig
}

func (rig *crashRig) see(line []byte) {
	m, err := ParseMessage(line)
	if err != nil || m.Type != "snapshot" || m.Reason != "crash" {
		return
	}
	rig.mu.Lock()
	defer rig.mu.Unlock()
	for _, n := range []string{m.File, companion(m.File)} {
		b, err := os.ReadFile(filepath.Join(rig.incoming, n))
		if err != nil {
			rig.err = fmt.Errorf("the snapshot message went out before its files were in incoming/: %w", err)
			return
		}
		rig.files[n] = b
	}
}

// replay starts a replay trainer through the tap; Replay's error comes on the
// channel.
func (rig *crashRig) replay(t *testing.T, cfg ReplayConfig) chan error {
	cfg.Socket, cfg.Snapshot, cfg.Rank, cfg.UUID = rig.tap.path, replaySnapshot(t), 2, "GPU-test"
	if cfg.Pace == 0 {
		cfg.Pace = 15 * time.Millisecond
	}
	cfg.Logger = testutil.Logger(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Replay(ctx, cfg) }()
	t.Cleanup(func() { cancel(); <-done })
	return done
}

// result waits for Replay's error: it must come well before replayStopWait, so
// the trainer returned because the agent read its messages, not on the bound.
func result(t *testing.T, done chan error, since time.Time) error {
	t.Helper()
	select {
	case err := <-done:
		done <- err // for the cleanup
		if d := time.Since(since); d > replayStopWait/2 {
			t.Fatalf("Replay returned after %v: it waited for its bound, not for the agent", d)
		}
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("Replay did not return")
	}
	return nil
}

// crashFile checks the crash snapshot the trainer wrote into incoming/ for message
// m: NAME.json holds m as the agent parses it, NAME.pickle decodes to the replayed
// events, returned.
func (rig *crashRig) crashFile(t *testing.T, m *Message) *snapshot.Snapshot {
	t.Helper()
	rig.mu.Lock()
	defer rig.mu.Unlock()
	if rig.err != nil {
		t.Fatal(rig.err)
	}
	if !strings.HasPrefix(m.File, fmt.Sprintf("rank2.crash%d.", m.Window)) {
		t.Fatalf("crash snapshot named %q", m.File)
	}
	side, err := ParseMessage(bytes.TrimSuffix(rig.files[companion(m.File)], []byte("\n")))
	if err != nil {
		t.Fatalf("%s: %v", companion(m.File), err)
	}
	if a, b := string(encodeMessage(side)), string(encodeMessage(m)); a != b {
		t.Fatalf("%s holds\n%s, the trainer sent\n%s", companion(m.File), a, b)
	}
	s, err := snapshot.Decode(rig.files[m.File])
	if err != nil {
		t.Fatalf("%s: %v", m.File, err)
	}
	want, _ := snapshot.Decode(replaySnapshot(t))
	if len(s.DeviceTraces) == 0 || len(s.DeviceTraces[0]) != len(want.DeviceTraces[0]) {
		t.Fatalf("the crash snapshot has %d traces, not the %d replayed events", len(s.DeviceTraces), len(want.DeviceTraces[0]))
	}
	return s
}

// noRefusals checks that the agent parsed everything the trainer sent.
func (rig *crashRig) noRefusals(t *testing.T) {
	t.Helper()
	if l := rig.logs.String(); strings.Contains(l, "refused a trainer message") {
		t.Fatalf("the agent refused a message:\n%s", l)
	}
}

// stopAndCrash returns the trainer's stopping and crash snapshot messages, checking
// that there is exactly one of each, stopping first.
func (rig *crashRig) stopAndCrash(t *testing.T) (stop, crash *Message) {
	t.Helper()
	ms := rig.tap.sent(t, "stopping", "snapshot")
	if len(ms) != 2 || ms[0].Type != "stopping" || ms[1].Type != "snapshot" || ms[1].Reason != "crash" {
		t.Fatalf("want stopping then a crash snapshot, the trainer sent %d: %+v", len(ms), ms)
	}
	return ms[0], ms[1]
}

func TestReplayFailAtDumpsTheWindow(t *testing.T) {
	rig := newCrashRig(t, false)
	done := rig.replay(t, ReplayConfig{HoldAt: []int64{3}, FailAt: 6})
	w := armAt(t, rig.h, 3, 100)
	var since time.Time
	testutil.Eventually(t, 20*time.Second, "the trainer to reach batch 6", func() bool {
		since = time.Now()
		return rig.h.agent.Batch() >= 5
	})
	err := result(t, done, since)
	want := "exception: RuntimeError: replay failure at batch 6"
	if !errors.Is(err, ErrTrainerFailed) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Replay returned %v, want ErrTrainerFailed with %q", err, want)
	}
	// Replay returned once the agent had read both: the tap forwarded them before
	stop, crash := rig.stopAndCrash(t)
	if stop.Cause != want || stop.Batch == nil || *stop.Batch != 6 || stop.TimeUS <= 0 {
		t.Fatalf("stopping %+v", stop)
	}
	if crash.Cause != want || crash.Window != w.ID || crash.Start != w.Start || crash.Stop != w.Stop {
		t.Fatalf("crash snapshot %+v for window %+v", crash, w)
	}
	checkCrashMarks(t, crash, 3, 6, stop.TimeUS)
	s := rig.crashFile(t, crash)
	first, last := s.DeviceTraces[0][0].TimeUS, s.DeviceTraces[0][len(s.DeviceTraces[0])-1].TimeUS
	if first < crash.Batches[0].StartUS || last > crash.Batches[len(crash.Batches)-1].EndUS {
		t.Fatalf("events [%d, %d] outside the marks [%d, %d]", first, last, crash.Batches[0].StartUS, crash.Batches[len(crash.Batches)-1].EndUS)
	}
	rig.noRefusals(t)
}

// checkCrashMarks: the marks are batches from..to, one after the other, the last
// (the batch in progress) ending at the stop.
func checkCrashMarks(t *testing.T, crash *Message, from, to, stopUS int64) {
	t.Helper()
	if int64(len(crash.Batches)) != to-from+1 {
		t.Fatalf("%d batch marks, want batches %d..%d: %+v", len(crash.Batches), from, to, crash.Batches)
	}
	for i, b := range crash.Batches {
		if b.Batch != from+int64(i) || b.EndUS < b.StartUS || (i > 0 && b.StartUS < crash.Batches[i-1].EndUS) {
			t.Fatalf("batch mark %d: %+v", i, crash.Batches)
		}
	}
	if last := crash.Batches[len(crash.Batches)-1]; last.EndUS != stopUS {
		t.Fatalf("the batch in progress ends at %d, the trainer stopped at %d", last.EndUS, stopUS)
	}
}

func TestReplayStopMidWindow(t *testing.T) {
	rig := newCrashRig(t, true) // history kept on, too: the window's dump wins
	stopCh := make(chan string, 1)
	done := rig.replay(t, ReplayConfig{HoldAt: []int64{3}, Stop: stopCh})
	w := armAt(t, rig.h, 3, 1000)
	testutil.Eventually(t, 20*time.Second, "the trainer to record batch 5", func() bool {
		_, st, ok := rig.h.agent.Current()
		return ok && st == WindowRecording && rig.h.agent.Batch() >= 5
	})
	since := time.Now()
	stopCh <- "SIGTERM"
	err := result(t, done, since)
	if !errors.Is(err, ErrTrainerStopped) || !strings.Contains(err.Error(), "SIGTERM") {
		t.Fatalf("Replay returned %v, want ErrTrainerStopped", err)
	}
	stop, crash := rig.stopAndCrash(t)
	if stop.Cause != "SIGTERM" || crash.Cause != "SIGTERM" || stop.Batch == nil {
		t.Fatalf("stopping %+v, crash %+v", stop, crash)
	}
	if crash.Window != w.ID || crash.Start != 3 || crash.Stop != 1003 {
		t.Fatalf("crash snapshot %+v for window %+v", crash, w)
	}
	checkCrashMarks(t, crash, 3, *stop.Batch, stop.TimeUS)
	rig.crashFile(t, crash)
	rig.noRefusals(t)
}

func TestReplayStopWithRecordAlwaysOnly(t *testing.T) {
	rig := newCrashRig(t, true)
	stopCh := make(chan string, 1)
	done := rig.replay(t, ReplayConfig{HoldAt: []int64{4}, Stop: stopCh}) // no window ever comes
	testutil.Eventually(t, 20*time.Second, "the trainer to hold before batch 4", func() bool { return rig.h.agent.Batch() == 3 })
	since := time.Now()
	stopCh <- "exception: KeyboardInterrupt: "
	err := result(t, done, since)
	if !errors.Is(err, ErrTrainerStopped) {
		t.Fatalf("Replay returned %v, want ErrTrainerStopped", err)
	}
	stop, crash := rig.stopAndCrash(t)
	if stop.Cause != "exception: KeyboardInterrupt: " || stop.Batch == nil || *stop.Batch != 3 {
		t.Fatalf("stopping %+v", stop)
	}
	if crash.Window != 0 || crash.Start != 0 || crash.Stop != 0 || len(crash.Batches) != 0 || crash.Cause != stop.Cause {
		t.Fatalf("a crash with only record-always history: %+v", crash)
	}
	// a post-mortem's shape: the history ends when the trainer stopped
	s := rig.crashFile(t, crash)
	last := s.DeviceTraces[0][len(s.DeviceTraces[0])-1].TimeUS
	if last < stop.TimeUS || last > time.Now().UnixMicro() {
		t.Fatalf("the last event at %d, the trainer stopped at %d", last, stop.TimeUS)
	}
	rig.noRefusals(t)
}

func TestReplayStopWithoutHistory(t *testing.T) {
	rig := newCrashRig(t, false)
	stopCh := make(chan string)
	done := rig.replay(t, ReplayConfig{Stop: stopCh})
	testutil.Eventually(t, 20*time.Second, "the trainer to train", func() bool { return rig.h.agent.Batch() >= 2 })
	since := time.Now()
	close(stopCh) // a closed channel stops it as SIGTERM
	err := result(t, done, since)
	if !errors.Is(err, ErrTrainerStopped) {
		t.Fatalf("Replay returned %v, want ErrTrainerStopped", err)
	}
	ms := rig.tap.sent(t, "stopping", "snapshot")
	if len(ms) != 1 || ms[0].Type != "stopping" || ms[0].Cause != "SIGTERM" {
		t.Fatalf("want only a stopping message, the trainer sent %+v", ms)
	}
	if ents, _ := os.ReadDir(rig.incoming); len(ents) != 0 {
		t.Fatalf("files in incoming/: %v", ents)
	}
	rig.noRefusals(t)
}

func TestReplayFailAtWithoutAgent(t *testing.T) {
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- Replay(context.Background(), ReplayConfig{Socket: shortSocket(t), Snapshot: replaySnapshot(t),
			Pace: time.Millisecond, FailAt: 3, Logger: testutil.Logger(t)})
	}()
	err := result(t, done, start)
	if !errors.Is(err, ErrTrainerFailed) {
		t.Fatalf("Replay returned %v, want ErrTrainerFailed", err)
	}
}
