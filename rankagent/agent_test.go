package rankagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// shortSocket returns a socket path short enough for a Unix socket.
func shortSocket(t *testing.T) string {
	d, err := os.MkdirTemp("", "ms")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return filepath.Join(d, "a.sock")
}

type harness struct {
	agent   *Agent
	cancel  context.CancelFunc
	done    chan error
	results chan UploadResult
}

// startAgent starts an agent of cfg that logs to the test and hands every
// upload's result to the harness's results.
func startAgent(t *testing.T, cfg Config) *harness {
	t.Helper()
	cfg.Logger = testutil.Logger(t)
	h := &harness{done: make(chan error, 1), results: make(chan UploadResult, 16)}
	cfg.OnUpload = func(r UploadResult) { h.results <- r }
	return startWith(t, cfg, h)
}

// startWith starts an agent of cfg in h (a socket and a spool of its own where
// cfg names none, retries within 20-200 ms), waits for its socket, and stops it
// when the test ends.
func startWith(t *testing.T, cfg Config, h *harness) *harness {
	t.Helper()
	if cfg.Socket == "" {
		cfg.Socket = shortSocket(t)
	}
	if cfg.Spool == "" {
		cfg.Spool = t.TempDir()
	}
	cfg.RetryMin, cfg.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.agent, h.cancel = a, cancel
	go func() { h.done <- a.Run(ctx) }()
	testutil.Eventually(t, 5*time.Second, "the agent's socket", func() bool {
		c, err := net.Dial("unix", cfg.Socket)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	h.cancel()
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
	}
}

func testID(rank int) Identity {
	return Identity{RunName: "run1", Rank: rank, LocalRank: rank, WorldSize: 4, LocalWorldSize: 4}
}

func replaySnapshot(t *testing.T) []byte {
	b, err := os.ReadFile(testutil.Snapshot(t, "ddp4/rank2.5.memory_snapshot.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// runReplay starts a replay trainer against the agent; it waits for a window before
// each batch in holds (default: batch 3).
func runReplay(t *testing.T, h *harness, rank int, holds ...int64) context.CancelFunc {
	if len(holds) == 0 {
		holds = []int64{3}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		Replay(ctx, ReplayConfig{Socket: h.agent.Socket(), Snapshot: replaySnapshot(t), Pace: 15 * time.Millisecond, Rank: rank, UUID: "GPU-test", HoldAt: holds})
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return cancel
}

// armAt waits until the replay trainer holds before batch start, then arms
// [start, start+length): the window reaches it in time however slow the machine is.
func armAt(t *testing.T, h *harness, start, length int64) Window {
	t.Helper()
	testutil.Eventually(t, 20*time.Second, fmt.Sprintf("the trainer to hold before batch %d", start), func() bool { return h.agent.Batch() == start-1 })
	w, err := h.agent.ArmNext(start, start+length)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func waitUpload(t *testing.T, h *harness, timeout time.Duration) UploadResult {
	t.Helper()
	select {
	case r := <-h.results:
		return r
	case <-time.After(timeout):
		t.Fatalf("no upload within %v (stats %+v)", timeout, h.agent.Stats())
	}
	return UploadResult{}
}

// checkUploaded verifies the object under key: it decodes to the replayed events,
// and its metadata's batch marks are exactly the window's batches.
func checkUploaded(t *testing.T, st store.Store, key string, w Window) {
	t.Helper()
	ctx := context.Background()
	b, err := store.ReadAll(ctx, st, key)
	if err != nil {
		t.Fatal(err)
	}
	got, err := snapshot.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := snapshot.Decode(replaySnapshot(t))
	if len(got.DeviceTraces[0]) != len(want.DeviceTraces[0]) {
		t.Fatalf("uploaded %d events, replayed %d", len(got.DeviceTraces[0]), len(want.DeviceTraces[0]))
	}
	for i, e := range got.DeviceTraces[0] {
		if e.Action != want.DeviceTraces[0][i].Action || e.Size != want.DeviceTraces[0][i].Size {
			t.Fatalf("event %d differs", i)
		}
	}
	mb, err := store.ReadAll(ctx, st, sidecar.MetaName(key))
	if err != nil {
		t.Fatal(err)
	}
	meta, err := sidecar.ParseRankMeta(mb)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Window == nil || meta.Window.Start != w.Start || meta.Window.Stop != w.Stop || int64(len(meta.Batches)) != w.Stop-w.Start {
		t.Fatalf("meta window %+v with %d batch marks, want %v", meta.Window, len(meta.Batches), w)
	}
	for i, m := range meta.Batches {
		if m.Batch != w.Start+int64(i) {
			t.Fatalf("batch mark %d is batch %d", i, m.Batch)
		}
	}
	// the events lie inside the recorded batches
	first, last := got.DeviceTraces[0][0].TimeUS, got.DeviceTraces[0][len(got.DeviceTraces[0])-1].TimeUS
	if first < meta.Batches[0].StartUS || last > meta.Batches[len(meta.Batches)-1].EndUS {
		t.Fatalf("events [%d, %d] outside the window's batches [%d, %d]", first, last, meta.Batches[0].StartUS, meta.Batches[len(meta.Batches)-1].EndUS)
	}
}

func TestAgentReplayFolderStore(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig(testID(2))
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(dir, true) }
	h := startAgent(t, cfg)
	runReplay(t, h, 2, 3, 12)
	w := armAt(t, h, 3, 4)
	r := waitUpload(t, h, 20*time.Second)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	wantKey := fmt.Sprintf("run1/torch_memory_traces/rank2.%d.memory_snapshot.pickle", w.Stop)
	if r.Key != wantKey {
		t.Fatalf("uploaded as %q, want %q", r.Key, wantKey)
	}
	st, _ := store.OpenDir(dir, false)
	checkUploaded(t, st, r.Key, w)
	testutil.Eventually(t, 5*time.Second, "an empty spool", h.agent.Idle)
	// a second window gets its own name
	w2 := armAt(t, h, 12, 2)
	r2 := waitUpload(t, h, 20*time.Second)
	if r2.Err != nil || r2.Key == r.Key || w2.ID != w.ID+1 {
		t.Fatalf("second window: %+v (ids %d, %d)", r2, w.ID, w2.ID)
	}
}

// flakyProxy forwards TCP to a real server and can be cut and restored.
type flakyProxy struct {
	ln     net.Listener
	target string
	down   atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	bytes  atomic.Int64
	cutAt  int64 // cut after this many bytes up, once
}

func newProxy(t *testing.T, target string) *flakyProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &flakyProxy{ln: ln, target: target}
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.cut() })
	return p
}

func (p *flakyProxy) addr() string { return "http://" + p.ln.Addr().String() }

func (p *flakyProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.down.Load() {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if p.cutAt > 0 && p.bytes.Add(int64(n)) > p.cutAt && !p.down.Load() {
						p.down.Store(true)
						p.cut()
						return
					}
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					s.Close()
					return
				}
			}
		}()
		go func() { io.Copy(c, s); c.Close() }()
	}
}

