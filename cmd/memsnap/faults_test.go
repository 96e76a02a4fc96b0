package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/rankagent"
	"github.com/memsnap/memsnap/runlog"
)

// procCluster is a cluster of real `memsnap agent` processes on loopback, each
// launching a replay trainer that holds before batch 5 until it has a window.
type procCluster struct {
	t      *testing.T
	run    string
	key    []byte
	ports  []int // rank r's gossip port: ports[0] + r (one host, local rank r)
	o      procOpts
	n      int
	mu     sync.Mutex // guards agents: a test kills one while its cleanup kills all
	agents []*exec.Cmd
	waits  []chan int // each agent's exit status, once it exited
	logs   []*testutil.SyncBuffer
	sock   string
}

// procOpts vary a procCluster's agents and trainers.
type procOpts struct {
	storeArgs  []string
	hang       []int            // ranks whose trainer gets stuck in the first batch of a window
	failAt     map[int]int64    // ranks whose trainer raises an exception at that batch
	agentArgs  []string         // more agent flags for every rank
	collect    string           // --collect-timeout (default 5s)
	joinHost   bool             // join "127.0.0.1" with no port: every local rank's port on it
	replay     map[int][]string // more replay flags for a rank
	masterAddr string           // no --join: MASTER_ADDR names the head host, as torchrun sets it
	// hosts: each host a network namespace (scripts/netns.sh), rank r on host
	// r/perHost as its local rank r%perHost; none: every rank on loopback
	hosts   []nsHost
	perHost int
}

// nsHost is a host in a network namespace: its name and its address.
type nsHost struct{ ns, ip string }

func startProcCluster(t *testing.T, n int, storeArgs []string, hang ...int) *procCluster {
	return startProcs(t, n, procOpts{storeArgs: storeArgs, hang: hang})
}

func startProcs(t *testing.T, n int, o procOpts) *procCluster {
	pc := &procCluster{t: t, run: fmt.Sprintf("fault%d", time.Now().UnixNano()%1e6), o: o, n: n}
	pc.key = make([]byte, 32)
	copy(pc.key, fmt.Sprintf("%032d", time.Now().UnixNano()))
	pc.sock, _ = os.MkdirTemp("", "ms")
	t.Cleanup(func() { os.RemoveAll(pc.sock) })
	base := testutil.FreePorts(t, n) // local rank L listens on base+L
	for r := 0; r < n; r++ {
		pc.ports = append(pc.ports, base+r)
	}
	pc.agents, pc.waits, pc.logs = make([]*exec.Cmd, n), make([]chan int, n), make([]*testutil.SyncBuffer, n)
	for r := 0; r < n; r++ {
		pc.start(r)
	}
	t.Cleanup(func() {
		for i := range pc.agents {
			pc.kill(i)
		}
		if t.Failed() || os.Getenv("MEMSNAP_TEST_AGENT_LOGS") != "" { // (set: every agent's log, pass or fail)
			for i, l := range pc.logs {
				t.Logf("agent %d said:\n%s", i, l)
			}
		}
	})
	return pc
}

