package rankagent

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/digest"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/runlog"
)

// logRefusing is a store that refuses, for now, every write into the run's log
// (the snapshots themselves go in) while refuse is set.
type logRefusing struct {
	store.Store
	refuse *atomic.Bool
}

func (s logRefusing) Put(ctx context.Context, key string, r io.Reader, o store.PutOptions) (store.ObjectInfo, error) {
	if s.refuse.Load() && strings.HasPrefix(key, runlog.Root("run1")) {
		return store.ObjectInfo{}, fmt.Errorf("%w: the log's folder is away", store.ErrUnreachable)
	}
	return s.Store.Put(ctx, key, r, o)
}

// spoolJobs makes a spool with a window's snapshot (window 4, batches 3-5) and
// a crash's in the middle of window 5 (it recorded batches 6-8 of [6, 12)).
func spoolJobs(t *testing.T) string {
	dir := t.TempDir()
	sp, err := openSpool(dir)
	if err != nil {
		t.Fatal(err)
	}
	data := replaySnapshot(t)
	add := func(j job) {
		src := filepath.Join(sp.incoming(), "x.pickle")
		if err := os.WriteFile(src, data, 0o600); err != nil {
			t.Fatal(err)
		}
		j.MetaKey, j.SHA256, j.Size, j.Events, j.Created = sidecar.MetaName(j.Key), digest.SHA256Hex(data), int64(len(data)), 7, time.Now().UTC()
		if _, err := sp.addJob(src, j, []byte("{}"), nil); err != nil {
			t.Fatal(err)
		}
	}
	add(job{Key: "run1/t/rank0.6.memory_snapshot.pickle", Window: 4, Start: 3, Stop: 6, Reason: "window"})
	add(job{Key: "run1/t/rank0.8.memory_snapshot.crash.pickle", Window: 5, Start: 8, Stop: 9, Reason: "crash", Cause: "SIGTERM",
		Covers: []int64{6, 9}, WindowPartial: "the trainer was stopped in batch 8 of [6, 12) (SIGTERM)"})
	return dir
}