func (p *flakyProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestAgentMinIOStoreGoesAway records a window against a real MinIO reached
// through a proxy that is cut in the middle of the upload and stays down for a
// while: the snapshot waits in the spool and arrives whole once the store is back.
func TestAgentMinIOStoreGoesAway(t *testing.T) {
	m := testutil.RequireMinIO(t)
	bucket := testutil.BucketName(t)
	target := strings.TrimPrefix(m.Endpoint, "http://")
	p := newProxy(t, target)
	p.cutAt = 20 << 10 // cut once 20 KiB of the upload went up
	// the test's own requests go through a proxy of their own, never cut: it
	// closes their connections when the test ends (a store has no Close, and its
	// client keeps idle connections open for a minute)
	direct := newProxy(t, target)
	scfg := store.Config{URL: "s3://" + bucket + "/jobs", Endpoint: p.addr(), CreateBucket: true,
		Credentials: store.Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}}
	// create the bucket beside the cut proxy, so its byte count starts with the upload
	if _, err := store.Open(testutil.Context(t, time.Minute), store.Config{URL: scfg.URL, Endpoint: direct.addr(), CreateBucket: true, Credentials: scfg.Credentials}); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig(testID(1))
	cfg.OpenStore = func(ctx context.Context) (store.Store, error) { return store.Open(ctx, scfg) }
	h := startAgent(t, cfg)
	runReplay(t, h, 1)
	w := armAt(t, h, 3, 3)
	testutil.Eventually(t, 20*time.Second, "the store to go away mid-upload", p.down.Load)
	testutil.Eventually(t, 10*time.Second, "a failed attempt", func() bool { return h.agent.Stats().Retries > 0 })
	// while the store is away the snapshot is in the spool
	if jobs := h.agent.sp.pendingJobs(); len(jobs) != 1 {
		t.Fatalf("%d jobs in the spool while the store is away", len(jobs))
	}
	// a few more failed attempts, on purpose: the snapshot stays in the spool through them
	failed := h.agent.Stats().Retries
	testutil.Eventually(t, 20*time.Second, "three more failed attempts while the store is away", func() bool {
		return h.agent.Stats().Retries >= failed+3
	})
	if jobs := h.agent.sp.pendingJobs(); len(jobs) != 1 {
		t.Fatalf("%d jobs in the spool after failed attempts", len(jobs))
	}
	p.cutAt = 0
	p.down.Store(false)
	r := waitUpload(t, h, 30*time.Second)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	st, err := store.Open(context.Background(), store.Config{URL: scfg.URL, Endpoint: direct.addr(), Credentials: scfg.Credentials})
	if err != nil {
		t.Fatal(err)
	}
	checkUploaded(t, st, r.Key, w)
	info, err := st.Stat(context.Background(), r.Key)
	if err != nil || info.SHA256 != r.SHA256 {
		t.Fatalf("stored checksum %q, spooled %q (%v)", info.SHA256, r.SHA256, err)
	}
	testutil.Eventually(t, 5*time.Second, "an empty spool", h.agent.Idle)
}

