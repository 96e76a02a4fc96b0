package window_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator/commit"
	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/runlog"
)

// TestModel drives one window through random interleavings of what a cluster
// does to it, one step at a time: acks, ranks' steps and results (lost,
// duplicated, reordered), polls, reports read from the run's log, ticks of the
// leader's clock, a store that goes away and comes back, leaders that die,
// stall and wake under a superseded term, forged terms. Every leader is the
// window's state machine with its effects carried out against a real folder
// store through the real run's log and commit functions, as a task that may
// pause before any of its writes (model_store_test.go): its fence check and
// its write are two steps, and another leader's steps, a new term taken
// included, run between them. Every rank is an agent with a durable spool
// (model_rank_test.go): it stores its snapshot (one step), then reports it
// into the log (another), and its job ends only then; its agent may be killed
// between any two steps and come back (or not) to finish its jobs; the
// launcher's teardown stops every trainer at once, and each one in the middle
// of the window stores and reports what it recorded as partial, with its
// incident, then exits. After every step it checks (model_check_test.go):
//
//   - the window's manifest, its one commit point, goes answered → published or
//     is failed, once; the run's log and the manifest never disagree;
//   - (a) stored means reported: a rank's job that ended has its report in the
//     log, and a snapshot in the store whose job ended is named by a report;
//   - (b) no window is failed for want of snapshots, or published without a
//     rank, while the log held that rank's report when its leader read it
//     (partial recordings are merged as partial);
//   - (c) no record of the log written under a term older than the head's,
//     after that term took over, is believed by ReadPlan, Latest, Unfinished,
//     ReadOutcome or ReadSchedule;
//   - what the members waiting are told is what the store holds;
//
// and (d) at the end, with the store back and a leader alive, that the window
// ends. A failure names its seed: go test -run 'TestModel/^SEED$'.
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

// mleader is one leadership of the window.
type mleader struct {
	n        int
	term     uint64 // 0 while it takes its term
	w        *window.Window
	dead     bool
	stalled  bool
	task     *task             // its work, paused before a write (nil: none)
	left     string            // why it has no window any more (deferred, stepped down)
	told     map[int][]pb.Step // each rank's steps it told, in order
	lastRead map[int]uint64    // for each rank, the store's write count when it last read the rank's report
}

// free reports whether the leader can take an event now.
func (l *mleader) free() bool { return !l.dead && !l.stalled && l.task == nil }

type msg struct {
	to int // leader index
	ev window.Event
}

type retry struct {
	at time.Time
	to int
}

type model struct {
	t         *testing.T
	seed      uint64
	rng       *rand.Rand
	now       time.Time
	st        *modelStore
	rl        *runlog.Log
	raw       *runlog.Log // the same log, past the store's faults
	plan      runlog.Plan
	ranks     []*mrank
	leaders   []*mleader
	msgs      []msg
	retries   []retry
	log       []string
	ended     []string // what the members waiting were told, at the end
	loss      float64  // the chance a message to a leader is lost
	pause     float64  // the chance a leader's write waits for the scheduler
	outage    [2]time.Time
	torn      bool           // the launcher tore the job down
	tearAt    int            // the step it does that at (0: never)
	seq       uint64         // the store's writes so far
	reportSeq map[int]uint64 // when each rank's report of a stored snapshot first reached the log
	stale     []staleRec     // records written under a superseded term
	closing   bool           // the test is over: the tasks still paused are ended
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
	if m.closing {
		return
	}
	tail := m.log
	if len(tail) > 200 {
		tail = tail[len(tail)-200:]
	}
	m.t.Fatalf("seed %d: %s\n--- trace (last %d lines):\n%s", m.seed, fmt.Sprintf(f, a...), len(tail), strings.Join(tail, "\n"))
}

var timers = window.Timers{Ack: 5 * time.Second, Silence: 20 * time.Second, Poll: 2 * time.Second, Spool: 30 * time.Second,
	Publish: 40 * time.Second, Postmortem: 5 * time.Second}

func runModel(t *testing.T, seed uint64) {
	m := &model{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 7)), now: t0, reportSeq: map[int]uint64{}}
	dir, err := store.OpenDir(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	m.st = &modelStore{Store: dir, m: m, manifest: modelRun + "/window1/merged.manifest.json"}
	m.rl, m.raw = runlog.New(m.st, modelRun), runlog.New(dir, modelRun)
	t.Cleanup(m.close)
	m.setup()
	for i := 0; i < modelSteps; i++ {
		if m.tearAt > 0 && i == m.tearAt {
			m.teardown()
		}
		m.randomStep()
		m.check()
	}
	m.heal()
}

