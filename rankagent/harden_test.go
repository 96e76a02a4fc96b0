package rankagent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/digest"
	"github.com/memsnap/memsnap/internal/gpu"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/naming"
)

// fakeTrainer speaks the hook's side of the socket protocol from the test.
type fakeTrainer struct {
	t     *testing.T
	c     net.Conn
	sc    *bufio.Scanner
	spool string
}

func dialTrainer(t *testing.T, sock string) *fakeTrainer {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	f := &fakeTrainer{t: t, c: c, sc: bufio.NewScanner(c)}
	f.send(&Message{V: ProtocolVersion, Type: "hello", PID: os.Getpid()})
	f.spool = f.next("welcome").Spool
	return f
}

func (f *fakeTrainer) send(m *Message) {
	f.t.Helper()
	if _, err := f.c.Write(encodeMessage(m)); err != nil {
		f.t.Fatal(err)
	}
}

// next reads messages until one of type typ arrives.
func (f *fakeTrainer) next(typ string) *Message {
	f.t.Helper()
	f.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for f.sc.Scan() {
		var m Message
		if err := json.Unmarshal(f.sc.Bytes(), &m); err != nil {
			f.t.Fatal(err)
		}
		if m.Type == typ {
			return &m
		}
	}
	f.t.Fatalf("no %s message: %v", typ, f.sc.Err())
	return nil
}

