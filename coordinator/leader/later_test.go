package leader

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/rankagent"
	"github.com/memsnap/memsnap/runlog"
)

// TestLaterDropped: the sweep tells the member waiting for a window that ended
// answered with its detail given up (its manifest pending, its outcome written)
// and keeps nothing of it, and forgets a window it only found (no member waiting)
// once another leader finished it; a window still unfinished keeps when it was
// found. Kept, such entries filled the bound on found windows, past which a
// window across a partition was found anew on every sweep and its deadline
// never came.
func TestLaterDropped(t *testing.T) {
	st, rl, ctx := folderLog(t)
	plan := func(manifest string) runlog.Plan {
		t.Helper()
		p, err := rl.CreatePlan(ctx, runlog.Plan{Leader: "job/rank1", Term: 1, Kind: runlog.KindWindow, Start: 1, Stop: 2, WorldSize: 2, Ranks: []int{0, 1},
			Deadline: time.Now().Add(time.Minute)}, 0, func(uint64) (string, error) { return manifest, nil })
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// window a: answered, its detail given up by its leader (outcome written)
	const key = "job/torch_memory_traces/window1/merged.manifest.json"
	a := plan(key)
	b, _ := json.Marshal(publish.Manifest{Version: 1, WorldSize: 2, RanksMerged: []int{0, 1}, Outputs: map[string]publish.Object{}, Pending: []string{"pickle"}})
	if _, err := st.Put(ctx, key, bytes.NewReader(b), store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rl.Finish(ctx, runlog.Outcome{ID: a.ID, Term: 1, State: runlog.Published, Manifest: key, Error: "the merged pickles were not written"}); err != nil {
		t.Fatal(err)
	}
	// window c: found by this leader, then failed by another
	c := plan("")
	if _, err := rl.Finish(ctx, runlog.Outcome{ID: c.ID, Term: 1, State: runlog.Failed, Error: "x"}); err != nil {
		t.Fatal(err)
	}
	cfg := config.DefaultLocal(rankagent.Identity{RunName: "job", Rank: 0, WorldSize: 2})
	f := &fakeMember{name: "job/rank0", world: 2, term: 2}
	l := New(f, &cfg, testutil.Logger(t))
	l.rl, l.st, l.term = rl, st, 2
	ask := &pb.Envelope{Sender: "job/client-a", SenderRank: -1, Seq: 1, WindowId: a.ID}
	l.mu.Lock()
	l.parkLocked(a.ID).watchers = []*pb.Envelope{ask}
	l.parkLocked(c.ID)
	l.mu.Unlock()
	l.sweep(ctx)
	f.mu.Lock()
	told := slices.Clone(f.to)
	f.mu.Unlock()
	l.mu.Lock()
	_, keptA := l.later[a.ID]
	_, keptC := l.later[c.ID]
	l.mu.Unlock()
	if !slices.Contains(told, "job/client-a") || keptA {
		t.Fatalf("answered with its detail given up: told %v, still kept %v; want the member told and nothing kept", told, keptA)
	}
	if keptC {
		t.Fatal("a window found and then finished by another leader is still kept")
	}
	// a window the log lists unfinished keeps when it was found, and so does
	// one found after the log was read
	before := time.Now()
	l.mu.Lock()
	l.parkLocked(99)
	l.later[100] = &parked{found: before.Add(-time.Hour), kept: time.Now()} // (a deferred plan dated by its oldest incident)
	l.mu.Unlock()
	l.dropFinished([]*runlog.Plan{{ID: 99}, {ID: 100}}, time.Now())
	l.dropFinished(nil, before)
	l.mu.Lock()
	_, kept99 := l.later[99]
	_, kept100 := l.later[100]
	l.mu.Unlock()
	if !kept99 || !kept100 {
		t.Fatalf("a window still unfinished lost when it was found (%v), or one kept after the log was read (%v)", !kept99, !kept100)
	}
}

// TestAnswerToTheAsker: members re-asking how an answered window ended (its
// detail still being written) are each told its answer once, when they ask,
// not again whenever another member asks.
func TestAnswerToTheAsker(t *testing.T) {
	st, rl, ctx := folderLog(t)
	const key = "job/torch_memory_traces/window1/merged.manifest.json"
	p, err := rl.CreatePlan(ctx, runlog.Plan{Leader: "job/rank1", Term: 1, Kind: runlog.KindWindow, Start: 1, Stop: 2, WorldSize: 2, Ranks: []int{0, 1},
		Deadline: time.Now().Add(time.Minute)}, 0, func(uint64) (string, error) { return key, nil })
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(publish.Manifest{Version: 1, WorldSize: 2, RanksMerged: []int{0, 1}, Outputs: map[string]publish.Object{}, Pending: []string{"pickle"}})
	if _, err := st.Put(ctx, key, bytes.NewReader(b), store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := config.DefaultLocal(rankagent.Identity{RunName: "job", Rank: 0, WorldSize: 2})
	f := &fakeMember{name: "job/rank0", world: 2, term: 2}
	l := New(f, &cfg, testutil.Logger(t))
	l.rl, l.st, l.term = rl, st, 2
	for i, who := range []string{"job/client-a", "job/client-b", "job/client-c"} {
		l.answerWatch(ctx, &pb.Envelope{Sender: who, SenderRank: -1, Seq: uint64(i + 1), WindowId: p.ID})
	}
	answers := map[string]int{}
	f.mu.Lock()
	for i, env := range f.sent {
		if env.GetWindowResult() != nil {
			answers[f.to[i]]++
		}
	}
	f.mu.Unlock()
	if len(answers) != 3 || answers["job/client-a"] != 1 || answers["job/client-b"] != 1 || answers["job/client-c"] != 1 {
		t.Fatalf("answers told: %v; want each member's once", answers)
	}
	if n := len(l.awaiting(p.ID)); n != 3 {
		t.Fatalf("%d members wait for the window's end, want 3", n)
	}
}