// TestSpoolSurvivesRestart: an agent stopped with a snapshot still in its spool
// uploads it when it starts again.
func TestSpoolSurvivesRestart(t *testing.T) {
	spoolDir := t.TempDir()
	var allow atomic.Bool
	dir := t.TempDir()
	cfg := DefaultConfig(testID(3))
	cfg.Spool = spoolDir
	cfg.OpenStore = func(context.Context) (store.Store, error) {
		if !allow.Load() {
			return nil, fmt.Errorf("%w: test store is down", store.ErrUnreachable)
		}
		return store.OpenDir(dir, true)
	}
	h := startAgent(t, cfg)
	runReplay(t, h, 3)
	w := armAt(t, h, 3, 2)
	testutil.Eventually(t, 20*time.Second, "a spooled snapshot", func() bool { return len(h.agent.sp.pendingJobs()) == 1 })
	h.stop()
	allow.Store(true)
	h2 := startAgent(t, cfg)
	r := waitUpload(t, h2, 20*time.Second)
	if r.Err != nil || !strings.HasSuffix(r.Key, fmt.Sprintf("rank3.%d.memory_snapshot.pickle", w.Stop)) {
		t.Fatalf("after restart: %+v", r)
	}
	st, _ := store.OpenDir(dir, false)
	checkUploaded(t, st, r.Key, w)
}

// TestExistingObjectIsKept: without overwrite, a name that exists (a relaunch
// under the same run name that recorded the same batches) is never replaced: the
// snapshot goes under its window's name, NAME.window<id>.pickle, with its
// sidecars; when that name is taken too, the snapshot is kept in the spool's
// failed folder.
func TestExistingObjectIsKept(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig(Identity{RunName: "run1", WorldSize: 1, LocalWorldSize: 1}) // one rank: a name without {rank} is fine
	cfg.Filename = "fixed"
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(dir, true) }
	folder := filepath.Join(dir, "run1", "torch_memory_traces")
	os.MkdirAll(folder, 0o755)
	os.WriteFile(filepath.Join(folder, "fixed.pickle"), []byte("older"), 0o644)
	h := startAgent(t, cfg)
	runReplay(t, h, 0, 3, 12)
	w := armAt(t, h, 3, 2)
	r := waitUpload(t, h, 20*time.Second)
	want := fmt.Sprintf("run1/torch_memory_traces/fixed.window%d.pickle", w.ID)
	if r.Err != nil || r.Key != want || r.MetaKey != strings.TrimSuffix(want, ".pickle")+".memsnap.json" {
		t.Fatalf("want the snapshot under %s, got %+v", want, r)
	}
	if b, _ := os.ReadFile(filepath.Join(folder, "fixed.pickle")); string(b) != "older" {
		t.Fatal("the existing object was replaced")
	}
	st, _ := store.OpenDir(dir, false)
	checkUploaded(t, st, r.Key, w)
	if _, err := os.Stat(filepath.Join(dir, r.MetaKey)); err != nil {
		t.Fatalf("the sidecar is not beside the renamed snapshot: %v", err)
	}

	// the window's own name taken as well: kept in the spool, never replaced
	os.WriteFile(filepath.Join(folder, fmt.Sprintf("fixed.window%d.pickle", w.ID+1)), []byte("older too"), 0o644)
	w2 := armAt(t, h, 12, 2)
	r = waitUpload(t, h, 20*time.Second)
	if !errors.Is(r.Err, store.ErrExists) || w2.ID != w.ID+1 {
		t.Fatalf("want ErrExists for window %d, got %+v", w2.ID, r)
	}
	failed, _ := filepath.Glob(filepath.Join(h.agent.cfg.Spool, "failed", "*", "snapshot.pickle"))
	if len(failed) != 1 {
		t.Fatalf("the refused snapshot is not kept in the spool: %v", failed)
	}
}