// write puts a snapshot file (and, with msg, its message beside it) into incoming/.
func writeIncoming(t *testing.T, incoming, name string, data []byte, msg *Message) {
	t.Helper()
	if msg != nil {
		if err := os.WriteFile(filepath.Join(incoming, companion(name)), encodeMessage(msg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(incoming, name), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// marks makes batch marks for [from, to) that span the replay snapshot's events.
func marks(t *testing.T, from, to int64) []BatchMark {
	s, err := snapshot.Decode(replaySnapshot(t))
	if err != nil {
		t.Fatal(err)
	}
	tr := s.DeviceTraces[0]
	t0, t1 := tr[0].TimeUS, tr[len(tr)-1].TimeUS
	step := (t1-t0)/(to-from) + 1
	var out []BatchMark
	for b := from; b < to; b++ {
		s := t0 + (b-from)*step
		out = append(out, BatchMark{Batch: b, StartUS: s, EndUS: s + step})
	}
	return out
}

func folderAgent(t *testing.T, rank int) (*harness, string) {
	dir := t.TempDir()
	cfg := DefaultConfig(testID(rank))
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(dir, true) }
	return startAgent(t, cfg), dir
}

// TestReplayReportsAPassedStart: a window that reaches the replay trainer after its
// start batch is reported as missed, never recorded with made-up times.
func TestReplayReportsAPassedStart(t *testing.T) {
	dir := t.TempDir()
	var events []WindowEvent
	var mu sync.Mutex
	cfg := DefaultConfig(testID(0))
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(dir, true) }
	cfg.OnWindow = func(e WindowEvent) { mu.Lock(); events = append(events, e); mu.Unlock() }
	h := startAgent(t, cfg)
	runReplay(t, h, 0, 6)
	testutil.Eventually(t, 20*time.Second, "the trainer to hold before batch 6", func() bool { return h.agent.Batch() == 5 })
	// the agent believes the trainer is earlier than it is (a report in flight)
	h.agent.mu.Lock()
	h.agent.batch = 1
	h.agent.mu.Unlock()
	w, err := h.agent.ArmNext(3, 5)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the missed window", func() bool { return h.agent.Stats().WindowsMissed == 1 })
	mu.Lock()
	last := events[len(events)-1]
	mu.Unlock()
	if last.Window != w || last.State != WindowMissed || !strings.Contains(last.Reason, "already passed") {
		t.Fatalf("last event %+v", last)
	}
	if objs, _ := filepath.Glob(filepath.Join(dir, "*", "*", "*")); len(objs) != 0 {
		t.Fatalf("a missed window stored %v", objs)
	}
}

// TestPartialWindowKeptAside: a snapshot whose batch marks do not cover its window
// is stored under a .partial name, with the reason, and never under the window's.
func TestPartialWindowKeptAside(t *testing.T) {
	h, dir := folderAgent(t, 0)
	tr := dialTrainer(t, h.agent.Socket())
	w, err := h.agent.ArmNext(3, 6)
	if err != nil {
		t.Fatal(err)
	}
	wm := tr.next("window")
	if wm.ID != w.ID || wm.Start != 3 || wm.Stop != 6 {
		t.Fatalf("window message %+v", wm)
	}
	writeIncoming(t, tr.spool, "p.pickle", replaySnapshot(t), nil)
	tr.send(&Message{Type: "snapshot", Window: w.ID, Reason: "window", File: "p.pickle", Batches: marks(t, 4, 6), Start: 3, Stop: 6})
	r := waitUpload(t, h, 20*time.Second)
	if r.Err != nil || r.Key != "run1/torch_memory_traces/rank0.6.memory_snapshot.partial.pickle" || !strings.Contains(r.Partial, "from 4 to 5, the window is [3, 6)") {
		t.Fatalf("upload %+v", r)
	}
	if _, err := os.Stat(filepath.Join(dir, "run1/torch_memory_traces/rank0.6.memory_snapshot.pickle")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a partial window was stored under the window's name: %v", err)
	}
	mb, err := os.ReadFile(filepath.Join(dir, "run1/torch_memory_traces/rank0.6.memory_snapshot.partial.memsnap.json"))
	if err != nil {
		t.Fatal(err)
	}
	meta, err := sidecar.ParseRankMeta(mb)
	if err != nil || meta.Partial == "" {
		t.Fatalf("meta %s (%v)", mb, err)
	}
	if s := h.agent.Stats(); s.WindowsPartial != 1 || s.WindowsRecorded != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestAdoptsIncomingAfterRestart: snapshots the hook wrote while no agent took them
// (the agent was killed) are uploaded by the next agent: under the window's name
// when the hook's message lies beside them, under a .partial name when not.
func TestAdoptsIncomingAfterRestart(t *testing.T) {
	spoolDir := t.TempDir()
	sp, err := openSpool(spoolDir)
	if err != nil {
		t.Fatal(err)
	}
	writeIncoming(t, sp.incoming(), "a.pickle", replaySnapshot(t), &Message{Type: "snapshot", Window: 9, Reason: "window", File: "a.pickle", Batches: marks(t, 7, 10), Start: 7, Stop: 10})
	writeIncoming(t, sp.incoming(), "b.pickle", replaySnapshot(t), nil)
	writeIncoming(t, sp.incoming(), ".c.pickle", []byte("half written"), nil)
	dir := t.TempDir()
	cfg := DefaultConfig(testID(1))
	cfg.Spool = spoolDir
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(dir, true) }
	h := startAgent(t, cfg)
	got := map[string]bool{}
	for i := 0; i < 2; i++ {
		r := waitUpload(t, h, 20*time.Second)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		got[r.Key] = true
	}
	for _, k := range []string{"run1/torch_memory_traces/rank1.10.memory_snapshot.pickle", "run1/torch_memory_traces/rank1.0.memory_snapshot.partial.pickle"} {
		if !got[k] {
			t.Fatalf("uploaded %v, want %s", got, k)
		}
	}
	st, _ := store.OpenDir(dir, false)
	checkUploaded(t, st, "run1/torch_memory_traces/rank1.10.memory_snapshot.pickle", Window{ID: 9, Start: 7, Stop: 10})
	left, _ := os.ReadDir(sp.incoming())
	if len(left) != 1 || left[0].Name() != ".c.pickle" {
		t.Fatalf("incoming/ holds %v; want only the half-written file", left)
	}
}

// blockingGPU is a GPU whose samples after the first block until released.
type blockingGPU struct {
	samples  atomic.Int64
	blocked  chan struct{} // closed once a sample blocks
	release  chan struct{}
	once     sync.Once
	returned atomic.Bool // a blocked sample has returned
}

func (g *blockingGPU) Open(string, int) (gpu.Device, error) { return g, nil }
func (g *blockingGPU) Available() bool                      { return true }
func (g *blockingGPU) Close() error                         { return nil }
func (g *blockingGPU) Info() gpu.Info                       { return gpu.Info{UUID: "GPU-block"} }
func (g *blockingGPU) Sample(int) (gpu.Sample, error) {
	if g.samples.Add(1) > 1 {
		g.once.Do(func() { close(g.blocked) })
		<-g.release
		g.returned.Store(true)
	}
	return gpu.Sample{TimeUS: time.Now().UnixMicro(), DeviceUsedBytes: 1}, nil
}

// TestRunWaitsForItsGoroutines: Run does not return while a goroutine it started
// (here the NVML sampler, stuck in a driver call) is still running: once its
// context ends, Run stops everything else and then waits, parked, with the stuck
// sampler the only goroutine of the agent left; it returns after the sampler
// does, and leaves no goroutine behind.
func TestRunWaitsForItsGoroutines(t *testing.T) {
	g := &blockingGPU{blocked: make(chan struct{}), release: make(chan struct{})}
	cfg := DefaultConfig(testID(0))
	cfg.GPU = g
	cfg.SampleEvery = time.Millisecond
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(t.TempDir(), true) }
	cfg.Socket, cfg.Spool, cfg.Logger = shortSocket(t), t.TempDir(), testutil.Logger(t)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	testutil.Eventually(t, 10*time.Second, "the socket", func() bool { _, err := os.Stat(cfg.Socket); return err == nil })
	c, err := net.Dial("unix", cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(encodeMessage(&Message{V: 1, Type: "hello", PID: 1, DeviceUUID: "GPU-block"}))
	if _, err := a.ArmNext(5, 6); err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.blocked:
	case <-time.After(20 * time.Second):
		t.Fatal("the sampler never got stuck in a driver call")
	}
	cancel()
	var left []string
	defer func() {
		if t.Failed() {
			t.Logf("the agent's goroutines:\n%s", strings.Join(left, "\n\n"))
		}
	}()
	testutil.Eventually(t, 20*time.Second, "Run to wait, parked, for the stuck sampler alone", func() bool {
		select {
		case <-done:
			t.Fatal("Run returned while its sampler was still inside a driver call")
		default:
		}
		run := false
		left = left[:0]
		for _, st := range agentGoroutines() {
			switch {
			case strings.Contains(st, "rankagent.(*Agent).Run("):
				run = parked(st)
			case strings.Contains(st, "(*blockingGPU).Sample("), strings.Contains(st, "rankagent.(*dispatcher).run("):
				// the sampler, stuck; the event dispatcher, which Run stops after the wait
			default:
				left = append(left, st)
			}
		}
		return run && len(left) == 0
	})
	close(g.release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return once the sampler was released")
	}
	if !g.returned.Load() {
		t.Fatal("Run returned before the sampler's driver call did")
	}
	testutil.Eventually(t, 20*time.Second, "no goroutine of the agent left", func() bool {
		left = agentGoroutines()
		return len(left) == 0
	})
}

// TestOneBadJobNeverBlocksTheQueue: a job the store can never take (a name too
// long for the folder store, a key over 1024 bytes, a spooled file that changed)
// goes to failed/ with its reason, and the jobs behind it are uploaded.
func TestOneBadJobNeverBlocksTheQueue(t *testing.T) {
	spoolDir := t.TempDir()
	sp, err := openSpool(spoolDir)
	if err != nil {
		t.Fatal(err)
	}
	data := replaySnapshot(t)
	mk := func(key string, sum string) {
		src := filepath.Join(sp.incoming(), "x.pickle")
		os.WriteFile(src, data, 0o600)
		if sum == "" {
			sum = digest.SHA256Hex(data)
		}
		if _, err := sp.addJob(src, job{Key: key, MetaKey: sidecar.MetaName(key), SHA256: sum, Size: int64(len(data)), Window: 1, Start: 1, Stop: 2, Reason: "window"}, []byte("{}"), nil); err != nil {
			t.Fatal(err)
		}
	}
	mk("a/"+strings.Repeat("n", 300)+".pickle", "") // too long for a file name
	mk(strings.Repeat("k/", 520)+"x.pickle", "")    // too long for an object key
	mk("a/corrupt.pickle", strings.Repeat("0", 64)) // the file is not what was spooled
	mk("a/good.pickle", "")
	dir := t.TempDir()
	cfg := DefaultConfig(testID(0))
	cfg.Spool = spoolDir
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(dir, true) }
	h := startAgent(t, cfg)
	var ok, failed int
	for i := 0; i < 4; i++ {
		r := waitUpload(t, h, 20*time.Second)
		if r.Err != nil {
			failed++
		} else if r.Key == "a/good.pickle" {
			ok++
		}
	}
	if ok != 1 || failed != 3 {
		t.Fatalf("%d uploaded, %d failed; want 1 and 3", ok, failed)
	}
	fj := sp.failedJobs()
	if len(fj) != 3 {
		t.Fatalf("failed/ holds %v", fj)
	}
	for _, id := range fj {
		b, err := os.ReadFile(filepath.Join(spoolDir, "failed", id, "error.txt"))
		if err != nil || len(b) == 0 {
			t.Fatalf("%s has no reason: %v", id, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "a", "good.pickle")); err != nil {
		t.Fatal(err)
	}
}

// TestTransientErrorsRetryPerJob: while the store fails for now, each job retries
// with its own backoff; once it is back, every job is uploaded.
func TestTransientErrorsRetryPerJob(t *testing.T) {
	spoolDir := t.TempDir()
	sp, _ := openSpool(spoolDir)
	data := replaySnapshot(t)
	for i := 0; i < 3; i++ {
		src := filepath.Join(sp.incoming(), "x.pickle")
		os.WriteFile(src, data, 0o600)
		key := fmt.Sprintf("a/%d.pickle", i)
		sp.addJob(src, job{Key: key, MetaKey: sidecar.MetaName(key), SHA256: digest.SHA256Hex(data), Size: int64(len(data)), Window: uint64(i + 1), Reason: "window"}, []byte("{}"), nil)
	}
	dir := t.TempDir()
	var calls int
	var mu sync.Mutex
	cfg := DefaultConfig(testID(0))
	cfg.Spool = spoolDir
	cfg.OpenStore = func(context.Context) (store.Store, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls <= 6 {
			return nil, fmt.Errorf("%w: down for now", store.ErrUnreachable)
		}
		return store.OpenDir(dir, true)
	}
	told := map[uint64]string{} // each window hears why its snapshot waits
	cfg.OnWindow = func(e WindowEvent) {
		if e.State == WindowSpooled && e.Reason != "" {
			mu.Lock()
			told[e.Window.ID] = e.Reason
			mu.Unlock()
		}
	}
	h := startAgent(t, cfg)
	for i := 0; i < 3; i++ {
		if r := waitUpload(t, h, 30*time.Second); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if s := h.agent.Stats(); s.Retries < 6 || s.UploadFailed != 0 {
		t.Fatalf("stats %+v", s)
	}
	testutil.Eventually(t, 10*time.Second, "every window told why its upload waits", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for w := uint64(1); w <= 3; w++ {
			if !strings.Contains(told[w], "retried") || !strings.Contains(told[w], "down for now") {
				return false
			}
		}
		return true
	})
}

func TestNamesCheckedAtStart(t *testing.T) {
	cfg := DefaultConfig(testID(0))
	cfg.OpenStore = func(context.Context) (store.Store, error) { return nil, nil }
	cfg.Spool = t.TempDir()
	cfg.Filename = "{rank}" + strings.Repeat("x", 240) + "{batch}"
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "path segment") {
		t.Fatalf("a name segment over 255 bytes: %v", err)
	}
	cfg.Filename = naming.DefaultFilename
	cfg.RemoteFileName = strings.Repeat("abcdefgh/", 115)
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "1024") {
		t.Fatalf("a key over 1024 bytes: %v", err)
	}
}

