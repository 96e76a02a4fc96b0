package window_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/runlog"
)

// TestModel drives one window through random interleavings of what a cluster
// does to it: acks, ranks' steps and results (lost, duplicated, reordered),
// polls, reports read from the run's log, ticks of the leader's clock, a store
// that goes away and comes back, leaders that die, stall and wake under a
// superseded term, forged terms, ranks that die. Every leader is the window's
// state machine with its effects carried out against a real folder store
// through the real run's log and commit functions. After every step it checks:
//
//   - the window's manifest, its one commit point, goes answered → published or
//     is failed, once: at most one published output set;
//   - the run's log and the manifest never disagree;
//   - a window is never failed for want of snapshots while the log holds one;
//   - what the members waiting are told is what the store holds;
//
// and at the end, with the store back and a leader alive, that the window ends.
func TestModel(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 40
	}
	if s := os.Getenv("MEMSNAP_MODEL_SEEDS"); s != "" {
		seeds, _ = strconv.Atoi(s)
	}
	for seed := 1; seed <= seeds; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runModel(t, uint64(seed)) })
	}
}

const (
	modelRun   = "run"
	modelSteps = 160
)

var t0 = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

// modelStore is a folder store that can be taken away, and that records every
// version of the window's manifest it stored.
type modelStore struct {
	store.Store
	m        *model
	down     bool
	flaky    float64 // the chance that one call fails while up
	manifest string
	versions [][]byte
}

func (s *modelStore) fail() error {
	if s.down || (s.flaky > 0 && s.m.rng.Float64() < s.flaky) {
		return fmt.Errorf("%w: the model's store is away", store.ErrUnreachable)
	}
	return nil
}

func (s *modelStore) Put(ctx context.Context, key string, r io.Reader, o store.PutOptions) (store.ObjectInfo, error) {
	if err := s.fail(); err != nil {
		return store.ObjectInfo{}, err
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return store.ObjectInfo{}, err
	}
	if w := s.m.writer; w != nil && (key == s.manifest || strings.Contains(key, "/memsnap/outcomes/")) {
		if lt, err := s.m.raw.LatestTerm(ctx); err == nil && lt > w.term {
			s.m.fatalf("leader %d writes %s under term %d; the log holds term %d", w.n, key, w.term, lt)
		}
	}
	info, err := s.Store.Put(ctx, key, bytes.NewReader(b), o)
	if err == nil && key == s.manifest {
		s.versions = append(s.versions, b)
		s.m.trace("  store: manifest version %d written", len(s.versions))
	}
	return info, err
}

func (s *modelStore) Get(ctx context.Context, key string) (io.ReadCloser, store.ObjectInfo, error) {
	if err := s.fail(); err != nil {
		return nil, store.ObjectInfo{}, err
	}
	return s.Store.Get(ctx, key)
}

func (s *modelStore) Stat(ctx context.Context, key string) (store.ObjectInfo, error) {
	if err := s.fail(); err != nil {
		return store.ObjectInfo{}, err
	}
	return s.Store.Stat(ctx, key)
}

func (s *modelStore) List(ctx context.Context, prefix string) ([]store.ObjectInfo, error) {
	if err := s.fail(); err != nil {
		return nil, err
	}
	return s.Store.List(ctx, prefix)
}

// mrank is one rank as the model plays it.
type mrank struct {
	id      int
	took    bool // it has the window
	refuse  pb.AckCode
	readyAt time.Time // when its trainer's snapshot is taken (zero: never)
	dead    bool
	spooled bool // taken, and waiting for the store
	stored  bool // in the store, its report in the log
	result  *pb.RankResult
}

// mleader is one leadership of the window.
type mleader struct {
	n       int
	term    uint64
	w       *window.Window
	dead    bool
	stalled bool
	left    string            // why it has no window any more (deferred, stepped down)
	told    map[int][]pb.Step // each rank's steps it told, in order
}

type msg struct {
	to int // leader index
	ev window.Event
}

