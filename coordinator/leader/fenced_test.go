package leader

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/rankagent"
	"github.com/memsnap/memsnap/runlog"
)

// TestStaleLeaderPlansNothing: a leader whose term was superseded while it was
// cut off cannot plan a window in the run's log, on MinIO as on a folder.
func TestStaleLeaderPlansNothing(t *testing.T) {
	for _, kind := range []string{"folder", "minio"} {
		t.Run(kind, func(t *testing.T) {
			var st store.Store
			if kind == "minio" {
				m := testutil.RequireMinIO(t)
				var err error
				st, err = store.Open(testutil.Context(t, time.Minute), store.Config{URL: "s3://" + testutil.BucketName(t) + "/jobs", Endpoint: m.Endpoint,
					Credentials: store.Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}, CreateBucket: true})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { st.Close() })
			} else {
				st, _ = store.OpenDir(t.TempDir(), true)
			}
			ctx := testutil.Context(t, time.Minute)
			rl := runlog.New(st, "job")
			old, _ := rl.NewTerm(ctx, runlog.Term{Leader: "job/rank0"}, 0)
			if _, err := rl.NewTerm(ctx, runlog.Term{Leader: "job/rank1", Rank: 1}, 0); err != nil {
				t.Fatal(err)
			}
			cfg := config.Config{Identity: rankagent.Identity{RunName: "job", WorldSize: 1}, AckTimeout: time.Second, MergedName: config.DefaultMergedName}
			l := New(&fakeMember{name: "job/rank0", world: 1}, &cfg, testutil.Logger(t))
			l.rl, l.st, l.term = rl, st, old.Term
			if _, err := l.createPlan(ctx, runlog.Plan{Kind: runlog.KindWindow, Start: 1, Stop: 2, Ranks: []int{0}}); !errors.Is(err, runlog.ErrSuperseded) {
				t.Fatalf("a stale leader's plan: %v", err)
			}
			if ids, _ := rl.PlanIDs(ctx); len(ids) != 0 {
				t.Fatalf("plans in the log: %v", ids)
			}
			// and its failure of a window is not committed either
			w := newWin(window.New(window.Config{ID: 1, World: 1, Asked: map[int]int64{0: 1}}), "", nil, "job/w1/merged.manifest.json")
			if _, err := publish.CommitFailed(ctx, st, w.manifest, publish.FailedWindow{Error: "x", WorldSize: 1}, l.fence); !errors.Is(err, runlog.ErrSuperseded) {
				t.Fatalf("a stale leader's failure: %v", err)
			}
			if _, err := st.Stat(ctx, w.manifest); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("a stale leader committed: %v", err)
			}
		})
	}
}

// TestTakeoverNeverComparesClocks: a leader finding another leader's window
// unfinished, none of its ranks reachable (the other side of a partition), gives
// it the window's planned duration from when it found it, on its own clock: a
// planner whose clock is two hours behind (its deadline long past, read on this
// host's clock) does not make its live window look abandoned.
func TestTakeoverNeverComparesClocks(t *testing.T) {
	cfg := config.DefaultLocal(rankagent.Identity{RunName: "skew", Rank: 0, WorldSize: 4})
	l := New(&fakeMember{name: "skew/rank0"}, &cfg, testutil.Logger(t))
	l.term = 5
	behind := time.Now().Add(-2 * time.Hour) // the planner's clock
	p := &runlog.Plan{ID: 9, Term: 4, Leader: "skew/rank2", Ranks: []int{2, 3}, WorldSize: 4, Created: behind, Deadline: behind.Add(time.Minute)}
	found := l.firstSeen(p)
	deadline := found.Add(p.Deadline.Sub(p.Created))
	if time.Until(deadline) < 50*time.Second {
		t.Fatalf("the window's deadline on this clock: %v from now", time.Until(deadline))
	}
	if l.mayRecover(p, deadline) {
		t.Fatal("a live window across a partition is taken over because another host's clock is behind")
	}
	if again := l.firstSeen(p); !again.Equal(found) {
		t.Fatalf("found again at %v, first at %v", again, found)
	}
	// past its duration on this clock (plus the collection time-out), it is taken over
	if !l.mayRecover(p, time.Now().Add(-cfg.CollectTimeout-time.Second)) {
		t.Fatal("a window past its deadline on this clock is not taken over")
	}
}