// setup makes the world (its ranks, how lossy and how slow it is) and leader
// 0, which plans the window and sends it out.
func (m *model) setup() {
	ctx := context.Background()
	world := 1 + m.rng.IntN(4)
	m.loss = []float64{0, 0.1, 0.4}[m.rng.IntN(3)]
	m.pause = []float64{0, 0.3, 0.6}[m.rng.IntN(3)]
	if m.rng.IntN(3) == 0 { // the launcher tears the job down at some step
		m.tearAt = 10 + m.rng.IntN(80)
	}
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
	tm, err := m.rl.NewTerm(ctx, runlog.Term{Leader: "leader0"}, 0)
	if err != nil {
		m.t.Fatal(err)
	}
	l := &mleader{term: tm.Term, lastRead: map[int]uint64{}}
	m.leaders = append(m.leaders, l)
	if m.plan, err = m.rl.CreatePlan(ctx, m.planOf(l, 5), 0, m.manifestKey); err != nil {
		m.t.Fatal(err)
	}
	asked := map[int]int64{}
	for r := range m.ranks {
		asked[r] = 0
	}
	l.w = window.New(window.Config{ID: m.plan.ID, Term: l.term, Kind: pb.WindowKind_WINDOW_KIND_WINDOW, Start: 5, Stop: 8, World: world, Asked: asked,
		Planned: t0, Deadline: t0.Add(60 * time.Second), Timers: timers, CanReplan: m.rng.IntN(2) == 0})
	m.trace("leader 0 takes term %d and plans window %d of %d ranks", l.term, m.plan.ID, world)
	for r := range m.ranks {
		m.command(0, r)
	}
	m.exec(ctx, l, l.w.Step(window.Sent{At: m.now}))
	m.st.flaky = []float64{0, 0, 0.05, 0.2}[m.rng.IntN(4)]
}

// planOf is a plan of every rank for batches [start, start+3), under l's term.
func (m *model) planOf(l *mleader, start int64) runlog.Plan {
	var ranks []int
	for r := range m.ranks {
		ranks = append(ranks, r)
	}
	return runlog.Plan{Term: l.term, Leader: fmt.Sprintf("leader%d", l.n), Kind: runlog.KindWindow, Start: start, Stop: start + 3, WorldSize: len(m.ranks),
		Ranks: ranks, Deadline: m.now.Add(60 * time.Second), Created: m.now}
}

func (m *model) manifestKey(id uint64) (string, error) {
	return fmt.Sprintf("%s/window%d/merged.manifest.json", modelRun, id), nil
}

// close ends the tasks still paused: their writes never happen.
func (m *model) close() {
	m.closing = true
	for _, l := range m.leaders {
		l.dead = true
		m.abort(l)
	}
}

// current is the leader the ranks talk to: the newest one.
func (m *model) current() *mleader { return m.leaders[len(m.leaders)-1] }

// command gives rank r the window's command from leader l.
func (m *model) command(l, r int) {
	rk := m.ranks[r]
	if !rk.member() {
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
	case n < 34:
		m.tick(time.Duration(m.rng.IntN(3000)) * time.Millisecond)
	case n < 56:
		m.deliver()
	case n < 70:
		m.rankStep()
	case n < 75:
		m.st.down = !m.st.down
		m.trace("store %s", map[bool]string{true: "goes away", false: "is back"}[m.st.down])
	case n < 91:
		m.leaderStep(n - 75)
	case n < 92:
		l := m.current()
		m.trace("a forged ack names term 2^53")
		m.msgs = append(m.msgs, msg{to: l.n, ev: window.Ack{Rank: m.rng.IntN(len(m.ranks)), Code: pb.AckCode_ACK_STALE_TERM, Term: 1 << 53, At: m.now}})
	case n < 96:
		m.sideWrite()
	default:
		// a sweep: a live leader without the window takes it over again
		if l := m.current(); l.free() && l.w == nil && l.term != 0 {
			m.act(l, func(ctx context.Context) { m.recover(ctx, l) })
		}
	}
}