// TestStoredMeansReported: a snapshot's job leaves the spool only once the run's
// log holds its report; while the log refuses writes the job waits (its snapshot
// stored once), an agent started later on the same spool finishes it, and a
// crash in the middle of a window is reported under that window as partial, with
// the batches it covers, and as the rank's incident.
func TestStoredMeansReported(t *testing.T) {
	spoolDir, dir := spoolJobs(t), t.TempDir()
	refuse := &atomic.Bool{}
	refuse.Store(true)
	cfg := DefaultConfig(testID(0))
	cfg.Spool = spoolDir
	cfg.OpenStore = func(context.Context) (store.Store, error) {
		st, err := store.OpenDir(dir, true)
		return logRefusing{st, refuse}, err
	}
	h := startAgent(t, cfg)
	sp := &spool{root: spoolDir}
	testutil.Eventually(t, 20*time.Second, "both snapshots stored, their reports refused", func() bool {
		n := 0
		for _, id := range sp.pendingJobs() {
			if j, err := readJob(filepath.Join(spoolDir, "pending", id)); err == nil && j.Stored {
				n++
			}
		}
		return n == 2 && h.agent.Stats().Retries >= 2
	})
	for _, k := range []string{"run1/t/rank0.6.memory_snapshot.pickle", "run1/t/rank0.8.memory_snapshot.crash.pickle"} {
		if _, err := os.Stat(filepath.Join(dir, k)); err != nil {
			t.Fatalf("%s not stored: %v", k, err)
		}
	}
	if s := h.agent.Stats(); s.Uploaded != 0 {
		t.Fatalf("a job ended with no report in the run's log: %+v", s)
	}
	h.stop()

	// the next agent on the same spool, with the log writable again
	refuse.Store(false)
	cfg.OnUpload = nil
	h2 := startAgent(t, cfg)
	for i := 0; i < 2; i++ {
		if r := waitUpload(t, h2, 30*time.Second); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if left := sp.pendingJobs(); len(left) != 0 {
		t.Fatalf("jobs left in the spool: %v", left)
	}
	st, _ := store.OpenDir(dir, false)
	rl := runlog.New(st, "run1")
	ctx := context.Background()
	w4, err := rl.Report(ctx, 4, 0)
	if err != nil || w4.Key != "run1/t/rank0.6.memory_snapshot.pickle" || w4.Start != 3 || w4.Stop != 6 || w4.Partial != "" {
		t.Fatalf("window 4's report %+v (%v)", w4, err)
	}
	w5, err := rl.Report(ctx, 5, 0)
	if err != nil || w5.Key != "run1/t/rank0.8.memory_snapshot.crash.pickle" || w5.Reason != "crash" || w5.Start != 6 || w5.Stop != 9 ||
		!strings.Contains(w5.Partial, "stopped in batch 8") || w5.Cause != "SIGTERM" {
		t.Fatalf("window 5's report %+v (%v)", w5, err)
	}
	incs, bad, err := rl.Incidents(ctx, 0, time.Now().Add(-time.Hour), time.Now())
	if err != nil || len(bad) != 0 || len(incs) != 1 || incs[0].Key != w5.Key || incs[0].Window != 5 {
		t.Fatalf("incidents %+v %v (%v)", incs, bad, err)
	}
}

// TestReportDeniedIsRetried: a log that denies the report after the snapshot is
// stored (credentials that expired, say) never moves the job to failed/ nor
// tells the window the snapshot was not stored: the report is retried until the
// log takes it.
func TestReportDeniedIsRetried(t *testing.T) {
	spoolDir, dir := spoolJobs(t), t.TempDir()
	deny := &atomic.Bool{}
	deny.Store(true)
	cfg := DefaultConfig(testID(0))
	cfg.Spool = spoolDir
	cfg.OpenStore = func(context.Context) (store.Store, error) {
		st, err := store.OpenDir(dir, true)
		return deniedLog{st, deny}, err
	}
	h := startAgent(t, cfg)
	testutil.Eventually(t, 20*time.Second, "the reports denied a few times", func() bool { return h.agent.Stats().Retries >= 4 })
	sp := &spool{root: spoolDir}
	if n, f := len(sp.pendingJobs()), len(sp.failedJobs()); n != 2 || f != 0 {
		t.Fatalf("%d pending and %d failed jobs, want 2 and 0", n, f)
	}
	select {
	case r := <-h.results:
		t.Fatalf("a job ended while its report was denied: %+v", r)
	default:
	}
	deny.Store(false)
	for i := 0; i < 2; i++ {
		if r := waitUpload(t, h, 30*time.Second); r.Err != nil {
			t.Fatalf("upload %+v", r)
		}
	}
	st, _ := store.OpenDir(dir, false)
	if reps, _, err := runlog.New(st, "run1").Reports(context.Background(), 4); err != nil || reps[0] == nil {
		t.Fatalf("window 4's reports %v (%v)", reps, err)
	}
}

type deniedLog struct {
	store.Store
	deny *atomic.Bool
}

func (s deniedLog) Put(ctx context.Context, key string, r io.Reader, o store.PutOptions) (store.ObjectInfo, error) {
	if s.deny.Load() && strings.HasPrefix(key, runlog.Root("run1")) {
		return store.ObjectInfo{}, fmt.Errorf("%w: under the log's folder", store.ErrAccess)
	}
	return s.Store.Put(ctx, key, r, o)
}

// TestSpoolIsOneAgents: a second agent started on a spool in use is refused with
// the reason, rather than uploading the first one's jobs as its own rank's.
func TestSpoolIsOneAgents(t *testing.T) {
	spoolDir := t.TempDir()
	first := DefaultConfig(testID(0))
	first.Spool = spoolDir
	first.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(t.TempDir(), true) }
	startAgent(t, first)
	second := DefaultConfig(testID(1))
	second.Spool, second.Socket, second.OpenStore = spoolDir, shortSocket(t), first.OpenStore
	second.Logger = testutil.Logger(t)
	a, err := New(second)
	if err != nil {
		t.Fatal(err)
	}
	err = a.Run(testutil.Context(t, 20*time.Second))
	if err == nil || !strings.Contains(err.Error(), "is in use by another agent") {
		t.Fatalf("a second agent on the spool: %v", err)
	}
}
