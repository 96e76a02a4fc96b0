package window

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
)

var at0 = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

var testTimers = Timers{Ack: 5 * time.Second, Silence: 10 * time.Second, Poll: 2 * time.Second, Spool: 30 * time.Second, Publish: 20 * time.Second}

// started is a window of n ranks, planned and sent at at0, every rank acked.
func started(t *testing.T, n int) *Window {
	t.Helper()
	asked := map[int]int64{}
	for r := 0; r < n; r++ {
		asked[r] = 3
	}
	w := New(Config{ID: 7, Term: 2, Kind: pb.WindowKind_WINDOW_KIND_WINDOW, Start: 5, Stop: 8, World: n, Asked: asked, Planned: at0,
		Deadline: at0.Add(time.Minute), Timers: testTimers})
	w.Step(Sent{At: at0})
	for r := 0; r < n; r++ {
		w.Step(Ack{Rank: r, Code: pb.AckCode_ACK_OK, At: at0})
	}
	if w.Phase != Collecting {
		t.Fatalf("phase %v after the acks", w.Phase)
	}
	return w
}

func result() *pb.RankResult { return &pb.RankResult{Key: "k", MetaKey: "m", Start: 5, Stop: 8} }

func find[E Effect](fx []Effect) (E, bool) {
	for _, f := range fx {
		if e, ok := f.(E); ok {
			return e, true
		}
	}
	var zero E
	return zero, false
}

// TestHappyPath: every rank stores its snapshot; the window publishes them,
// answers, then ends published with its outcome written and the members told.
func TestHappyPath(t *testing.T) {
	w := started(t, 3)
	var fx []Effect
	for r := 0; r < 3; r++ {
		fx = w.Step(Stored{Rank: r, Result: result(), At: at0.Add(time.Second)})
	}
	p, ok := find[Publish](fx)
	if !ok || len(p.Ranks) != 3 || w.Phase != Merging {
		t.Fatalf("after the last result: %v %+v", w.Phase, fx)
	}
	if _, ok := find[TellAnswer](w.Step(AnswerCommitted{})); !ok || w.Phase != Answered {
		t.Fatalf("the answer: %v", w.Phase)
	}
	fx = w.Step(Publication{Done: true})
	if o, ok := find[WriteOutcome](fx); !ok || o.Phase != Published || w.Phase != Published || !w.Final {
		t.Fatalf("the end: %v %+v", w.Phase, fx)
	}
	if _, ok := find[TellEnd](fx); !ok {
		t.Fatal("nobody told the window ended")
	}
	if e, _ := w.Exit(); e != Ended {
		t.Fatalf("exit of an ended window: %v", e)
	}
	if fx := w.Step(Tick{At: at0.Add(time.Hour)}); fx != nil {
		t.Fatalf("an ended window still acts: %+v", fx)
	}
}

// TestSpooledRankIsWaitedFor: at the deadline, a rank whose snapshot waits in
// its spool for the store is waited for Timers.Spool more, and merged once it
// is stored; a rank silent is read for in the log, then missing.
func TestSpooledRankIsWaitedFor(t *testing.T) {
	w := started(t, 3)
	w.Step(Stored{Rank: 0, Result: result(), At: at0})
	w.Step(Progress{Rank: 1, Step: pb.Step_STEP_SPOOLED, At: at0.Add(50 * time.Second), Reason: "the store refuses"})
	w.Step(Progress{Rank: 2, Step: pb.Step_STEP_RECORDING, At: at0.Add(50 * time.Second)})
	fx := w.Step(Tick{At: at0.Add(61 * time.Second)})
	rl, ok := find[ReadLog](fx)
	if !ok || len(rl.Ranks) != 1 || rl.Ranks[0] != 2 {
		t.Fatalf("at the deadline the log is read for the rank not spooled: %+v", fx)
	}
	w.Step(LogRead{At: at0.Add(61 * time.Second), Ranks: rl.Ranks, OK: true})
	if w.Ranks[2].Phase != Missing || w.Ranks[1].Phase != Spooled || w.Phase != Collecting {
		t.Fatalf("rank 2 %v, rank 1 %v, window %v", w.Ranks[2].Phase, w.Ranks[1].Phase, w.Phase)
	}
	fx = w.Step(Stored{Rank: 1, Result: result(), At: at0.Add(80 * time.Second)})
	if p, ok := find[Publish](fx); !ok || len(p.Ranks) != 2 {
		t.Fatalf("the spooled rank's snapshot is merged: %+v", fx)
	}
	// past the spool's wait it is given up on
	w = started(t, 2)
	w.Step(Stored{Rank: 0, Result: result(), At: at0})
	w.Step(Progress{Rank: 1, Step: pb.Step_STEP_SPOOLED, At: at0.Add(50 * time.Second)})
	fx = w.Step(Tick{At: at0.Add(91 * time.Second)})
	if rl, ok := find[ReadLog](fx); !ok || len(rl.Ranks) != 1 || !strings.Contains(w.lost[1], "spool") {
		t.Fatalf("past the spool's wait: %+v %q", fx, w.lost[1])
	}
}

