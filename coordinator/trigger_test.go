package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator/view"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/rankagent"
	"github.com/memsnap/memsnap/runlog"
)

// TestTriggers: a rank whose memory grows batch after batch (a replay trainer
// leaking on a 2 GiB device, which runs out of memory once its peak would not
// fit) crosses a trigger, and the leader takes a window of every rank, of kind
// trigger, whose reason names the rank and what it crossed, published before the
// rank's OOM, its findings leading with that rank and the site that leaks. Once
// with --trigger-growth, once with --trigger-headroom, and once with
// --record-always, where the window is every rank's history at once.
func TestTriggers(t *testing.T) {
	const leaking, leak, device = 2, int64(16 << 20), int64(2 << 30)
	for _, c := range []struct {
		name string
		trig view.Triggers
		want string
	}{
		{"growth", view.Triggers{GrowthBytes: 128 << 20, GrowthBatches: 10, Cooldown: time.Hour}, "growing 16.0 MiB a batch (128.0 MiB or more over 10 batches)"},
		{"headroom", view.Triggers{HeadroomRatio: 0.5, Cooldown: time.Hour}, "%) < 50%, growing 16.0 MiB a batch"},
		{"record-always", view.Triggers{GrowthBytes: 128 << 20, GrowthBatches: 10, Cooldown: time.Hour, Dump: true}, "growing 16.0 MiB a batch (128.0 MiB or more over 10 batches)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tc := leakingCluster(t, leaking, leak, device)
			opts := func(cfg *Config, a *rankagent.Config) {
				cfg.FiguresInterval, cfg.Triggers = 200*time.Millisecond, c.trig
				a.RecordAlways = c.trig.Dump
			}
			for r := 0; r < 4; r++ {
				tc.startRank(r, 4, opts)
			}
			st, err := store.OpenDir(tc.dir, false)
			if err != nil {
				t.Fatal(err)
			}
			rl := runlog.New(st, tc.run)
			var trig *runlog.Plan
			testutil.Eventually(t, time.Minute, "a window of kind trigger", func() bool {
				ps, err := rl.Latest(testutil.Context(t, 10*time.Second), 16)
				if err != nil {
					return false
				}
				for _, p := range ps {
					if p.Kind == runlog.KindTrigger {
						trig = p
						return true
					}
				}
				return false
			})
			if !strings.HasPrefix(trig.Reason, fmt.Sprintf("trigger: rank %d: ", leaking)) || !strings.Contains(trig.Reason, c.want) {
				t.Fatalf("the trigger window's reason: %q", trig.Reason)
			}
			// published with every rank, the leaking one recorded before it ran out
			// of memory (its peak outgrows the device at batch oom)
			oom := (device - base(t, leaking)) / leak
			var o *runlog.Outcome
			testutil.Eventually(t, time.Minute, "the trigger window published", func() bool {
				var err error
				o, err = rl.ReadOutcome(testutil.Context(t, 10*time.Second), trig.ID)
				return err == nil
			})
			if o.State != runlog.Published || len(o.Ranks) != 4 || o.Kind != runlog.KindTrigger || trig.Stop > oom || trig.Dump != c.trig.Dump {
				t.Fatalf("the trigger window %+v (planned %d-%d, dumps %v), the leaking rank runs out of memory at batch %d", o, trig.Start, trig.Stop, trig.Dump, oom)
			}
			m := readManifest(t, filepath.Join(tc.dir, trig.Manifest))
			if c.trig.Dump {
				// every rank's history at once, the leaking rank's taken before its OOM
				sum := readSummary(t, filepath.Join(tc.dir, filepath.Dir(trig.Manifest), m.Outputs[publish.OutSummary].Name))
				for _, r := range sum.Ranks {
					if r.Events == 0 || len(r.OOMs) != 0 || len(r.Batches) != 0 {
						t.Fatalf("rank %d's part of the dumps: %d events, %d OOMs, batches %v", r.Rank, r.Events, len(r.OOMs), r.Batches)
					}
				}
			}
			if m.Kind != runlog.KindTrigger || m.Reason != trig.Reason {
				t.Fatalf("the manifest says kind %q, reason %q", m.Kind, m.Reason)
			}
			// the findings lead with the rank that crossed, naming the site that leaks
			site := fmt.Sprintf("%s (%s:%d)", rankagent.LeakSite.Name, rankagent.LeakSite.Filename, rankagent.LeakSite.Line)
			if len(m.Findings) == 0 || !strings.HasPrefix(m.Findings[0], fmt.Sprintf("rank %d, which this window was taken for (crossed a trigger: ", leaking)) ||
				!strings.Contains(m.Findings[0], site) {
				t.Fatalf("the trigger window's findings do not lead with rank %d and %s:\n%s", leaking, site, strings.Join(m.Findings, "\n"))
			}
			// one a cooldown: no second trigger window while the rank keeps crossing
			ps, _ := rl.Latest(testutil.Context(t, 10*time.Second), 64)
			n := 0
			for _, p := range ps {
				if p.Kind == runlog.KindTrigger {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%d trigger windows within the cooldown", n)
			}
		})
	}
}

// base is the peak of rank's recorded snapshot, from which its replay leaks.
func base(t *testing.T, rank int) int64 {
	t.Helper()
	b, err := os.ReadFile(testutil.Snapshot(t, fmt.Sprintf("ddp4/rank%d.5.memory_snapshot.pickle", rank)))
	if err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.DecodeAny(b)
	if err != nil {
		t.Fatal(err)
	}
	return s.ComputeFigures().Devices[0].PeakAllocatedBytes
}