type retry struct {
	at time.Time
	to int
}

type model struct {
	t       *testing.T
	rng     *rand.Rand
	now     time.Time
	st      *modelStore
	rl      *runlog.Log
	raw     *runlog.Log // the same log, past the store's faults
	plan    runlog.Plan
	ranks   []*mrank
	leaders []*mleader
	msgs    []msg
	retries []retry
	log     []string
	ended   []string // what the members waiting were told, at the end
	loss    float64  // the chance a message to a leader is lost
	writer  *mleader // the leader whose effects are being carried out
	outage  [2]time.Time
}

func (m *model) trace(f string, a ...any) {
	m.log = append(m.log, fmt.Sprintf("%6.1fs ", m.now.Sub(t0).Seconds())+fmt.Sprintf(f, a...))
}

// toldStep checks that a leader tells each rank's steps as its story: in order,
// once each, and a step after those it implies (acked, armed, recording) unless
// the rank's end was told first.
func (m *model) toldStep(l *mleader, rank int, step pb.Step) {
	if l.told == nil {
		l.told = map[int][]pb.Step{}
	}
	prev := l.told[rank]
	o := window.StepOrder(step)
	for _, p := range prev {
		if po := window.StepOrder(p); po > o || po == o && (o < window.EndOrder || p == step) {
			m.fatalf("leader %d told rank %d %s after %v", l.n, rank, window.StepName(step), prev)
		}
	}
	ended := slices.ContainsFunc(prev, func(p pb.Step) bool { return window.StepOrder(p) == window.EndOrder })
	if !ended && (step == pb.Step_STEP_UPLOADED || o < window.EndOrder && step != pb.Step_STEP_STOPPING) {
		for _, implied := range []pb.Step{pb.Step_STEP_ACKED, pb.Step_STEP_ARMED, pb.Step_STEP_RECORDING} {
			if window.StepOrder(implied) < o && !slices.Contains(prev, implied) && !slices.Contains(prev, pb.Step_STEP_STOPPING) {
				m.fatalf("leader %d told rank %d %s before %s (%v)", l.n, rank, window.StepName(step), window.StepName(implied), prev)
			}
		}
	}
	l.told[rank] = append(prev, step)
	m.trace("told rank %d %s", rank, window.StepName(step))
}

func (m *model) fatalf(f string, a ...any) {
	m.t.Helper()
	tail := m.log
	if len(tail) > 200 {
		tail = tail[len(tail)-200:]
	}
	m.t.Fatalf("%s\n--- trace (last %d lines):\n%s", fmt.Sprintf(f, a...), len(tail), strings.Join(tail, "\n"))
}

var timers = window.Timers{Ack: 5 * time.Second, Silence: 20 * time.Second, Poll: 2 * time.Second, Spool: 30 * time.Second,
	Publish: 40 * time.Second, Postmortem: 5 * time.Second}