// TestFailureIsConfirmed: with no snapshot in, the window is committed as
// failed only once the log was read and holds none; a log that cannot be read
// is retried, and a report found there is merged.
func TestFailureIsConfirmed(t *testing.T) {
	w := started(t, 2)
	w.Step(Tick{At: at0.Add(61 * time.Second)})
	fx := w.Step(LogRead{At: at0.Add(61 * time.Second), Ranks: []int{0, 1}, OK: false})
	// both missing; the log could not be read: confirm first
	rl, ok := find[ReadLog](fx)
	if !ok || w.Phase != Merging {
		t.Fatalf("with no snapshot and an unread log: %v %+v", w.Phase, fx)
	}
	fx = w.Step(LogRead{At: at0.Add(62 * time.Second), Ranks: rl.Ranks, OK: false})
	if _, ok := find[Retry](fx); !ok {
		t.Fatalf("a log that cannot be read is retried: %+v", fx)
	}
	if _, ok := find[CommitFailure](fx); ok {
		t.Fatal("failed while the log could not be read")
	}
	fx = w.Step(RetryDue{At: at0.Add(63 * time.Second)})
	rl, _ = find[ReadLog](fx)
	fx = w.Step(LogRead{At: at0.Add(63 * time.Second), Ranks: rl.Ranks, Reports: map[int]*pb.RankResult{1: result()}, OK: true})
	if p, ok := find[Publish](fx); !ok || len(p.Ranks) != 1 || p.Ranks[0] != 1 {
		t.Fatalf("a report found while confirming is merged: %+v", fx)
	}
	// none there: failed
	w = started(t, 1)
	w.Step(Tick{At: at0.Add(61 * time.Second)})
	fx = w.Step(LogRead{At: at0.Add(61 * time.Second), Ranks: []int{0}, OK: true})
	if c, ok := find[CommitFailure](fx); !ok || !strings.Contains(c.Why, "no rank stored") {
		t.Fatalf("no snapshot, the log read: %+v", fx)
	}
	fx = w.Step(FailureCommitted{})
	if _, ok := find[TellEnd](fx); !ok || w.Phase != Failed {
		t.Fatalf("committed failed: %v %+v", w.Phase, fx)
	}
}

// TestTickWithoutPollKeepsMembersAlive: between polls only what needs no
// answer is checked: a member silent past Silence may have advanced since the
// last poll, so a tick does not call it missing; a rank not a member now, its
// grace over, is read for in the log and missing.
func TestTickWithoutPollKeepsMembersAlive(t *testing.T) {
	w := started(t, 3)
	w.lastPoll = at0.Add(11 * time.Second)
	w.Ranks[2].Gone = "not a member now, and no snapshot"
	fx := w.Step(Tick{At: at0.Add(12 * time.Second), IsMember: func(r int) bool { return r != 2 }})
	rl, ok := find[ReadLog](fx)
	if !ok || len(rl.Ranks) != 1 || rl.Ranks[0] != 2 {
		t.Fatalf("a tick without a poll: %+v", fx)
	}
	w.Step(LogRead{At: at0.Add(12 * time.Second), Ranks: rl.Ranks, OK: true})
	if w.Ranks[1].Phase == Missing || w.Ranks[2].Phase != Missing || w.Ranks[2].Reason != "not a member now, and no snapshot" {
		t.Fatalf("rank 1 %v, rank 2 %v %q", w.Ranks[1].Phase, w.Ranks[2].Phase, w.Ranks[2].Reason)
	}
}