// TestSocketFolderMustBePrivate: a socket folder another user could write into is
// refused (they could replace the socket and receive the trainer's snapshots).
func TestSocketFolderMustBePrivate(t *testing.T) {
	base, _ := os.MkdirTemp("", "ms")
	defer os.RemoveAll(base)
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	cfg := DefaultConfig(testID(0))
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(t.TempDir(), true) }
	cfg.Spool, cfg.Socket = t.TempDir(), filepath.Join(open, "a.sock")
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Run(context.Background()); !errors.Is(err, ErrUnsafeFolder) || !strings.Contains(err.Error(), "writable by others") {
		t.Fatalf("a 0777 socket folder: %v", err)
	}
	if os.Getuid() == 0 { // root can hand a folder to another user
		other := filepath.Join(base, "other")
		os.Mkdir(other, 0o700)
		if err := os.Chown(other, 12345, 12345); err != nil {
			t.Fatal(err)
		}
		cfg.Socket = filepath.Join(other, "a.sock")
		a, _ := New(cfg)
		if err := a.Run(context.Background()); !errors.Is(err, ErrUnsafeFolder) || !strings.Contains(err.Error(), "belongs to user 12345") {
			t.Fatalf("another user's socket folder: %v", err)
		}
		cfg.Socket = shortSocket(t)
		cfg.Spool = other
		if _, err := New(cfg); !errors.Is(err, ErrUnsafeFolder) {
			t.Fatalf("another user's spool: %v", err)
		}
	}
	link := filepath.Join(base, "link")
	os.Symlink(t.TempDir(), link)
	cfg.Socket, cfg.Spool = filepath.Join(link, "a.sock"), t.TempDir()
	a, _ = New(cfg)
	if err := a.Run(context.Background()); !errors.Is(err, ErrUnsafeFolder) {
		t.Fatalf("a symlinked socket folder: %v", err)
	}
}