func TestGarbageOnSocket(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig(testID(1))
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(dir, true) }
	h := startAgent(t, cfg)
	st, err := os.Stat(h.agent.Socket())
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v (%v), want 0600", st.Mode().Perm(), err)
	}
	garbage := [][]byte{
		[]byte("\x00\x01\x02\xff\xfe\n"),
		[]byte("not json\n"),
		[]byte(`{"type":"batch","batch":3}` + "\n"), // before hello
		[]byte(`{"v":1,"type":"hello","pid":1}` + "\n" + `{"type":"snapshot","window":1,"reason":"window","file":"../../etc/passwd"}` + "\n"),
		[]byte(`{"v":1,"type":"hello","pid":1}` + "\n" + `{"type":"snapshot","window":99,"reason":"window","file":"nothere.pickle"}` + "\n"),
		[]byte(`{"v":2,"type":"hello","pid":1}` + "\n"),
		[]byte(`{"v":1,"type":"hello","pid":1,"evil":true}` + "\n"),
		append([]byte(`{"v":1,"type":"hello","pid":1,"hook":"`), append([]byte(strings.Repeat("A", 200<<10)), []byte(`"}`+"\n")...)...),
		[]byte(`{"v":1,"type":"hello","pid":1}` + "\n" + `{"type":"batch","batch":-5}` + "\n"),
		[]byte(`{"v":1,"type":"hello","pid":1}` + "\n" + `[1,2,3]` + "\n"),
	}
	for i, g := range garbage {
		c, err := net.Dial("unix", h.agent.Socket())
		if err != nil {
			t.Fatalf("garbage %d: the agent stopped accepting: %v", i, err)
		}
		c.SetDeadline(time.Now().Add(2 * time.Second))
		c.Write(g)
		io.Copy(io.Discard, c) // the agent answers and closes, or closes
		c.Close()
	}
	// a garbage file in the spool's incoming folder is refused when announced
	os.WriteFile(filepath.Join(h.agent.sp.incoming(), "junk.pickle"), []byte("junk"), 0o600)
	c, _ := net.Dial("unix", h.agent.Socket())
	c.Write([]byte(`{"v":1,"type":"hello","pid":1}` + "\n"))
	c.Write([]byte(`{"type":"snapshot","window":7,"reason":"window","file":"junk.pickle"}` + "\n"))
	// the agent has dealt with the announcement once it set the junk aside in the
	// spool's failed folder and is taking nothing more into the spool
	testutil.Eventually(t, 20*time.Second, "the junk to be set aside in the spool's failed folder", func() bool {
		kept, _ := filepath.Glob(filepath.Join(h.agent.Spool(), "failed", "r1-w7-*", "snapshot.pickle"))
		h.agent.mu.Lock()
		busy := h.agent.working > 0 || len(h.agent.taking) > 0
		h.agent.mu.Unlock()
		if len(kept) != 1 || busy {
			return false
		}
		b, _ := os.ReadFile(kept[0])
		return string(b) == "junk"
	})
	c.Close()
	if n := len(h.agent.sp.pendingJobs()); n != 0 {
		t.Fatalf("garbage made %d spool jobs", n)
	}
	// and after all that, a real trainer still records and uploads
	runReplay(t, h, 1)
	armAt(t, h, 3, 2)
	if r := waitUpload(t, h, 20*time.Second); r.Err != nil {
		t.Fatal(r.Err)
	}
}

func TestArmErrors(t *testing.T) {
	cfg := DefaultConfig(testID(0))
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(t.TempDir(), true) }
	h := startAgent(t, cfg)
	if _, err := h.agent.ArmNext(5, 5); err == nil {
		t.Fatal("an empty window was armed")
	}
	if _, err := h.agent.ArmNext(-1, 3); err == nil {
		t.Fatal("a negative window was armed")
	}
	if err := h.agent.Arm(Window{Start: 1, Stop: 2}); err == nil {
		t.Fatal("window id 0 was armed")
	}
	runReplay(t, h, 0)
	testutil.Eventually(t, 5*time.Second, "batches", func() bool { return h.agent.Batch() >= 2 })
	if _, err := h.agent.ArmNext(0, 2); !errors.Is(err, ErrPassed) {
		t.Fatalf("a window in the past: %v", err)
	}
	w, err := h.agent.ArmNext(100, 102)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.agent.Arm(w); err != nil {
		t.Fatalf("arming the same window again: %v", err)
	}
	if err := h.agent.Arm(Window{ID: w.ID + 1, Start: 200, Stop: 201}); !errors.Is(err, ErrBusy) {
		t.Fatalf("a second window while one is in progress: %v", err)
	}
	if err := h.agent.Cancel(w.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if err := h.agent.Arm(Window{ID: w.ID, Start: 300, Stop: 301}); !errors.Is(err, ErrStale) {
		t.Fatalf("an old window id: %v", err)
	}
}