func runModel(t *testing.T, seed uint64) {
	ctx := context.Background()
	m := &model{t: t, rng: rand.New(rand.NewPCG(seed, 7)), now: t0}
	dir, err := store.OpenDir(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	m.st = &modelStore{Store: dir, m: m}
	m.rl = runlog.New(m.st, modelRun)
	m.raw = runlog.New(dir, modelRun)
	world := 1 + m.rng.IntN(4)
	m.st.manifest = modelRun + "/window1/merged.manifest.json"
	m.loss = []float64{0, 0.1, 0.4}[m.rng.IntN(3)]
	if m.rng.IntN(3) == 0 { // the store is away around the window's deadline
		from := t0.Add(time.Duration(30+m.rng.IntN(40)) * time.Second)
		m.outage = [2]time.Time{from, from.Add(time.Duration(5+m.rng.IntN(40)) * time.Second)}
	}
	for r := 0; r < world; r++ {
		rk := &mrank{id: r}
		if m.rng.IntN(10) > 0 {
			rk.readyAt = t0.Add(time.Duration(2+m.rng.IntN(40)) * time.Second)
		}
		switch m.rng.IntN(20) {
		case 0:
			rk.refuse = pb.AckCode_ACK_PASSED
		case 1:
			rk.refuse = pb.AckCode_ACK_BUSY
		}
		m.ranks = append(m.ranks, rk)
	}
	l := m.newLeader()
	asked := map[int]int64{}
	for r := range m.ranks {
		asked[r] = 0
	}
	m.plan, err = m.rl.CreatePlan(ctx, runlog.Plan{Term: l.term, Leader: "leader", Kind: runlog.KindWindow, Start: 5, Stop: 8, WorldSize: world,
		Ranks: keys(asked), Deadline: t0.Add(60 * time.Second), Created: t0}, 0, func(uint64) (string, error) { return m.st.manifest, nil })
	if err != nil {
		t.Fatal(err)
	}
	l.w = window.New(window.Config{ID: m.plan.ID, Term: l.term, Kind: pb.WindowKind_WINDOW_KIND_WINDOW, Start: 5, Stop: 8, World: world, Asked: asked,
		Planned: t0, Deadline: t0.Add(60 * time.Second), Timers: timers, CanReplan: m.rng.IntN(2) == 0})
	m.trace("leader 0 plans window %d of %d ranks", m.plan.ID, world)
	for r := range m.ranks {
		m.command(0, r)
	}
	m.exec(l, l.w.Step(window.Sent{At: m.now}))
	m.st.flaky = []float64{0, 0, 0.05, 0.2}[m.rng.IntN(4)]

	for i := 0; i < modelSteps; i++ {
		m.randomStep()
		m.check()
	}
	m.heal()
}

func keys(m map[int]int64) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	return out
}

func (m *model) newLeader() *mleader {
	m.t.Helper()
	var tm runlog.Term
	var err error
	for try := 0; ; try++ {
		down, flaky := m.st.down, m.st.flaky
		m.st.down, m.st.flaky = false, 0 // a leader takes its term once the store answers
		tm, err = m.rl.NewTerm(context.Background(), runlog.Term{Leader: fmt.Sprintf("leader%d", len(m.leaders))}, 0)
		m.st.down, m.st.flaky = down, flaky
		if err == nil {
			break
		}
		m.t.Fatal(err)
	}
	l := &mleader{n: len(m.leaders), term: tm.Term}
	m.leaders = append(m.leaders, l)
	m.trace("leader %d takes term %d", l.n, l.term)
	return l
}

// current is the leader the ranks talk to: the newest one.
func (m *model) current() *mleader { return m.leaders[len(m.leaders)-1] }

// command gives rank r the window's command from leader l.
func (m *model) command(l, r int) {
	rk := m.ranks[r]
	if rk.dead {
		return
	}
	if rk.refuse != 0 {
		m.send(l, window.Ack{Rank: r, Code: rk.refuse, At: m.now, Message: "no"})
		return
	}
	rk.took = true
	m.send(l, window.Ack{Rank: r, Code: pb.AckCode_ACK_OK, At: m.now})
}

// send queues a message to leader l; some are lost.
func (m *model) send(l int, ev window.Event) {
	if m.rng.Float64() < m.loss {
		return
	}
	m.msgs = append(m.msgs, msg{to: l, ev: ev})
}