// TestLaunchOutcome: `memsnap agent -- CMD` fails when a window was missed or a
// snapshot was not uploaded, and a signal during the wait for uploads stops it at
// once, saying what stays in the spool.
func TestLaunchOutcome(t *testing.T) {
	py := testutil.Python(t)
	hook := filepath.Join(testutil.RepoRoot(t), "rankagent", "hook")
	env := []string{"PYTHONPATH=" + filepath.Join(hook, "testdata", "faketorch") + string(os.PathListSeparator) + hook,
		"MEMSNAP_FAKE_SNAPSHOT=" + testutil.Snapshot(t, "ddp4/rank1.5.memory_snapshot.pickle")}
	trainer := func(batches string, wait string) []string {
		return []string{py, filepath.Join(hook, "testdata", "train_fake.py"), batches, "0.01", wait}
	}
	newAgent := func(open func(context.Context) (store.Store, error)) *Agent {
		cfg := DefaultConfig(testID(1))
		cfg.OpenStore = open
		cfg.Socket, cfg.Spool, cfg.Logger = shortSocket(t), t.TempDir(), testutil.Logger(t)
		cfg.RetryMin, cfg.RetryMax = 20*time.Millisecond, 100*time.Millisecond
		a, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	folder := func(context.Context) (store.Store, error) { return store.OpenDir(t.TempDir(), true) }

	t.Run("recorded", func(t *testing.T) {
		a := newAgent(folder)
		a.ArmNext(2, 4)
		o, err := RunWithTrainer(a, Trainer{Command: trainer("6", "1"), Env: env, DrainTimeout: time.Minute})
		if err != nil || o.Code() != 0 || o.Stats.Uploaded != 1 {
			t.Fatalf("outcome %+v (%v)", o, err)
		}
	})
	t.Run("missed", func(t *testing.T) {
		a := newAgent(folder)
		a.ArmNext(100, 102) // the trainer ends long before
		o, err := RunWithTrainer(a, Trainer{Command: trainer("3", "0"), Env: env, DrainTimeout: time.Minute})
		if err != nil || o.Code() != 1 || o.ExitCode != 0 || !strings.Contains(o.String(), "1 window(s) missed") {
			t.Fatalf("outcome %+v (%v)", o, err)
		}
	})
	t.Run("cluster work left at the drain's timeout", func(t *testing.T) {
		a := newAgent(folder)
		a.ArmNext(2, 4)
		o, err := RunWithTrainer(a, Trainer{Command: trainer("6", "1"), Env: env, DrainTimeout: 200 * time.Millisecond,
			Idle: func() bool { return false }, Unfinished: func() string { return "window 7 unpublished" }})
		if err != nil || o.Code() != 1 || o.ExitCode != 0 || !strings.Contains(o.String(), "window 7 unpublished") {
			t.Fatalf("outcome %+v (%v)", o, err)
		}
	})
	t.Run("signal during drain", func(t *testing.T) {
		a := newAgent(func(context.Context) (store.Store, error) {
			return nil, fmt.Errorf("%w: never up", store.ErrUnreachable)
		})
		a.ArmNext(2, 4)
		sigs := make(chan os.Signal, 1)
		res := make(chan Outcome, 1)
		exited := make(chan int, 1)
		go func() {
			o, err := RunWithTrainer(a, Trainer{Command: trainer("6", "1"), Env: env, Signals: sigs, DrainTimeout: time.Hour,
				OnExit: func(c int) { exited <- c }})
			if err != nil {
				t.Error(err)
			}
			res <- o
		}()
		select {
		case c := <-exited:
			if c != 0 {
				t.Fatalf("trainer exited %d", c)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("the trainer did not exit")
		}
		testutil.Eventually(t, 30*time.Second, "a spooled snapshot the store cannot take", func() bool {
			s := a.Stats()
			return s.Pending == 1 && s.Retries > 0
		})
		sigs <- syscall.SIGINT
		select {
		case o := <-res:
			if !o.Stopped || o.Code() != 1 || !strings.Contains(o.String(), "1 snapshot(s) not uploaded yet") {
				t.Fatalf("outcome %+v", o)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a signal did not stop the wait for uploads")
		}
	})
}

// TestReplayEventsInsideBatches: the replay lays every recorded event inside a
// batch's marks, however long the gaps between batches are (one event in such a
// gap once made a rank's peak belong to no batch).
func TestReplayEventsInsideBatches(t *testing.T) {
	marks := []BatchMark{{Batch: 13, StartUS: 1000, EndUS: 1100}, {Batch: 14, StartUS: 5000, EndUS: 5100}, {Batch: 15, StartUS: 9000, EndUS: 9001}}
	const t0, t1 = 7, 7 + 3*1000
	inside := func(v int64) bool {
		for _, m := range marks {
			if v >= m.StartUS && v <= m.EndUS {
				return true
			}
		}
		return false
	}
	prev := int64(-1)
	for tt := int64(t0); tt <= t1; tt++ {
		v := inBatches(tt, t0, t1, marks)
		if !inside(v) {
			t.Fatalf("time %d placed at %d, outside every batch %v", tt, v, marks)
		}
		if v < prev {
			t.Fatalf("time %d placed at %d, before the previous event's %d", tt, v, prev)
		}
		prev = v
	}
	// the first third of the span is the first batch, the last third the last
	if v := inBatches(t0+500, t0, t1, marks); v < 1000 || v > 1100 {
		t.Fatalf("the middle of the first third placed at %d", v)
	}
	if v := inBatches(t1, t0, t1, marks); v != 9001 {
		t.Fatalf("the last event placed at %d, not at the last batch's end", v)
	}
	if v := inBatches(t0, t0, t0, marks[:1]); v != 1000 {
		t.Fatalf("a span of one instant placed at %d", v)
	}
}

// TestSpoolDiskFull: a snapshot the spool's full disk cannot take is kept whole in
// incoming/ (never in failed/, which nothing uploads), the window hears why, and
// the snapshot is taken and uploaded once there is room.
func TestSpoolDiskFull(t *testing.T) {
	var full atomic.Bool
	var tries atomic.Int32
	var agent atomic.Pointer[Agent]
	var during atomic.Value // SpooledWindows while a try again writes
	full.Store(true)
	jobWrite = func(p string, b []byte) error {
		if full.Load() {
			if tries.Add(1) == 2 {
				during.Store(fmt.Sprint(agent.Load().SpooledWindows()))
			}
			return &os.PathError{Op: "write", Path: p, Err: syscall.ENOSPC}
		}
		return writeFileSync(p, b)
	}
	t.Cleanup(func() { jobWrite = writeFileSync })
	dir := t.TempDir()
	var mu sync.Mutex
	var failed []string
	cfg := DefaultConfig(testID(0))
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(dir, true) }
	cfg.RetryMin, cfg.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	cfg.OnWindow = func(e WindowEvent) {
		if e.State == WindowFailed {
			mu.Lock()
			failed = append(failed, e.Reason)
			mu.Unlock()
		}
	}
	h := startAgent(t, cfg)
	agent.Store(h.agent)
	tr := dialTrainer(t, h.agent.Socket())
	w, err := h.agent.ArmNext(3, 6)
	if err != nil {
		t.Fatal(err)
	}
	tr.next("window")
	writeIncoming(t, tr.spool, "f.pickle", replaySnapshot(t), nil)
	tr.send(&Message{Type: "snapshot", Window: w.ID, Reason: "window", File: "f.pickle", Batches: marks(t, 3, 6), Start: 3, Stop: 6})
	testutil.Eventually(t, 20*time.Second, "the window told the disk is full", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(failed) == 1 && strings.Contains(failed[0], "disk is full")
	})
	if _, err := os.Stat(filepath.Join(tr.spool, "f.pickle")); err != nil {
		t.Fatalf("the snapshot left incoming/: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(filepath.Dir(tr.spool), "failed")); len(ents) != 0 {
		t.Fatalf("failed/ holds %d entries", len(ents))
	}
	// the disk stays full for a few tries: the window is missed once, told once
	testutil.Eventually(t, 20*time.Second, "three tries on the full disk", func() bool { return tries.Load() >= 3 })
	mu.Lock()
	told := len(failed)
	mu.Unlock()
	if s := h.agent.Stats(); s.WindowsMissed != 1 || told != 1 || h.agent.Idle() {
		t.Fatalf("after %d tries: %d missed, told %d times, idle %v", tries.Load(), s.WindowsMissed, told, h.agent.Idle())
	}
	// its status says the window's snapshot waits on the rank (a leader does
	// not take it for lost)
	if sw := h.agent.SpooledWindows(); fmt.Sprint(sw) != fmt.Sprint([]uint64{w.ID}) {
		t.Fatalf("spooled windows %v, want [%d]", sw, w.ID)
	}
	// and while it is taken again (a try in progress)
	if d := during.Load(); d != fmt.Sprint([]uint64{w.ID}) {
		t.Fatalf("spooled windows while taken again %v, want [%d]", d, w.ID)
	}
	full.Store(false)
	r := waitUpload(t, h, 20*time.Second)
	if r.Err != nil || r.Key != "run1/torch_memory_traces/rank0.6.memory_snapshot.pickle" {
		t.Fatalf("upload once there is room: %+v", r)
	}
}

// TestLargestSidecarFits: the largest sidecar an agent writes (MaxFileMarks
// batch marks and maxSamples NVML samples, of many-digit figures) is within
// sidecar.MaxMetaBytes, the most a merge reads of one.
func TestLargestSidecarFits(t *testing.T) {
	size := func(marks, samples int) int64 {
		m := sidecar.RankMeta{Version: 1, RunName: strings.Repeat("r", 64), Rank: 65535, WorldSize: 65536, Hostname: strings.Repeat("h", 64)}
		for i := range marks {
			m.Batches = append(m.Batches, sidecar.BatchMark{Batch: 1e12 + int64(i), StartUS: 1767225600000000, EndUS: 1767225600000000})
		}
		for range samples {
			m.Samples = append(m.Samples, sidecar.MemorySample{TimeUS: 1767225600000000, DeviceUsedBytes: 200 << 30, ProcessUsedBytes: 200 << 30})
		}
		b, err := json.MarshalIndent(m, "", "  ") // as the agent writes it
		if err != nil {
			t.Fatal(err)
		}
		return int64(len(b))
	}
	const n = 1000
	base := size(1, 1)
	mark, sample := (size(n+1, 1)-base)/n, (size(1, n+1)-base)/n
	if largest := base + mark*MaxFileMarks + sample*maxSamples; largest > sidecar.MaxMetaBytes {
		t.Fatalf("the largest sidecar is about %d bytes, more than sidecar.MaxMetaBytes (%d)", largest, sidecar.MaxMetaBytes)
	} else {
		t.Logf("the largest sidecar is about %d bytes (%.0f MiB)", largest, float64(largest)/(1<<20))
	}
}