func TestConfigRefusesUnknownTemplateVariables(t *testing.T) {
	cfg := DefaultConfig(testID(0))
	cfg.OpenStore = func(context.Context) (store.Store, error) { return nil, nil }
	cfg.Spool = t.TempDir()
	cfg.Filename = "rank{rank}.{sample}"
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "{sample}") {
		t.Fatalf("want an error naming {sample}, got %v", err)
	}
	cfg.Filename = "rank{rank"
	if _, err := New(cfg); err == nil {
		t.Fatal("an unclosed brace was accepted")
	}
}

func TestIdentityFromEnv(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	cases := []struct {
		name string
		env  func(string) string
		want Identity
		ok   bool
		err  bool
	}{
		{"torchrun", env("RANK", "5", "LOCAL_RANK", "1", "WORLD_SIZE", "8", "LOCAL_WORLD_SIZE", "4", "GROUP_RANK", "1", "TORCHELASTIC_RUN_ID", "job9"),
			Identity{RunName: "job9", Rank: 5, LocalRank: 1, NodeRank: 1, WorldSize: 8, LocalWorldSize: 4, Launcher: "torchrun"}, true, false},
		{"slurm", env("SLURM_PROCID", "3", "SLURM_LOCALID", "1", "SLURM_NTASKS", "4", "SLURM_NODEID", "1", "SLURM_JOB_ID", "777", "SLURM_NTASKS_PER_NODE", "2(x2)"),
			Identity{RunName: "777", Rank: 3, LocalRank: 1, NodeRank: 1, WorldSize: 4, LocalWorldSize: 2, Launcher: "slurm"}, true, false},
		{"mpi", env("OMPI_COMM_WORLD_RANK", "2", "OMPI_COMM_WORLD_LOCAL_RANK", "0", "OMPI_COMM_WORLD_SIZE", "3", "OMPI_COMM_WORLD_LOCAL_SIZE", "1", "MEMSNAP_RUN_NAME", "r"),
			Identity{RunName: "r", Rank: 2, LocalRank: 0, WorldSize: 3, LocalWorldSize: 1, Launcher: "mpi"}, true, false},
		{"mpi-4", env("OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2", "OMPI_COMM_WORLD_LOCAL_SIZE", "2", "OMPI_COMM_WORLD_LOCAL_RANK", "1",
			"OMPI_MCA_orte_hnp_uri", "3210149888.0;tcp://10.0.0.1:45678"),
			Identity{RunName: "mpi-3210149888.0", Rank: 1, LocalRank: 1, WorldSize: 2, LocalWorldSize: 2, Launcher: "mpi"}, true, false},
		{"mpi-5", env("OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "2", "PMIX_NAMESPACE", "prterun-node1-4242@1"),
			Identity{RunName: "mpi-prterun-node1-4242-1", Rank: 0, WorldSize: 2, LocalWorldSize: 1, Launcher: "mpi"}, true, false},
		{"kubernetes", env("JOB_COMPLETION_INDEX", "5", "WORLD_SIZE", "8", "MEMSNAP_RUN_NAME", "train-7f3a"),
			Identity{RunName: "train-7f3a", Rank: 5, NodeRank: 5, WorldSize: 8, LocalWorldSize: 1, Launcher: "kubernetes"}, true, false},
		{"none", env(), Identity{}, false, false},
		{"bad", env("RANK", "x", "WORLD_SIZE", "2"), Identity{}, true, true},
		{"outside", env("RANK", "4", "WORLD_SIZE", "2"), Identity{}, true, true},
		{"run name with a slash", env("RANK", "0", "WORLD_SIZE", "2", "TORCHELASTIC_RUN_ID", "../other"), Identity{}, true, true},
		{"run name with a space", env("RANK", "0", "WORLD_SIZE", "2", "MEMSNAP_RUN_NAME", "my run"), Identity{}, true, true},
		{"no run id", env("RANK", "1", "WORLD_SIZE", "2"), Identity{Rank: 1, WorldSize: 2, LocalWorldSize: 1, Launcher: "torchrun"}, true, false},
		{"torchrun's NODE_RANK", env("RANK", "1", "WORLD_SIZE", "2", "NODE_RANK", "1"), Identity{Rank: 1, NodeRank: 1, WorldSize: 2, LocalWorldSize: 1, Launcher: "torchrun"}, true, false},
		{"a bad SLURM_NODEID", env("SLURM_PROCID", "0", "SLURM_NTASKS", "2", "SLURM_NODEID", "-1"), Identity{}, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id, ok, err := IdentityFromEnv(c.env)
			if ok != c.ok || (err != nil) != c.err || (!c.err && id != c.want) {
				t.Fatalf("got %+v ok=%v err=%v", id, ok, err)
			}
		})
	}
}