// TestResendWaitsForARankGoneAMoment: a rank that refused the plan (it saw
// another leader) and is not a member at the moment of the re-send is asked
// again at a later tick, not dropped: nothing else would ever arm it. Past the
// ack deadline it is missing.
func TestResendWaitsForARankGoneAMoment(t *testing.T) {
	w := New(Config{ID: 3, Term: 1, Kind: pb.WindowKind_WINDOW_KIND_WINDOW, Start: 5, Stop: 8, World: 3, Asked: map[int]int64{0: 1, 1: 1, 2: 1},
		Planned: at0, Deadline: at0.Add(time.Minute), Timers: testTimers})
	w.Step(Sent{At: at0})
	w.Step(Ack{Rank: 2, Code: pb.AckCode_ACK_NOT_LEADER, At: at0})
	fx := w.Step(Tick{At: at0.Add(time.Second), IsMember: func(r int) bool { return r != 2 }})
	if _, ok := find[Send](fx); ok || w.Ranks[2].RetryAt.IsZero() || w.Ranks[2].Phase == Missing {
		t.Fatalf("a rank not a member at the re-send: %+v %+v", fx, w.Ranks[2])
	}
	fx = w.Step(Tick{At: at0.Add(1500 * time.Millisecond)})
	if s, ok := find[Send](fx); !ok || len(s.Ranks) != 1 || s.Ranks[0] != 2 {
		t.Fatalf("a member again: %+v", fx)
	}
	w.Step(Ack{Rank: 2, Code: pb.AckCode_ACK_NOT_LEADER, At: at0.Add(2 * time.Second)})
	w.Step(Tick{At: at0.Add(6 * time.Second)})
	if w.Ranks[2].Phase != Missing {
		t.Fatalf("past the ack deadline: %+v", w.Ranks[2])
	}
}

// TestWindowWaiting: Waiting says whether any rank is outstanding, as
// Outstanding lists them, whichever rank comes in first.
func TestWindowWaiting(t *testing.T) {
	w := started(t, 50)
	w.Ranks[7].Phase = Missing
	for r := 49; r >= 0; r-- {
		if got, want := w.Waiting(), len(w.Outstanding()) > 0; got != want {
			t.Fatalf("with ranks up to %d in: waiting %v, outstanding %v", r, got, w.Outstanding())
		}
		if r != 7 {
			w.Ranks[r].Phase = Uploaded
		}
		w.hint = r
	}
	if w.Waiting() {
		t.Fatal("every rank is in, and Waiting says one is outstanding")
	}
	w.Ranks[3].Phase = Recording
	if !w.Waiting() || w.hint != 3 {
		t.Fatalf("rank 3 is outstanding again: waiting %v, hint %d", w.Waiting(), w.hint)
	}
}

// TestReplanAndStaleTerm: a rank past the start makes the window planned again
// (once); a rank's word of a newer term is looked up once, and a newer term in
// the log makes the leader step down and do nothing more.
func TestReplanAndStaleTerm(t *testing.T) {
	w := New(Config{ID: 3, Term: 1, Kind: pb.WindowKind_WINDOW_KIND_WINDOW, Start: 5, Stop: 8, World: 2, Asked: map[int]int64{0: 1, 1: 1},
		Planned: at0, Deadline: at0.Add(time.Minute), Timers: testTimers, CanReplan: true})
	w.Step(Sent{At: at0})
	w.Step(Ack{Rank: 0, Code: pb.AckCode_ACK_PASSED, At: at0, Message: "at batch 6"})
	fx := w.Step(Ack{Rank: 1, Code: pb.AckCode_ACK_OK, At: at0})
	if r, ok := find[Replan](fx); !ok || len(r.Passed) != 1 {
		t.Fatalf("a rank past the start: %+v", fx)
	}
	if e, _ := w.Exit(); e != Replanned || fmt.Sprint(w.Passed()) != "[0]" {
		t.Fatalf("exit of a window planned again: %v %v", e, w.Passed())
	}
	fx = w.Step(Abandon{Why: "planned again", Quiet: true})
	if _, ok := find[CommitFailure](fx); !ok {
		t.Fatalf("an abandoned window is committed as failed: %+v", fx)
	}
	if fx := w.Step(FailureCommitted{}); len(fx) != 1 {
		t.Fatalf("a quiet failure tells nobody: %+v", fx)
	}
	if e, _ := w.Exit(); e != Replanned {
		t.Fatalf("a window planned again, once abandoned, exits as %v", e)
	}

	w = started(t, 2)
	fx = w.Step(Ack{Rank: 0, Code: pb.AckCode_ACK_STALE_TERM, Term: 9, At: at0})
	if c, ok := find[CheckTerm](fx); !ok || c.Term != 9 {
		t.Fatalf("a newer term named: %+v", fx)
	}
	if fx := w.Step(Ack{Rank: 1, Code: pb.AckCode_ACK_STALE_TERM, Term: 9, At: at0}); len(fx) != 0 {
		t.Fatalf("the same term is looked up once: %+v", fx)
	}
	if e, _ := w.Exit(); e != Running {
		t.Fatalf("exit before the term is read: %v", e)
	}
	if _, ok := find[StepDown](w.Step(Superseded{Term: 9})); !ok || !w.Down() {
		t.Fatal("a newer term in the log: no step down")
	}
	if e, _ := w.Exit(); e != SteppedDown {
		t.Fatalf("exit of a window stepped down from: %v", e)
	}
	if fx := w.Step(Stored{Rank: 0, Result: result(), At: at0}); fx != nil {
		t.Fatalf("a window stepped down from still acts: %+v", fx)
	}
}

