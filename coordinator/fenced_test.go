package coordinator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator/client"
	"github.com/memsnap/memsnap/coordinator/commit"
	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/rankagent"
	"github.com/memsnap/memsnap/runlog"
)

// The end-to-end cases of a window's life as one state machine, its store the
// fenced log: real agents and trainers, memberlist on loopback, and a real MinIO
// where the store's behaviour is the point.

// withMinIO points every rank's store at a bucket of m.
func withMinIO(t *testing.T, m testutil.MinIO) clusterOpt {
	bucket := testutil.BucketName(t)
	return func(c *Config, a *rankagent.Config) {
		open := func(ctx context.Context) (store.Store, error) {
			return store.Open(ctx, store.Config{URL: "s3://" + bucket + "/jobs", Endpoint: m.Endpoint,
				Credentials: store.Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}, CreateBucket: true})
		}
		c.OpenStore, a.OpenStore = open, open
	}
}

// storeOf opens the store rank r's agents use.
func (tc *testCluster) storeOf(t *testing.T, r int) store.Store {
	st, err := tc.ranks[r].Coord.cfg.OpenStore(testutil.Context(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// checkLog checks what `memsnap ls` and a leader taking a window over read of
// every window of the run: the state derived from its commit and its outcome,
// which must agree.
func checkLog(t *testing.T, st store.Store, run string) map[uint64]window.Phase {
	t.Helper()
	ctx := testutil.Context(t, time.Minute)
	rl := runlog.New(st, run)
	ids, err := rl.PlanIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64]window.Phase{}
	for _, id := range ids {
		p, err := rl.ReadPlan(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var c *window.Commit
		if m, err := publish.ReadManifest(ctx, st, p.Manifest); err == nil {
			c = commit.Of(m)
		} else if !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
		state := ""
		if o, err := rl.ReadOutcome(ctx, id); err == nil {
			state = o.State
		}
		if !window.Agrees(c, state) {
			t.Fatalf("window %d: the log says %q, the manifest %+v", id, state, c)
		}
		out[id], _ = window.Derive(c, state)
	}
	return out
}

// publishedOnly leaves out of paths the manifests of failed windows (a window
// planned again commits its failure under its own name).
func publishedOnly(t *testing.T, paths []string) []string {
	var out []string
	for _, p := range paths {
		if m := readManifest(t, p); !m.Failed() {
			out = append(out, p)
		}
	}
	return out
}

// TestForgedTermAndIDTakeNothing: a member holding the key sends the ranks one
// message naming the leader with term 2^53, and one plan naming the leader with
// a window id 2^31 past the newest. The term is not believed (the run's log does
// not hold it) and the forged window is withdrawn once a real one meets it, so
// the next window is planned by the real leader and merges every rank.
func TestForgedTermAndIDTakeNothing(t *testing.T) {
	tc := startCluster(t, 3)
	tc.holding()
	c := tc.client()
	lead := tc.ranks[0].Coord
	testutil.Eventually(t, 20*time.Second, "rank 0 to lead under a term every rank believes", func() bool {
		term := lead.Term()
		return lead.IsLeader() && !lead.Busy() && term > 0 && tc.ranks[1].Coord.Term() == term && tc.ranks[2].Coord.Term() == term
	})
	term := lead.Term()
	rank0 := NodeName(tc.run, 0)
	lead.mu.Lock()
	seen := lead.lastWindow
	lead.mu.Unlock()
	bigID := seen + 1<<31
	forge := func(to string, window, term uint64, body any) {
		env := c.envelope(window)
		env.Sender, env.SenderRank, env.Term = rank0, 0, term // the leader's name, as a key holder may write it
		switch b := body.(type) {
		case *pb.Plan:
			env.Body = &pb.Envelope_Plan{Plan: b}
		case *pb.Cancel:
			env.Body = &pb.Envelope_Cancel{Cancel: b}
		}
		if err := c.send(to, env, false); err != nil {
			t.Fatal(err)
		}
	}
	for r := 0; r < 3; r++ {
		to := NodeName(tc.run, r)
		forge(to, seen+1<<20, 1<<53, &pb.Cancel{Reason: "forged"})
		if r > 0 {
			forge(to, bigID, term, &pb.Plan{Start: 1 << 40, Stop: 1<<40 + 3, Reason: "forged", WorldSize: 3, Ranks: []int32{0, 1, 2}})
		}
		barrier(t, c, to)
	}
	testutil.Eventually(t, 20*time.Second, "the forged plan armed on ranks 1 and 2", func() bool {
		for r := 1; r < 3; r++ {
			if w, _, ok := tc.ranks[r].Agent.Current(); !ok || w.ID != bigID {
				return false
			}
		}
		return true
	})
	res, err := c.Snapshot(testutil.Context(t, 2*time.Minute), 2, nil, nil)
	if err != nil || res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != 3 || res.Window >= bigID {
		t.Fatalf("the window after the forgeries: %+v %v", res, err)
	}
	for r, rk := range tc.ranks {
		if got := rk.Coord.Term(); got >= 1<<53 || got < term {
			t.Fatalf("rank %d believes term %d", r, got)
		}
		if last := rk.Agent.LastWindow(); last != res.Window {
			t.Fatalf("rank %d's newest window is %d, not the real %d", r, last, res.Window)
		}
	}
	checkLog(t, tc.storeOf(t, 0), tc.run)
}

// TestLateStoreDoesNotFailTheWindow: MinIO goes away while the ranks record and
// comes back only past the window's deadline. The ranks keep their snapshots in
// their spools and say so; the window waits for them (never "no rank stored a
// snapshot") and is published with every rank once they are stored.
func TestLateStoreDoesNotFailTheWindow(t *testing.T) {
	m := testutil.StartMinIO(t)
	tc := startCluster(t, 3, withMinIO(t, m.MinIO), func(c *Config, a *rankagent.Config) { c.PublishTimeout = 2 * time.Minute })
	tc.holding()
	c := tc.client()
	var deadline atomic.Int64
	var stopped atomic.Bool
	type result struct {
		res *pb.WindowResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := c.Snapshot(testutil.Context(t, 4*time.Minute), 2, func(u Update) {
			if u.State == pb.Step_STEP_PLANNED {
				deadline.Store(u.Deadline.UnixNano())
			}
			if u.Rank >= 0 && u.State == pb.Step_STEP_RECORDING && stopped.CompareAndSwap(false, true) {
				m.Stop()
			}
		}, nil)
		done <- result{res, err}
	}()
	testutil.Eventually(t, time.Minute, "the store gone and the window's deadline passed", func() bool {
		d := deadline.Load()
		return stopped.Load() && d > 0 && time.Now().After(time.Unix(0, d).Add(time.Second))
	})
	m.Start()
	r := <-done
	if r.err != nil || r.res.State != pb.Outcome_OUTCOME_PUBLISHED || len(r.res.Ranks) != 3 {
		t.Fatalf("the window after a store that came back late: %+v %v", r.res, r.err)
	}
	if p := checkLog(t, tc.storeOf(t, 0), tc.run)[r.res.Window]; p != window.Published {
		t.Fatalf("the log says window %d is %v", r.res.Window, p)
	}
}

// TestTwoRanksOneBogusBatch: of two ranks, one reports batch 10^9. No majority
// says which is healthy, so no window is planned, and the request hears why at
// once (it is not planned on the bogus rank alone to fail at its deadline).
func TestTwoRanksOneBogusBatch(t *testing.T) {
	tc := startClusterWith(t, 2, func(r int, a *rankagent.Agent) Recorder {
		if r == 1 {
			return bogusBatch{a}
		}
		return a
	})
	tc.holding()
	start := time.Now()
	res, err := tc.client().Snapshot(testutil.Context(t, time.Minute), 2, nil, nil)
	if err != nil || res.State != pb.Outcome_OUTCOME_FAILED || !strings.Contains(res.Error, "no majority") || res.Window != 0 {
		t.Fatalf("result %+v %v", res, err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("refused after %v", d)
	}
}

// bogusBatch is a rank whose trainer reports batch 10^9.
type bogusBatch struct{ *rankagent.Agent }

func (b bogusBatch) Progress() (int64, time.Duration) { return 1_000_000_000, 20 * time.Millisecond }

// TestWatchAnsweredAtOnce: a member asking how a window ended while the leader
// records another one (a rank holds its plan) is answered at once from the
// run's log, not queued behind the window in progress.
func TestWatchAnsweredAtOnce(t *testing.T) {
	var gate atomic.Pointer[chan struct{}] // while set, rank 1's Arm waits until it is closed
	tc := startClusterWith(t, 2, func(r int, a *rankagent.Agent) Recorder {
		if r == 1 {
			return &gatedArm{Agent: a, gate: &gate}
		}
		return a
	})
	tc.holding()
	c := tc.client()
	first, err := c.Snapshot(testutil.Context(t, time.Minute), 2, nil, nil)
	if err != nil || first.State != pb.Outcome_OUTCOME_PUBLISHED {
		t.Fatalf("the first window: %+v %v", first, err)
	}
	hold := make(chan struct{})
	gate.Store(&hold)
	defer func() {
		gate.Store(nil)
		close(hold)
	}()
	planned := make(chan uint64, 1)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		c.Snapshot(testutil.Context(t, 2*time.Minute), 2, func(u Update) {
			if u.State == pb.Step_STEP_PLANNED {
				select {
				case planned <- u.Window:
				default:
				}
			}
		}, nil)
	}()
	second := <-planned
	ch, seq := c.expect(16, nil)
	defer c.forget(seq)
	env := c.envelope(first.Window)
	env.Seq = seq
	env.Body = &pb.Envelope_Request{Request: &pb.SnapshotRequest{Watch: true, Kind: pb.WindowKind_WINDOW_KIND_WINDOW}}
	if err := c.send(NodeName(tc.run, 0), env, true); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case got := <-ch:
			if r := got.GetWindowResult(); r != nil {
				if r.State != pb.Outcome_OUTCOME_PUBLISHED || r.Window != first.Window {
					t.Fatalf("the watch of window %d: %+v", first.Window, r)
				}
				select {
				case <-ended:
					t.Fatalf("the watch was answered only once window %d ended", second)
				default:
				}
				return
			}
		case <-ended:
			t.Fatalf("window %d ended before the watch of window %d was answered", second, first.Window)
		}
	}
}

// TestFloodDoesNotLoseARequest: 3,000 connections that never speak (no key is
// needed to open them) hold every stream place the leader has, for the whole of
// memberlist's read time-out. A request made then is not lost: the quiet
// streams make room, and the member asks again after a silence.
func TestFloodDoesNotLoseARequest(t *testing.T) {
	tc := startCluster(t, 2, func(c *Config, a *rankagent.Config) {
		c.Memberlist.TCPTimeout = 30 * time.Second // production's is 10 s: the flood holds its places throughout
	})
	tc.holding()
	c := tc.client()
	var conns []net.Conn
	defer func() {
		for _, cn := range conns {
			cn.Close()
		}
	}()
	for i := 0; i < 3000; i++ {
		cn, err := net.Dial("tcp", tc.ranks[0].Coord.Addr())
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, cn)
	}
	// every place taken: a stream of the client's own finds none (its bytes are
	// read unanswered, or it is closed at once)
	res, err := c.Snapshot(testutil.Context(t, 90*time.Second), 2, nil, nil)
	if err != nil || res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != 2 {
		t.Fatalf("a request during the flood: %+v %v", res, err)
	}
}