func FuzzParseMessage(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"type":"hello","pid":12,"rank":0,"device_uuid":"GPU-x","torch":"2.11"}`,
		`{"type":"batch","batch":3,"t_us":1}`,
		`{"type":"snapshot","window":1,"reason":"window","file":"a.pickle","batches":[{"batch":2,"start_us":1,"end_us":2}]}`,
		`{"type":"error","window":1,"message":"x"}`,
		`{"type":"stopping","cause":"SIGTERM","t_us":5,"batch":3}`,
		`{"type":"snapshot","window":2,"reason":"crash","cause":"exception: RuntimeError: x","file":"rank0.crash2.1.pickle","start":1,"stop":4,"batches":[{"batch":1,"start_us":1,"end_us":2}]}`,
		`{"type":"snapshot","window":0,"reason":"crash","cause":"SIGTERM","file":"rank0.crash0.1.pickle","batches":[]}`,
		`{"type":"memory","batch":7,"memory":{"allocated":1000,"reserved":4096,"peak":3000,"inactive_split":96,"alloc_retries":2,"ooms":0,"device_free":70,"device_total":80}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMessage(b)
		if err != nil {
			return
		}
		if m.Memory != nil && (m.Type != "memory" || m.Memory.check() != nil) {
			t.Fatalf("accepted figures %+v in a %s message", m.Memory, m.Type)
		}
		if m.Type == "snapshot" {
			if checkSpoolName(m.File) != nil || strings.Contains(m.File, "/") {
				t.Fatalf("accepted file %q", m.File)
			}
		}
		if _, err := json.Marshal(m); err != nil {
			t.Fatal(err)
		}
	})
}

// TestMemoryMessages: the hook's memory figures are taken when they are figures
// an allocator can report and refused otherwise; the agent keeps them, measures
// the growth per batch over the reports it keeps, and starts again when a
// trainer's batches go back (a restarted trainer).
func TestMemoryMessages(t *testing.T) {
	good := `{"type":"memory","batch":7,"memory":{"allocated":1000,"reserved":4096,"peak":3000,"inactive_split":96,"alloc_retries":2,"ooms":1,"device_free":70,"device_total":80}}`
	m, err := ParseMessage([]byte(good))
	if err != nil || m.Memory == nil || m.Memory.Reserved != 4096 || *m.Batch != 7 {
		t.Fatalf("%+v %v", m, err)
	}
	for _, bad := range []string{
		`{"type":"memory","batch":7}`,
		`{"type":"memory","memory":{"allocated":1}}`,
		`{"type":"memory","batch":-1,"memory":{"allocated":1}}`,
		`{"type":"memory","batch":1,"memory":{"allocated":-1}}`,
		`{"type":"memory","batch":1,"memory":{"reserved":1125899906842625}}`,
		`{"type":"memory","batch":1,"memory":{"device_free":81,"device_total":80}}`,
		`{"type":"memory","batch":1,"memory":{"device_free":8,"device_total":80,"device_limit":81}}`,
		`{"type":"memory","batch":1,"memory":{"device_free":8,"device_total":80,"device_limit":-1}}`,
		`{"type":"memory","batch":1,"memory":{"allocated":1,"swap":3}}`,
		`{"type":"batch","batch":1,"memory":{"allocated":1}}`,
	} {
		if m, err := ParseMessage([]byte(bad)); err == nil {
			t.Errorf("accepted %s as %+v", bad, m)
		}
	}
	a := &Agent{}
	if _, ok := a.Memory(); ok {
		t.Fatal("figures before any report")
	}
	for b := int64(0); b < 40; b++ {
		a.noteMemoryLocked(b, Memory{Allocated: 1000 + 10*b, Reserved: 8000, Peak: 1500 + 10*b, DeviceFree: 100, DeviceTotal: 10000})
	}
	v, ok := a.Memory()
	if !ok || v.Batch != 39 || v.Allocated != 1390 || v.Growth != 10 || v.DeviceUsed != 9900 || v.Headroom != 100+8000-1890 || len(a.mem) != memoryKeep {
		t.Fatalf("%+v (kept %d)", v, len(a.mem))
	}
	a.noteMemoryLocked(0, Memory{Allocated: 5, Reserved: 8, Peak: 5, DeviceTotal: 10})
	if v, _ := a.Memory(); v.Growth != 0 || len(a.mem) != 1 || v.Headroom != 3 {
		t.Fatalf("after a restart: %+v", v)
	}
	// a warm-up: 4 GiB made at the first step (the optimizer's state), then flat:
	// no growth, however large the jump
	a = &Agent{}
	for b := int64(0); b < 8; b++ {
		alloc := int64(8 << 30)
		if b == 0 {
			alloc = 4 << 30
		}
		a.noteMemoryLocked(b, Memory{Allocated: alloc, Reserved: 9 << 30, Peak: alloc, DeviceTotal: 80 << 30})
		if v, _ := a.Memory(); v.Growth != 0 {
			t.Fatalf("a warm-up step read as growth at batch %d: %+v", b, v)
		}
	}
}