// leaderStep is one of a leader's fates, n in [0, 16): it dies, stalls, wakes,
// or its paused write goes on.
func (m *model) leaderStep(n int) {
	l := m.current()
	switch {
	case n < 2:
		if !l.dead && !l.stalled && len(m.leaders) < 6 {
			l.dead = true
			m.trace("leader %d dies", l.n)
			m.abort(l)
			m.takeOver()
		}
	case n < 5:
		if !l.dead && !l.stalled && len(m.leaders) < 6 {
			l.stalled = true
			m.trace("leader %d stalls", l.n)
			m.takeOver()
		}
	case n < 9:
		for _, l := range m.leaders {
			if l.stalled && m.rng.IntN(2) == 0 {
				l.stalled = false
				m.trace("leader %d wakes under term %d", l.n, l.term)
			}
		}
	default:
		var paused []*mleader
		for _, l := range m.leaders {
			if l.task != nil && !l.dead && !l.stalled {
				paused = append(paused, l)
			}
		}
		if len(paused) > 0 {
			m.resume(paused[m.rng.IntN(len(paused))])
		}
	}
}

// sideWrite is a leader's write of another record of the log, under its term:
// where the schedule stands, or the plan of another window. A leader woken
// under a superseded term makes such writes too.
func (m *model) sideWrite() {
	l := m.leaders[m.rng.IntN(len(m.leaders))]
	if !l.free() || l.term == 0 {
		return
	}
	schedule := m.rng.IntN(2) == 0
	m.act(l, func(ctx context.Context) {
		if schedule {
			err := m.rl.PutSchedule(ctx, runlog.Schedule{Next: int64(100*l.n + m.rng.IntN(100)), Term: l.term})
			m.trace("leader %d (term %d) writes the schedule: %v", l.n, l.term, err)
			return
		}
		p, err := m.rl.CreatePlan(ctx, m.planOf(l, 100), 0, m.manifestKey)
		m.trace("leader %d (term %d) plans window %d: %v", l.n, l.term, p.ID, err)
	})
}

// tick moves the clock on: trainers whose snapshot is ready spool it, some
// uploaders take a step, retries fall due, and every live leader's window
// hears the time.
func (m *model) tick(d time.Duration) {
	m.now = m.now.Add(d)
	if !m.outage[0].IsZero() && !m.now.Before(m.outage[0]) {
		m.st.down = m.now.Before(m.outage[1])
		if !m.st.down {
			m.outage = [2]time.Time{}
			m.trace("store is back (outage over)")
		}
	}
	for _, r := range m.ranks {
		if r.member() && r.took && !r.recorded && !r.readyAt.IsZero() && !m.now.Before(r.readyAt) {
			m.record(r, &mjob{key: fmt.Sprintf("%s/snapshots/rank%d.window.pickle", modelRun, r.id), start: 5, stop: 8, reason: "window"})
		}
		if r.busy() && m.rng.IntN(2) == 0 {
			m.upload(r) // an uploader's step in the background
		}
	}
	for i := 0; i < len(m.retries); i++ {
		rt := m.retries[i]
		l := m.leaders[rt.to]
		if m.now.Before(rt.at) || l.task != nil && !l.dead {
			continue // not due, or its leader waits on a write
		}
		m.retries = append(m.retries[:i], m.retries[i+1:]...)
		i--
		if l.w != nil && l.free() {
			m.act(l, func(ctx context.Context) { m.exec(ctx, l, l.w.Step(window.RetryDue{At: m.now})) })
		}
	}
	for _, l := range m.leaders {
		if l.w != nil && l.free() {
			m.act(l, func(ctx context.Context) {
				m.exec(ctx, l, l.w.Step(window.Tick{At: m.now, IsMember: func(r int) bool { return m.ranks[r].member() }}))
			})
		}
	}
}

// deliver hands one message, at random, to its leader (sometimes twice); one
// for a leader waiting on a write waits for it.
func (m *model) deliver() {
	if len(m.msgs) == 0 {
		return
	}
	i := m.rng.IntN(len(m.msgs))
	mm := m.msgs[i]
	l := m.leaders[mm.to]
	if l.task != nil && !l.dead {
		return
	}
	if m.rng.IntN(8) != 0 {
		m.msgs = append(m.msgs[:i], m.msgs[i+1:]...)
	}
	if l.w == nil || !l.free() {
		return
	}
	m.trace("leader %d hears %T %+v", l.n, mm.ev, mm.ev)
	m.act(l, func(ctx context.Context) { m.exec(ctx, l, l.w.Step(mm.ev)) })
}