// start starts (or starts again, as a relaunch does) rank r's agent and trainer.
func (pc *procCluster) start(r int) {
	t, o := pc.t, pc.o
	collect := o.collect
	if collect == "" {
		collect = "5s"
	}
	snap := testutil.Snapshot(t, fmt.Sprintf("ddp4/rank%d.5.memory_snapshot.pickle", r%4))
	local, localWorld, bind := r, pc.n, "127.0.0.1"
	if len(o.hosts) > 0 {
		local, localWorld, bind = r%o.perHost, o.perHost, o.hosts[r/o.perHost].ip
	}
	args := append([]string{"agent", "--run-name", pc.run, "--rank", strconv.Itoa(r), "--local-rank", strconv.Itoa(local), "--world-size", strconv.Itoa(pc.n),
		"--local-world-size", strconv.Itoa(localWorld), "--spool", filepath.Join(pc.sock, fmt.Sprintf("spool%d", r)), "--socket", filepath.Join(pc.sock, fmt.Sprintf("s%d", r)),
		"--bind", bind, "--gossip-port", strconv.Itoa(pc.ports[0]), "--no-schedule", "--collect-timeout", collect, "--drain-timeout", "30s"}, o.storeArgs...)
	args = append(args, o.agentArgs...)
	switch {
	case len(o.hosts) > 0 && r > 0:
		args = append(args, "--join", net.JoinHostPort(o.hosts[0].ip, strconv.Itoa(pc.ports[0])))
	case len(o.hosts) > 0:
	case o.masterAddr != "":
	case o.joinHost:
		args = append(args, "--join", "127.0.0.1")
	case r > 0:
		args = append(args, "--join", fmt.Sprintf("127.0.0.1:%d", pc.ports[0]))
	}
	args = append(args, "--", os.Args[0], "replay", "--snapshot", snap, "--batches", "0", "--pace", "20ms", "--hold-at", "5", "--rank", strconv.Itoa(r))
	if slices.Contains(o.hang, r) { // this rank's trainer gets stuck in the window: it dies mid-window
		args = append(args, "--hang-in-window")
	}
	if b, ok := o.failAt[r]; ok {
		args = append(args, "--fail-at", strconv.FormatInt(b, 10))
	}
	args = append(args, o.replay[r]...)
	cmd := memsnapCmd(t, args...)
	if len(o.hosts) > 0 { // (ip netns exec runs the command in the host's namespace, as itself)
		cmd.Args = append([]string{"ip", "netns", "exec", o.hosts[r/o.perHost].ns}, cmd.Args...)
		cmd.Path = ipCmd
	}
	cmd.Env = append(cmd.Env, coordinator.KeyEnv+"="+encodeKey(pc.key))
	if o.masterAddr != "" {
		cmd.Env = append(cmd.Env, "MASTER_ADDR="+o.masterAddr)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // kill -9 takes its trainer too
	buf := &testutil.SyncBuffer{}
	if old := pc.logs[r]; old != nil {
		buf.Write([]byte(old.String() + "\n--- started again ---\n"))
	}
	cmd.Stdout, cmd.Stderr = buf, buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() {
		cmd.Wait()
		done <- cmd.ProcessState.ExitCode()
	}()
	pc.mu.Lock()
	pc.agents[r], pc.waits[r], pc.logs[r] = cmd, done, buf
	pc.mu.Unlock()
}

// whenRecording is a window's progress callback that runs f (once, on a
// goroutine of its own) when rank says it records the window.
func whenRecording(rank int, f func()) func(coordinator.Update) {
	var done atomic.Bool
	return func(u coordinator.Update) {
		if u.Rank == rank && u.State == pb.Step_STEP_RECORDING && done.CompareAndSwap(false, true) {
			go f()
		}
	}
}

func encodeKey(k []byte) string { return base64.StdEncoding.EncodeToString(k) }

// kill sends SIGKILL to agent i and its trainer, and waits for the agent.
func (pc *procCluster) kill(i int) {
	pc.mu.Lock()
	a, done := pc.agents[i], pc.waits[i]
	pc.agents[i] = nil
	pc.mu.Unlock()
	if a != nil && a.Process != nil {
		syscall.Kill(-a.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// signal sends sig to agent i (its process group: its trainer too, when group).
func (pc *procCluster) signal(i int, sig syscall.Signal, group bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if a := pc.agents[i]; a != nil && a.Process != nil {
		pid := a.Process.Pid
		if group {
			pid = -pid
		}
		syscall.Kill(pid, sig)
	}
}

// exited waits (up to timeout) for agent i to exit and returns its status.
func (pc *procCluster) exited(i int, timeout time.Duration) int {
	pc.t.Helper()
	pc.mu.Lock()
	done := pc.waits[i]
	pc.mu.Unlock()
	select {
	case code := <-done:
		done <- code
		pc.mu.Lock()
		pc.agents[i] = nil
		pc.mu.Unlock()
		return code
	case <-time.After(timeout):
		pc.t.Fatalf("agent %d did not exit within %v", i, timeout)
	}
	return -1
}

// client joins the cluster in this process, as memsnap snapshot does, and waits
// until every trainer holds before batch 5.
func (pc *procCluster) client(n int) *coordinator.Coordinator {
	return pc.clientVia(n, pc.ports...)
}

// clientVia is client, joining through the given gossip ports only.
func (pc *procCluster) clientVia(n int, ports ...int) *coordinator.Coordinator {
	t := pc.t
	cfg := coordinator.DefaultLocalConfig(rankagent.Identity{RunName: pc.run})
	cfg.Client, cfg.SecretKey, cfg.Logger = true, pc.key, testutil.Logger(t)
	for _, p := range ports {
		cfg.Join = append(cfg.Join, fmt.Sprintf("127.0.0.1:%d", p))
	}
	c, err := coordinator.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.Eventually(t, 90*time.Second, "every trainer holding before batch 5", func() bool {
		b, ok := c.Batches(ctx)
		if !ok || len(b) != n {
			return false
		}
		for _, v := range b {
			if v != 4 {
				return false
			}
		}
		return true
	})
	return c
}

// TestFaultNonLeaderKilled: a non-leader agent is killed (SIGKILL, with its
// trainer) in the middle of a window; the other ranks record on, and the merge
// completes at the deadline with that rank listed missing.
func TestFaultNonLeaderKilled(t *testing.T) {
	dir := t.TempDir()
	pc := startProcCluster(t, 3, []string{"--store", dir}, 2)
	c := pc.client(3)
	res, err := c.Snapshot(testutil.Context(t, 2*time.Minute), 3, whenRecording(2, func() { pc.kill(2) }), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || fmt.Sprint(res.Ranks) != "[0 1]" || res.Missing[2] == "" {
		t.Fatalf("result %+v", res)
	}
	checkPublished(t, dir, res, 1)
}

// TestFaultLeaderKilled: the leader (rank 0) is killed mid-window; rank 1 takes
// over, finishes the window from the ranks' status and their stored snapshots, and
// exactly one set of merged outputs exists.
func TestFaultLeaderKilled(t *testing.T) {
	dir := t.TempDir()
	pc := startProcCluster(t, 3, []string{"--store", dir}, 0)
	c := pc.client(3)
	res, err := c.Snapshot(testutil.Context(t, 2*time.Minute), 3, whenRecording(0, func() { pc.kill(0) }), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || fmt.Sprint(res.Ranks) != "[1 2]" {
		t.Fatalf("result %+v", res)
	}
	checkPublished(t, dir, res, 1)
}

// TestFaultStoreDownDuringUploads: MinIO stops while the ranks upload and comes back
// later; every rank's snapshot arrives whole, and the leader merges once the store
// is back.
func TestFaultStoreDownDuringUploads(t *testing.T) {
	m := testutil.StartMinIO(t)
	bucket := testutil.BucketName(t)
	storeArgs := []string{"--store", "s3://" + bucket + "/jobs", "--endpoint", m.Endpoint, "--access-key", m.AccessKey, "--secret-key", m.SecretKey}
	pc := startProcCluster(t, 2, storeArgs)
	c := pc.client(2)
	var stopped atomic.Int32
	var restarted sync.Once
	resc := make(chan *pb.WindowResult, 1)
	go func() {
		res, err := c.Snapshot(testutil.Context(t, 3*time.Minute), 2, func(u coordinator.Update) {
			if u.Rank >= 0 && u.State == pb.Step_STEP_RECORDING && stopped.CompareAndSwap(0, 1) {
				m.Stop()
				stopped.Store(2)
			}
		}, nil)
		if err != nil {
			t.Error(err)
		}
		resc <- res
	}()
	// both ranks spooled their snapshot while the store is away, and retry
	testutil.Eventually(t, 2*time.Minute, "the store down and both ranks retrying", func() bool {
		return stopped.Load() == 2 && countRetries(pc) >= 2
	})
	restarted.Do(m.Start)
	res := <-resc
	if res == nil || res.State != pb.Outcome_OUTCOME_PUBLISHED || fmt.Sprint(res.Ranks) != "[0 1]" {
		t.Fatalf("result %+v", res)
	}
	ctx := testutil.Context(t, time.Minute)
	st, err := store.Open(ctx, store.Config{URL: "s3://" + bucket + "/jobs", Endpoint: m.Endpoint, Credentials: store.Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}})
	if err != nil {
		t.Fatal(err)
	}
	man, err := publish.ReadManifest(ctx, st, pc.run+"/torch_memory_traces/window1/merged.manifest.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range man.Inputs {
		info, err := st.Stat(ctx, in.Source)
		if err != nil || info.SHA256 != in.SHA256 || info.Size != in.Size {
			t.Fatalf("rank %d's snapshot %s: %+v %v, the manifest says %s", in.Rank, in.Source, info, err, in.SHA256)
		}
	}
}

// checkLsAgrees checks that `memsnap ls` says of every window what its commit
// (the manifest) and its outcome say, and that they agree.
func checkLsAgrees(t *testing.T, dir string) {
	t.Helper()
	code, out, errOut := runCLI(t, "ls", "--json", dir)
	if code != 0 {
		t.Fatalf("ls: %d %s", code, errOut)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var row struct {
			Window   uint64
			State    string
			Manifest *publish.Manifest
			Outcome  *runlog.Outcome
		}
		if err := json.Unmarshal([]byte(line), &row); err != nil {
			t.Fatalf("ls --json: %v: %s", err, line)
		}
		var c *window.Commit
		if m := row.Manifest; m != nil {
			c = &window.Commit{Failed: m.Failed(), Pending: len(m.Pending) > 0, Error: m.Error}
		}
		state := ""
		if row.Outcome != nil {
			state = row.Outcome.State
		}
		if !window.Agrees(c, state) {
			t.Fatalf("window %d: its outcome says %q, its manifest %+v", row.Window, state, c)
		}
		p, _ := window.Derive(c, state)
		want := map[window.Phase]string{window.Published: "published", window.Failed: "failed", window.Answered: "answered", window.Collecting: "unfinished"}[p]
		if !strings.HasPrefix(row.State, want) {
			t.Fatalf("ls says window %d is %q; its commit and outcome say %v", row.Window, row.State, p)
		}
	}
}

// countRetries counts the agents' logged upload retries.
func countRetries(pc *procCluster) int {
	n := 0
	for _, l := range pc.logs {
		if bytes.Contains([]byte(l.String()), []byte("upload failed; the snapshot stays in the spool")) {
			n++
		}
	}
	return n
}

// checkPublished: exactly n manifests under the folder store, the result's among them.
func checkPublished(t *testing.T, dir string, res *pb.WindowResult, n int) {
	t.Helper()
	all, _ := filepath.Glob(filepath.Join(dir, "*", "torch_memory_traces", "window*", "merged.manifest.json"))
	var ms []string
	for _, p := range all {
		if b, err := os.ReadFile(p); err == nil {
			if m, err := publish.ParseManifest(b); err == nil && !m.Failed() {
				ms = append(ms, p)
			}
		}
	}
	if len(ms) != n {
		t.Fatalf("%d published manifests: %v", len(ms), ms)
	}
	checkLsAgrees(t, dir)
	b, err := os.ReadFile(res.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := publish.ParseManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.RanksMerged) != len(res.Ranks) {
		t.Fatalf("manifest ranks %v, result %v", m.RanksMerged, res.Ranks)
	}
}