// TestHeadroomAgainstTheCap: a trainer whose allocator is capped at 4 GiB of
// an 80 GiB device (set_per_process_memory_fraction) has the headroom the cap
// leaves, not the device's: at 1 GiB allocated (1.5 GiB reserved) 3 GiB, a
// ratio of 0.75 of the cap, where the device's free bytes gave 79.4 GiB (0.99);
// the device's own free bytes bound it when they are fewer.
func TestHeadroomAgainstTheCap(t *testing.T) {
	const gib = int64(1) << 30
	msg := `{"type":"memory","batch":3,"memory":{"allocated":1073741824,"reserved":1610612736,"peak":1073741824,"inactive_split":0,"alloc_retries":0,"ooms":0,"device_free":84725645312,"device_total":85899345920,"device_limit":4294967296}}`
	m, err := ParseMessage([]byte(msg))
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{}
	a.noteMemoryLocked(3, *m.Memory)
	v, _ := a.Memory()
	if !v.Capped || v.DeviceTotal != 4*gib || v.DeviceUsed != 3*gib/2 || v.Headroom != 4*gib-3*gib/2+gib/2 {
		t.Fatalf("capped at 4 GiB: %+v", v)
	}
	if r := float64(v.Headroom) / float64(v.DeviceTotal); r != 0.75 {
		t.Fatalf("headroom ratio %.3f of the cap", r)
	}
	// the device nearly full of other processes' memory: its free bytes bound it
	a.noteMemoryLocked(4, Memory{Allocated: gib, Reserved: 3 * gib / 2, Peak: gib, DeviceFree: gib / 4, DeviceTotal: 80 * gib, DeviceLimit: 4 * gib})
	if v, _ := a.Memory(); v.Headroom != gib/4+gib/2 {
		t.Fatalf("a full device under a cap: %+v", v)
	}
	// no cap: the device's
	a.noteMemoryLocked(5, Memory{Allocated: gib, Reserved: 3 * gib / 2, Peak: gib, DeviceFree: 70 * gib, DeviceTotal: 80 * gib})
	if v, _ := a.Memory(); v.Capped || v.Headroom != 70*gib+gib/2 || v.DeviceTotal != 80*gib {
		t.Fatalf("no cap: %+v", v)
	}
}

// TestMemoryGrowthAfterWarmUp: a trainer flat for 42 batches that then leaks 24
// MiB a batch, reporting every 8 batches: the agent's growth is 0 until the leak
// holds for three reports, then 24 MiB a batch, never the 15 MiB a batch of the
// report that straddles the leak's start (a window measures 24: see
// analysis.TestGrowthLiveAgreesWithWindow).
func TestMemoryGrowthAfterWarmUp(t *testing.T) {
	a := &Agent{}
	for b := int64(7); b < 200; b += 8 {
		alloc := int64(4 << 30)
		if b > 42 {
			alloc += (b - 42) * 24 << 20
		}
		a.noteMemoryLocked(b, Memory{Allocated: alloc, Reserved: 80 << 30, Peak: alloc, DeviceTotal: 80 << 30})
		v, _ := a.Memory()
		if v.Growth != 0 && v.Growth != 24<<20 {
			t.Fatalf("at batch %d: growth %v", b, v.Growth)
		}
		if b >= 71 && v.Growth != 24<<20 {
			t.Fatalf("at batch %d, three reports into the leak: growth %v", b, v.Growth)
		}
	}
}

