package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/runlog"
)

// manifestAt reads the manifest of window id in a folder store's run.
func manifestAt(t *testing.T, dir, run string, id uint64) *publish.Manifest {
	t.Helper()
	p := filepath.Join(dir, run, "torch_memory_traces", fmt.Sprintf("window%d", id), "merged.manifest.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	m, err := publish.ParseManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// ask asks the cluster for a window through c and returns how it ended.
func ask(t *testing.T, c *coordinator.Coordinator, batches int64, timeout time.Duration, progress func(coordinator.Update)) *pb.WindowResult {
	t.Helper()
	res, err := c.Snapshot(testutil.Context(t, timeout), batches, progress, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestFaultRelaunch: a job stopped and launched again under the same run name,
// resuming from the same checkpoint (the same batches, so the same snapshot
// names), records and publishes a new window: its id continues after the first
// launch's, each rank's snapshot whose name is taken is stored under its
// window's name (NAME.window<id>.pickle), nothing of the first launch is lost,
// and `memsnap ls` shows both windows.
func TestFaultRelaunch(t *testing.T) {
	dir := t.TempDir()
	// names without the batch, so every window's names collide, as batches that
	// repeat after a resume do
	pc := startProcs(t, 3, procOpts{storeArgs: []string{"--store", dir}, agentArgs: []string{"--filename", "rank{rank}.memory_snapshot"}})
	c := pc.client(3)
	first := ask(t, c, 3, 2*time.Minute, nil)
	if first.State != pb.Outcome_OUTCOME_PUBLISHED || first.Window != 1 || len(first.Ranks) != 3 {
		t.Fatalf("first launch: %+v", first)
	}
	for r := 0; r < 3; r++ { // the job ends: every agent and trainer stops
		pc.signal(r, syscall.SIGTERM, false)
	}
	for r := 0; r < 3; r++ {
		pc.exited(r, time.Minute)
	}
	for r := 0; r < 3; r++ { // and is launched again, as torchrun --max-restarts or a requeue does
		pc.start(r)
	}
	c2 := pc.client(3)
	second := ask(t, c2, 3, 2*time.Minute, nil)
	if second.State != pb.Outcome_OUTCOME_PUBLISHED || second.Window <= first.Window || len(second.Ranks) != 3 {
		t.Fatalf("relaunch: %+v", second)
	}
	m1, m2 := manifestAt(t, dir, pc.run, first.Window), manifestAt(t, dir, pc.run, second.Window)
	for _, in := range m2.Inputs {
		if want := fmt.Sprintf("rank%d.memory_snapshot.window%d.pickle", in.Rank, second.Window); filepath.Base(in.Source) != want {
			t.Errorf("rank %d's snapshot %s, want %s", in.Rank, in.Source, want)
		}
	}
	for _, in := range m1.Inputs { // the first launch's snapshots are still what its manifest says
		b, err := os.ReadFile(filepath.Join(dir, in.Source))
		if h := sha256.Sum256(b); err != nil || hex.EncodeToString(h[:]) != in.SHA256 {
			t.Errorf("the first launch's snapshot %s changed: %v", in.Source, err)
		}
	}
	code, out, errOut := runCLI(t, "ls", dir)
	rows := lsRows(out)
	for _, w := range []uint64{first.Window, second.Window} {
		if r := rows[fmt.Sprint(w)]; r == nil || r["RUN"] != pc.run || r["KIND"] != "asked" || r["STATE"] != "published" || r["RANKS"] != "3/3" {
			t.Errorf("ls does not show window %d published: %v", w, r)
		}
	}
	if code != 0 || t.Failed() {
		t.Fatalf("ls: %d\n%s\n%s", code, out, errOut)
	}
}

// lsRows reads `memsnap ls`'s table: each row by its window, as column -> value.
func lsRows(out string) map[string]map[string]string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	split := regexp.MustCompile(`\s{2,}`)
	head := split.Split(strings.TrimSpace(lines[0]), -1)
	rows := map[string]map[string]string{}
	for _, l := range lines[1:] {
		f := split.Split(strings.TrimSpace(l), -1)
		row := map[string]string{}
		for i, h := range head {
			if i < len(f) {
				row[h] = f[i]
			}
		}
		rows[row["WINDOW"]] = row
	}
	return rows
}

// waitOutcome waits until the run's log says how window id ended.
func waitOutcome(t *testing.T, st store.Store, run string, id uint64, timeout time.Duration) *runlog.Outcome {
	t.Helper()
	var o *runlog.Outcome
	testutil.Eventually(t, timeout, fmt.Sprintf("window %d's outcome in the run's log", id), func() bool {
		var err error
		o, err = runlog.New(st, run).ReadOutcome(context.Background(), id)
		return err == nil
	})
	return o
}

// TestFaultTrainerFails: one rank's trainer raises an exception in the middle of
// a window (the leader's own, or another rank's), and then the launcher tears
// the job down (SIGTERM to every agent, as torchrun does when a worker fails).
// The store ends with one crash post-mortem of every rank that was alive,
// naming the rank that failed first and how; the window itself ends with the
// truth; every agent exits with its trainer's status.
func TestFaultTrainerFails(t *testing.T) {
	for _, failing := range []int{1, 0} {
		t.Run(fmt.Sprintf("rank %d fails", failing), func(t *testing.T) {
			dir := t.TempDir()
			pc := startProcs(t, 3, procOpts{storeArgs: []string{"--store", dir}, failAt: map[int]int64{failing: 150}})
			c := pc.client(3)
			var teardown sync.Once
			res := ask(t, c, 400, 3*time.Minute, func(u coordinator.Update) {
				if u.Rank == failing && (u.State == pb.Step_STEP_STOPPING || u.State == pb.Step_STEP_FAILED || u.State == pb.Step_STEP_PARTIAL) {
					// the launcher sees the worker fail and stops every other one
					teardown.Do(func() {
						go func() {
							for r := 0; r < 3; r++ {
								if r != failing {
									pc.signal(r, syscall.SIGTERM, false)
								}
							}
						}()
					})
				}
			})
			// every rank stopped in the middle of the window: it is published
			// with what each recorded, as partial, the failing rank's cause named
			if res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != 3 {
				t.Fatalf("the window every rank was stopped in, published with what each recorded: %+v", res)
			}
			wm := manifestAt(t, dir, pc.run, res.Window)
			if len(wm.PartialRanks) != 3 || !strings.Contains(wm.PartialRanks[fmt.Sprint(failing)], "exception: RuntimeError: replay failure at batch 150") {
				t.Errorf("the window's partial ranks: %v", wm.PartialRanks)
			}
			for r := 0; r < 3; r++ {
				want := 128 + int(syscall.SIGTERM)
				if r == failing {
					want = 1
				}
				if code := pc.exited(r, 2*time.Minute); code != want {
					t.Errorf("agent %d exited %d, want %d (its trainer's)", r, code, want)
				}
			}
			st, _ := store.OpenDir(dir, false)
			pm := waitOutcome(t, st, pc.run, res.Window+1, time.Second)
			if pm.State != runlog.Published || pm.Kind != runlog.KindCrash || len(pm.Ranks) != 3 {
				t.Fatalf("the crash post-mortem: %+v", pm)
			}
			m := manifestAt(t, dir, pc.run, pm.ID)
			want := fmt.Sprintf("crash post-mortem: rank %d failed first (exception: RuntimeError: replay failure at batch 150)", failing)
			if m.Kind != runlog.KindCrash || m.Reason != want || len(m.RanksMerged) != 3 {
				t.Fatalf("the crash post-mortem's manifest: kind %q, reason %q, ranks %v", m.Kind, m.Reason, m.RanksMerged)
			}
			for _, in := range m.Inputs {
				if in.Rank == failing && !strings.HasSuffix(in.Source, ".crash.pickle") {
					t.Errorf("the failing rank's snapshot is %s, want its crash dump", in.Source)
				}
			}
			o := waitOutcome(t, st, pc.run, res.Window, time.Second)
			if o.State != runlog.Published {
				t.Fatalf("the interrupted window: %+v", o)
			}
			_, out, _ := runCLI(t, "ls", dir)
			rows := lsRows(out)
			if r := rows[fmt.Sprint(pm.ID)]; r["KIND"] != "postmortem" || r["STATE"] != "published" {
				t.Fatalf("ls:\n%s", out)
			}
			if r := rows[fmt.Sprint(res.Window)]; r["KIND"] != "asked" || r["STATE"] != "published" {
				t.Fatalf("ls:\n%s", out)
			}
		})
	}
}

// TestFaultTornDown: the launcher stops every agent (SIGTERM) in the middle of a
// window, with no rank failing first: every trainer dumps what it recorded, and
// the leader, itself being stopped, publishes a crash post-mortem of every rank
// before its agent exits.
func TestFaultTornDown(t *testing.T) {
	dir := t.TempDir()
	pc := startProcs(t, 3, procOpts{storeArgs: []string{"--store", dir}})
	c := pc.client(3)
	var recording atomic.Int32
	var once sync.Once
	res := ask(t, c, 400, 3*time.Minute, func(u coordinator.Update) {
		if u.Rank >= 0 && u.State == pb.Step_STEP_RECORDING && recording.Add(1) == 3 {
			once.Do(func() {
				go func() {
					for r := 2; r >= 0; r-- {
						pc.signal(r, syscall.SIGTERM, false)
					}
				}()
			})
		}
	})
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != 3 {
		t.Fatalf("the torn-down window, published with what every rank recorded: %+v", res)
	}
	if wm := manifestAt(t, dir, pc.run, res.Window); len(wm.PartialRanks) != 3 {
		t.Errorf("the torn-down window's partial ranks: %v", wm.PartialRanks)
	}
	for r := 0; r < 3; r++ {
		if code := pc.exited(r, 2*time.Minute); code != 128+int(syscall.SIGTERM) {
			t.Errorf("agent %d exited %d", r, code)
		}
	}
	st, _ := store.OpenDir(dir, false)
	pm := waitOutcome(t, st, pc.run, res.Window+1, time.Second)
	m := manifestAt(t, dir, pc.run, pm.ID)
	if pm.Kind != runlog.KindCrash || len(m.RanksMerged) != 3 || !strings.Contains(m.Reason, "failed first (SIGTERM)") {
		t.Fatalf("the crash post-mortem: %+v, manifest reason %q, ranks %v", pm, m.Reason, m.RanksMerged)
	}
	// each rank's part is what its trainer recorded when it was stopped, or (a
	// rank the post-mortem's dump reached before its own SIGTERM) its state then
	crash := 0
	for _, in := range m.Inputs {
		switch {
		case strings.HasSuffix(in.Source, ".crash.pickle"):
			crash++
		case strings.HasSuffix(in.Source, ".postmortem.pickle"):
		default:
			t.Errorf("rank %d's snapshot %s is neither a crash dump nor a post-mortem dump", in.Rank, in.Source)
		}
	}
	if crash == 0 {
		t.Errorf("no rank's crash dump is in the post-mortem: %v", m.Inputs)
	}
}

// TestFaultLeaderStalls: the leader (rank 0) stalls (SIGSTOP, as a long GC or
// swap pause does) in the middle of a window; rank 1 takes over and finishes it,
// and records the next window; the old leader wakes (SIGCONT) in the middle of
// that one. It never acts on its stale state: it takes a newer term, the window
// in progress is finished by the leader of the moment, and every request ends
// published. Each window is published once.
func TestFaultLeaderStalls(t *testing.T) {
	dir := t.TempDir()
	pc := startProcs(t, 3, procOpts{storeArgs: []string{"--store", dir}})
	c := pc.client(3)
	var stopped atomic.Bool
	first := ask(t, c, 150, 3*time.Minute, func(u coordinator.Update) {
		if u.Rank == 0 && u.State == pb.Step_STEP_RECORDING && stopped.CompareAndSwap(false, true) {
			pc.signal(0, syscall.SIGSTOP, true) // the agent and its trainer
		}
	})
	if first.State != pb.Outcome_OUTCOME_PUBLISHED || fmt.Sprint(first.Ranks) != "[1 2]" || first.Missing[0] == "" {
		t.Fatalf("the window the leader stalled in: %+v", first)
	}
	var woke atomic.Bool
	var recording atomic.Int32
	second := ask(t, c, 150, 3*time.Minute, func(u coordinator.Update) {
		if u.Rank > 0 && u.State == pb.Step_STEP_RECORDING && recording.Add(1) == 2 && woke.CompareAndSwap(false, true) {
			pc.signal(0, syscall.SIGCONT, true)
		}
	})
	if !woke.Load() {
		t.Fatal("the old leader was never woken")
	}
	if second.State != pb.Outcome_OUTCOME_PUBLISHED || second.Window <= first.Window || len(second.Ranks) < 2 {
		t.Fatalf("the window the old leader woke in: %+v", second)
	}
	testutil.Eventually(t, time.Minute, "the woken rank 0 to lead again", func() bool { l, ok := c.Leader(); return ok && l == 0 })
	st, _ := store.OpenDir(dir, false)
	for _, id := range []uint64{first.Window, second.Window} {
		ms, _ := filepath.Glob(filepath.Join(dir, pc.run, "torch_memory_traces", fmt.Sprintf("window%d", id), "*.manifest.json"))
		if len(ms) != 1 {
			t.Fatalf("window %d: manifests %v", id, ms)
		}
		if o := waitOutcome(t, st, pc.run, id, 30*time.Second); o.State != runlog.Published {
			t.Fatalf("window %d's outcome: %+v", id, o)
		}
	}
	// and the cluster under its old leader records the next window with every rank
	testutil.Eventually(t, time.Minute, "rank 0's trainer to be free", func() bool {
		b, ok := c.Batches(testutil.Context(t, 10*time.Second))
		return ok && len(b) == 3
	})
	third := ask(t, c, 3, 3*time.Minute, nil)
	if third.State != pb.Outcome_OUTCOME_PUBLISHED || third.Window <= second.Window {
		t.Fatalf("the next window: %+v", third)
	}
}

// storeDown runs a 3-rank cluster on a real MinIO whose rank 2 gets stuck in the
// window; once ranks 0 and 1 stored their snapshots and reports, MinIO stops,
// so the leader merges (once rank 2 is given up) while the store is away. onRetry
// runs when the client sees the leader retry the publication.
func storeDown(t *testing.T, onRetry func(m *testutil.MinIOServer, pc *procCluster)) (*procCluster, *testutil.MinIOServer, store.Store, *pb.WindowResult) {
	m := testutil.StartMinIO(t)
	bucket := testutil.BucketName(t)
	url := "s3://" + bucket + "/jobs"
	pc := startProcs(t, 3, procOpts{storeArgs: []string{"--store", url, "--endpoint", m.Endpoint, "--access-key", m.AccessKey, "--secret-key", m.SecretKey},
		hang: []int{2}})
	var st store.Store
	testutil.Eventually(t, time.Minute, "the store to open", func() bool {
		var err error
		st, err = store.Open(testutil.Context(t, time.Minute), store.Config{URL: url, Endpoint: m.Endpoint, CreateBucket: true,
			Credentials: store.Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}})
		return err == nil
	})
	c := pc.client(3)
	var uploaded atomic.Int32
	var down, retried atomic.Bool
	type result struct {
		res *pb.WindowResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := c.Snapshot(testutil.Context(t, 3*time.Minute), 3, func(u coordinator.Update) {
			if u.Rank >= 0 && u.Rank < 2 && u.State == pb.Step_STEP_UPLOADED {
				uploaded.Add(1)
			}
			if u.Rank < 0 && u.State == pb.Step_STEP_RETRYING && down.Load() && retried.CompareAndSwap(false, true) {
				go onRetry(m, pc)
			}
		}, nil)
		done <- result{res, err}
	}()
	rl := runlog.New(st, pc.run)
	testutil.Eventually(t, 2*time.Minute, "ranks 0 and 1 stored their snapshots and reports", func() bool {
		if uploaded.Load() < 2 {
			return false
		}
		reps, _, err := rl.Reports(context.Background(), 1)
		return err == nil && reps[0] != nil && reps[1] != nil
	})
	m.Stop()
	down.Store(true)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !retried.Load() {
		t.Fatalf("the leader never said it retries the publication: %+v", r.res)
	}
	return pc, m, st, r.res
}

// TestFaultStoreDownDuringMerge: the store goes away while the leader merges and
// publishes a window whose ranks' snapshots are all in it; the leader retries
// with backoff (and says so) and publishes once the store is back. A cluster
// relaunched while such a window is unfinished publishes it when it starts.
func TestFaultStoreDownDuringMerge(t *testing.T) {
	t.Run("the leader retries", func(t *testing.T) {
		pc, m, _, res := storeDown(t, func(m *testutil.MinIOServer, pc *procCluster) { m.Start() })
		if res.State != pb.Outcome_OUTCOME_PUBLISHED || fmt.Sprint(res.Ranks) != "[0 1]" || !strings.Contains(res.Missing[2], "no sign of life") {
			t.Fatalf("result %+v", res)
		}
		// ls of the store's prefix (opened at the bucket, where the run's log keys
		// are relative to the prefix) shows the window once, published
		code, out, errOut := runCLI(t, "ls", "--endpoint", m.Endpoint, "--access-key", m.AccessKey, "--secret-key", m.SecretKey, pc.o.storeArgs[1])
		rows := lsRows(out)
		if r := rows["1"]; code != 0 || len(rows) != 1 || r["RUN"] != pc.run || r["STATE"] != "published" || r["RANKS"] != "2/3" {
			t.Fatalf("ls: %d\n%s\n%s", code, out, errOut)
		}
	})
	t.Run("a relaunched cluster publishes it", func(t *testing.T) {
		restarted := make(chan struct{})
		pc, _, st, res := storeDown(t, func(m *testutil.MinIOServer, pc *procCluster) {
			for r := 0; r < 3; r++ { // the whole job dies while the store is away
				pc.kill(r)
			}
			m.Start()
			for r := 0; r < 3; r++ {
				pc.start(r)
			}
			close(restarted)
		})
		<-restarted
		// the client's leader died under it: the window is not published yet, and
		// the relaunched job's leader finishes it from the run's log
		o := waitOutcome(t, st, pc.run, 1, 2*time.Minute)
		if o.State != runlog.Published || fmt.Sprint(o.Ranks) != "[0 1]" {
			t.Fatalf("window 1 after the relaunch: %+v (the client saw %+v)", o, res)
		}
		if _, err := publish.ReadManifest(context.Background(), st, o.Manifest); err != nil {
			t.Fatal(err)
		}
		// and the member that asked for it, whose leader died, heard so from the next
		if res.State != pb.Outcome_OUTCOME_PUBLISHED || res.Window != 1 {
			t.Fatalf("the client saw %+v", res)
		}
	})
}

// TestFaultTrainerDiesMidWindow: a trainer is killed (SIGKILL: no dump) in the
// middle of a window, the leader's own or another rank's; its agent says so at
// once (and stays until the cluster heard it), and the window is merged without
// it, the reason in the manifest, long before the collection's time-out (here 10
// minutes). A crash post-mortem of the live ranks is published too, naming the
// rank whose trainer died.
func TestFaultTrainerDiesMidWindow(t *testing.T) {
	for _, dying := range []int{0, 2} {
		t.Run(fmt.Sprintf("rank %d", dying), func(t *testing.T) {
			dir := t.TempDir()
			pc := startProcs(t, 3, procOpts{storeArgs: []string{"--store", dir}, collect: "10m"})
			c := pc.client(3)
			trainer := trainerPID(t, pc, dying)
			var killed atomic.Bool
			res := ask(t, c, 100, 90*time.Second, func(u coordinator.Update) {
				if u.Rank == dying && u.State == pb.Step_STEP_RECORDING && killed.CompareAndSwap(false, true) {
					syscall.Kill(trainer, syscall.SIGKILL)
				}
			})
			var want []int32
			for r := 0; r < 3; r++ {
				if r != dying {
					want = append(want, int32(r))
				}
			}
			if res.State != pb.Outcome_OUTCOME_PUBLISHED || fmt.Sprint(res.Ranks) != fmt.Sprint(want) || !strings.Contains(res.Missing[int32(dying)], "killed by signal 9") {
				t.Fatalf("result %+v", res)
			}
			m := manifestAt(t, dir, pc.run, res.Window)
			if !strings.Contains(m.MissingReasons[fmt.Sprint(dying)], "during the window") {
				t.Fatalf("the manifest's reason for rank %d: %q", dying, m.MissingReasons[fmt.Sprint(dying)])
			}
			st, _ := store.OpenDir(dir, false)
			pm := waitOutcome(t, st, pc.run, res.Window+1, 30*time.Second)
			if pm.Kind != runlog.KindCrash || fmt.Sprint(pm.Ranks) != strings.ReplaceAll(fmt.Sprint(want), " ", " ") || !strings.Contains(pm.Missing[fmt.Sprint(dying)], "without a snapshot") {
				t.Fatalf("the crash post-mortem: %+v", pm)
			}
			if code := pc.exited(dying, time.Minute); code != 128+int(syscall.SIGKILL) {
				t.Fatalf("the agent of the killed trainer exited %d", code)
			}
		})
	}
}

// trainerPID reads the pid of rank r's trainer from its agent's log.
func trainerPID(t *testing.T, pc *procCluster, r int) int {
	t.Helper()
	re := regexp.MustCompile(`msg="trainer connected" rank=\d+ pid=(\d+)`)
	pid := 0
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("rank %d's trainer to connect", r), func() bool {
		if m := re.FindStringSubmatch(pc.logs[r].String()); m != nil {
			fmt.Sscan(m[1], &pid)
		}
		return pid > 0
	})
	return pid
}

// TestFaultRestartedAgentRejoins: agents that join through a host name without a
// port (every local rank's port on it) form one cluster; an agent killed and
// started again with the same flags joins the others (not only its own port), so
// the job is never split, and a window asked through it is planned on every rank.
func TestFaultRestartedAgentRejoins(t *testing.T) {
	dir := t.TempDir()
	pc := startProcs(t, 3, procOpts{storeArgs: []string{"--store", dir}, joinHost: true})
	c := pc.client(3)
	testutil.Eventually(t, 30*time.Second, "rank 0 to lead", func() bool { l, ok := c.Leader(); return ok && l == 0 })
	pc.kill(0)
	testutil.Eventually(t, time.Minute, "rank 1 to lead the two left", func() bool { l, ok := c.Leader(); return ok && l == 1 })
	pc.start(0)
	// a client that reaches the cluster only through the restarted agent sees all of it
	via := pc.clientVia(3, pc.ports[0])
	testutil.Eventually(t, time.Minute, "one cluster under rank 0", func() bool {
		l1, ok1 := c.Leader()
		l2, ok2 := via.Leader()
		return ok1 && ok2 && l1 == 0 && l2 == 0 && len(via.Members()) == 5 // three ranks, two clients
	})
	res := ask(t, via, 3, 2*time.Minute, nil)
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != 3 {
		t.Fatalf("a window asked through the restarted agent: %+v", res)
	}
}

// TestFaultLeaderRestartedAtOnce: the leader's agent (rank 0, which has no one to
// join: the launcher's head) is killed mid-window and started again at once under
// its old name and address. The others never see it die (the new process answers
// their probes), so it comes up alone; it learns the cluster from the first
// probe it answers, and publishes the window with what the other ranks stored,
// its own rank missing with the reason.
func TestFaultLeaderRestartedAtOnce(t *testing.T) {
	dir := t.TempDir()
	pc := startProcCluster(t, 3, []string{"--store", dir}, 0)
	c := pc.client(3)
	res := ask(t, c, 3, 2*time.Minute, whenRecording(0, func() { pc.kill(0); pc.start(0) }))
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || fmt.Sprint(res.Ranks) != "[1 2]" || res.Missing[0] == "" {
		t.Fatalf("result %+v", res)
	}
	checkPublished(t, dir, res, 1)
}

// TestFaultRankRestartedMidWindow: a rank's agent is killed mid-window and
// started again at once, its trainer from the first batch. Its new agent has no
// record of the window, and its trainer's batches are no sign of the window's
// life: the leader says so and publishes the others' snapshots, rather than
// waiting for the rank until it gives up. (When the plan's gossip still reaches
// the new agent, before the window's start, the rank records the window after
// all: that is right too.)
func TestFaultRankRestartedMidWindow(t *testing.T) {
	dir := t.TempDir()
	pc := startProcCluster(t, 3, []string{"--store", dir}, 2)
	c := pc.client(3)
	res := ask(t, c, 3, 2*time.Minute, whenRecording(2, func() {
		pc.kill(2)
		pc.o.hang = nil // the restarted trainer records what it is given
		pc.start(2)
	}))
	lost := fmt.Sprint(res.Ranks) == "[0 1]" && strings.Contains(res.Missing[2], "restarted")
	rearmed := fmt.Sprint(res.Ranks) == "[0 1 2]"
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || !lost && !rearmed {
		t.Fatalf("result %+v", res)
	}
	checkPublished(t, dir, res, 1)
}

// TestFaultQueuedRequestsSurviveLeaderRestart: five members ask for a window
// at once; the leader serves one and queues the rest, and its agent is killed
// and started again at once (the others never see it die). The requests it
// held are not lost: each member asks again after a silence and every one ends
// with its window published, long before its own time-out. (Each window after
// the restart waits about 10 s for the restarted trainer to catch up with the
// others' batches.)
func TestFaultQueuedRequestsSurviveLeaderRestart(t *testing.T) {
	dir := t.TempDir()
	pc := startProcCluster(t, 3, []string{"--store", dir})
	const n = 5
	clients := make([]*coordinator.Coordinator, n)
	for i := range clients {
		clients[i] = pc.client(3)
	}
	var queued atomic.Int32
	var restarted sync.Once
	type result struct {
		res *pb.WindowResult
		err error
		at  time.Duration
	}
	results := make(chan result, n)
	start := time.Now()
	for i, c := range clients {
		go func() {
			var told atomic.Bool
			res, err := c.Snapshot(testutil.Context(t, 4*time.Minute), 2, func(u coordinator.Update) {
				if strings.HasPrefix(u.Reason, "waiting:") && told.CompareAndSwap(false, true) && queued.Add(1) >= n-2 {
					restarted.Do(func() { go func() { pc.kill(0); pc.start(0) }() })
				}
			}, nil)
			if err != nil {
				err = fmt.Errorf("member %d: %w", i, err)
			}
			results <- result{res, err, time.Since(start)}
		}()
	}
	windows := map[uint64]bool{}
	for range n {
		r := <-results
		if r.err != nil || r.res.State != pb.Outcome_OUTCOME_PUBLISHED {
			t.Fatalf("a request made before the leader restarted: %+v %v", r.res, r.err)
		}
		windows[r.res.Window] = true
		t.Logf("window %d published after %v", r.res.Window, r.at.Round(time.Second))
	}
	if queued.Load() < n-2 {
		t.Fatalf("only %d requests were queued", queued.Load())
	}
	if len(windows) != n {
		t.Fatalf("%d requests ended in %d windows", n, len(windows))
	}
}