func (m *model) randomStep() {
	switch n := m.rng.IntN(100); {
	case n < 40:
		m.tick(time.Duration(m.rng.IntN(3000)) * time.Millisecond)
	case n < 70:
		m.deliver()
	case n < 76:
		m.st.down = !m.st.down
		m.trace("store %s", map[bool]string{true: "goes away", false: "is back"}[m.st.down])
	case n < 79:
		if l := m.current(); !l.dead && !l.stalled && len(m.leaders) < 6 {
			l.dead = true
			m.trace("leader %d dies", l.n)
			m.takeOver()
		}
	case n < 82:
		if l := m.current(); !l.dead && !l.stalled && len(m.leaders) < 6 {
			l.stalled = true
			m.trace("leader %d stalls", l.n)
			m.takeOver()
		}
	case n < 86:
		for _, l := range m.leaders {
			if l.stalled && m.rng.IntN(2) == 0 {
				l.stalled = false
				m.trace("leader %d wakes under term %d", l.n, l.term)
			}
		}
	case n < 88:
		l := m.current()
		m.trace("a forged ack names term 2^53")
		m.msgs = append(m.msgs, msg{to: l.n, ev: window.Ack{Rank: m.rng.IntN(len(m.ranks)), Code: pb.AckCode_ACK_STALE_TERM, Term: 1 << 53, At: m.now}})
	case n < 90:
		r := m.ranks[m.rng.IntN(len(m.ranks))]
		if !r.dead {
			r.dead = true
			m.trace("rank %d dies", r.id)
		}
	default:
		// a sweep: a live leader without the window takes it over again
		for _, l := range m.leaders {
			if l.w == nil && !l.dead && !l.stalled && l == m.current() {
				m.recover(l)
			}
		}
	}
}

// tick moves the clock on: ranks whose snapshot is ready store it, retries fall
// due, and every live leader's window hears the time.
func (m *model) tick(d time.Duration) {
	ctx := context.Background()
	m.now = m.now.Add(d)
	if !m.outage[0].IsZero() && !m.now.Before(m.outage[0]) {
		m.st.down = m.now.Before(m.outage[1])
		if !m.st.down {
			m.outage = [2]time.Time{}
			m.trace("store is back (outage over)")
		}
	}
	for _, r := range m.ranks {
		if r.dead || !r.took || r.stored || r.readyAt.IsZero() || m.now.Before(r.readyAt) {
			continue
		}
		res := &pb.RankResult{Key: fmt.Sprintf("%s/rank%d.pickle", modelRun, r.id), Start: 5, Stop: 8, Size: 1}
		err := m.rl.PutReport(ctx, runlog.Report{Window: m.plan.ID, Rank: r.id, Key: res.Key, Start: 5, Stop: 8, Size: 1})
		if err != nil {
			if !r.spooled {
				r.spooled = true
				m.trace("rank %d: its snapshot waits in its spool", r.id)
				m.send(m.current().n, window.Progress{Rank: r.id, Step: pb.Step_STEP_SPOOLED, At: m.now, Reason: err.Error()})
			}
			continue
		}
		r.stored, r.spooled, r.result = true, false, res
		m.trace("rank %d stored its snapshot", r.id)
		m.send(m.current().n, window.Stored{Rank: r.id, Result: res, At: m.now})
	}
	for i := 0; i < len(m.retries); i++ {
		if rt := m.retries[i]; !m.now.Before(rt.at) {
			m.retries = append(m.retries[:i], m.retries[i+1:]...)
			i--
			if l := m.leaders[rt.to]; l.w != nil && !l.dead && !l.stalled {
				m.exec(l, l.w.Step(window.RetryDue{At: m.now}))
			}
		}
	}
	for _, l := range m.leaders {
		if l.w != nil && !l.dead && !l.stalled {
			m.exec(l, l.w.Step(window.Tick{At: m.now, IsMember: func(r int) bool { return !m.ranks[r].dead }}))
		}
	}
}

// deliver hands one message, at random, to its leader (sometimes twice).
func (m *model) deliver() {
	if len(m.msgs) == 0 {
		return
	}
	i := m.rng.IntN(len(m.msgs))
	mm := m.msgs[i]
	if m.rng.IntN(8) != 0 {
		m.msgs = append(m.msgs[:i], m.msgs[i+1:]...)
	}
	l := m.leaders[mm.to]
	if l.w == nil || l.dead || l.stalled {
		return
	}
	m.trace("leader %d hears %T %+v", l.n, mm.ev, mm.ev)
	m.exec(l, l.w.Step(mm.ev))
}