// TestLongWindow: a window of more batches than one socket line can mark (here
// 1,500; up to 1,048,576 may be asked for) is recorded whole: the snapshot
// message on the socket says its marks are in the file beside the snapshot, and
// the agent takes them from there.
func TestLongWindow(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig(testID(0))
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(dir, true) }
	h := startAgent(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Replay(ctx, ReplayConfig{Socket: h.agent.Socket(), Snapshot: replaySnapshot(t), Pace: time.Millisecond, HoldAt: []int64{3}})
	}()
	t.Cleanup(func() { cancel(); <-done })
	w := armAt(t, h, 3, 1500)
	r := waitUpload(t, h, 2*time.Minute)
	if r.Err != nil || r.Partial != "" || r.Window != w {
		t.Fatalf("upload %+v", r)
	}
	st, _ := store.OpenDir(dir, false)
	b, err := store.ReadAll(context.Background(), st, r.MetaKey)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := sidecar.ParseRankMeta(b)
	if err != nil || len(meta.Batches) != 1500 || meta.Batches[1499].Batch != w.Stop-1 {
		t.Fatalf("the sidecar's marks: %v, %d", err, len(meta.Batches))
	}
}

// TestTeardownWithoutHistoryIsNoIncident: a launcher stopping a trainer that keeps
// no allocator history (no window, no --record-always) asks for no crash
// post-mortem, whichever the agent hears of first: its own signal, the trainer's
// "stopping" message, or the trainer's death by SIGTERM (a launcher signals both
// at once). With --record-always it does.
func TestTeardownWithoutHistoryIsNoIncident(t *testing.T) {
	for _, order := range []string{"signal first", "message first", "exit only", "message only"} {
		for _, always := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/record-always=%v", order, always), func(t *testing.T) {
				cfg := DefaultConfig(testID(0))
				dir := t.TempDir()
				cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(dir, true) }
				cfg.RecordAlways = always
				var mu sync.Mutex
				var states []WindowState
				cfg.OnWindow = func(e WindowEvent) {
					mu.Lock()
					states = append(states, e.State)
					mu.Unlock()
				}
				h := startAgent(t, cfg)
				if order == "signal first" {
					h.agent.TrainerSignalled(syscall.SIGTERM)
				}
				if order != "exit only" {
					// its hook says it is being stopped, then it dies of it, as mpirun's and srun's do
					c, err := net.Dial("unix", h.agent.Socket())
					if err != nil {
						t.Fatal(err)
					}
					c.Write([]byte(`{"v":1,"type":"hello","pid":1}` + "\n" + `{"type":"stopping","cause":"SIGTERM","t_us":1,"batch":5}` + "\n"))
					testutil.Eventually(t, 10*time.Second, "the stopping message read", func() bool {
						h.agent.mu.Lock()
						defer h.agent.mu.Unlock()
						return h.agent.batch == 5
					})
					c.Close()
				}
				if order == "message first" {
					h.agent.TrainerSignalled(syscall.SIGTERM)
				}
				if order != "message only" {
					h.agent.TrainerExited(128 + int(syscall.SIGTERM))
				}
				testutil.Eventually(t, 10*time.Second, "the agent idle", h.agent.Idle)
				mu.Lock()
				got := slices.Contains(states, WindowStopping)
				mu.Unlock()
				if got != always {
					t.Errorf("events %v", states)
				}
			})
		}
	}
}

// TestKilledTrainerIsAnIncident: a trainer that dies of anything but a
// termination signal (an exception, SIGKILL: the kernel's OOM killer), or is
// stopped while it records a window, is an incident the cluster hears of.
func TestKilledTrainerIsAnIncident(t *testing.T) {
	for _, code := range []int{1, 128 + int(syscall.SIGKILL)} {
		cfg := DefaultConfig(testID(0))
		dir := t.TempDir()
		cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(dir, true) }
		var mu sync.Mutex
		var states []WindowState
		cfg.OnWindow = func(e WindowEvent) {
			mu.Lock()
			states = append(states, e.State)
			mu.Unlock()
		}
		h := startAgent(t, cfg)
		h.agent.TrainerExited(code)
		testutil.Eventually(t, 10*time.Second, "the agent idle", h.agent.Idle)
		mu.Lock()
		got := slices.Contains(states, WindowStopping)
		mu.Unlock()
		if !got {
			t.Errorf("exit %d: events %v", code, states)
		}
	}
}