// takeOver makes a new leader: it takes the next term (its writes may pause
// as any leader's do; the store answers it), then finishes the window from
// the log.
func (m *model) takeOver() {
	l := &mleader{n: len(m.leaders), lastRead: map[int]uint64{}}
	m.leaders = append(m.leaders, l)
	m.act(l, func(ctx context.Context) {
		a := actorOf(ctx)
		a.noFault = true
		tm, err := m.rl.NewTerm(ctx, runlog.Term{Leader: fmt.Sprintf("leader%d", l.n)}, 0)
		a.noFault = false
		if err != nil {
			if !l.dead {
				m.fatalf("leader %d cannot take a term: %v", l.n, err)
			}
			return
		}
		l.term = tm.Term
		m.trace("leader %d takes term %d", l.n, l.term)
		m.recover(ctx, l)
	})
}

// recover is a leader taking the window over as the sweep does: from its
// manifest or outcome if it has one, else from the reports in the log and the
// ranks that answer.
func (m *model) recover(ctx context.Context, l *mleader) {
	c, err := m.commit(ctx)
	if err != nil {
		m.trace("leader %d cannot read the store to take the window over: %v", l.n, err)
		l.left = "store away"
		return
	}
	if _, oerr := m.rl.ReadOutcome(ctx, m.plan.ID); oerr == nil && c != nil {
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
		m.exec(ctx, l, w.Step(window.Publication{At: m.now, Held: c}))
		return
	}
	reps, err := m.readReports(ctx, l, m.plan.Ranks)
	if err != nil {
		m.trace("leader %d cannot read the reports: %v", l.n, err)
		l.left = "store away"
		return
	}
	found := map[int]window.Found{}
	for _, r := range m.ranks {
		f := window.Found{Report: reps[r.id]}
		if r.member() {
			f.Status = m.status(r)
		} else {
			f.LastHeard = m.now
		}
		found[r.id] = f
	}
	w := window.Recover(window.Resume{Config: cfg, Found: found, At: m.now, RejoinGrace: 5 * time.Second})
	l.w, l.left, l.told = w, "", nil // a window taken over anew tells its story anew
	m.trace("leader %d takes the window over", l.n)
	m.exec(ctx, l, w.Step(window.Tick{At: m.now, IsMember: func(r int) bool { return m.ranks[r].member() }}))
}

// readReports reads the window's reports from the log as leader l, noting
// what it read of ranks (for invariant b).
func (m *model) readReports(ctx context.Context, l *mleader, ranks []int) (map[int]*pb.RankResult, error) {
	at := m.seq + 1
	reps, _, err := m.rl.Reports(ctx, m.plan.ID)
	if err != nil {
		return nil, err
	}
	got := map[int]*pb.RankResult{}
	for _, r := range ranks {
		l.lastRead[r] = at
		if rep := reps[r]; rep != nil {
			got[r] = &pb.RankResult{Key: rep.Key, Start: rep.Start, Stop: rep.Stop, Size: rep.Size, Partial: rep.Partial, Reason: rep.Reason, Error: rep.Error}
		}
	}
	return got, nil
}

// commit reads the window's commit from the store (nil: none yet).
func (m *model) commit(ctx context.Context) (*window.Commit, error) { return m.commitIn(ctx, m.st) }

// rawCommit reads it past the store's faults.
func (m *model) rawCommit() (*window.Commit, error) {
	return m.commitIn(context.Background(), m.st.Store)
}

func (m *model) commitIn(ctx context.Context, st store.Store) (*window.Commit, error) {
	mf, err := publish.ReadManifest(ctx, st, m.st.manifest)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return commit.Of(mf), nil
}

// exec carries out a leader's effects, as the coordinator's leader does.
func (m *model) exec(ctx context.Context, l *mleader, fx []window.Effect) {
	for _, f := range fx {
		if l.w == nil || l.dead {
			return
		}
		m.effect(ctx, l, l.w, f)
	}
	if l.w != nil && l.w.Final {
		l.w, l.left = nil, "done" // a later sweep writes an outcome that did not get written
	}
}