// takeOver makes a new leader, which finishes the window from the log.
func (m *model) takeOver() {
	l := m.newLeader()
	m.recover(l)
}

// recover is a leader taking the window over as the sweep does: from its
// manifest or outcome if it has one, else from the reports in the log and the
// ranks that answer.
func (m *model) recover(l *mleader) {
	ctx := context.Background()
	c, err := m.commit()
	if err != nil {
		m.trace("leader %d cannot read the store to take the window over: %v", l.n, err)
		l.left = "store away"
		return
	}
	o, oerr := m.rl.ReadOutcome(ctx, m.plan.ID)
	if oerr == nil && c != nil {
		m.trace("leader %d: the window ended", l.n)
		l.w = nil
		return
	}
	asked := map[int]int64{}
	for _, r := range m.plan.Ranks {
		asked[r] = -1
	}
	cfg := window.Config{ID: m.plan.ID, Term: l.term, Kind: pb.WindowKind_WINDOW_KIND_WINDOW, Start: 5, Stop: 8, World: m.plan.WorldSize, Asked: asked,
		Planned: m.now, Deadline: m.now.Add(60 * time.Second), Timers: timers}
	if c != nil {
		// its commit is there and its outcome is not: the window's own state
		w := window.Recover(window.Resume{Config: cfg, At: m.now})
		l.w, l.told = w, nil
		m.trace("leader %d takes over a committed window (%+v)", l.n, *c)
		m.exec(l, w.Step(window.Publication{At: m.now, Held: c}))
		return
	}
	_ = o
	reps, _, err := m.rl.Reports(ctx, m.plan.ID)
	if err != nil {
		m.trace("leader %d cannot read the reports: %v", l.n, err)
		l.left = "store away"
		return
	}
	found := map[int]window.Found{}
	for _, r := range m.ranks {
		f := window.Found{}
		if rep := reps[r.id]; rep != nil {
			f.Report = &pb.RankResult{Key: rep.Key, Start: rep.Start, Stop: rep.Stop, Size: rep.Size}
		}
		if !r.dead {
			f.Status = m.status(r)
		} else {
			f.LastHeard = m.now
		}
		found[r.id] = f
	}
	w := window.Recover(window.Resume{Config: cfg, Found: found, At: m.now, RejoinGrace: 5 * time.Second})
	l.w, l.left, l.told = w, "", nil // a window taken over anew tells its story anew
	m.trace("leader %d takes the window over", l.n)
	m.exec(l, w.Step(window.Tick{At: m.now, IsMember: func(r int) bool { return !m.ranks[r].dead }}))
}

func (m *model) status(r *mrank) *window.Status {
	st := &window.Status{Batch: 4, Step: pb.Step_STEP_RECORDING}
	if r.took {
		st.Window = m.plan.ID
	}
	if r.stored {
		st.Step, st.Result = pb.Step_STEP_UPLOADED, r.result
	}
	st.Spooled = r.spooled
	return st
}

// commit reads the window's commit from the store (nil: none yet).
func (m *model) commit() (*window.Commit, error) { return m.commitIn(m.st) }

// rawCommit reads it past the store's faults.
func (m *model) rawCommit() (*window.Commit, error) { return m.commitIn(m.st.Store) }

func (m *model) commitIn(st store.Store) (*window.Commit, error) {
	mf, err := publish.ReadManifest(context.Background(), st, m.st.manifest)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &window.Commit{Failed: mf.Failed(), Pending: len(mf.Pending) > 0, Error: mf.Error}, nil
}

