package runlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/sidecar"
)

// TestStaleCommitIsFenced: leader A (term 1) checks its term, then is paused
// at its manifest's create; leader B takes term 2, which claims the unfinished
// window's commit point; then A's create goes on. It is refused
// (ErrNewerClaim), no reader takes the claim for a commit, and B's commit
// replaces the claim. Before the claim, A's manifest would have been the
// window's truth, written after a newer term took the window over.
func TestStaleCommitIsFenced(t *testing.T) {
	stores(t, func(t *testing.T, st store.Store) {
		ctx := testutil.Context(t, time.Minute)
		g := &gated{Store: st}
		a, b := New(g, "gpt"), New(st, "gpt")
		ta, err := a.NewTerm(ctx, Term{Leader: "gpt/rank0"}, 0)
		if err != nil {
			t.Fatal(err)
		}
		manifestOf := func(id uint64) (string, error) {
			return fmt.Sprintf("gpt/torch_memory_traces/window%d/merged.manifest.json", id), nil
		}
		p1, err := a.CreatePlan(ctx, Plan{Term: ta.Term, Leader: "gpt/rank0", Kind: KindWindow, Start: 1, Stop: 2, WorldSize: 2, Ranks: []int{0, 1}}, 0, manifestOf)
		if err != nil {
			t.Fatal(err)
		}
		failed := func(term uint64) publish.FailedWindow {
			return publish.FailedWindow{Error: fmt.Sprintf("failed by term %d", term), Window: &sidecar.WindowInfo{ID: p1.ID, Start: 1, Stop: 2}, WorldSize: 2,
				Kind: KindWindow, Attempt: publish.AttemptOf(term)}
		}
		h := g.hold(".manifest.json")
		errs := make(chan error, 1)
		go func() {
			_, err := publish.CommitFailed(ctx, g, p1.Manifest, failed(ta.Term), func(ctx context.Context) error { return a.Fence(ctx, ta.Term) })
			errs <- err
		}()
		<-h.reached // (A's term was checked: it was the newest)
		tb, err := b.NewTerm(ctx, Term{Leader: "gpt/rank1", Rank: 1}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := publish.ReadManifest(ctx, st, p1.Manifest); !errors.Is(err, store.ErrNotFound) || !errors.Is(err, publish.ErrClaimed) {
			t.Fatalf("term %d's claim reads as %v, not as no commit", tb.Term, err)
		}
		close(h.release)
		if err := <-errs; !errors.Is(err, publish.ErrNewerClaim) || !errors.Is(err, publish.ErrFenced) {
			t.Fatalf("the stale leader's commit: %v", err)
		}
		if ps, err := publish.ListPublished(ctx, st, "gpt/"); err != nil || len(ps) != 0 {
			t.Fatalf("published after the stale commit: %d %v", len(ps), err)
		}
		// B commits: its manifest replaces its claim
		m, err := publish.CommitFailed(ctx, st, p1.Manifest, failed(tb.Term), func(ctx context.Context) error { return b.Fence(ctx, tb.Term) })
		if err != nil || m.Attempt != publish.AttemptOf(tb.Term) {
			t.Fatalf("the current leader's commit: %+v %v", m, err)
		}
		if m, err := publish.ReadManifest(ctx, st, p1.Manifest); err != nil || m.Attempt != publish.AttemptOf(tb.Term) || !m.Failed() {
			t.Fatalf("the window's commit: %+v %v", m, err)
		}
		// a later term's takeover leaves a commit as it is
		if _, err := New(st, "gpt").NewTerm(ctx, Term{Leader: "gpt/rank2", Rank: 2}, 0); err != nil {
			t.Fatal(err)
		}
		if m, err := publish.ReadManifest(ctx, st, p1.Manifest); err != nil || m.Attempt != publish.AttemptOf(tb.Term) {
			t.Fatalf("the window's commit after another takeover: %+v %v", m, err)
		}
	})
}

// TestCommitClaims: a claim is created once, replaces only an older term's
// claim, never a commit; a commit replaces a claim of its own term or an older
// one, and a claim of a newer term refuses it.
func TestCommitClaims(t *testing.T) {
	stores(t, func(t *testing.T, st store.Store) {
		ctx := testutil.Context(t, time.Minute)
		key := "run/torch_memory_traces/window3/merged.manifest.json"
		claimOf := func() string {
			b, err := store.ReadAll(ctx, st, key)
			if err != nil {
				t.Fatal(err)
			}
			m, err := publish.ParseManifest(b)
			if err != nil || m.State != publish.ManifestClaimed {
				t.Fatalf("not a claim: %+v %v", m, err)
			}
			return m.Attempt
		}
		for _, c := range []struct {
			term uint64
			want string
		}{{3, "t3"}, {2, "t3"}, {5, "t5"}, {5, "t5"}} {
			if err := publish.ClaimCommit(ctx, st, key, c.term, 3, 4); err != nil {
				t.Fatal(err)
			}
			if got := claimOf(); got != c.want {
				t.Fatalf("after term %d's claim: %s, want %s", c.term, got, c.want)
			}
		}
		fw := func(term uint64) publish.FailedWindow {
			return publish.FailedWindow{Error: "x", Window: &sidecar.WindowInfo{ID: 3}, WorldSize: 4, Attempt: publish.AttemptOf(term)}
		}
		if _, err := publish.CommitFailed(ctx, st, key, fw(4), nil); !errors.Is(err, publish.ErrNewerClaim) {
			t.Fatalf("term 4's commit over term 5's claim: %v", err)
		}
		if m, err := publish.CommitFailed(ctx, st, key, fw(5), nil); err != nil || m.Attempt != "t5" {
			t.Fatalf("term 5's commit over its claim: %+v %v", m, err)
		}
		if err := publish.ClaimCommit(ctx, st, key, 9, 3, 4); err != nil {
			t.Fatal(err)
		}
		if m, err := publish.ReadManifest(ctx, st, key); err != nil || m.Attempt != "t5" || !m.Failed() {
			t.Fatalf("a claim over a commit: %+v %v", m, err)
		}
	})
}

// flakyGet fails the next Get of a key ending in suffix once, as a reset
// connection does.
type flakyGet struct {
	store.Store
	suffix string
	armed  bool
}

func (f *flakyGet) Get(ctx context.Context, key string) (io.ReadCloser, store.ObjectInfo, error) {
	if f.armed && strings.HasSuffix(key, f.suffix) {
		f.armed = false
		return nil, store.ObjectInfo{}, fmt.Errorf("%w: connection reset by peer", store.ErrUnreachable)
	}
	return f.Store.Get(ctx, key)
}

// TestClaimNeverAssumed: a takeover whose read of an older claim fails takes
// no term (it would leave the older term's claim, and that term's stalled
// leader could commit): the next try claims the window for its term. A plan
// whose manifest key no store takes (a bad key, a folder in a folder store)
// blocks no takeover.
func TestClaimNeverAssumed(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	dir := t.TempDir()
	st, err := store.OpenDir(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	f := &flakyGet{Store: st, suffix: ".manifest.json"}
	l := New(f, "gpt")
	t1, err := l.NewTerm(ctx, Term{Leader: "gpt/rank0"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	key := "gpt/torch_memory_traces/window1/merged.manifest.json"
	_, err = l.CreatePlan(ctx, Plan{Term: t1.Term, Kind: KindWindow, Start: 1, Stop: 2, WorldSize: 1, Ranks: []int{0}}, 0, func(uint64) (string, error) { return key, nil })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.NewTerm(ctx, Term{Leader: "gpt/rank1", Rank: 1}, 0); err != nil { // (claims it for term 2)
		t.Fatal(err)
	}
	f.armed = true
	if _, err := l.NewTerm(ctx, Term{Leader: "gpt/rank2", Rank: 2}, 0); !errors.Is(err, store.ErrUnreachable) {
		t.Fatalf("a takeover whose claim's read failed: %v", err)
	}
	t3, err := l.NewTerm(ctx, Term{Leader: "gpt/rank2", Rank: 2}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := store.ReadAll(ctx, st, key)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := publish.ParseManifest(b); err != nil || m.State != publish.ManifestClaimed || m.Attempt != publish.AttemptOf(t3.Term) {
		t.Fatalf("the claim after term %d took over: %+v %v", t3.Term, m, err)
	}
	// plans whose manifest keys no store takes
	for _, bad := range []string{"gpt/" + strings.Repeat("x", 300) + "/merged.manifest.json", "gpt/../escape.manifest.json", "gpt/torch_memory_traces"} {
		if _, err := l.CreatePlan(ctx, Plan{Term: t3.Term, Kind: KindWindow, Start: 1, Stop: 2, WorldSize: 1, Ranks: []int{0}}, 0, func(uint64) (string, error) { return bad, nil }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.NewTerm(ctx, Term{Leader: "gpt/rank3", Rank: 3}, 0); err != nil {
		t.Fatalf("a takeover past plans whose manifest keys no store takes: %v", err)
	}
}
