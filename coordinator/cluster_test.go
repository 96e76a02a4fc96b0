package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/rankagent"
)

// testCluster is N real rank agents with real memberlist on loopback, each with a
// replay trainer that holds before batch holdAt until it has a window.
type testCluster struct {
	t      *testing.T
	run    string
	key    []byte
	dir    string // the folder store
	ranks  []*Rank
	stops  []func()
	holdAt int64
	wrap   func(rank int, a *rankagent.Agent) Recorder // stands between a rank's coordinator and its agent
	replay func(rank int, rc *rankagent.ReplayConfig)  // adjusts a rank's replay trainer
	mu     sync.Mutex
	events []rankagent.WindowEvent
}

type clusterOpt func(*Config, *rankagent.Config)

func newKey(t *testing.T) []byte {
	k := make([]byte, 32)
	rand.Read(k)
	return k
}

func startCluster(t *testing.T, n int, opts ...clusterOpt) *testCluster {
	return startClusterWith(t, n, nil, opts...)
}

func startClusterWith(t *testing.T, n int, wrap func(int, *rankagent.Agent) Recorder, opts ...clusterOpt) *testCluster {
	tc := &testCluster{t: t, run: fmt.Sprintf("run%d", time.Now().UnixNano()%1e6), key: newKey(t), dir: t.TempDir(), holdAt: 5, wrap: wrap}
	for r := 0; r < n; r++ {
		tc.startRank(r, n, opts...)
	}
	testutil.Eventually(t, 20*time.Second, "every rank to see every rank", func() bool {
		for _, r := range tc.ranks {
			if r != nil && len(r.Coord.Members()) < n {
				return false
			}
		}
		return true
	})
	return tc
}