func (m *model) effect(ctx context.Context, l *mleader, w *window.Window, f window.Effect) {
	fence := func(ctx context.Context) error { return m.rl.Fence(ctx, l.term) }
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
			if rk := m.ranks[r]; rk.member() && m.rng.IntN(10) > 0 {
				sts[r] = *m.status(rk)
			}
		}
		m.exec(ctx, l, w.Step(window.Polled{At: m.now, Status: sts}))
	case window.ReadLog:
		got, err := m.readReports(ctx, l, e.Ranks)
		m.trace("leader %d reads the log for ranks %v: %d reports, %v", l.n, e.Ranks, len(got), err)
		m.exec(ctx, l, w.Step(window.LogRead{At: m.now, Ranks: e.Ranks, Reports: got, OK: err == nil}))
	case window.CheckTerm:
		if latest, err := m.rl.LatestTerm(ctx); err == nil && latest > l.term {
			m.exec(ctx, l, w.Step(window.Superseded{Term: latest}))
		}
	case window.Replan:
		m.trace("leader %d gives the window up to plan it again", l.n)
		m.exec(ctx, l, w.Step(window.Abandon{Why: "planned again as a later window", Quiet: true, At: m.now}))
		if !l.dead {
			p, err := m.rl.CreatePlan(ctx, m.planOf(l, 20), 0, m.manifestKey)
			m.trace("leader %d plans it again as window %d: %v", l.n, p.ID, err)
		}
	case window.Publish:
		m.trace("leader %d publishes ranks %v", l.n, e.Ranks)
		m.publish(ctx, l, e.Ranks, fence)
	case window.Complete:
		m.trace("leader %d completes the answer", l.n)
		m.complete(ctx, l, fence)
	case window.CommitFailure:
		m.commitFailure(ctx, l, w, e, fence)
	case window.WriteOutcome:
		o := runlog.Outcome{ID: m.plan.ID, Term: l.term, Kind: runlog.KindWindow, State: runlog.Published, Manifest: m.st.manifest, Error: e.Why}
		if e.Phase == window.Failed {
			o.State = runlog.Failed
		}
		got, err := m.rl.Finish(ctx, o)
		m.trace("leader %d writes the outcome %s: %s %v", l.n, o.State, got.State, err)
	case window.TellAnswer:
		if c, err := m.rawCommit(); err == nil && (c == nil || c.Failed) {
			m.fatalf("leader %d tells the window answered; the store holds %+v", l.n, c)
		}
	case window.TellEnd:
		m.tellEnd(l, w)
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

func (m *model) commitFailure(ctx context.Context, l *mleader, w *window.Window, e window.CommitFailure, fence func(context.Context) error) {
	m.trace("leader %d commits the window as failed: %s", l.n, e.Why)
	attempt := "t" + strconv.FormatUint(l.term, 10)
	held, err := publish.CommitFailed(ctx, m.st, m.st.manifest, publish.FailedWindow{Error: e.Why, WorldSize: m.plan.WorldSize,
		MissingReasons: e.Missing, Attempt: attempt, Kind: "window"}, fence)
	ev := window.FailureCommitted{At: m.now}
	switch {
	case errors.Is(err, runlog.ErrSuperseded):
		ev.Superseded = true
	case err != nil:
		ev.Err, ev.Retryable = err.Error(), !store.Permanent(err)
	case held.Attempt != attempt || !held.Failed():
		ev.Held = commit.Of(held)
	}
	m.exec(ctx, l, w.Step(ev))
}

// tellEnd checks that what the members waiting hear is what the store holds.
func (m *model) tellEnd(l *mleader, w *window.Window) {
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
}

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

// answerOf is leader l's answer: the ranks it merges, under its attempt's claim.
func answerOf(l *mleader, ranks []int, world int) (*publish.Manifest, []byte) {
	attempt := "t" + strconv.FormatUint(l.term, 10)
	claim := []byte(fmt.Sprintf("claim of %s: %v", attempt, ranks))
	mf := &publish.Manifest{Version: 1, Claim: publish.Object{Name: "merged." + attempt + ".inputs.json", Size: int64(len(claim)), SHA256: sum(claim)},
		Outputs: map[string]publish.Object{}, WorldSize: world, RanksMerged: ranks, MissingRanks: []int{}, Attempt: attempt, Pending: []string{publish.OutPickle, publish.OutPB}}
	mf.Outputs[publish.OutSummary] = publish.Object{Name: "merged." + attempt + ".summary.json", Size: 1, SHA256: sum([]byte(attempt))}
	return mf, claim
}

