package commit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/digest"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/runlog"
)

const run = "job7"

// stored puts rank's recorded snapshot and its sidecar into st, as an agent
// does, and returns the report it writes of it.
func stored(t *testing.T, st store.Store, rank int, name string, meta sidecar.RankMeta) runlog.Report {
	t.Helper()
	data, err := os.ReadFile(testutil.Snapshot(t, fmt.Sprintf("ddp4/rank%d.5.memory_snapshot.pickle", rank)))
	if err != nil {
		t.Fatal(err)
	}
	key := run + "/torch_memory_traces/" + name
	if _, err := st.Put(context.Background(), key, bytes.NewReader(data), store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	meta.Version, meta.RunName, meta.Rank, meta.WorldSize = 1, run, rank, 3
	mb, _ := json.Marshal(meta)
	if _, err := st.Put(context.Background(), sidecar.MetaName(key), bytes.NewReader(mb), store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	return runlog.Report{Rank: rank, Key: key, MetaKey: sidecar.MetaName(key), Size: int64(len(data)), SHA256: digest.SHA256Hex(data), Events: 1}
}

// tornDown is the store of a job whose leader died in the middle of window 1
// (batches 10-19 of ranks 0-2) and whose launcher then stopped every rank:
// ranks 1 and 2 stored what they had recorded as crash snapshots, reported
// under window 1 and as incidents; the leader's crash post-mortem, window 2,
// was planned and never finished. Rank 0 stored nothing.
func tornDown(t *testing.T) (store.Store, *runlog.Log) { return tornDownWith(t, true) }

func tornDownWith(t *testing.T, postmortem bool) (store.Store, *runlog.Log) {
	st, err := store.OpenDir(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rl := runlog.New(st, run)
	term, err := rl.NewTerm(ctx, runlog.Term{Leader: "r0", Rank: 0}, 0)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	w1 := run + "/torch_memory_traces/window1/merged.manifest.json"
	p := runlog.Plan{Run: run, Term: term.Term, Leader: "r0", Kind: runlog.KindWindow, Reason: "request", Start: 10, Stop: 20, WorldSize: 3,
		Ranks: []int{0, 1, 2}, Created: now.Add(-time.Minute), Deadline: now.Add(-time.Second)} // (its deadline passed)
	if _, err := rl.CreatePlan(ctx, p, 0, func(uint64) (string, error) { return w1, nil }); err != nil {
		t.Fatal(err)
	}
	for _, rank := range []int{1, 2} {
		var marks []sidecar.BatchMark
		for b := int64(10); b < 14+int64(rank); b++ {
			marks = append(marks, sidecar.BatchMark{Batch: b, StartUS: b * 1000, EndUS: b*1000 + 900})
		}
		last := marks[len(marks)-1].Batch
		why := fmt.Sprintf("the trainer was stopped in batch %d of [10, 20) (SIGTERM)", last)
		rep := stored(t, st, rank, fmt.Sprintf("rank%d.%d.memory_snapshot.crash.pickle", rank, last), sidecar.RankMeta{Reason: "crash", Cause: "SIGTERM",
			Window: &sidecar.WindowInfo{ID: 1, Start: 10, Stop: 20}, Batches: marks, Partial: why})
		rep.Reason, rep.Cause = "crash", "SIGTERM"
		inc := rep
		inc.Window, inc.Start, inc.Stop, inc.At = 1, last, last+1, now.Add(-time.Duration(3-rank)*time.Second)
		if err := rl.PutIncident(ctx, inc); err != nil {
			t.Fatal(err)
		}
		rep.Window, rep.Start, rep.Stop, rep.Partial = 1, 10, last+1, why
		if err := rl.PutReport(ctx, rep); err != nil {
			t.Fatal(err)
		}
	}
	if !postmortem {
		return st, rl
	}
	failed := 0
	pm := runlog.Plan{Run: run, Term: term.Term, Leader: "r0", Kind: runlog.KindCrash, Reason: "crash post-mortem", WorldSize: 3, Ranks: []int{0, 1, 2},
		Created: now.Add(-5 * time.Second), Deadline: now.Add(15 * time.Second), FailedRank: &failed, Cause: "SIGKILL", Dump: true}
	w2 := run + "/torch_memory_traces/window2/merged.manifest.json"
	if _, err := rl.CreatePlan(ctx, pm, 0, func(uint64) (string, error) { return w2, nil }); err != nil {
		t.Fatal(err)
	}
	return st, rl
}

// TestFinishFromTheStoreAlone: with every agent gone, the unfinished window is
// published with every rank that stored a recording of it, as partial with the
// batches each covers, and the crash post-mortem with every rank's incident; the
// run's log says so, under a term that fences any older leader.
func TestFinishFromTheStoreAlone(t *testing.T) {
	st, rl := tornDown(t)
	ctx := context.Background()
	// the post-mortem is within its deadline: left, as a live leader may finish it
	res, err := Finish(ctx, Config{Store: st, Run: run, Logger: testutil.Logger(t)})
	if err != nil || len(res) != 2 || res[0].Left || !res[1].Left || !strings.Contains(res[1].Error, "--force finishes it now") {
		t.Fatalf("finished %+v (%v)", res, err)
	}
	res, err = Finish(ctx, Config{Store: st, Run: run, Force: true, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	res = append([]Result{res0(t, rl, 1)}, res...)
	if len(res) != 2 {
		t.Fatalf("finished %+v", res)
	}
	for _, r := range res {
		if r.State != runlog.Published || fmt.Sprint(r.Ranks) != "[1 2]" || !strings.Contains(r.Missing[0], "no report of it in the run's log") {
			t.Fatalf("window %d: %+v", r.Window, r)
		}
		o, err := rl.ReadOutcome(ctx, r.Window)
		if err != nil || o.State != runlog.Published || o.Manifest != r.Manifest || fmt.Sprint(o.Ranks) != "[1 2]" {
			t.Fatalf("window %d's outcome %+v (%v)", r.Window, o, err)
		}
		m, err := publish.ReadManifest(ctx, st, r.Manifest)
		if err != nil || m.Failed() || fmt.Sprint(m.RanksMerged) != "[1 2]" {
			t.Fatalf("window %d's manifest %+v (%v)", r.Window, m, err)
		}
		if r.Window == 1 {
			if !strings.HasPrefix(m.PartialRanks["1"], "batches 10-14: the trainer was stopped in batch 14") ||
				!strings.HasPrefix(m.PartialRanks["2"], "batches 10-15:") || !strings.Contains(m.Findings[0], "ranks 1, 2 recorded part of the window") {
				t.Fatalf("window 1's partial ranks %v, findings %q", m.PartialRanks, m.Findings)
			}
		} else if len(m.PartialRanks) != 0 {
			t.Fatalf("a post-mortem's ranks called partial: %v", m.PartialRanks)
		}
	}
	// the finisher's term fences the leader that planned them
	if err := rl.Fence(ctx, 1); err == nil {
		t.Fatal("the old leader's term is not fenced")
	}
	// and a second run finds nothing left
	if again, err := Finish(ctx, Config{Store: st, Run: run, Force: true}); err != nil || len(again) != 0 {
		t.Fatalf("second finish %+v (%v)", again, err)
	}
}

// res0 is window id's result as the run's log says it ended.
func res0(t *testing.T, rl *runlog.Log, id uint64) Result {
	o, err := rl.ReadOutcome(context.Background(), id)
	if err != nil {
		t.Fatalf("window %d's outcome: %v", id, err)
	}
	r := Result{Window: id, Kind: o.Kind, State: o.State, Manifest: o.Manifest, Ranks: o.Ranks, Missing: map[int]string{}}
	for k, why := range o.Missing {
		if k == "0" {
			r.Missing[0] = why
		}
	}
	return r
}

// TestFinishWithNothingStored: a window no rank reported is failed with the
// reason, once, and its commit says so.
func TestFinishWithNothingStored(t *testing.T) {
	st, rl := tornDown(t)
	ctx := context.Background()
	for _, r := range []int{1, 2} {
		if err := st.Delete(ctx, rl.ReportKey(1, r)); err != nil {
			t.Fatal(err)
		}
	}
	res, err := Finish(ctx, Config{Store: st, Run: run, Windows: []uint64{1}, Force: true})
	if err != nil || len(res) != 1 {
		t.Fatalf("finished %+v (%v)", res, err)
	}
	if r := res[0]; r.State != runlog.Failed || !strings.Contains(r.Error, "no rank's snapshot of the window is in the run's log") {
		t.Fatalf("window 1: %+v", r)
	}
	m, err := publish.ReadManifest(ctx, st, res[0].Manifest)
	if err != nil || !m.Failed() {
		t.Fatalf("window 1's manifest %+v (%v)", m, err)
	}
	if undone, _ := Unfinished(ctx, st, run); fmt.Sprint(undone) != "[2]" {
		t.Fatalf("unfinished after finishing window 1 only: %v", undone)
	}
}

// TestFinishTakesTheOrphanedPostmortem: when the leader died before it planned
// the crash post-mortem, the ranks' incidents in the run's log are taken into one
// (a crash's, led by the first rank that failed), and a second finish takes none.
func TestFinishTakesTheOrphanedPostmortem(t *testing.T) {
	st, rl := tornDownWith(t, false)
	ctx := context.Background()
	cfg := Config{Store: st, Run: run, MergedName: "{run_name}/torch_memory_traces/window{window}/merged", Logger: testutil.Logger(t)}
	res, err := Finish(ctx, cfg)
	if err != nil || len(res) != 2 {
		t.Fatalf("finished %+v (%v)", res, err)
	}
	pm := res[1]
	if pm.Window != 2 || pm.Kind != runlog.KindCrash || pm.State != runlog.Published || fmt.Sprint(pm.Ranks) != "[1 2]" ||
		pm.Manifest != run+"/torch_memory_traces/window2/merged.manifest.json" {
		t.Fatalf("the post-mortem %+v", pm)
	}
	p, err := rl.ReadPlan(ctx, 2)
	if err != nil || p.FailedRank == nil || *p.FailedRank != 1 || p.Cause != "SIGTERM" || p.WorldSize != 3 {
		t.Fatalf("its plan %+v (%v)", p, err)
	}
	if again, err := Finish(ctx, cfg); err != nil || len(again) != 0 {
		t.Fatalf("second finish %+v (%v)", again, err)
	}
	if orphans, err := Orphans(ctx, rl, time.Now()); err != nil || len(orphans) != 0 {
		t.Fatalf("orphans left %+v (%v)", orphans, err)
	}
}

// TestFinishTrustsNoReportBlindly: a report naming another rank's snapshot, or
// a snapshot whose size in the store is not the reported one, leaves that rank
// out with the reason; the window is published with the others all the same.
func TestFinishTrustsNoReportBlindly(t *testing.T) {
	st, rl := tornDownWith(t, false)
	ctx := context.Background()
	r1, err := rl.Report(ctx, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	forged := *r1
	forged.Rank = 0 // rank 0's report names rank 1's snapshot
	if err := rl.PutReport(ctx, forged); err != nil {
		t.Fatal(err)
	}
	r2, err := rl.Report(ctx, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(ctx, r2.Key, bytes.NewReader([]byte("cut short")), store.PutOptions{Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	res, err := Finish(ctx, Config{Store: st, Run: run, Windows: []uint64{1}})
	if err != nil || len(res) != 1 {
		t.Fatalf("finished %+v (%v)", res, err)
	}
	r := res[0]
	if r.State != runlog.Published || fmt.Sprint(r.Ranks) != "[1]" || !strings.Contains(r.Missing[0], "its metadata is rank 1's") ||
		!strings.Contains(r.Missing[2], "bytes in the store, its report says") {
		t.Fatalf("window 1: %+v", r)
	}
}

// TestFinishSaysWhenThereIsNoLog: a wrong store or run name is said, not
// taken for a run with nothing to finish.
func TestFinishSaysWhenThereIsNoLog(t *testing.T) {
	st, _ := tornDown(t)
	if _, err := Finish(context.Background(), Config{Store: st, Run: "nope"}); !errors.Is(err, ErrNoLog) {
		t.Fatalf("a run with no log: %v", err)
	}
	if _, err := Finish(context.Background(), Config{Store: st, Run: run, MergedName: "{run_name}/pm"}); err == nil || !strings.Contains(err.Error(), "does not name {window}") {
		t.Fatalf("a merged name without {window}: %v", err)
	}
}
