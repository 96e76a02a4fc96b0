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
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/runlog"
)

// manifestAt reads the manifest of window id in a folder store's run.
func manifestAt(t *testing.T, dir, run string, id uint64) *merge.Manifest {
	t.Helper()
	p := filepath.Join(dir, run, "torch_memory_traces", fmt.Sprintf("window%d", id), "merged.manifest.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	m, err := merge.ParseManifest(b)
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
		if r := rows[fmt.Sprint(w)]; r == nil || r["RUN"] != pc.run || r["KIND"] != "window" || r["STATE"] != "published" || r["RANKS"] != "3/3" {
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
				if u.Rank == failing && (u.State == pb.Step_STEP_STOPPING || u.State == pb.Step_STEP_FAILED) {
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
			if res.State == pb.Outcome_OUTCOME_PUBLISHED {
				t.Fatalf("a window whose ranks were all stopped was published: %+v", res)
			}
			if !strings.Contains(res.Missing[int32(failing)], "during the window") {
				t.Errorf("the failing rank's reason: %q", res.Missing[int32(failing)])
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
			if o.State != runlog.Failed {
				t.Fatalf("the interrupted window: %+v", o)
			}
			_, out, _ := runCLI(t, "ls", dir)
			rows := lsRows(out)
			if r := rows[fmt.Sprint(pm.ID)]; r["KIND"] != "crash post-mortem" || r["STATE"] != "published" {
				t.Fatalf("ls:\n%s", out)
			}
			if r := rows[fmt.Sprint(res.Window)]; r["KIND"] != "window" || r["STATE"] != "failed" {
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
	if res.State == pb.Outcome_OUTCOME_PUBLISHED {
		t.Fatalf("the torn-down window was published: %+v", res)
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
	for _, in := range m.Inputs {
		if !strings.HasSuffix(in.Source, ".crash.pickle") {
			t.Errorf("rank %d's snapshot %s is not what its trainer recorded when stopped", in.Rank, in.Source)
		}
	}
}