// exec carries out a leader's effects, as the coordinator's leader does.
func (m *model) exec(l *mleader, fx []window.Effect) {
	ctx := context.Background()
	prev := m.writer
	m.writer = l
	defer func() { m.writer = prev }()
	fence := func(ctx context.Context) error { return m.rl.Fence(ctx, l.term) }
	for _, f := range fx {
		if l.w == nil {
			return
		}
		w := l.w
		switch e := f.(type) {
		case window.Tell:
			if e.Rank >= 0 {
				m.toldStep(l, e.Rank, e.Step)
			}
		case window.Send:
			for _, r := range e.Ranks {
				m.command(l.n, r)
			}
		case window.Poll:
			sts := map[int]window.Status{}
			for _, r := range e.Ranks {
				if rk := m.ranks[r]; !rk.dead && m.rng.IntN(10) > 0 {
					sts[r] = *m.status(rk)
				}
			}
			m.exec(l, w.Step(window.Polled{At: m.now, Status: sts}))
		case window.ReadLog:
			reps, _, err := m.rl.Reports(ctx, m.plan.ID)
			got := map[int]*pb.RankResult{}
			for _, r := range e.Ranks {
				if rep := reps[r]; rep != nil {
					got[r] = &pb.RankResult{Key: rep.Key, Start: rep.Start, Stop: rep.Stop, Size: rep.Size}
				}
			}
			m.trace("leader %d reads the log for ranks %v: %d reports, %v", l.n, e.Ranks, len(got), err)
			m.exec(l, w.Step(window.LogRead{At: m.now, Ranks: e.Ranks, Reports: got, OK: err == nil}))
		case window.CheckTerm:
			if latest, err := m.rl.LatestTerm(ctx); err == nil && latest > l.term {
				m.exec(l, w.Step(window.Superseded{Term: latest}))
			}
		case window.Replan:
			m.trace("leader %d gives the window up to plan it again", l.n)
			m.exec(l, w.Step(window.Abandon{Why: "planned again as a later window", Quiet: true, At: m.now}))
		case window.Publish:
			m.trace("leader %d publishes ranks %v", l.n, e.Ranks)
			m.publish(l, e.Ranks, fence)
		case window.Complete:
			m.trace("leader %d completes the answer", l.n)
			m.complete(l, fence)
		case window.CommitFailure:
			m.trace("leader %d commits the window as failed: %s", l.n, e.Why)
			held, err := publish.CommitFailed(ctx, m.st, m.st.manifest, publish.FailedWindow{Error: e.Why, WorldSize: m.plan.WorldSize,
				MissingReasons: e.Missing, Attempt: "t" + strconv.FormatUint(l.term, 10), Kind: "window"}, fence)
			if err == nil && held.Attempt == "t"+strconv.FormatUint(l.term, 10) && strings.HasPrefix(e.Why, "no rank stored") {
				// this leader failed the window for want of snapshots: the store
				// (seen past its faults) must hold none
				if reps, _, rerr := m.raw.Reports(ctx, m.plan.ID); rerr == nil && len(reps) > 0 {
					m.fatalf("leader %d (term %d) failed the window for want of snapshots while the log holds %d reports", l.n, l.term, len(reps))
				}
			}
			ev := window.FailureCommitted{At: m.now}
			switch {
			case errors.Is(err, runlog.ErrSuperseded):
				ev.Superseded = true
			case err != nil:
				ev.Err, ev.Retryable = err.Error(), !store.Permanent(err)
			case held.Attempt != "t"+strconv.FormatUint(l.term, 10) || !held.Failed():
				ev.Held = &window.Commit{Failed: held.Failed(), Pending: len(held.Pending) > 0, Error: held.Error}
			}
			m.exec(l, w.Step(ev))
		case window.WriteOutcome:
			o := runlog.Outcome{ID: m.plan.ID, Term: l.term, Kind: runlog.KindWindow, State: runlog.Published, Manifest: m.st.manifest, Error: e.Why}
			if e.Phase == window.Failed {
				o.State = runlog.Failed
			}
			got, err := m.rl.Finish(ctx, o)
			m.trace("leader %d writes the outcome %s: %s %v", l.n, o.State, got.State, err)
		case window.TellAnswer:
			c, err := m.rawCommit()
			if err == nil && (c == nil || c.Failed) {
				m.fatalf("leader %d tells the window answered; the store holds %+v", l.n, c)
			}
		case window.TellEnd:
			c, err := m.rawCommit()
			if err == nil {
				switch {
				case c == nil:
					m.fatalf("leader %d tells the window ended (%v); the store holds no commit", l.n, w.Phase)
				case c.Failed != (w.Phase == window.Failed) || w.Phase == window.Published && c.Pending:
					m.fatalf("leader %d tells the window %v; the store holds %+v", l.n, w.Phase, *c)
				}
			}
			m.ended = append(m.ended, w.Phase.String())
		case window.Retry:
			m.retries = append(m.retries, retry{at: m.now.Add(e.After), to: l.n})
		case window.Defer:
			m.trace("leader %d leaves the window for later: %s", l.n, e.Why)
			l.w, l.left = nil, "deferred"
		case window.StepDown:
			m.trace("leader %d steps down", l.n)
			l.w, l.left = nil, "stepped down"
		default:
			m.fatalf("an effect the model does not know: %T", f)
		}
	}
	if l.w != nil && l.w.Final {
		l.w, l.left = nil, "done" // a later sweep writes an outcome that did not get written
	}
}

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