// TestPublicationRetriesThenDefers: a store that fails is retried within
// Timers.Publish, then the window is left for later (never failed for it); an
// error no retry fixes fails it, but only an answer's detail once answered.
func TestPublicationRetriesThenDefers(t *testing.T) {
	w := started(t, 1)
	w.Step(Stored{Rank: 0, Result: result(), At: at0})
	fx := w.Step(Publication{At: at0.Add(time.Second), Err: "unreachable", Retryable: true})
	if _, ok := find[Retry](fx); !ok {
		t.Fatalf("a store failure is retried: %+v", fx)
	}
	if _, ok := find[Publish](w.Step(RetryDue{At: at0.Add(2 * time.Second)})); !ok {
		t.Fatal("the retry publishes again")
	}
	fx = w.Step(Publication{At: at0.Add(30 * time.Second), Err: "unreachable", Retryable: true})
	if _, ok := find[Defer](fx); !ok || w.Phase == Failed {
		t.Fatalf("past Timers.Publish the window is left for later: %v %+v", w.Phase, fx)
	}
	if e, why := w.Exit(); e != Deferred || !strings.Contains(why, "unreachable") {
		t.Fatalf("exit of a window left for later: %v %q", e, why)
	}

	w = started(t, 1)
	w.Step(Stored{Rank: 0, Result: result(), At: at0})
	w.Step(AnswerCommitted{})
	fx = w.Step(Publication{Err: "other inputs"})
	if o, ok := find[WriteOutcome](fx); !ok || o.Phase != Answered || !w.Final || w.Phase != Answered {
		t.Fatalf("an answer whose detail cannot be written: %v %+v", w.Phase, fx)
	}
}

// TestDeriveAndAgree: the phase the log and the commit give, and when they agree.
func TestDeriveAndAgree(t *testing.T) {
	for _, c := range []struct {
		c       *Commit
		outcome string
		phase   Phase
		final   bool
		agrees  bool
	}{
		{nil, "", Collecting, false, true},
		{&Commit{Pending: true}, "", Answered, false, true},
		{&Commit{Pending: true}, "published", Answered, true, true},
		{&Commit{}, "", Published, true, true},
		{&Commit{}, "published", Published, true, true},
		{&Commit{}, "failed", Published, true, false},
		{&Commit{Failed: true}, "failed", Failed, true, true},
		{&Commit{Failed: true}, "published", Failed, true, false},
		{nil, "failed", Failed, true, true},
	} {
		p, final := Derive(c.c, c.outcome)
		if p != c.phase || final != c.final || Agrees(c.c, c.outcome) != c.agrees {
			t.Errorf("%+v %q: %v %v %v", c.c, c.outcome, p, final, Agrees(c.c, c.outcome))
		}
	}
}

// TestDumpsTakeWhatRanksHold: a trigger's window of dumps (Dump, no batches)
// merges each rank's snapshot as it is, as a post-mortem does; the same window
// planned for batches leaves such a snapshot out.
func TestDumpsTakeWhatRanksHold(t *testing.T) {
	for _, dump := range []bool{true, false} {
		w := New(Config{ID: 9, Term: 2, Kind: pb.WindowKind_WINDOW_KIND_TRIGGER, World: 2, Asked: map[int]int64{0: -1, 1: -1}, Planned: at0,
			Deadline: at0.Add(time.Minute), Timers: testTimers, Dump: dump})
		if !dump {
			w.Start, w.Stop = 5, 8
		}
		w.Step(Sent{At: at0})
		var fx []Effect
		for r := 0; r < 2; r++ {
			w.Step(Ack{Rank: r, Code: pb.AckCode_ACK_OK, At: at0})
			fx = w.Step(Stored{Rank: r, Result: &pb.RankResult{Key: "k", MetaKey: "m", Reason: "postmortem"}, At: at0.Add(time.Second)})
		}
		p, ok := find[Publish](fx)
		switch {
		case dump && (!ok || len(p.Ranks) != 2):
			t.Fatalf("dumps: %v %+v", w.Phase, fx)
		case !dump && ok && len(p.Ranks) != 0:
			t.Fatalf("a planned window merged snapshots of no batches: %+v", p)
		}
	}
}