// publish is a progressive merge's claim and two commits, as merge.Merge makes
// them, each write fenced by a check first.
func (m *model) publish(ctx context.Context, l *mleader, ranks []int, fence func(context.Context) error) {
	w := l.w
	cur, _, err := publish.ReadManifestVersion(ctx, m.st, m.st.manifest)
	switch {
	case err == nil:
		m.exec(ctx, l, w.Step(window.Publication{At: m.now, Held: commit.Of(cur)}))
		return
	case !errors.Is(err, store.ErrNotFound):
		m.exec(ctx, l, w.Step(publicationErr(err)))
		return
	}
	answer, claim := answerOf(l, ranks, m.plan.WorldSize)
	if err := fence(ctx); err != nil {
		m.exec(ctx, l, w.Step(publicationErr(err)))
		return
	}
	if _, err := m.st.Put(ctx, modelRun+"/window1/"+answer.Claim.Name, bytes.NewReader(claim), store.PutOptions{}); err != nil && !errors.Is(err, store.ErrExists) {
		m.exec(ctx, l, w.Step(publicationErr(err)))
		return
	}
	if _, err := publish.CommitManifest(ctx, m.st, m.st.manifest, answer, "", fence); err != nil {
		if errors.Is(err, store.ErrExists) {
			m.publish(ctx, l, ranks, fence) // another's commit: held
			return
		}
		m.exec(ctx, l, w.Step(publicationErr(err)))
		return
	}
	m.exec(ctx, l, w.Step(window.AnswerCommitted{At: m.now}))
	if l.w == nil || l.dead || m.rng.IntN(6) == 0 {
		if l.w != nil && !l.dead {
			l.dead = true
			m.trace("leader %d dies between its answer and its detail", l.n)
		}
		return
	}
	m.complete(ctx, l, fence)
}

// complete writes the detail of the answer the store holds, as merge.Merge does
// for an answer published with outputs pending.
func (m *model) complete(ctx context.Context, l *mleader, fence func(context.Context) error) {
	w := l.w
	cur, tag, err := publish.ReadManifestVersion(ctx, m.st, m.st.manifest)
	if err != nil {
		m.exec(ctx, l, w.Step(publicationErr(err)))
		return
	}
	if len(cur.Pending) == 0 {
		m.exec(ctx, l, w.Step(window.Publication{At: m.now, Held: &window.Commit{Failed: cur.Failed(), Error: cur.Error}}))
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
			m.complete(ctx, l, fence)
			return
		}
		m.exec(ctx, l, w.Step(publicationErr(err)))
		return
	}
	m.exec(ctx, l, w.Step(window.Publication{At: m.now, Done: true}))
}

func publicationErr(err error) window.Publication {
	if errors.Is(err, runlog.ErrSuperseded) {
		return window.Publication{Superseded: true}
	}
	return window.Publication{Err: err.Error(), Retryable: !store.Permanent(err)}
}

// heal brings the store back and keeps a leader alive until the window ends
// (invariant d): paused writes go on, live agents drain their spools.
func (m *model) heal() {
	m.st.down, m.st.flaky = false, 0
	for _, l := range m.leaders {
		if l.stalled && m.rng.IntN(2) == 0 {
			l.stalled = false
		}
	}
	m.trace("healed")
	for i := 0; i < 400; i++ {
		if m.ended1() {
			return
		}
		for _, l := range m.leaders {
			if l.task != nil && !l.dead && !l.stalled {
				m.resume(l)
			}
		}
		l := m.current()
		if l.dead || l.stalled {
			m.takeOver()
			continue
		}
		if l.free() && l.w == nil && l.term != 0 {
			m.act(l, func(ctx context.Context) { m.recover(ctx, l) })
		}
		for n := 0; len(m.msgs) > 0 && n < 100; n++ {
			m.deliver()
		}
		for _, r := range m.ranks {
			if r.busy() {
				m.upload(r)
			}
		}
		m.tick(time.Second)
		m.check()
	}
	m.fatalf("(d) the window did not end once the store was back")
}

// ended1 reports whether the window ended (its commit and its outcome are in),
// checking that its end is what the members waiting were told.
func (m *model) ended1() bool {
	c, _ := m.rawCommit()
	o, oerr := m.raw.ReadOutcome(context.Background(), m.plan.ID)
	if c == nil || oerr != nil {
		return false
	}
	p, final := window.Derive(c, o.State)
	if !p.Ended() && !final {
		m.fatalf("the window's log says %s, and its commit %+v is not an end", o.State, *c)
	}
	for _, told := range m.ended {
		if told != p.String() {
			m.fatalf("the members waiting were told %s; the window is %v", told, p)
		}
	}
	return true
}
