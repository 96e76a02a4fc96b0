package runlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
)

// stores runs f against a folder store and, where the test script started one, a
// real MinIO.
func stores(t *testing.T, f func(t *testing.T, st store.Store)) {
	t.Run("folder", func(t *testing.T) {
		st, err := store.OpenDir(t.TempDir(), true)
		if err != nil {
			t.Fatal(err)
		}
		f(t, st)
	})
	t.Run("minio", func(t *testing.T) {
		m := testutil.RequireMinIO(t)
		st, err := store.Open(testutil.Context(t, time.Minute), store.Config{URL: "s3://" + testutil.BucketName(t) + "/runs", Endpoint: m.Endpoint,
			Credentials: store.Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}, CreateBucket: true})
		if err != nil {
			t.Fatal(err)
		}
		f(t, st)
	})
}

func TestIDsAreUniqueUnderConcurrentLeaders(t *testing.T) {
	stores(t, func(t *testing.T, st store.Store) {
		ctx := testutil.Context(t, time.Minute)
		l := New(st, "gpt")
		const n = 8
		var mu sync.Mutex
		var terms, ids []uint64
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tm, err := l.NewTerm(ctx, Term{Leader: fmt.Sprintf("gpt/rank%d", i), Rank: i}, 0)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				terms = append(terms, tm.Term)
				mu.Unlock()
			}()
		}
		wg.Wait()
		// plans of the newest term, by writers racing for ids
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, err := l.CreatePlan(ctx, Plan{Term: n, Leader: "gpt/rank0", LeaderRank: i, Kind: KindWindow, Start: 5, Stop: 8, WorldSize: n}, 0, nil)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids = append(ids, p.ID)
				mu.Unlock()
			}()
		}
		wg.Wait()
		for what, got := range map[string][]uint64{"terms": terms, "ids": ids} {
			sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
			if len(got) != n {
				t.Fatalf("%s: %v", what, got)
			}
			for i, v := range got {
				if v != uint64(i+1) {
					t.Fatalf("%s are not 1..%d, each once: %v", what, n, got)
				}
			}
		}
		// a relaunch (a new Log on the same store) continues after them
		p, err := New(st, "gpt").CreatePlan(ctx, Plan{Term: n, Leader: "gpt/rank0", Kind: KindWindow, Start: 1, Stop: 2, WorldSize: 1}, 3, nil)
		if err != nil || p.ID != n+1 {
			t.Fatalf("after a relaunch: window %d, %v", p.ID, err)
		}
		// another run's log is its own
		if p, err := New(st, "bert").CreatePlan(ctx, Plan{Leader: "bert/rank0", Kind: KindWindow, Start: 1, Stop: 2, WorldSize: 1}, 0, nil); err != nil || p.ID != 1 {
			t.Fatalf("another run: window %d, %v", p.ID, err)
		}
		// atLeast wins over a shorter log
		if p, err := l.CreatePlan(ctx, Plan{Term: n, Leader: "gpt/rank0", Kind: KindWindow, Start: 1, Stop: 2, WorldSize: 1}, 100, nil); err != nil || p.ID != 100 {
			t.Fatalf("at least 100: window %d, %v", p.ID, err)
		}
	})
}