// TestWaitAllNotToldFailed: the leader dies at its first write of the detail,
// the answer out; the next leader finds the store refusing writes for a while.
// A member waiting for everything is never told the window failed: it waits,
// and hears it published once the store takes writes again.
func TestWaitAllNotToldFailed(t *testing.T) {
	trip := &trip{n: int32(len(publicationWrites) - 3), tripped: make(chan struct{}), release: make(chan struct{})} // the pickle
	var readOnly atomic.Bool
	tc := startCluster(t, 3, func(c *Config, a *rankagent.Config) {
		if c.Identity.Rank == 0 {
			trip.wrap(c)
		} else {
			refuseWrites(c, func(key string) error {
				if readOnly.Load() {
					return fmt.Errorf("%w: the store is read-only", store.ErrAccess)
				}
				return nil
			})
		}
	})
	tc.holding()
	c := tc.client()
	type result struct {
		res *pb.WindowResult
		err error
	}
	done := make(chan result, 1)
	var answered atomic.Bool
	var unsure atomic.Int32 // times the new leader said it cannot tell yet
	go func() {
		res, err := c.Request(testutil.Context(t, 3*time.Minute), 2, RequestOptions{Progress: func(u Update) {
			if u.Answer != nil {
				answered.Store(true)
			}
			if strings.HasPrefix(u.Reason, "the leader cannot tell yet") {
				unsure.Add(1)
			}
		}})
		done <- result{res, err}
	}()
	<-trip.tripped
	testutil.Eventually(t, 30*time.Second, "the member to hear the answer", answered.Load)
	readOnly.Store(true)
	tc.ranks[0].Coord.Shutdown() // no goodbye: it dies
	tc.stops[0]()
	testutil.Eventually(t, 30*time.Second, "rank 1 to lead", func() bool { return tc.ranks[1].Coord.IsLeader() })
	// more times than a member asks a leader that cannot tell before it gives up
	// on a window it has no answer of
	testutil.Eventually(t, 2*time.Minute, "the new leader to say more than client.UnknownTries times that it cannot tell", func() bool {
		select {
		case r := <-done:
			t.Fatalf("the member stopped waiting while the store refused writes: %+v %v", r.res, r.err)
		default:
		}
		return unsure.Load() > client.UnknownTries
	})
	readOnly.Store(false)
	r := <-done
	if r.err != nil || r.res.State != pb.Outcome_OUTCOME_PUBLISHED || r.res.Pending || r.res.Error != "" {
		t.Fatalf("the member waiting for everything: %+v %v", r.res, r.err)
	}
	st, _ := store.OpenDir(tc.dir, false)
	checkLog(t, st, tc.run)
}

