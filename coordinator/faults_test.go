package coordinator

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/rankagent"
	"github.com/memsnap/memsnap/runlog"
)

// TestRankDiesMidWindow: a non-leader agent stops in the middle of a window; the
// other ranks' window completes at the deadline with that rank listed missing.
func TestRankDiesMidWindow(t *testing.T) {
	tc := hangingCluster(t, 3, 2)
	tc.holding()
	c := tc.client()
	var killed atomic.Bool
	res, err := c.Snapshot(testutil.Context(t, time.Minute), 3, func(u Update) {
		if u.Rank == 2 && u.State == pb.Step_STEP_RECORDING && killed.CompareAndSwap(false, true) {
			go tc.stops[2]()
		}
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || fmt.Sprint(res.Ranks) != "[0 1]" || res.Missing[2] == "" {
		t.Fatalf("result %+v", res)
	}
	m := readManifest(t, res.Manifest)
	if fmt.Sprint(m.MissingRanks) != "[2]" || m.MissingReasons["2"] == "" {
		t.Fatalf("manifest missing %v %v", m.MissingRanks, m.MissingReasons)
	}
}

// TestLeaderDiesMidWindow: the leader stops after the plan went out; the next rank
// takes over, finishes the window from the ranks' status and stored snapshots, and
// exactly one set of merged outputs exists.
func TestLeaderDiesMidWindow(t *testing.T) {
	tc := hangingCluster(t, 3, 0)
	tc.holding()
	c := tc.client()
	var killed atomic.Bool
	res, err := c.Snapshot(testutil.Context(t, 2*time.Minute), 3, func(u Update) {
		if u.Rank == 0 && u.State == pb.Step_STEP_RECORDING && killed.CompareAndSwap(false, true) {
			go tc.stops[0]()
		}
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || fmt.Sprint(res.Ranks) != "[1 2]" || res.Missing[0] == "" {
		t.Fatalf("result %+v", res)
	}
	manifests, _ := filepath.Glob(filepath.Join(tc.dir, tc.run, "torch_memory_traces", "window*", "*.manifest.json"))
	if manifests = publishedOnly(t, manifests); len(manifests) != 1 {
		t.Fatalf("manifests: %v", manifests)
	}
	if l, _ := tc.ranks[1].Coord.Leader(); l != 1 {
		t.Fatalf("leader %d, want 1", l)
	}
}

// passing is a recorder whose trainer is past the start of the first n windows
// planned (a plan arrives directly and through gossip: each window counts once).
type passing struct {
	*rankagent.Agent
	mu   sync.Mutex
	n    int
	seen map[uint64]bool
}

func (p *passing) Arm(w rankagent.Window) error {
	p.mu.Lock()
	if p.seen == nil {
		p.seen = map[uint64]bool{}
	}
	pass, ok := p.seen[w.ID]
	if !ok {
		pass = p.n > 0
		p.n--
		p.seen[w.ID] = pass
	}
	p.mu.Unlock()
	if pass {
		return fmt.Errorf("%w: (test) the trainer ran ahead", rankagent.ErrPassed)
	}
	return p.Agent.Arm(w)
}

// TestRankPastTheStart: a rank past the window's start makes the leader plan once
// more; a rank past it twice is left out, and says why.
func TestRankPastTheStart(t *testing.T) {
	for _, times := range []int64{1, 2} {
		t.Run(fmt.Sprint(times), func(t *testing.T) {
			tc := startClusterWith(t, 3, func(r int, a *rankagent.Agent) Recorder {
				p := &passing{Agent: a}
				if r == 1 {
					p.n = int(times)
				}
				return p
			})
			tc.holding()
			c := tc.client()
			var mu sync.Mutex
			plans := 0
			res, err := c.Snapshot(testutil.Context(t, time.Minute), 2, func(u Update) {
				if u.Rank < 0 && u.State == pb.Step_STEP_PLANNED {
					mu.Lock()
					plans++
					mu.Unlock()
				}
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if plans != 2 {
				t.Fatalf("%d plans, want 2", plans)
			}
			switch times {
			case 1:
				if res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != 3 {
					t.Fatalf("re-planned window: %+v", res)
				}
			case 2:
				if res.State != pb.Outcome_OUTCOME_PUBLISHED || fmt.Sprint(res.Ranks) != "[0 2]" || !strings.Contains(res.Missing[1], "past the window's start") {
					t.Fatalf("a rank past the start twice: %+v", res)
				}
			}
		})
	}
}

// TestClockSkew: a rank whose clock runs 250 ms ahead of the leader's measures an
// offset within the measured round trip of 250 ms, and its snapshot's metadata and
// the merged summary carry it.
func TestClockSkew(t *testing.T) {
	const skew = 250 * time.Millisecond
	tc := startCluster(t, 2, func(c *Config, a *rankagent.Config) {
		if c.Identity.Rank == 1 {
			c.Now = func() time.Time { return time.Now().Add(skew) }
		}
	})
	var off, rtt time.Duration
	testutil.Eventually(t, 20*time.Second, "a clock measurement", func() bool {
		var ok bool
		off, rtt, ok = tc.ranks[1].Coord.ClockOffset()
		return ok
	})
	if d := off - skew; d < -rtt || d > rtt {
		t.Fatalf("offset %v for a skew of %v, more than the round trip %v away", off, skew, rtt)
	}
	t.Logf("measured offset %v (skew %v), round trip %v", off, skew, rtt)
	tc.holding()
	c := tc.client()
	res, err := c.Snapshot(testutil.Context(t, time.Minute), 2, nil, nil)
	if err != nil || res.State != pb.Outcome_OUTCOME_PUBLISHED {
		t.Fatalf("%+v %v", res, err)
	}
	b, err := os.ReadFile(outputEnding(res.Outputs, ".summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sum analysis.Summary
	if err := jsonUnmarshal(b, &sum); err != nil {
		t.Fatal(err)
	}
	got := time.Duration(sum.ClockOffsetsUS["1"]) * time.Microsecond
	if d := got - skew; d < -rtt-5*time.Millisecond || d > rtt+5*time.Millisecond || sum.ClockOffsetsUS["0"] != 0 {
		t.Fatalf("summary offsets %v, want rank 1 near %v", sum.ClockOffsetsUS, skew)
	}
}

// TestOutsidersAreNotAdmitted: a member with another key, with none, or of another
// run cannot join: its join is refused, and every member still sees exactly the
// two ranks. (What such a member sends, once refused, is TestForgedMessagesChangeNothing.)
func TestOutsidersAreNotAdmitted(t *testing.T) {
	tc := startCluster(t, 2)
	for name, tune := range map[string]func(*Config){
		"wrong key": func(c *Config) { c.SecretKey = newKey(t) },
		"no key":    func(c *Config) { c.SecretKey, c.Insecure = nil, true },
		"other run": func(c *Config) { c.Identity.RunName = tc.run + "x" },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := DefaultLocalConfig(rankagent.Identity{RunName: tc.run})
			cfg.Client, cfg.SecretKey, cfg.Logger = true, tc.key, testutil.Logger(t)
			cfg.Join = []string{tc.ranks[0].Coord.Addr()}
			tune(&cfg)
			c, err := New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.start(); err != nil {
				t.Fatal(err)
			}
			defer c.Shutdown()
			if n, err := c.ml.Join(cfg.Join); n != 0 || err == nil {
				t.Fatalf("joined %d members", n)
			}
			for _, r := range tc.ranks {
				if len(r.Coord.Members()) != 2 {
					t.Fatalf("rank sees %d members", len(r.Coord.Members()))
				}
			}
		})
	}
}

// TestOOMPostmortem: one rank's trainer hits an OOM; the leader at once asks every
// rank for its allocator state, and the merged post-mortem holds every rank: the
// OOM rank's snapshot taken at the OOM, the others' taken then.
func TestOOMPostmortem(t *testing.T) {
	tc := &testCluster{t: t, run: fmt.Sprintf("run%d", time.Now().UnixNano()%1e6), key: newKey(t), dir: t.TempDir(), holdAt: 5,
		replay: func(rank int, rc *rankagent.ReplayConfig) {
			if rank == 2 {
				rc.OOMAt, rc.HoldAt = 3, nil
			}
		}}
	for r := 0; r < 3; r++ {
		tc.startRank(r, 3)
	}
	var m *publish.Manifest
	testutil.Eventually(t, time.Minute, "a published post-mortem", func() bool {
		ms, _ := filepath.Glob(filepath.Join(tc.dir, tc.run, "torch_memory_traces", "window*", "merged.manifest.json"))
		if ms = publishedOnly(t, ms); len(ms) != 1 {
			return false
		}
		m = readManifest(t, ms[0])
		return true
	})
	if m.Reason != "OOM post-mortem: rank 2 failed first (out of memory)" || m.Kind != "oom" || fmt.Sprint(m.RanksMerged) != "[0 1 2]" || len(m.MissingRanks) != 0 {
		t.Fatalf("manifest %+v", m)
	}
	if len(m.Findings) == 0 || !strings.HasPrefix(m.Findings[0], "rank 2, which this window was taken for (failed first: out of memory): peak ") {
		t.Fatalf("the post-mortem's findings do not lead with the rank that failed first: %q", m.Findings)
	}
	for _, in := range m.Inputs {
		want := ".postmortem.pickle"
		if in.Rank == 2 {
			want = ".oom.pickle"
		}
		if !strings.HasSuffix(in.Source, want) {
			t.Fatalf("rank %d's input %s, want a %s", in.Rank, in.Source, want)
		}
	}
	// the leader's view carries rank 2's OOM, at the batch it hit it (memsnap top says it)
	var incs []*pb.RankIncident
	for _, r := range tc.ranks {
		if r.Coord.IsLeader() {
			incs = r.Coord.View().Incidents
		}
	}
	if len(incs) != 1 || incs[0].Rank != 2 || incs[0].Kind != pb.WindowKind_WINDOW_KIND_OOM || incs[0].Batch != 3 || incs[0].Cause != "out of memory" {
		t.Fatalf("the leader's view's incidents: %v", incs)
	}
	// rank 2's agent is gone; an alert about it comes late: the alert's window
	// says where rank 2's history is, the post-mortem
	tc.stops[2]()
	testutil.Eventually(t, time.Minute, "rank 2 gone from the leader's view", func() bool {
		for _, r := range tc.ranks[:2] {
			if r.Coord.IsLeader() {
				return !slices.ContainsFunc(r.Coord.Members(), func(n *pb.NodeMeta) bool { return n.GetRank() == 2 })
			}
		}
		return false
	})
	res, err := tc.client().Request(testutil.Context(t, time.Minute), 2, RequestOptions{Reason: runlog.ReasonAlert + "MemsnapLowHeadroom (rank 2)"})
	if err != nil || res.State != pb.Outcome_OUTCOME_PUBLISHED {
		t.Fatalf("the alert's window: %v %+v", err, res)
	}
	am := readManifest(t, res.Manifest)
	want := fmt.Sprintf("; its history is in oom post-mortem window %d, which it failed first (out of memory)", m.Window.ID)
	if len(am.Findings) == 0 || !strings.HasPrefix(am.Findings[0], "rank 2, which this window was taken for (alerted: MemsnapLowHeadroom (rank 2)): its snapshot is missing: ") ||
		!strings.HasSuffix(am.Findings[0], want) {
		t.Fatalf("the alert's window's first finding does not point to the post-mortem: %q", am.Findings)
	}
}

// TestSchedule: with Composer's schedule the leader records by itself once every
// rank's trainer runs: once, or every N batches.
func TestSchedule(t *testing.T) {
	for _, every := range []int64{0, 40} {
		t.Run(fmt.Sprint("every ", every), func(t *testing.T) {
			tc := startCluster(t, 3, func(c *Config, a *rankagent.Config) {
				c.Schedule = Schedule{Enabled: true, Skip: 2, Every: every}
				c.WindowBatches = 2
			})
			want := 1
			if every > 0 {
				want = 2
			}
			var ms []string
			testutil.Eventually(t, 2*time.Minute, fmt.Sprintf("%d scheduled windows", want), func() bool {
				ms, _ = filepath.Glob(filepath.Join(tc.dir, tc.run, "torch_memory_traces", "window*", "merged.manifest.json"))
				ms = publishedOnly(t, ms)
				return len(ms) >= want
			})
			var starts []int64
			for _, p := range ms {
				m := readManifest(t, p)
				if m.Reason != "schedule" || len(m.RanksMerged) != 3 || m.Window.Stop-m.Window.Start != 2 {
					t.Fatalf("%s: %+v", p, m)
				}
				starts = append(starts, m.Window.Start)
			}
			// the second starts on the grid 2 + k*40 after the first, or later if it could not make it
			if every > 0 && (starts[0] < 2 || starts[1] < 42 || starts[1] < starts[0]+2) {
				t.Fatalf("window starts %v for a window every %d batches from batch 2", starts, every)
			}
		})
	}
}

// hangingCluster is a cluster whose rank hang's trainer gets stuck in the first
// batch of a window, so the test can stop that rank mid-window whatever the
// machine's speed.
func hangingCluster(t *testing.T, n, hang int) *testCluster {
	tc := &testCluster{t: t, run: fmt.Sprintf("run%d", time.Now().UnixNano()%1e6), key: newKey(t), dir: t.TempDir(), holdAt: 5,
		replay: func(rank int, rc *rankagent.ReplayConfig) { rc.HangInWindow = rank == hang }}
	for r := 0; r < n; r++ {
		tc.startRank(r, n)
	}
	testutil.Eventually(t, 20*time.Second, "every rank to see every rank", func() bool {
		for _, r := range tc.ranks {
			if len(r.Coord.Members()) < n {
				return false
			}
		}
		return true
	})
	return tc
}

// TestSnapshotAsksPastAnUnreachableLeader: the leader dies without a goodbye just
// before a member asks for a window, so gossip still names it and the request
// cannot reach it. The request is asked again until the next leader takes it,
// not failed with the dial error (seen in CI, where a rewatch hit a dead leader).
func TestSnapshotAsksPastAnUnreachableLeader(t *testing.T) {
	tc := startCluster(t, 3)
	tc.holding()
	c := tc.client()
	testutil.Eventually(t, 20*time.Second, "the client to see rank 0 lead", func() bool { l, ok := c.Leader(); return ok && l == 0 })
	tc.ranks[0].Coord.Shutdown() // no goodbye: it dies
	tc.stops[0]()
	if l, ok := c.Leader(); !ok || l != 0 {
		t.Skipf("gossip already named the next leader (%d): nothing to test", l)
	}
	var unreachable atomic.Bool
	res, err := c.Snapshot(testutil.Context(t, 2*time.Minute), 3, func(u Update) {
		if strings.Contains(u.Reason, "could not reach the leader") {
			unreachable.Store(true)
		}
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !unreachable.Load() {
		t.Fatal("the client never said it could not reach the leader")
	}
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || fmt.Sprint(res.Ranks) != "[1 2]" {
		t.Fatalf("result %+v", res)
	}
}

// refusingStore fails the writes refuse names (an error), as a full or absent
// store does for them.
type refusingStore struct {
	store.Store
	refuse func(key string) error
}

func (s refusingStore) Put(ctx context.Context, key string, r io.Reader, opts store.PutOptions) (store.ObjectInfo, error) {
	if err := s.refuse(key); err != nil {
		return store.ObjectInfo{}, err
	}
	return s.Store.Put(ctx, key, r, opts)
}

// refuseWrites makes every store the member opens a refusingStore.
func refuseWrites(c *Config, refuse func(key string) error) {
	wrapStores(c, func(st store.Store) store.Store { return refusingStore{st, refuse} })
}

// TestFailedOutcomeNotWritten: a window nothing was stored for is committed as
// failed by its manifest; an outcome the store refuses changes nothing (it is
// an index of the commit), and a failure that cannot be committed is told as
// unfinished, not failed.
func TestFailedOutcomeNotWritten(t *testing.T) {
	for _, what := range []string{"outcome", "manifest"} {
		t.Run(what, func(t *testing.T) {
			tc := &testCluster{t: t, run: fmt.Sprintf("run%d", time.Now().UnixNano()%1e6), key: newKey(t), dir: t.TempDir(), holdAt: 5,
				replay: func(rank int, rc *rankagent.ReplayConfig) { rc.HangInWindow = true }}
			tc.startRank(0, 1, func(c *Config, a *rankagent.Config) {
				c.PublishTimeout = 3 * time.Second
				// the window's outcome, or its commit, as a full store refuses it
				refuseWrites(c, func(key string) error {
					if what == "outcome" && strings.Contains(key, "/memsnap/outcomes/") || what == "manifest" && strings.HasSuffix(key, ".manifest.json") {
						return fmt.Errorf("%w: no space left on device", store.ErrAccess)
					}
					return nil
				})
			})
			tc.holding()
			res, err := tc.client().Snapshot(testutil.Context(t, 2*time.Minute), 3, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			switch what {
			case "outcome":
				// the commit is the failed manifest: the outcome is only its index
				if res.State != pb.Outcome_OUTCOME_FAILED || !strings.Contains(res.Error, "no rank stored") {
					t.Fatalf("result %+v", res)
				}
				st, _ := store.OpenDir(tc.dir, false)
				if m, err := publish.ReadManifest(context.Background(), st, strings.TrimPrefix(res.Manifest, tc.dir+"/")); err != nil || !m.Failed() {
					t.Fatalf("the failed window's manifest: %+v %v", m, err)
				}
			case "manifest":
				// its failure cannot be committed: it is not finished, and not failed
				if res.State != pb.Outcome_OUTCOME_UNFINISHED || !strings.Contains(res.Error, "cannot be committed") {
					t.Fatalf("result %+v", res)
				}
			}
		})
	}
}

// TestDetailNeverWritten: the store fails for the whole PublishTimeout while the
// merged pickle is written, after the answer was published. The member waiting
// for everything hears what is true: the answer is published, the rest pending,
// and why; not that the window failed.
func TestDetailNeverWritten(t *testing.T) {
	tc := &testCluster{t: t, run: fmt.Sprintf("run%d", time.Now().UnixNano()%1e6), key: newKey(t), dir: t.TempDir(), holdAt: 5}
	tc.startRank(0, 1, func(c *Config, a *rankagent.Config) {
		c.PublishTimeout = 2 * time.Second
		// the merged pickles: the store is away for them
		refuseWrites(c, func(key string) error {
			if strings.Contains(key, "/merged.") && (strings.HasSuffix(key, ".pickle") || strings.HasSuffix(key, ".pb")) {
				return fmt.Errorf("%w: injected", store.ErrUnreachable)
			}
			return nil
		})
	})
	tc.holding()
	res, err := tc.client().Snapshot(testutil.Context(t, 2*time.Minute), 3, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || !res.Pending || !strings.Contains(res.Error, "the answer is published") || res.Manifest == "" {
		t.Fatalf("result %+v", res)
	}
}

// TestQueuedRequestIsTold: a request that arrives while another window is in
// progress waits for it, and its member hears so at once (a window finished by a
// new leader may wait for its deadline), not silence.
func TestQueuedRequestIsTold(t *testing.T) {
	tc := hangingCluster(t, 2, 1)
	tc.holding()
	c := tc.client()
	planned := make(chan struct{})
	var once sync.Once
	go c.Snapshot(testutil.Context(t, time.Minute), 3, func(u Update) {
		if u.State == pb.Step_STEP_PLANNED {
			once.Do(func() { close(planned) })
		}
	}, nil)
	select {
	case <-planned:
	case <-time.After(time.Minute):
		t.Fatal("the first window was not planned")
	}
	told := make(chan string, 16)
	ctx := testutil.Context(t, time.Minute)
	go c.Snapshot(ctx, 3, func(u Update) {
		if u.Rank < 0 && strings.HasPrefix(u.Reason, "waiting: ") {
			told <- u.Reason
		}
	}, nil)
	select {
	case why := <-told:
		if !strings.Contains(why, "window 1 is in progress") {
			t.Fatalf("told %q", why)
		}
	case <-time.After(time.Minute):
		t.Fatal("the queued request heard nothing")
	}
}

// TestScheduleNotRepeatedByARestartedLeader: the once-only scheduled window is
// recorded; the leader's agent is then restarted. The new leader reads in the
// run's log that the schedule is done and does not plan it again (which would
// stall every rank for a window nobody asked for): two windows asked for after
// the restart are the only windows planned.
func TestScheduleNotRepeatedByARestartedLeader(t *testing.T) {
	sched := func(c *Config, a *rankagent.Config) {
		c.Schedule = Schedule{Enabled: true, Skip: 2}
		c.WindowBatches = 2
	}
	tc := startCluster(t, 3, sched)
	testutil.Eventually(t, 2*time.Minute, "the scheduled window published", func() bool {
		ms, _ := filepath.Glob(filepath.Join(tc.dir, tc.run, "torch_memory_traces", "window*", "merged.manifest.json"))
		return len(publishedOnly(t, ms)) == 1
	})
	st, _ := store.OpenDir(tc.dir, false)
	rl := runlog.New(st, tc.run)
	testutil.Eventually(t, time.Minute, "the scheduled window's outcome in the run's log", func() bool {
		_, err := rl.ReadOutcome(context.Background(), 1)
		return err == nil
	})
	old := tc.ranks[0].Coord.Term()
	tc.ranks[0].Coord.Shutdown()
	tc.stops[0]()
	tc.startRank(0, 3, sched)
	testutil.Eventually(t, time.Minute, "the restarted rank 0 to lead under a newer term", func() bool {
		return tc.ranks[0].Coord.IsLeader() && tc.ranks[0].Coord.Term() > old
	})
	// the windows below are asked of the restarted leader once every rank knows
	// its new address: until memberlist takes the old incarnation's address
	// away, the successor pings that and may lead in its place for a moment
	// (leadership flapping between the two is not what this test is about)
	testutil.Eventually(t, time.Minute, "every rank to know the restarted rank 0's address", func() bool {
		return tc.memberlistKnows(0) && tc.ranks[0].Coord.IsLeader()
	})
	c := tc.client()
	for i := 0; i < 2; i++ {
		if res, err := c.Snapshot(testutil.Context(t, 2*time.Minute), 2, nil, nil); err != nil || res.State != pb.Outcome_OUTCOME_PUBLISHED {
			t.Fatalf("window %d asked for after the restart: %+v %v", i+1, res, err)
		}
	}
	plans, err := rl.Latest(context.Background(), 16)
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	scheduled := 0
	for i := len(plans) - 1; i >= 0; i-- {
		reasons = append(reasons, plans[i].Reason)
		if plans[i].Reason == "schedule" {
			scheduled++
		}
	}
	// (a request's window may be planned twice: a rank past its start)
	if scheduled != 1 || reasons[0] != "schedule" {
		t.Fatalf("windows planned, oldest first: %v", reasons)
	}
}

// TestNoSilentWaits: while a rank of the world is absent the member that asked
// hears what the leader waits for and until when. A rank whose agent has not
// joined yet is waited for while the cluster is young (agents of one job start
// seconds apart, and a script may ask at once): it arrives and is in the window.
// Once the cluster is older than JoinGrace, a request is not held for a rank
// that never joined (waiting cannot help, and the user asked now): it is planned
// at once and the member hears why. For a rank that was a member, the leader
// waits out its JoinGrace from when it went, and says so; a request made later
// is not held for it.
func TestNoSilentWaits(t *testing.T) {
	heard := func(c *Coordinator, got chan<- string) func(Update) {
		return func(u Update) {
			if u.Rank < 0 && u.State == pb.Step_STEP_UNSPECIFIED {
				select {
				case got <- u.Reason:
				default:
				}
			}
		}
	}
	t.Run("young cluster", func(t *testing.T) {
		tc := &testCluster{t: t, run: fmt.Sprintf("run%d", time.Now().UnixNano()%1e6), key: newKey(t), dir: t.TempDir(), holdAt: 5}
		grace := func(c *Config, a *rankagent.Config) { c.JoinGrace = 10 * time.Minute }
		for r := 0; r < 3; r++ {
			tc.startRank(r, 4, grace) // rank 3 of 4 starts late
		}
		tc.holding()
		c := tc.client()
		got := make(chan string, 16)
		type answer struct {
			res *pb.WindowResult
			err error
		}
		done := make(chan answer, 1)
		go func() {
			res, err := c.Snapshot(testutil.Context(t, 2*time.Minute), 2, heard(c, got), nil)
			done <- answer{res, err}
		}()
		select {
		case why := <-got:
			if !strings.Contains(why, "waiting for ranks 3 to join (until ") {
				t.Fatalf("the member heard %q", why)
			}
		case a := <-done:
			t.Fatalf("answered before rank 3 was waited for: %+v %v", a.res, a.err)
		}
		tc.startRank(3, 4, grace)
		a := <-done
		if a.err != nil || a.res.State != pb.Outcome_OUTCOME_PUBLISHED || len(a.res.Ranks) != 4 {
			t.Fatalf("the window with rank 3 late: %+v %v", a.res, a.err)
		}
	})
	t.Run("never joined", func(t *testing.T) {
		tc := &testCluster{t: t, run: fmt.Sprintf("run%d", time.Now().UnixNano()%1e6), key: newKey(t), dir: t.TempDir(), holdAt: 5}
		const joinGrace = 2 * time.Second
		began := time.Now()
		grace := func(c *Config, a *rankagent.Config) { c.JoinGrace = joinGrace }
		for r := 0; r < 3; r++ {
			tc.startRank(r, 4, grace) // rank 3 of 4 never starts
		}
		tc.holding()
		testutil.Eventually(t, time.Minute, "the cluster older than its JoinGrace", func() bool { return time.Since(began) > joinGrace })
		c := tc.client()
		var heardAll []string
		var mu sync.Mutex
		res, err := c.Snapshot(testutil.Context(t, time.Minute), 2, func(u Update) {
			if u.Rank < 0 && u.State == pb.Step_STEP_UNSPECIFIED {
				mu.Lock()
				heardAll = append(heardAll, u.Reason)
				mu.Unlock()
			}
		}, nil)
		if err != nil || res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != 3 || res.Missing[3] == "" {
			t.Fatalf("a window with rank 3 never joined: %+v %v", res, err)
		}
		mu.Lock()
		said := strings.Join(heardAll, "\n")
		mu.Unlock()
		if !strings.Contains(said, "ranks 3 never joined this cluster: planning without them") || strings.Contains(said, "waiting for") {
			t.Fatalf("the member heard: %q", said)
		}
		// a rank that was a member goes away: the leader waits, and says so
		tc.ranks[2].Coord.Shutdown()
		tc.stops[2]()
		testutil.Eventually(t, 30*time.Second, "rank 2 gone from the leader's view", func() bool { return len(tc.ranks[0].Coord.Members()) <= 3 })
		got := make(chan string, 16)
		ctx, cancel := context.WithCancel(testutil.Context(t, time.Minute))
		defer cancel()
		go c.Snapshot(ctx, 2, heard(c, got), nil)
	wait:
		for {
			select {
			case why := <-got:
				if strings.HasPrefix(why, "waiting for ranks") {
					if !strings.Contains(why, "waiting for ranks 2 to join (until ") {
						t.Fatalf("the member heard %q", why)
					}
					break wait
				}
			case <-ctx.Done():
				t.Fatal("the member heard nothing while the leader waits for rank 2")
			}
		}
		cancel()
		// once rank 2 has been gone longer than JoinGrace, a request is not held
		// for it again (the grace runs from when it went, not from each request)
		name := NodeName(tc.run, 2)
		testutil.Eventually(t, time.Minute, "rank 2 gone longer than JoinGrace", func() bool {
			return time.Since(tc.ranks[0].Coord.goneAt(name, time.Now())) > joinGrace
		})
		heardAll = nil
		res, err = c.Snapshot(testutil.Context(t, time.Minute), 2, func(u Update) {
			if u.Rank < 0 && u.State == pb.Step_STEP_UNSPECIFIED {
				mu.Lock()
				heardAll = append(heardAll, u.Reason)
				mu.Unlock()
			}
		}, nil)
		if err != nil || res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != 2 || res.Missing[2] == "" {
			t.Fatalf("a window with rank 2 long gone: %+v %v", res, err)
		}
		mu.Lock()
		said = strings.Join(heardAll, "\n")
		mu.Unlock()
		if strings.Contains(said, "waiting for") {
			t.Fatalf("the member was held for a rank gone longer than JoinGrace: %q", said)
		}
	})
}

// memberlistKnows reports whether every other rank's memberlist gives rank r's
// name its address now. It asks each rank's coordinator, not memberlist:
// memberlist.Members returns memberlist's own records, whose address it rewrites
// under its lock when it takes up a new incarnation, so reading them races. The
// coordinator copies each record memberlist hands it (under that lock), and
// memberlist has taken up the address when the coordinator knows rank r there
// and no move of r is pending (a move ends on memberlist's news of the new
// incarnation: moved.go).
func (tc *testCluster) memberlistKnows(r int) bool {
	addr, name := tc.ranks[r].Coord.Addr(), tc.ranks[r].Coord.Name()
	for i, o := range tc.ranks {
		if i == r || o == nil {
			continue
		}
		if at, moving := o.Coord.knownAt(name); at != addr || moving {
			return false
		}
	}
	return true
}

// knownAt is the address this member knows name at ("" when not a member) and
// whether a move of name is pending.
func (c *Coordinator) knownAt(name string) (addr string, moving bool) {
	c.moves.mu.Lock()
	_, moving = c.moves.from[name]
	c.moves.mu.Unlock()
	return c.memberNamed(name).addr, moving
}