// readSummary reads a published merged.summary.json.
func readSummary(t *testing.T, path string) *analysis.Summary {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s analysis.Summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// TestStaleTriggerIsDropped: a trigger that waited in the leader's queue plans
// nothing once its rank no longer crosses: its figures went stale (it left, or
// ran out of memory meanwhile) or came back under the threshold.
func TestStaleTriggerIsDropped(t *testing.T) {
	c := &Coordinator{cfg: Config{FiguresInterval: time.Second, Triggers: view.Triggers{GrowthBytes: 10 << 20, GrowthBatches: 1}}, log: slog.New(slog.DiscardHandler)}
	if why := c.stillCrossing(2); why != "" {
		t.Fatalf("a rank with no figures still crosses: %q", why)
	}
	c.views = map[int]rankView{2: {f: &pb.Figures{Growth: 16 << 20}, at: time.Now()}}
	if why := c.stillCrossing(2); !strings.Contains(why, "growing 16.0 MiB a batch") {
		t.Fatalf("a rank crossing now: %q", why)
	}
	c.views[2] = rankView{f: &pb.Figures{Growth: 16 << 20}, at: time.Now().Add(-viewStale*time.Second - time.Second)}
	if why := c.stillCrossing(2); why != "" {
		t.Fatalf("a rank silent for %d report periods still crosses: %q", viewStale, why)
	}
	c.views[2] = rankView{f: &pb.Figures{Growth: 1 << 20}, at: time.Now()}
	if why := c.stillCrossing(2); why != "" {
		t.Fatalf("a rank back under the threshold still crosses: %q", why)
	}
}

// leakingCluster is a cluster whose replay trainers run free on a device of
// device bytes, rank leaking leak bytes a batch.
func leakingCluster(t *testing.T, leaking int, leak, device int64) *testCluster {
	return &testCluster{t: t, run: fmt.Sprintf("run%d", time.Now().UnixNano()%1e6), key: newKey(t), dir: t.TempDir(),
		replay: func(rank int, rc *rankagent.ReplayConfig) {
			rc.HoldAt, rc.Pace, rc.DeviceTotal, rc.MemoryEvery = nil, 50*time.Millisecond, device, 10*time.Millisecond
			if rank == leaking {
				rc.LeakPerBatch = leak
			}
		}}
}

// refusePlans is a store that refuses to take plans into the run's log while
// refuse is set (a read-only or full store, for the log's plans).
type refusePlans struct {
	store.Store
	refuse *atomic.Bool
	tried  *atomic.Int32
}

func (s refusePlans) Put(ctx context.Context, key string, r io.Reader, o store.PutOptions) (store.ObjectInfo, error) {
	if strings.Contains(key, "/memsnap/plans/") && s.refuse.Load() {
		s.tried.Add(1)
		return store.ObjectInfo{}, fmt.Errorf("%w: read-only for now", store.ErrAccess)
	}
	return s.Store.Put(ctx, key, r, o)
}

// TestTriggerDeferredWhileTheLogRefusesPlans: a rank crosses a trigger while the
// run's log refuses plans: the trigger window is not dropped, and is taken (once,
// under its cooldown) when the store takes plans again.
func TestTriggerDeferredWhileTheLogRefusesPlans(t *testing.T) {
	const leaking, leak, device = 2, int64(16 << 20), int64(2 << 30)
	refuse, tried := &atomic.Bool{}, &atomic.Int32{}
	refuse.Store(true)
	tc := leakingCluster(t, leaking, leak, device)
	opts := func(cfg *Config, a *rankagent.Config) {
		cfg.FiguresInterval, cfg.Triggers = 200*time.Millisecond, view.Triggers{GrowthBytes: 128 << 20, GrowthBatches: 10, Cooldown: time.Hour}
		wrapStores(cfg, func(st store.Store) store.Store { return refusePlans{st, refuse, tried} })
	}
	for r := 0; r < 3; r++ {
		tc.startRank(r, 3, opts)
	}
	deferred := func() bool {
		c := tc.ranks[0].Coord
		c.mu.Lock()
		l := c.lead
		c.mu.Unlock()
		if l == nil {
			return false
		}
		d := l.Deferred()
		return len(d) == 1 && d[0] == pb.WindowKind_WINDOW_KIND_TRIGGER
	}
	testutil.Eventually(t, time.Minute, "the trigger window deferred, its plan refused", func() bool { return tried.Load() > 0 && deferred() })
	refuse.Store(false)
	st, err := store.OpenDir(tc.dir, false)
	if err != nil {
		t.Fatal(err)
	}
	rl := runlog.New(st, tc.run)
	var trig *runlog.Plan
	testutil.Eventually(t, time.Minute, "the trigger window planned once the log takes plans", func() bool {
		ps, err := rl.Latest(testutil.Context(t, 10*time.Second), 16)
		for _, p := range ps {
			if err == nil && p.Kind == runlog.KindTrigger {
				trig = p
				return true
			}
		}
		return false
	})
	if !strings.HasPrefix(trig.Reason, fmt.Sprintf("trigger: rank %d: ", leaking)) {
		t.Fatalf("the trigger window's reason: %q", trig.Reason)
	}
	testutil.Eventually(t, time.Minute, "the trigger window published", func() bool {
		o, err := rl.ReadOutcome(testutil.Context(t, 10*time.Second), trig.ID)
		return err == nil && o.State == runlog.Published
	})
	ps, _ := rl.Latest(testutil.Context(t, 10*time.Second), 64)
	n := 0
	for _, p := range ps {
		if p.Kind == runlog.KindTrigger {
			n++
		}
	}
	if n != 1 || deferred() {
		t.Fatalf("%d trigger windows (deferred still: %v)", n, deferred())
	}
}
