package leader

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/runlog"
)

// TestServedRequestFoundAfterManyWindows: a request served by a window that
// 20 others followed is still found as served (the log notes which window
// serves it), not planned twice.
func TestServedRequestFoundAfterManyWindows(t *testing.T) {
	st, err := store.OpenDir(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rl := runlog.New(st, "run")
	term, err := rl.NewTerm(ctx, runlog.Term{Leader: "run/rank0", Rank: 0}, 0)
	if err != nil {
		t.Fatal(err)
	}
	plan := func(req string) uint64 {
		p, err := rl.CreatePlan(ctx, runlog.Plan{Run: "run", Term: term.Term, Leader: "run/rank0", Kind: runlog.KindWindow, Start: 1, Stop: 2, WorldSize: 1,
			Ranks: []int{0}, Request: req, Created: time.Now(), Deadline: time.Now()}, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := rl.NoteRequest(ctx, req, p.ID); err != nil {
			t.Fatal(err)
		}
		return p.ID
	}
	first := plan("run/client-1#00000000000000aa")
	for i := 0; i < 20; i++ {
		plan(fmt.Sprintf("run/client-2#%016x", i))
	}
	l := &Leader{rl: rl}
	ps, err := l.requestPlans(ctx, "run/client-1#00000000000000aa")
	if err != nil || len(ps) != 1 || ps[0].ID != first {
		t.Fatalf("the plans that may serve the first request: %v (%v)", ps, err)
	}
	if w, err := rl.RequestWindow(ctx, "run/client-3#0000000000000001"); err != nil || w != 0 {
		t.Fatalf("a request never served: window %d (%v)", w, err)
	}
}
