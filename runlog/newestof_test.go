package runlog

import (
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
)

// TestNewestOfByTime: the newest plan of a kind is the one created last, not the
// last planned (a leader whose clock runs behind plans after another), and a
// plan dated past this host's clock by more than Skew is passed over.
func TestNewestOfByTime(t *testing.T) {
	st, err := store.OpenDir(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, time.Minute)
	l := New(st, "gpt")
	now := time.Now()
	plan := func(kind string, created time.Time) uint64 {
		t.Helper()
		p, err := l.CreatePlan(ctx, Plan{Leader: "gpt/rank0", Kind: kind, Start: 1, Stop: 2, WorldSize: 1, Created: created}, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p.ID
	}
	newest := plan(KindTrigger, now.Add(-10*time.Second))            // leader A, its clock right
	lagging := plan(KindTrigger, now.Add(-5*time.Minute))            // leader B after it, its clock 5 min behind
	plan(KindTrigger, now.Add(10*time.Minute))                       // a leader whose clock runs 10 min ahead
	p, err := l.NewestOf(ctx, now.Add(-10*time.Minute), KindTrigger) // a 10-minute cooldown
	if err != nil || p == nil {
		t.Fatal(p, err)
	}
	if p.ID != newest {
		t.Errorf("NewestOf: window %d created %v from now; want window %d, 10 s ago (window %d is older, the one ahead cannot be judged)", p.ID, p.Created.Sub(now).Round(time.Second), newest, lagging)
	}
}