func (tc *testCluster) startRank(rank, world int, opts ...clusterOpt) {
	t := tc.t
	id := rankagent.Identity{RunName: tc.run, Rank: rank, LocalRank: rank, WorldSize: world, LocalWorldSize: world}
	acfg := rankagent.DefaultConfig(id)
	dir := tc.dir
	acfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(dir, true) }
	sd, err := os.MkdirTemp("", "mc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sd) })
	acfg.Socket = filepath.Join(sd, "s")
	acfg.Spool = filepath.Join(sd, "spool")
	acfg.RetryMin, acfg.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	acfg.Logger = testutil.Logger(t).With("agent", rank)
	acfg.OnWindow = func(ev rankagent.WindowEvent) {
		tc.mu.Lock()
		tc.events = append(tc.events, ev)
		tc.mu.Unlock()
	}
	ccfg := DefaultLocalConfig(id)
	ccfg.SecretKey = tc.key
	ccfg.OpenStore = acfg.OpenStore
	ccfg.Logger = testutil.Logger(t).With("member", rank)
	ccfg.CollectTimeout = 5 * time.Second
	if len(tc.ranks) > 0 {
		for _, r := range tc.ranks {
			if r != nil {
				ccfg.Join = append(ccfg.Join, r.Coord.Addr())
			}
		}
	}
	for _, o := range opts {
		o(&ccfg, &acfg)
	}
	var r *Rank
	if tc.wrap == nil {
		if r, err = NewRank(acfg, ccfg); err != nil {
			t.Fatal(err)
		}
	} else {
		r = &Rank{}
		prev := acfg.OnWindow
		acfg.OnWindow = func(ev rankagent.WindowEvent) { prev(ev); r.Coord.Observe(ev) }
		a, err := rankagent.New(acfg)
		if err != nil {
			t.Fatal(err)
		}
		c, err := New(ccfg, tc.wrap(rank, a))
		if err != nil {
			t.Fatal(err)
		}
		r.Agent, r.Coord = a, c
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	testutil.Eventually(t, 10*time.Second, "the rank's gossip address", func() bool { return r.Coord.Addr() != "" })
	snap, err := os.ReadFile(testutil.Snapshot(t, fmt.Sprintf("ddp4/rank%d.5.memory_snapshot.pickle", rank%4)))
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	rdone := make(chan struct{})
	go func() {
		defer close(rdone)
		rc := rankagent.ReplayConfig{Socket: acfg.Socket, Snapshot: snap, Pace: 20 * time.Millisecond, HoldAt: []int64{tc.holdAt}, Rank: rank, UUID: fmt.Sprintf("GPU-%d", rank)}
		if tc.replay != nil {
			tc.replay(rank, &rc)
		}
		rankagent.Replay(rctx, rc)
	}()
	stop := func() {
		rcancel()
		<-rdone
		cancel()
		<-done
	}
	t.Cleanup(stop)
	for len(tc.ranks) <= rank {
		tc.ranks = append(tc.ranks, nil)
		tc.stops = append(tc.stops, nil)
	}
	tc.ranks[rank], tc.stops[rank] = r, stop
}

// holding waits until every live rank's trainer holds before batch holdAt.
func (tc *testCluster) holding() {
	tc.t.Helper()
	testutil.Eventually(tc.t, 30*time.Second, "every trainer to hold", func() bool {
		for _, r := range tc.ranks {
			if r != nil && r.Agent.Batch() != tc.holdAt-1 {
				return false
			}
		}
		return true
	})
}

// client joins the cluster as the snapshot command does.
func (tc *testCluster) client() *Coordinator {
	t := tc.t
	cfg := DefaultLocalConfig(rankagent.Identity{RunName: tc.run})
	cfg.Client = true
	cfg.SecretKey = tc.key
	cfg.Logger = testutil.Logger(t).With("member", "client")
	for _, r := range tc.ranks {
		if r != nil {
			cfg.Join = append(cfg.Join, r.Coord.Addr())
		}
	}
	c, stop := runMember(t, cfg)
	t.Cleanup(stop)
	testutil.Eventually(t, 20*time.Second, "the client to see a leader", func() bool { _, ok := c.Leader(); return ok })
	return c
}

// runMember starts a member that is not a rank (a client) with cfg; stop ends
// its Run and waits for it.
func runMember(t *testing.T, cfg Config) (c *Coordinator, stop func()) {
	t.Helper()
	c, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	return c, func() { cancel(); <-done }
}

func readManifest(t *testing.T, path string) *publish.Manifest {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := publish.ParseManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestClusterOnDemandWindow: four real agents on loopback form a cluster; a client
// asks for a window; every rank records the same batches, the leader merges them
// straight from the store and publishes, and the client sees each rank's progress.
func TestClusterOnDemandWindow(t *testing.T) {
	tc := startCluster(t, 4)
	tc.holding()
	c := tc.client()
	if l, _ := c.Leader(); l != 0 {
		t.Fatalf("leader %d, want rank 0", l)
	}
	var mu sync.Mutex
	seen := map[int]map[pb.Step]bool{}
	ctx := testutil.Context(t, time.Minute)
	res, err := c.Snapshot(ctx, 3, func(u Update) {
		mu.Lock()
		defer mu.Unlock()
		if seen[u.Rank] == nil {
			seen[u.Rank] = map[pb.Step]bool{}
		}
		seen[u.Rank][u.State] = true
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != 4 || len(res.Missing) != 0 || res.Stop-res.Start != 3 || res.Start < tc.holdAt-1 {
		t.Fatalf("result %+v", res)
	}
	m := readManifest(t, res.Manifest)
	if len(m.RanksMerged) != 4 || m.Window == nil || m.Window.Start != res.Start || fmt.Sprint(m.Batches) != fmt.Sprint([]int64{res.Start, res.Start + 1, res.Start + 2}) {
		t.Fatalf("manifest %+v", m)
	}
	for r := 0; r < 4; r++ {
		for _, st := range []pb.Step{pb.Step_STEP_ACKED, pb.Step_STEP_ARMED, pb.Step_STEP_RECORDING, pb.Step_STEP_UPLOADED} {
			if !seen[r][st] {
				t.Errorf("the client never saw rank %d %s (saw %v)", r, st, seen[r])
			}
		}
	}
	// every rank stored its own analysis beside its snapshot, for the leader to merge from
	if an, _ := filepath.Glob(filepath.Join(tc.dir, tc.run, "torch_memory_traces", "rank*.analysis.json")); len(an) != 4 {
		t.Fatalf("analyses in the store: %v", an)
	}
	var sum analysis.Summary
	b, _ := os.ReadFile(outputEnding(res.Outputs, ".summary.json"))
	if err := jsonUnmarshal(b, &sum); err != nil || len(sum.Ranks) != 4 || sum.Align != merge.AlignOffsets {
		t.Fatalf("summary: %v %+v", err, sum.Align)
	}
	_ = pb.Envelope{}
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// outputEnding finds the output whose name ends in suffix.
func outputEnding(outputs []string, suffix string) string {
	for _, o := range outputs {
		if strings.HasSuffix(o, suffix) {
			return o
		}
	}
	return ""
}

// TestProgressIsTheWindowsStory: the member that asked hears the window's story
// complete and in order, as a user reads its progress: the window planned before
// any rank's step; each rank acked, armed, recording (spooled) and uploaded, in
// that order and once each; every rank uploaded before the leader publishes; and
// nothing of the window after its result. (A rank's steps reach the leader as
// datagrams, apart from its ack, and the leader's messages each travel on a
// stream of their own: the leader tells them in order and the member hears them
// in order.)
func TestProgressIsTheWindowsStory(t *testing.T) {
	const n = 6
	tc := startCluster(t, n)
	tc.holding()
	c := tc.client()
	for round := 0; round < 3; round++ {
		var heard []Update
		var mu sync.Mutex
		res, err := c.Snapshot(testutil.Context(t, 2*time.Minute), 2, func(u Update) {
			mu.Lock()
			heard = append(heard, u)
			mu.Unlock()
		}, nil)
		if err != nil || res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != n {
			t.Fatalf("result %+v %v", res, err)
		}
		mu.Lock()
		story := heard
		heard = nil
		mu.Unlock()
		planned, publishing := -1, -1
		steps := map[int][]pb.Step{}
		uploaded := map[int]int{}
		for i, u := range story {
			switch {
			case u.Rank < 0 && u.State == pb.Step_STEP_PLANNED:
				planned = i
			case u.Rank < 0 && u.State == pb.Step_STEP_PUBLISHING && publishing < 0:
				publishing = i
			case u.Rank >= 0:
				if planned < 0 {
					t.Fatalf("round %d: rank %d %s told before the window was planned", round, u.Rank, StepName(u.State))
				}
				if publishing >= 0 {
					t.Fatalf("round %d: rank %d %s told after the leader said it publishes", round, u.Rank, StepName(u.State))
				}
				if u.State != pb.Step_STEP_QUEUED && u.State != pb.Step_STEP_SENT {
					steps[u.Rank] = append(steps[u.Rank], u.State)
				}
				if u.State == pb.Step_STEP_UPLOADED {
					uploaded[u.Rank] = i
				}
			}
		}
		if planned < 0 || publishing < 0 {
			t.Fatalf("round %d: planned at %d, publishing at %d", round, planned, publishing)
		}
		want := []pb.Step{pb.Step_STEP_ACKED, pb.Step_STEP_ARMED, pb.Step_STEP_RECORDING, pb.Step_STEP_SPOOLED, pb.Step_STEP_UPLOADED}
		for r := 0; r < n; r++ {
			got := slices.DeleteFunc(slices.Clone(steps[r]), func(s pb.Step) bool { return s == pb.Step_STEP_SPOOLED })
			wantNoSpool := slices.DeleteFunc(slices.Clone(want), func(s pb.Step) bool { return s == pb.Step_STEP_SPOOLED })
			if !slices.Equal(got, wantNoSpool) || len(steps[r])-len(got) > 1 {
				t.Errorf("round %d: rank %d's story: %v (want %v, spooled at most once)", round, r, steps[r], want)
			}
		}
	}
}