// TestLaterWindow: a window this leader finishes later keeps, across its
// tries, the time this leader first found it (its machine's Planned) and every
// member waiting for it: the ones that waited during a try and one that re-asked
// meanwhile, all told its result once; the leader is busy while they wait.
func TestLaterWindow(t *testing.T) {
	cfg := config.DefaultLocal(rankagent.Identity{RunName: "job", Rank: 0, WorldSize: 2})
	f := &fakeMember{name: "job/rank0", world: 2}
	l := New(f, &cfg, testutil.Logger(t))
	l.term = 5
	p := &runlog.Plan{ID: 7, Term: 4, Leader: "job/rank1", Ranks: []int{0, 1}, WorldSize: 2, Created: time.Now(), Deadline: time.Now().Add(time.Minute)}
	found := l.firstSeen(p)
	if l.Busy() {
		t.Fatal("busy with a window no member waits for")
	}
	ask := func(sender string, seq uint64) *pb.Envelope {
		return &pb.Envelope{Sender: sender, SenderRank: -1, Seq: seq, WindowId: 7}
	}
	// a try of the window, one member waiting on it; another re-asks meanwhile
	// (answerWatch parks it with the window)
	try := newWin(window.Recover(window.Resume{Config: window.Config{ID: 7, Term: 5, World: 2, Asked: map[int]int64{0: -1, 1: -1},
		Planned: found, Deadline: found.Add(time.Minute), Timers: l.timers()}, At: time.Now()}), "recovered", []*pb.Envelope{ask("job/client-a", 1)}, "")
	l.mu.Lock()
	w := l.parkLocked(p.ID)
	w.watchers = append(w.watchers, ask("job/client-b", 2))
	l.mu.Unlock()
	if got := l.watchersOf(try); len(got) != 2 {
		t.Fatalf("the try's watchers: %d, want both", len(got))
	}
	l.keepWaiting(try) // (not ended: left for later)
	if again := l.firstSeen(p); !again.Equal(found) {
		t.Fatalf("found again at %v after a try, first at %v", again, found)
	}
	if !l.Busy() {
		t.Fatal("not busy while two members wait for a window it finishes later")
	}
	l.tellResult(7, nil, &pb.WindowResult{State: pb.Outcome_OUTCOME_PUBLISHED, Window: 7}, true)
	f.mu.Lock()
	told := slices.Clone(f.to)
	f.mu.Unlock()
	slices.Sort(told)
	if fmt.Sprint(told) != "[job/client-a job/client-b]" || l.Busy() {
		t.Fatalf("told the result: %v (busy after: %v); want both waiting members, once", told, l.Busy())
	}
	// ended: nothing of it is kept; a member that read the log before its end
	// and parks afterwards is kept for the sweep, with a window found anew
	l.mu.Lock()
	n := len(l.later)
	l.parkLocked(p.ID).watchers = []*pb.Envelope{ask("job/client-c", 3)}
	l.mu.Unlock()
	if n != 0 || !l.Busy() {
		t.Fatalf("%d windows kept after the result; busy with a late watcher: %v", n, l.Busy())
	}
	// a result that is not an end (left unfinished) keeps when it was found
	l.tellResult(7, nil, &pb.WindowResult{State: pb.Outcome_OUTCOME_UNFINISHED, Window: 7}, false)
	l.mu.Lock()
	kept := l.later[7]
	l.mu.Unlock()
	if kept == nil || len(kept.watchers) != 0 {
		t.Fatalf("after an unfinished result: %+v", kept)
	}
}