// TestFence: once a newer term is in the log, a leader of an older one can
// neither plan nor finish a window, and its plans are not half written.
func TestFence(t *testing.T) {
	stores(t, func(t *testing.T, st store.Store) {
		ctx := testutil.Context(t, time.Minute)
		l := New(st, "gpt")
		old, err := l.NewTerm(ctx, Term{Leader: "gpt/rank0"}, 0)
		if err != nil {
			t.Fatal(err)
		}
		p, err := l.CreatePlan(ctx, Plan{Term: old.Term, Leader: "gpt/rank0", Kind: KindWindow, Start: 1, Stop: 2, WorldSize: 1}, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Fence(ctx, old.Term); err != nil {
			t.Fatalf("the newest term is fenced: %v", err)
		}
		cur, err := l.NewTerm(ctx, Term{Leader: "gpt/rank1", Rank: 1}, 0)
		if err != nil || cur.Term <= old.Term {
			t.Fatalf("a newer term: %+v %v", cur, err)
		}
		if err := l.Fence(ctx, old.Term); !errors.Is(err, ErrSuperseded) {
			t.Fatalf("fence of a superseded term: %v", err)
		}
		if _, err := l.CreatePlan(ctx, Plan{Term: old.Term, Leader: "gpt/rank0", Kind: KindWindow, Start: 1, Stop: 2, WorldSize: 1}, 0, nil); !errors.Is(err, ErrSuperseded) {
			t.Fatalf("a plan of a superseded term: %v", err)
		}
		if ids, _ := l.PlanIDs(ctx); len(ids) != 1 {
			t.Fatalf("plans after a refused one: %v", ids)
		}
		if _, err := l.Finish(ctx, Outcome{ID: p.ID, Term: old.Term, State: Failed, Error: "x"}); !errors.Is(err, ErrSuperseded) {
			t.Fatalf("an outcome of a superseded term: %v", err)
		}
		if o, err := l.Finish(ctx, Outcome{ID: p.ID, Term: cur.Term, State: Failed, Error: "y"}); err != nil || o.Error != "y" {
			t.Fatalf("the current term's outcome: %+v %v", o, err)
		}
	})
}

func TestFinishOnce(t *testing.T) {
	stores(t, func(t *testing.T, st store.Store) {
		ctx := testutil.Context(t, time.Minute)
		l := New(st, "gpt")
		for i := 0; i < 3; i++ {
			if _, err := l.CreatePlan(ctx, Plan{Leader: "gpt/rank0", Kind: KindWindow, Start: 1, Stop: 2, WorldSize: 2, Ranks: []int{0, 1}}, 0, nil); err != nil {
				t.Fatal(err)
			}
		}
		un, err := l.Unfinished(ctx, 0)
		if err != nil || len(un) != 3 {
			t.Fatalf("unfinished %v %v", un, err)
		}
		// two leaders finish window 2 at once: one outcome, both told the same
		var wg sync.WaitGroup
		got := make([]Outcome, 2)
		for i := range got {
			wg.Add(1)
			go func() {
				defer wg.Done()
				o := Outcome{ID: 2, Term: uint64(i + 1), Kind: KindWindow, State: Published, Manifest: fmt.Sprintf("m%d", i), Leader: fmt.Sprint(i)}
				var err error
				got[i], err = l.Finish(ctx, o)
				if err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if got[0].Manifest != got[1].Manifest || got[0].Term != got[1].Term {
			t.Fatalf("two outcomes of one window: %+v %+v", got[0], got[1])
		}
		if _, err := l.Finish(ctx, Outcome{ID: 3, State: Failed, Error: "no rank stored a snapshot"}); err != nil {
			t.Fatal(err)
		}
		un, err = l.Unfinished(ctx, 0)
		if err != nil || len(un) != 1 || un[0].ID != 1 {
			t.Fatalf("unfinished after finishing 2 and 3: %v %v", un, err)
		}
		if _, err := l.ReadOutcome(ctx, 1); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("outcome of an unfinished window: %v", err)
		}
	})
}

func TestReports(t *testing.T) {
	stores(t, func(t *testing.T, st store.Store) {
		ctx := testutil.Context(t, time.Minute)
		l := New(st, "gpt")
		for r := 0; r < 3; r++ {
			if err := l.PutReport(ctx, Report{Window: 7, Rank: r, Key: fmt.Sprintf("gpt/rank%d.9.pickle", r), Size: 10, Start: 6, Stop: 9, Reason: "window"}); err != nil {
				t.Fatal(err)
			}
		}
		// a report replaced (the rank reported again) and one of another window
		if err := l.PutReport(ctx, Report{Window: 7, Rank: 1, Error: "refused"}); err != nil {
			t.Fatal(err)
		}
		if err := l.PutReport(ctx, Report{Window: 70, Rank: 1, Key: "x"}); err != nil {
			t.Fatal(err)
		}
		// a hostile object in the reports folder
		st.Put(ctx, l.ReportKey(7, 5), strings.NewReader(`{"version":1,"window":7,"rank":4,"key":"k"}`), store.PutOptions{})
		got, bad, err := l.Reports(ctx, 7)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 3 || got[0].Key != "gpt/rank0.9.pickle" || got[1].Error != "refused" || got[2].Start != 6 {
			t.Fatalf("reports %+v", got)
		}
		if len(bad) != 1 || !errors.Is(bad[0], ErrMalformed) {
			t.Fatalf("the report naming another rank was not refused: %v", bad)
		}
		if err := l.PutReport(ctx, Report{Window: 7, Rank: 1}); !errors.Is(err, ErrMalformed) {
			t.Fatalf("a report with nothing: %v", err)
		}
	})
}

func TestMalformedPlanIsFinishedAsFailed(t *testing.T) {
	st, err := store.OpenDir(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l := New(st, "gpt")
	st.Put(ctx, l.PlanKey(4), strings.NewReader(`{"version":1,"window":4,"kind":"window","start":9,"stop":3,"world_size":2,"leader_rank":0}`), store.PutOptions{})
	un, err := l.Unfinished(ctx, 0)
	if err != nil || len(un) != 0 {
		t.Fatalf("unfinished %v %v", un, err)
	}
	o, err := l.ReadOutcome(ctx, 4)
	if err != nil || o.State != Failed || !strings.Contains(o.Error, "batches [9, 3)") {
		t.Fatalf("outcome %+v %v", o, err)
	}
}

func TestParseName(t *testing.T) {
	for name, want := range map[string]int64{
		"window1.json": 1, "window12.json": 12, "window0.json": 0, "window01.json": -1, "window.json": -1,
		"window1.json.tmp": -1, "windowx.json": -1, "window-1.json": -1, "window9007199254740993.json": -1,
		"rank3.json": -1,
	} {
		n, ok := parseName(name, "window")
		if (want < 0) == ok || (ok && int64(n) != want) {
			t.Errorf("%s: %d %v, want %d", name, n, ok, want)
		}
	}
}

func TestParsersRefuse(t *testing.T) {
	for _, c := range []struct {
		name string
		b    string
		f    func([]byte) error
	}{
		{"plan: unknown field", `{"version":1,"window":1,"kind":"window","start":1,"stop":2,"world_size":1,"x":1}`, planErr},
		{"plan: version", `{"version":0,"window":1,"kind":"window","start":1,"stop":2,"world_size":1}`, planErr},
		{"plan: newer, out of range", `{"version":2,"window":1,"kind":"window","start":3,"stop":2,"world_size":1,"x":1}`, planErr},
		{"plan: empty window", `{"version":1,"window":1,"kind":"window","start":2,"stop":2,"world_size":1}`, planErr},
		{"plan: kind", `{"version":1,"window":1,"kind":"lunch","start":1,"stop":2,"world_size":1}`, planErr},
		{"plan: ranks", `{"version":1,"window":1,"kind":"window","start":1,"stop":2,"world_size":2,"ranks":[1,0]}`, planErr},
		{"plan: world", `{"version":1,"window":1,"kind":"window","start":1,"stop":2,"world_size":70000}`, planErr},
		{"plan: failed rank", `{"version":1,"window":1,"kind":"crash","world_size":2,"failed_rank":2}`, planErr},
		{"plan: dumps with batches", `{"version":1,"window":1,"kind":"trigger","start":1,"stop":2,"world_size":1,"dump":true}`, planErr},
		{"plan: a window of dumps", `{"version":1,"window":1,"kind":"window","world_size":1,"dump":true}`, planErr},
		{"plan: two values", `{"version":1,"window":1,"kind":"window","start":1,"stop":2,"world_size":1} {}`, planErr},
		{"outcome: state", `{"version":1,"window":1,"state":"maybe"}`, outcomeErr},
		{"outcome: published without manifest", `{"version":1,"window":1,"state":"published"}`, outcomeErr},
		{"outcome: rank name", `{"version":1,"window":1,"state":"failed","missing":{"03":"x"}}`, outcomeErr},
		{"term: zero", `{"version":1,"term":0}`, termErr},
		{"report: reason", `{"version":1,"window":1,"rank":0,"key":"k","reason":"lunch"}`, reportErr},
	} {
		if err := c.f([]byte(c.b)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if _, err := ParsePlan([]byte(`{"version":1,"window":1,"kind":"crash","world_size":2,"failed_rank":1,"ranks":[0,1]}`)); err != nil {
		t.Errorf("a crash post-mortem's plan: %v", err)
	}
	if p, err := ParsePlan([]byte(`{"version":1,"window":1,"kind":"trigger","world_size":2,"ranks":[0,1],"dump":true}`)); err != nil || !p.Dump {
		t.Errorf("a trigger's plan of dumps: %+v, %v", p, err)
	}
}

// TestNewerPlanIsRead: a plan of a newer version, with fields and a kind this
// version does not know, is read for what it knows (its manifest first), not
// refused as malformed; nor finished as failed by a leader of this version.
func TestNewerPlanIsRead(t *testing.T) {
	newer := `{"version":2,"window":3,"term":1,"kind":"sampled","start":5,"stop":9,"world_size":2,"ranks":[0,1],"manifest":"gpt/w3/merged.manifest.json","sampling":{"every":2}}`
	p, err := ParsePlan([]byte(newer))
	if err != nil || p.ID != 3 || p.Manifest != "gpt/w3/merged.manifest.json" || p.Kind != "sampled" || p.Start != 5 || p.Stop != 9 || len(p.Ranks) != 2 || p.Version != 2 {
		t.Fatalf("a newer plan: %+v %v", p, err)
	}
	st, err := store.OpenDir(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l := New(st, "gpt")
	st.Put(ctx, l.PlanKey(3), strings.NewReader(newer), store.PutOptions{})
	un, err := l.Unfinished(ctx, 0)
	if err != nil || len(un) != 1 || un[0].Manifest != p.Manifest {
		t.Fatalf("unfinished: %v %v", un, err)
	}
	if latest, err := l.Latest(ctx, 4); err != nil || len(latest) != 1 || latest[0].ID != 3 {
		t.Fatalf("latest: %v %v", latest, err)
	}
}

func planErr(b []byte) error    { _, err := ParsePlan(b); return err }
func outcomeErr(b []byte) error { _, err := ParseOutcome(b); return err }
func termErr(b []byte) error    { _, err := ParseTerm(b); return err }
func reportErr(b []byte) error  { _, err := ParseReport(b); return err }

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"version":1,"window":1,"kind":"window","start":1,"stop":2,"world_size":1,"ranks":[0]}`))
	f.Add([]byte(`{"version":1,"window":1,"state":"failed","missing":{"3":"x"},"ranks":[1]}`))
	f.Add([]byte(`{"version":1,"window":1,"rank":0,"key":"k","reason":"crash","cause":"SIGTERM"}`))
	f.Add([]byte(`{"version":1,"term":3,"leader":"x","rank":0}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if p, err := ParsePlan(b); err == nil {
			if p.Stop < p.Start || p.WorldSize <= 0 || len(p.Ranks) > p.WorldSize {
				t.Fatalf("accepted plan %+v", p)
			}
		}
		if o, err := ParseOutcome(b); err == nil && o.State != Published && o.State != Failed {
			t.Fatalf("accepted outcome %+v", o)
		}
		if r, err := ParseReport(b); err == nil && (r.Window == 0 || r.Rank < 0) {
			t.Fatalf("accepted report %+v", r)
		}
		ParseTerm(b)
	})
}

// TestOutcomeReasonsAreCut: a rank's long reason (its own words) is cut when the
// outcome is written, so an outcome of the largest world stays readable.
func TestOutcomeReasonsAreCut(t *testing.T) {
	st, err := store.OpenDir(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	l := New(st, "run")
	long := strings.Repeat("é", 10_000)
	missing := map[string]string{}
	for r := 0; r < 65536; r++ {
		missing[strconv.Itoa(r)] = long
	}
	o, err := l.Finish(context.Background(), Outcome{ID: 1, State: Failed, Error: long, Missing: missing})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Error) > MaxError || len(o.Missing["7"]) > MaxReason || !utf8.ValidString(o.Missing["7"]) || !strings.HasSuffix(o.Missing["7"], "…") {
		t.Fatalf("error %d bytes, reason %d bytes %q", len(o.Error), len(o.Missing["7"]), o.Missing["7"])
	}
	back, err := l.ReadOutcome(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Missing) != 65536 || back.Missing["65535"] != o.Missing["65535"] {
		t.Fatalf("read back %d reasons", len(back.Missing))
	}
}

// TestMalformedTopPlanDoesNotTakeTheIDs: garbage stored under a huge window id
// (a bad write, a hostile one) does not push every new window id to the end of
// the range.
func TestMalformedTopPlanDoesNotTakeTheIDs(t *testing.T) {
	st, err := store.OpenDir(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l := New(st, "gpt")
	if _, err := st.Put(ctx, l.PlanKey(MaxID), strings.NewReader("garbage"), store.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	for want := uint64(1); want <= 2; want++ {
		p, err := l.CreatePlan(ctx, Plan{Kind: KindWindow, Start: 1, Stop: 2, WorldSize: 1, Leader: "gpt/rank0", Deadline: time.Now().Add(time.Hour)}, 0, nil)
		if err != nil || p.ID != want {
			t.Fatalf("plan %d: %+v %v", want, p, err)
		}
	}
}

// gated is a store whose Puts of keys containing a chosen text stop until
// released: a writer paused (a stall, a GC pause, a partition) between its
// checks and its write.
type gated struct {
	store.Store
	mu    sync.Mutex
	holds map[string]*hold
}

type hold struct{ reached, release chan struct{} }

// hold makes the next Put of a key containing sub wait for release.
func (g *gated) hold(sub string) *hold {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.holds == nil {
		g.holds = map[string]*hold{}
	}
	h := &hold{reached: make(chan struct{}), release: make(chan struct{})}
	g.holds[sub] = h
	return h
}

func (g *gated) Put(ctx context.Context, key string, r io.Reader, opts store.PutOptions) (store.ObjectInfo, error) {
	g.mu.Lock()
	var h *hold
	for sub, x := range g.holds {
		if strings.Contains(key, sub) {
			h = x
			delete(g.holds, sub)
			break
		}
	}
	g.mu.Unlock()
	if h != nil {
		close(h.reached)
		<-h.release
	}
	return g.Store.Put(ctx, key, r, opts)
}

// TestStaleWriterIsFenced: leader A (term 1) is paused between its checks and
// its writes of a plan, an outcome and the schedule; leader B takes term 2 and
// plans; then A's writes go on. Each is refused (ErrSuperseded) or ignored by
// every reader: no stale plan is unfinished or latest, window 1 is not finished
// by A, and the schedule is not A's.
func TestStaleWriterIsFenced(t *testing.T) {
	stores(t, func(t *testing.T, st store.Store) {
		ctx := testutil.Context(t, time.Minute)
		g := &gated{Store: st}
		a, b := New(g, "gpt"), New(st, "gpt")
		ta, err := a.NewTerm(ctx, Term{Leader: "gpt/rank0"}, 0)
		if err != nil {
			t.Fatal(err)
		}
		plan := Plan{Term: ta.Term, Leader: "gpt/rank0", Kind: KindWindow, Start: 1, Stop: 2, WorldSize: 2, Ranks: []int{0, 1}}
		p1, err := a.CreatePlan(ctx, plan, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.PutSchedule(ctx, Schedule{Next: 10, Term: ta.Term}); err != nil {
			t.Fatal(err)
		}
		// A's three writes, each paused at its Put
		holds := []*hold{g.hold("plans/"), g.hold("outcomes/"), g.hold("schedule.json")}
		errs := make(chan error, 3)
		go func() { _, err := a.CreatePlan(ctx, plan, 0, nil); errs <- err }()
		go func() {
			_, err := a.Finish(ctx, Outcome{ID: p1.ID, Term: ta.Term, Kind: KindWindow, State: Published, Manifest: "stale", Leader: "gpt/rank0"})
			errs <- err
		}()
		go func() { errs <- a.PutSchedule(ctx, Schedule{Next: 20, Term: ta.Term}) }()
		for _, h := range holds {
			<-h.reached
		}
		// B takes term 2 and plans
		tb, err := b.NewTerm(ctx, Term{Leader: "gpt/rank1", Rank: 1}, 0)
		if err != nil {
			t.Fatal(err)
		}
		pb := plan
		pb.Term, pb.Leader = tb.Term, "gpt/rank1"
		p2, err := b.CreatePlan(ctx, pb, 10, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range holds {
			close(h.release)
		}
		for range holds {
			if err := <-errs; !errors.Is(err, ErrSuperseded) {
				t.Errorf("a stale write: %v", err)
			}
		}
		checkNoStale(t, ctx, New(st, "gpt"), tb.Term, p1.ID, p2.ID)
		// B finishes window 1: its outcome is the truth
		if o, err := b.Finish(ctx, Outcome{ID: p1.ID, Term: tb.Term, State: Failed, Error: "taken over"}); err != nil || o.Term != tb.Term {
			t.Fatalf("the current leader's outcome: %+v %v", o, err)
		}
	})
}

// checkNoStale checks what every reader of l says after a stale leader's writes:
// the unfinished windows are old (planned before term cur) and mine; no outcome
// and no schedule of an older term is the truth.
func checkNoStale(t *testing.T, ctx context.Context, l *Log, cur, old, mine uint64) {
	t.Helper()
	un, err := l.Unfinished(ctx, cur)
	if err != nil || len(un) != 2 || un[0].ID != old || un[1].ID != mine {
		var ids []uint64
		for _, p := range un {
			ids = append(ids, p.ID)
		}
		t.Errorf("unfinished windows %v (%v), want [%d %d]", ids, err, old, mine)
	}
	latest, err := l.Latest(ctx, 16)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range latest {
		if p.ID != old && p.ID != mine {
			t.Errorf("a stale plan is latest: window %d of term %d", p.ID, p.Term)
		}
	}
	if o, err := l.ReadOutcome(ctx, old); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("window %d finished by a stale leader: %+v %v", old, o, err)
	}
	sc, err := l.ReadSchedule(ctx)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	if err == nil && (sc.Term < cur || sc.Next == 20) {
		t.Errorf("the schedule is a stale leader's: %+v", sc)
	}
}

// TestLogWithoutHead: a log written by the previous version (term and plan
// records, no head) gets its head from what it lists: the next term and window
// id follow the records, its unfinished windows stay unfinished, and its
// schedule stands.
func TestLogWithoutHead(t *testing.T) {
	stores(t, func(t *testing.T, st store.Store) {
		ctx := testutil.Context(t, time.Minute)
		l := New(st, "gpt")
		put := func(key, body string) {
			if _, err := st.Put(ctx, key, strings.NewReader(body), store.PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for tm := 1; tm <= 2; tm++ {
			put(l.TermKey(uint64(tm)), fmt.Sprintf(`{"version":1,"term":%d,"leader":"gpt/rank0","rank":0}`, tm))
		}
		for id := 1; id <= 3; id++ {
			put(l.PlanKey(uint64(id)), fmt.Sprintf(`{"version":1,"window":%d,"term":2,"kind":"window","start":1,"stop":2,"world_size":1,"ranks":[0]}`, id))
		}
		put(l.OutcomeKey(1), `{"version":1,"window":1,"term":2,"state":"failed","error":"x","ranks":[]}`)
		put(l.ScheduleKey(), `{"version":1,"next":40,"term":1}`)
		tm, err := l.NewTerm(ctx, Term{Leader: "gpt/rank1", Rank: 1}, 0)
		if err != nil || tm.Term != 3 {
			t.Fatalf("the next term: %+v %v", tm, err)
		}
		p, err := l.CreatePlan(ctx, Plan{Term: tm.Term, Leader: "gpt/rank1", Kind: KindWindow, Start: 1, Stop: 2, WorldSize: 1}, 0, nil)
		if err != nil || p.ID != 4 {
			t.Fatalf("the next window: %+v %v", p, err)
		}
		un, err := l.Unfinished(ctx, tm.Term)
		if err != nil || len(un) != 3 || un[0].ID != 2 || un[2].ID != 4 {
			t.Fatalf("unfinished: %v %v", un, err)
		}
		if sc, err := l.ReadSchedule(ctx); err != nil || sc.Next != 40 {
			t.Fatalf("the schedule: %+v %v", sc, err)
		}
		if _, err := l.Finish(ctx, Outcome{ID: 2, Term: 2, State: Failed, Error: "stale"}); !errors.Is(err, ErrSuperseded) {
			t.Fatalf("an outcome of term 2: %v", err)
		}
		if o, err := l.Finish(ctx, Outcome{ID: 2, Term: tm.Term, State: Failed, Error: "y"}); err != nil || o.Error != "y" {
			t.Fatalf("the current term's outcome: %+v %v", o, err)
		}
	})
}

// TestNewestOf: a cooldown or a quiet time is read whole: the newest plan of a
// kind is found behind any number of newer plans of other kinds, and not past
// the first plan older than the time asked; a plan that does not read is passed
// over, and a log that cannot be read is an error, never "none".
func TestNewestOf(t *testing.T) {
	stores(t, func(t *testing.T, st store.Store) {
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
		oom := plan(KindOOM, now.Add(-time.Hour))
		trigger := plan(KindTrigger, now.Add(-50*time.Second))
		for range 20 {
			plan(KindWindow, now)
		}
		// a newer plan dated earlier (a post-mortem of orphaned incidents is
		// dated by its oldest; another leader's clock) does not end the walk
		crash := plan(KindCrash, now.Add(-3*time.Minute))
		if _, err := st.Put(ctx, l.PlanKey(30), strings.NewReader("{not a plan"), store.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			since time.Time
			kinds []string
			want  uint64
		}{
			{now.Add(-time.Minute), []string{KindTrigger}, trigger},
			{now.Add(-time.Minute), []string{KindCrash, KindTrigger}, trigger},
			{now.Add(-40 * time.Second), []string{KindTrigger}, 0},
			{now.Add(-time.Minute), []string{KindOOM}, 0},
			{now.Add(-2 * time.Hour), []string{KindOOM, KindCrash}, crash},
			{now.Add(-2 * time.Hour), []string{KindOOM}, oom},
			{now.Add(-time.Minute), []string{KindCrash}, 0},
		} {
			p, err := l.NewestOf(ctx, c.since, c.kinds...)
			got := uint64(0)
			if p != nil {
				got = p.ID
			}
			if err != nil || got != c.want {
				t.Errorf("the newest of %v since %v ago: window %d, %v; want %d", c.kinds, now.Sub(c.since), got, err, c.want)
			}
		}
		if _, err := New(listFails{st}, "gpt").NewestOf(ctx, now.Add(-time.Hour), KindTrigger); err == nil {
			t.Error("a log that cannot be listed: no error")
		}
	})
}

// listFails is a store whose listings fail.
type listFails struct{ store.Store }

func (listFails) List(ctx context.Context, prefix string) ([]store.ObjectInfo, error) {
	return nil, fmt.Errorf("%w: connection refused", store.ErrUnreachable)
}