// answerOf is leader l's answer: the ranks it merges, under its attempt's claim.
func answerOf(l *mleader, ranks []int, world int) *publish.Manifest {
	attempt := "t" + strconv.FormatUint(l.term, 10)
	claim := []byte(fmt.Sprintf("claim of %s: %v", attempt, ranks))
	mf := &publish.Manifest{Version: 1, Claim: publish.Object{Name: "merged." + attempt + ".inputs.json", Size: int64(len(claim)), SHA256: sum(claim)},
		Outputs: map[string]publish.Object{}, WorldSize: world, RanksMerged: ranks, MissingRanks: []int{}, Attempt: attempt, Pending: []string{publish.OutPickle, publish.OutPB}}
	mf.Outputs[publish.OutSummary] = publish.Object{Name: "merged." + attempt + ".summary.json", Size: 1, SHA256: sum([]byte(attempt))}
	return mf
}

// publish is a progressive merge's two commits, as merge.Merge makes them.
func (m *model) publish(l *mleader, ranks []int, fence func(context.Context) error) {
	ctx := context.Background()
	w := l.w
	cur, _, err := publish.ReadManifestVersion(ctx, m.st, m.st.manifest)
	switch {
	case err == nil:
		m.exec(l, w.Step(window.Publication{At: m.now, Held: &window.Commit{Failed: cur.Failed(), Pending: len(cur.Pending) > 0, Error: cur.Error}}))
		return
	case !errors.Is(err, store.ErrNotFound):
		m.exec(l, w.Step(publicationErr(err)))
		return
	}
	answer := answerOf(l, ranks, m.plan.WorldSize)
	if _, err := publish.CommitManifest(ctx, m.st, m.st.manifest, answer, "", fence); err != nil {
		if errors.Is(err, store.ErrExists) {
			m.publish(l, ranks, fence) // another's commit: held
			return
		}
		m.exec(l, w.Step(publicationErr(err)))
		return
	}
	m.exec(l, w.Step(window.AnswerCommitted{At: m.now}))
	if l.w == nil || m.rng.IntN(6) == 0 {
		if l.w != nil {
			l.dead = true
			m.trace("leader %d dies between its answer and its detail", l.n)
		}
		return
	}
	m.complete(l, fence)
}