// TestRecoverNeverSendsToAnotherAgent: a leader taking over a window sends its
// command again to a rank that never heard of it only while that rank's agent
// is the one the window was planned with; another agent (restarted, or a later
// launch of the run, whose trainer records other batches) is missing, with why.
func TestRecoverNeverSendsToAnotherAgent(t *testing.T) {
	cfg := Config{ID: 4, Term: 3, Kind: pb.WindowKind_WINDOW_KIND_WINDOW, Start: 20, Stop: 30, World: 2, Asked: map[int]int64{0: -1, 1: -1},
		Planned: at0, Deadline: at0.Add(time.Minute), Timers: testTimers}
	never := &Status{Window: 1, Seen: 1, Batch: 3, Step: pb.Step_STEP_UPLOADED}
	w := Recover(Resume{Config: cfg, At: at0, Found: map[int]Found{
		0: {Status: never},                   // the agent the window was planned with: sent again
		1: {Status: never, OtherAgent: true}, // another agent of rank 1
	}})
	if r := w.Ranks[0]; r.Phase != Expected || !r.Resent {
		t.Fatalf("rank 0 (the same agent): %+v", r)
	}
	if r := w.Ranks[1]; r.Phase != Missing || r.Resent || !strings.Contains(r.Reason, "started after the window was planned") {
		t.Fatalf("rank 1 (another agent): %+v", r)
	}
}

// TestPostmortemWaitsForNoGoneAgent: a post-mortem asks every rank, a gone one
// too (what it stored of its failure is in the run's log); one that is not a
// member is looked for in the log after a poll's time, and is missing if the
// log holds nothing of it, long before the post-mortem's deadline; a member
// that has not answered yet is waited for.
func TestPostmortemWaitsForNoGoneAgent(t *testing.T) {
	w := New(Config{ID: 4, Term: 2, Kind: pb.WindowKind_WINDOW_KIND_CRASH, World: 3, Asked: map[int]int64{0: -1, 1: -1, 2: -1}, Planned: at0,
		Deadline: at0.Add(time.Minute), Timers: testTimers})
	w.Step(Sent{At: at0}) // (sent to the members only: rank 0 is not one)
	for r := 1; r < 3; r++ {
		w.Step(Ack{Rank: r, Code: pb.AckCode_ACK_OK, At: at0})
	}
	w.Step(Stored{Rank: 1, Result: &pb.RankResult{Key: "k", MetaKey: "m", Reason: "crash"}, At: at0.Add(100 * time.Millisecond)})
	member := func(r int) bool { return r != 0 }
	w.lastPoll = at0.Add(time.Hour) // (no poll in the way)
	// rank 2 is away for a tick (a flap, or held silent a moment), past a
	// poll's time with no sign: it is a member again at the next, and waited for
	flap := func(r int) bool { return r == 1 }
	if fx := w.Step(Tick{At: at0.Add(testTimers.Poll + time.Millisecond), IsMember: flap}); len(fx) != 0 {
		t.Fatalf("ranks away for one tick: %+v", fx)
	}
	if fx := w.Step(Tick{At: at0.Add(testTimers.Poll + 500*time.Millisecond), IsMember: member}); len(fx) != 0 {
		t.Fatalf("rank 0 away half a poll's time: %+v", fx)
	}
	rl, ok := find[ReadLog](w.Step(Tick{At: at0.Add(2*testTimers.Poll + 2*time.Millisecond), IsMember: member}))
	if !ok || len(rl.Ranks) != 1 || rl.Ranks[0] != 0 {
		t.Fatalf("a rank away a poll's time on end: %+v", rl)
	}
	w.Step(LogRead{At: at0.Add(2*testTimers.Poll + 3*time.Millisecond), Ranks: []int{0}, OK: true})
	if r := w.Ranks[0]; r.Phase != Missing || !strings.Contains(r.Reason, "its agent is gone") {
		t.Fatalf("rank 0: %v %q", r.Phase, r.Reason)
	}
	if w.Phase != Collecting || w.Ranks[2].Phase.In() {
		t.Fatalf("rank 2, a member, is not waited for: %v %v", w.Phase, w.Ranks[2].Phase)
	}
	fx := w.Step(Stored{Rank: 2, Result: &pb.RankResult{Key: "k2", MetaKey: "m2", Reason: "postmortem"}, At: at0.Add(3 * time.Second)})
	if p, ok := find[Publish](fx); !ok || len(p.Ranks) != 2 {
		t.Fatalf("the post-mortem once rank 2 is in: %v %+v", w.Phase, fx)
	}
}