// TestCommandNeverSentIsSentAgain: a leader that dies after it recorded a
// window's plan and before its command reached any rank leaves a window nobody
// heard of. The next leader sends the command again to the ranks that never heard
// of it and can still record it: the window asked for is recorded and published
// (it was failed as "no rank stored a snapshot", and the request planned again).
func TestCommandNeverSentIsSentAgain(t *testing.T) {
	trip := &trip{n: 1, tripped: make(chan struct{}), release: make(chan struct{})} // the plan
	tc := startCluster(t, 3, func(c *Config, a *rankagent.Config) {
		if !c.Client && c.Identity.Rank == 0 {
			trip.wrap(c)
		}
	})
	tc.holding()
	c := tc.client()
	type result struct {
		res *pb.WindowResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := c.Snapshot(testutil.Context(t, 3*time.Minute), 3, nil, nil)
		done <- result{res, err}
	}()
	<-trip.tripped // the plan is in the log; its command has gone nowhere
	tc.ranks[0].Coord.Shutdown()
	tc.stops[0]()
	r := <-done
	if r.err != nil || r.res.State != pb.Outcome_OUTCOME_PUBLISHED || r.res.Window != 1 || fmt.Sprint(r.res.Ranks) != "[1 2]" {
		t.Fatalf("the window asked for: %+v %v", r.res, r.err)
	}
	st := tc.storeOf(t, 1)
	if got := checkLog(t, st, tc.run); len(got) != 1 || got[1] != window.Published {
		t.Fatalf("the run's log: %v", got)
	}
}