// complete writes the detail of the answer the store holds, as merge.Merge does
// for an answer published with outputs pending.
func (m *model) complete(l *mleader, fence func(context.Context) error) {
	ctx := context.Background()
	w := l.w
	cur, tag, err := publish.ReadManifestVersion(ctx, m.st, m.st.manifest)
	if err != nil {
		m.exec(l, w.Step(publicationErr(err)))
		return
	}
	if len(cur.Pending) == 0 {
		m.exec(l, w.Step(window.Publication{At: m.now, Held: &window.Commit{Failed: cur.Failed(), Error: cur.Error}}))
		return
	}
	done := *cur
	done.Pending = nil
	done.Outputs = map[string]publish.Object{}
	for k, v := range cur.Outputs {
		done.Outputs[k] = v
	}
	done.Outputs[publish.OutPickle] = publish.Object{Name: strings.TrimSuffix(cur.Claim.Name, ".inputs.json") + ".memory_snapshot.pickle", Size: 1, SHA256: sum([]byte("p"))}
	if _, err := publish.CommitManifest(ctx, m.st, m.st.manifest, &done, tag, fence); err != nil {
		if errors.Is(err, store.ErrChanged) {
			m.complete(l, fence)
			return
		}
		m.exec(l, w.Step(publicationErr(err)))
		return
	}
	m.exec(l, w.Step(window.Publication{At: m.now, Done: true}))
}

func publicationErr(err error) window.Publication {
	if errors.Is(err, runlog.ErrSuperseded) {
		return window.Publication{Superseded: true}
	}
	return window.Publication{Err: err.Error(), Retryable: !store.Permanent(err)}
}

// check tests the invariants against the store.
func (m *model) check() {
	m.t.Helper()
	// the manifest's versions: an answer then its completion, or a failure; once
	var first *publish.Manifest
	for i, b := range m.st.versions {
		mf, err := publish.ParseManifest(b)
		if err != nil {
			m.fatalf("manifest version %d does not parse: %v", i+1, err)
		}
		switch {
		case i == 0:
			first = mf
			if !mf.Failed() && len(mf.Pending) == 0 {
				m.fatalf("the first commit is published whole, not answered first")
			}
		case i == 1 && first.Failed():
			m.fatalf("a failed window's manifest was replaced")
		case i == 1:
			if mf.Failed() || len(mf.Pending) > 0 || mf.Claim != first.Claim || mf.Attempt != first.Attempt {
				m.fatalf("an answer (%s) was replaced by another set (%s, failed %v, pending %v)", first.Attempt, mf.Attempt, mf.Failed(), mf.Pending)
			}
		default:
			m.fatalf("the manifest was written %d times", len(m.st.versions))
		}
	}
	// the log and the manifest agree
	c, err := m.rawCommit()
	if err != nil {
		m.fatalf("reading the commit: %v", err)
	}
	o, err := m.raw.ReadOutcome(context.Background(), m.plan.ID)
	if err == nil && !window.Agrees(c, o.State) {
		m.fatalf("the log says %s, the manifest %+v", o.State, c)
	}
	if err == nil && c == nil {
		m.fatalf("an outcome (%s) with no commit", o.State)
	}
}

// heal brings the store back and keeps a leader alive until the window ends.
func (m *model) heal() {
	m.st.down, m.st.flaky = false, 0
	for _, l := range m.leaders {
		if l.stalled && m.rng.IntN(2) == 0 {
			l.stalled = false
		}
	}
	m.trace("healed")
	for i := 0; i < 400; i++ {
		c, _ := m.rawCommit()
		o, oerr := m.raw.ReadOutcome(context.Background(), m.plan.ID)
		if c != nil && oerr == nil {
			if p, final := window.Derive(c, o.State); !p.Ended() && !final {
				m.fatalf("the window's log says %s, and its commit %+v is not an end", o.State, *c)
			}
			for _, told := range m.ended {
				if p, _ := window.Derive(c, o.State); told != p.String() {
					m.fatalf("the members waiting were told %s; the window is %v", told, p)
				}
			}
			return
		}
		l := m.current()
		if l.dead || l.stalled {
			m.takeOver()
			continue
		}
		if l.w == nil {
			m.recover(l)
		}
		for len(m.msgs) > 0 {
			m.deliver()
		}
		m.tick(time.Second)
		m.check()
	}
	m.fatalf("the window did not end once the store was back")
}
