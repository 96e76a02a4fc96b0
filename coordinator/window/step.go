package window

import (
	"fmt"
	"sort"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
)

// Event is something that happened to a window, as its leader saw it.
type Event interface{ event() }

// Effect is something the leader carries out for a window.
type Effect interface{ effect() }

// --- events -------------------------------------------------------------------

// Sent: the window's command has gone out to every rank asked; it could not
// reach Unreachable (rank -> why).
type Sent struct {
	At          time.Time
	Unreachable map[int]string
}

// SendFailed: the command sent again could not reach these ranks.
type SendFailed struct {
	At          time.Time
	Unreachable map[int]string
}

// Ack is a rank's answer to the command.
type Ack struct {
	Rank    int
	Code    pb.AckCode
	Batch   int64
	Message string
	Term    uint64 // the newest term the rank has seen (Code ACK_STALE_TERM)
	At      time.Time
}

// Progress is a rank's step in the window.
type Progress struct {
	Rank   int
	Step   pb.Step
	Batch  int64
	Reason string
	At     time.Time
}

// Stored is a rank's snapshot as stored (or why it could not be), from its
// message.
type Stored struct {
	Rank   int
	Result *pb.RankResult
	At     time.Time
}

// Status is a rank's answer to a poll, about its newest window.
type Status struct {
	Window  uint64
	Step    pb.Step
	Batch   int64
	Result  *pb.RankResult // its snapshot of that window, once stored
	Spooled bool           // this window's snapshot waits in its spool for the store
	Term    uint64         // the newest term it has seen
	Seen    uint64         // the newest window id it has seen at all
}

// neverHeard reports whether a rank whose status is st never heard of window w
// and can still record it: the leader that planned w died before its command
// reached the rank, or the rank's agent restarted before w began. Such a rank is
// sent the command again (once).
func neverHeard(w *Window, st *Status) bool {
	return st.Window < w.ID && st.Seen < w.ID && st.Batch < w.Start && !st.Spooled && !w.Dumps()
}

// Tick is the leader's clock. IsMember says whether a rank is a member of the
// cluster now (nil: every rank is).
type Tick struct {
	At       time.Time
	IsMember func(rank int) bool
}

// Polled carries the answers to a Poll: the ranks that did not answer are not
// in Status.
type Polled struct {
	At     time.Time
	Status map[int]Status
}

// LogRead carries the answer to a ReadLog: the reports the run's log holds of
// Ranks; OK is false when the log could not be read.
type LogRead struct {
	At      time.Time
	Ranks   []int
	Reports map[int]*pb.RankResult
	OK      bool
}

// Rejoined: a rank of a post-mortem that failed itself reported its failure;
// its snapshot of the failure is its part, so it is asked again.
type Rejoined struct {
	Rank int
	At   time.Time
}

// Superseded: the run's log holds a newer term than the window's leader's.
type Superseded struct{ Term uint64 }

// Abandon gives the window up (it is planned again as another window): it is
// committed as failed with the reason; Quiet tells nobody.
type Abandon struct {
	Why   string
	Quiet bool
	At    time.Time
}

// AnswerCommitted: the leader's answer (summary, report, trace) is committed.
type AnswerCommitted struct{ At time.Time }

// Publication is what came of a Publish or a Complete.
type Publication struct {
	At time.Time
	// Unfit are ranks whose stored snapshots cannot be merged, and why: the
	// window is published without them.
	Unfit map[int]string
	// Done: the window is committed whole (published).
	Done bool
	// Held: the store holds another leader's commit, and this one's was refused.
	Held *Commit
	// Err: it failed; Retryable when the store may answer later.
	Err       string
	Retryable bool
	// Superseded: a newer term is in the run's log (nothing was written).
	Superseded bool
}

// FailureCommitted is what came of a CommitFailure.
type FailureCommitted struct {
	At         time.Time
	Held       *Commit // the store holds another commit (its own, when this one's was written: nil)
	Err        string
	Retryable  bool
	Superseded bool
}

// RetryDue: the wait a Retry asked for is over.
type RetryDue struct{ At time.Time }

func (Sent) event()             {}
func (SendFailed) event()       {}
func (Ack) event()              {}
func (Progress) event()         {}
func (Stored) event()           {}
func (Tick) event()             {}
func (Polled) event()           {}
func (LogRead) event()          {}
func (Rejoined) event()         {}
func (Superseded) event()       {}
func (Abandon) event()          {}
func (AnswerCommitted) event()  {}
func (Publication) event()      {}
func (FailureCommitted) event() {}
func (RetryDue) event()         {}

// --- effects ------------------------------------------------------------------

// Tell passes a step on to the members waiting for the window (Rank -1: the
// window's own step).
type Tell struct {
	Rank   int
	Step   pb.Step
	Batch  int64
	Reason string
}

// Send sends the window's command again to these ranks.
type Send struct{ Ranks []int }

// Poll asks these ranks where they stand; the answers come back as Polled.
type Poll struct{ Ranks []int }

// ReadLog reads these ranks' reports from the run's log; the answer comes back
// as LogRead, at once.
type ReadLog struct{ Ranks []int }

// CheckTerm looks in the run's log for a term newer than the window's (a rank
// says it saw Term); one there comes back as Superseded.
type CheckTerm struct{ Term uint64 }

// Replan: ranks were past the start; the leader gives the window up (Abandon)
// and plans it again with a longer lead.
type Replan struct{ Passed []int }

// Publish merges these ranks' stored snapshots and commits the window: its
// answer (AnswerCommitted), then the rest (a Publication).
type Publish struct{ Ranks []int }

// Complete completes the answer the store holds: the merged pickles and the
// timeline from the snapshots it names (a Publication).
type Complete struct{}

// CommitFailure commits the window as failed (a FailureCommitted).
type CommitFailure struct {
	Why     string
	Missing map[int]string
}

// WriteOutcome writes the window's outcome into the run's log, as its commit
// says (the log is an index of the commits).
type WriteOutcome struct {
	Phase Phase
	Why   string
}

// TellAnswer tells the members waiting that the window's answer is published.
type TellAnswer struct{}

// TellEnd tells the members waiting how the window ended.
type TellEnd struct{}

// Retry waits After, then steps RetryDue.
type Retry struct{ After time.Duration }

// Defer leaves the window unfinished in the run's log for a later try (the
// store failed past Timers.Publish): the members waiting are told Why.
type Defer struct{ Why string }

// StepDown: a newer term is in the run's log; the leader writes nothing more for
// the window and leaves it to the newer one.
type StepDown struct{ Term uint64 }

func (Tell) effect()          {}
func (Send) effect()          {}
func (Poll) effect()          {}
func (ReadLog) effect()       {}
func (CheckTerm) effect()     {}
func (Replan) effect()        {}
func (Publish) effect()       {}
func (Complete) effect()      {}
func (CommitFailure) effect() {}
func (WriteOutcome) effect()  {}
func (TellAnswer) effect()    {}
func (TellEnd) effect()       {}
func (Retry) effect()         {}
func (Defer) effect()         {}
func (StepDown) effect()      {}

// --- the step function --------------------------------------------------------

// Step applies one event and returns the effects to carry out, in order.
func (w *Window) Step(ev Event) []Effect {
	if w.Final || w.down {
		return nil
	}
	fx := w.step(ev)
	if w.Final && w.exit == Running {
		w.exit = Ended
	}
	return fx
}

func (w *Window) step(ev Event) []Effect {
	s := stepper{w: w}
	switch e := ev.(type) {
	case Sent:
		s.sent(e.At, e.Unreachable, true)
	case SendFailed:
		s.sent(e.At, e.Unreachable, false)
	case Ack:
		s.ack(e)
	case Progress:
		s.progress(e)
	case Stored:
		if w.Phase == Collecting || w.Phase == Planned {
			if r := w.Ranks[e.Rank]; r != nil && r.Phase != LeftOut && r.Result == nil && e.Result != nil {
				r.LastSign = e.At
				s.take(e.Rank, e.Result, -1)
			}
		}
	case Tick:
		s.tick(e)
	case Polled:
		if w.Phase == Collecting {
			s.alive(e.At, e.Status, nil)
		}
	case LogRead:
		s.logRead(e)
	case Rejoined:
		if r := w.Ranks[e.Rank]; w.Phase == Collecting && r != nil && r.Phase != LeftOut && r.Result == nil {
			r.Phase, r.Reason, r.LastSign = Expected, "", e.At
			delete(w.lost, e.Rank)
			s.do(Send{Ranks: []int{e.Rank}})
		}
	case Superseded:
		if e.Term > w.Term {
			w.down = true
			s.do(StepDown{Term: e.Term})
		}
		return s.fx
	case Abandon:
		w.quiet = e.Quiet
		w.Phase = Merging
		w.inFlight = true
		w.failure = e.Why
		s.do(CommitFailure{Why: e.Why, Missing: w.MissingReasons()})
		return s.fx
	case AnswerCommitted:
		if w.Phase == Merging {
			w.Phase = Answered
			s.do(TellAnswer{})
		}
		return s.fx
	case Publication:
		s.publication(e)
		return s.fx
	case FailureCommitted:
		s.failureCommitted(e)
		return s.fx
	case RetryDue:
		if w.retrying {
			w.retrying = false
			s.conclude(e.At)
		}
		return s.fx
	}
	s.advance(atOf(ev))
	return s.fx
}

func atOf(ev Event) time.Time {
	switch e := ev.(type) {
	case Sent:
		return e.At
	case SendFailed:
		return e.At
	case Ack:
		return e.At
	case Progress:
		return e.At
	case Stored:
		return e.At
	case Tick:
		return e.At
	case Polled:
		return e.At
	case LogRead:
		return e.At
	case Rejoined:
		return e.At
	}
	return time.Time{}
}

// stepper gathers one step's effects.
type stepper struct {
	w  *Window
	fx []Effect
}

// do gathers effect e; the effects that end the leader's running of the window
// say so in its Exit.
func (s *stepper) do(e Effect) {
	switch e := e.(type) {
	case Replan:
		s.w.exit = Replanned
	case Defer:
		s.w.exit, s.w.exitWhy = Deferred, e.Why
	case StepDown:
		s.w.exit = SteppedDown
	}
	s.fx = append(s.fx, e)
}

// tell tells the members waiting for the window a step of it, or of one of its
// ranks. A rank's steps are told as its story: in order and once each, whatever
// order they reach the leader in (a rank's progress travels apart from its ack,
// as datagrams): one that comes after a later step was told is not told, and the
// steps a told one implies (a rank that recorded was acked and armed; one whose
// snapshot is stored recorded) are told before it when they were not heard of.
// Its end is told once (a second, other end too: a snapshot stored after the
// rank was called missing).
func (s *stepper) tell(rank int, step pb.Step, batch int64, reason string) {
	if r := s.w.Ranks[rank]; rank >= 0 && r != nil {
		o, told := StepOrder(step), StepOrder(r.Told)
		switch {
		case o == EndOrder && step == r.Told:
			return
		case o < EndOrder && o <= told:
			return
		}
		if told < EndOrder && (step == pb.Step_STEP_UPLOADED || o < EndOrder && step != pb.Step_STEP_STOPPING) {
			for _, implied := range []pb.Step{pb.Step_STEP_ACKED, pb.Step_STEP_ARMED, pb.Step_STEP_RECORDING} {
				if io := StepOrder(implied); io > told && io < o {
					s.do(Tell{Rank: rank, Step: implied, Batch: -1})
				}
			}
		}
		r.Told = step
	}
	s.do(Tell{Rank: rank, Step: step, Batch: batch, Reason: reason})
}

// miss calls a rank missing, for why (told with step).
func (s *stepper) miss(rank int, why string, step pb.Step) {
	r := s.w.Ranks[rank]
	r.Phase, r.Reason = Missing, why
	delete(s.w.lost, rank)
	if step != pb.Step_STEP_UNSPECIFIED {
		s.tell(rank, step, r.Batch, why)
	}
}

// take records a rank's stored snapshot (or why it could not be stored).
func (s *stepper) take(rank int, res *pb.RankResult, batch int64) {
	r := s.w.Ranks[rank]
	r.Result, r.Reason = res, ""
	delete(s.w.lost, rank)
	if res.Error != "" {
		r.Phase, r.Reason = Missing, "its snapshot was not stored: "+res.Error
		s.tell(rank, pb.Step_STEP_FAILED, batch, res.Error)
		return
	}
	r.Phase = Uploaded
	s.tell(rank, pb.Step_STEP_UPLOADED, batch, res.Partial)
}

func (s *stepper) sent(at time.Time, unreachable map[int]string, first bool) {
	w := s.w
	if first && w.Phase == Planned {
		w.Phase = Collecting
		w.ackDeadline = at.Add(w.timers.Ack)
		w.lastPoll = at
	}
	for _, rank := range sortedKeys(unreachable) {
		if r := w.Ranks[rank]; r != nil && r.out() && r.Result == nil {
			s.miss(rank, "unreachable: "+unreachable[rank], pb.Step_STEP_UNSPECIFIED)
		}
	}
}

func (s *stepper) ack(a Ack) {
	w := s.w
	r := w.Ranks[a.Rank]
	if r == nil || r.Phase == Missing || r.Phase == LeftOut || w.Phase != Collecting && w.Phase != Planned {
		return
	}
	r.LastSign = a.At
	if r.Phase == Uploaded && a.Code != pb.AckCode_ACK_OK {
		return // its snapshot is in: a late refusal changes nothing
	}
	switch {
	case a.Code == pb.AckCode_ACK_OK && r.Acked:
	case a.Code == pb.AckCode_ACK_OK:
		r.Acked = true
		if r.Phase == Expected {
			r.Phase = Acked
		}
		s.tell(a.Rank, pb.Step_STEP_ACKED, a.Batch, "")
	case a.Code == pb.AckCode_ACK_PASSED:
		w.passed = append(w.passed, a.Rank)
		s.miss(a.Rank, "past the window's start: "+a.Message, pb.Step_STEP_PASSED)
	case a.Code == pb.AckCode_ACK_NOT_LEADER && (w.ackDeadline.IsZero() || a.At.Before(w.ackDeadline)):
		r.RetryAt = a.At.Add(retryNotLeader)
	case a.Code == pb.AckCode_ACK_STALE_TERM:
		s.checkTerm(a.Term)
	default:
		why := fmt.Sprintf("refused the window (%s): %s", pb.Name(a.Code), a.Message)
		r.Phase, r.Reason = Missing, why
		s.tell(a.Rank, pb.Step_STEP_REFUSED, a.Batch, a.Message)
	}
}

func (s *stepper) checkTerm(t uint64) {
	if t > s.w.Term && !s.w.checked[t] {
		s.w.checked[t] = true
		s.do(CheckTerm{Term: t})
	}
}

func (s *stepper) progress(p Progress) {
	w := s.w
	r := w.Ranks[p.Rank]
	if r == nil || r.Phase == LeftOut {
		return // a rank the plan left out took it from gossip: nothing of it is merged
	}
	r.LastSign = p.At
	if r.Result != nil {
		return
	}
	r.Step, r.Batch = p.Step, max(r.Batch, p.Batch)
	out := r.out() && (w.Phase == Collecting || w.Phase == Planned)
	switch p.Step {
	case pb.Step_STEP_MISSED:
		if out {
			w.passed = append(w.passed, p.Rank)
			r.Phase, r.Reason = Missing, "past the window's start: "+p.Reason
		}
	case pb.Step_STEP_FAILED:
		if out {
			r.Phase, r.Reason = Missing, "failed: "+p.Reason
		}
	case pb.Step_STEP_CANCELLED:
		if out {
			r.Phase, r.Reason = Missing, "cancelled: "+p.Reason
		}
	case pb.Step_STEP_SPOOLED:
		if out {
			r.Phase = Spooled
		}
	case pb.Step_STEP_QUEUED, pb.Step_STEP_SENT, pb.Step_STEP_ARMED, pb.Step_STEP_RECORDING, pb.Step_STEP_PARTIAL, pb.Step_STEP_STOPPING:
		if out && r.Phase < Recording {
			r.Phase = Recording
		}
	}
	if out {
		delete(w.lost, p.Rank) // a sign of life: asked again at the next poll
	}
	s.tell(p.Rank, p.Step, p.Batch, p.Reason)
}

func (s *stepper) tick(t Tick) {
	w := s.w
	if w.Phase != Collecting {
		return
	}
	s.resend(t)
	if w.timers.Poll > 0 && t.At.Sub(w.lastPoll) >= w.timers.Poll {
		w.lastPoll = t.At
		var ask []int
		for _, rank := range w.Outstanding() {
			if _, ok := w.lost[rank]; !ok {
				ask = append(ask, rank)
			}
		}
		if len(ask) > 0 {
			s.do(Poll{Ranks: ask})
		}
	} else {
		s.alive(t.At, nil, t.IsMember)
	}
	s.deadline(t.At)
}

// sendAgain sends the command, at the next tick, to a rank that never heard of
// the window (neverHeard); it has Timers.Ack from now to take it.
func (s *stepper) sendAgain(rank int, at time.Time) {
	w := s.w
	r := w.Ranks[rank]
	r.Phase, r.Acked, r.Resent, r.RetryAt, r.LastSign, r.Gone = Expected, false, true, at, at, ""
	if d := at.Add(w.timers.Ack); d.After(w.ackDeadline) {
		w.ackDeadline = d
	}
}

// resend sends the command again to the ranks that saw another leader when it
// first arrived (their membership had not caught up). A rank that is not a
// member at this moment is asked again at a later tick.
func (s *stepper) resend(t Tick) {
	w := s.w
	var again []int
	for _, rank := range sortedKeys(w.Ranks) {
		r := w.Ranks[rank]
		if r.RetryAt.IsZero() || t.At.Before(r.RetryAt) || !r.out() {
			continue
		}
		r.RetryAt = time.Time{}
		switch {
		case t.At.After(w.ackDeadline):
			s.miss(rank, "refused the window: it sees another member as leader", pb.Step_STEP_REFUSED)
		case t.IsMember != nil && !t.IsMember(rank):
			r.RetryAt = t.At.Add(retryNotLeader)
		default:
			again = append(again, rank)
		}
	}
	if len(again) > 0 {
		s.do(Send{Ranks: again})
	}
}

// alive looks at the outstanding ranks: with sts (a poll's answers), a result
// that never arrived is taken from the answer, and a batch that advanced, a
// snapshot in a spool or a step is a sign of life; without, only ranks that are
// not members can be called silent (a member may have advanced since the last
// poll). A rank silent for Timers.Silence is missing once the run's log is read
// for its report; so is one whose agent no longer knows the window, and, in a
// post-mortem or dumps, one not a member for Timers.Poll.
func (s *stepper) alive(at time.Time, sts map[int]Status, isMember func(int) bool) {
	w := s.w
	pm := w.Dumps()
	var lost []int
	for _, rank := range w.Outstanding() {
		r := w.Ranks[rank]
		if _, ok := w.lost[rank]; ok {
			continue
		}
		if sts == nil && (isMember == nil || isMember(rank)) {
			r.Away = time.Time{}
			continue // a member: the next poll says whether it lives
		}
		if st, ok := sts[rank]; ok {
			if st.Term > w.Term {
				s.checkTerm(st.Term)
			}
			switch {
			case st.Window == w.ID && st.Result != nil:
				r.LastSign = at
				s.take(rank, st.Result, st.Batch)
				continue
			case st.Window > w.ID && !pm && !st.Spooled:
				s.miss(rank, fmt.Sprintf("moved on to window %d", st.Window), pb.Step_STEP_MISSING)
				continue
			case neverHeard(w, &st) && !r.Resent:
				s.sendAgain(rank, at)
				continue
			case (r.Acked || r.Phase == Recording || r.Phase == Spooled) && st.Window < w.ID && !pm && !st.Spooled:
				// it took the window, and its agent no longer knows it: the agent
				// was restarted. What it stored before is in the run's log.
				w.lost[rank] = "its agent was restarted and has no record of the window (no snapshot of it in the run's log or the rank's spool)"
				lost = append(lost, rank)
				continue
			case st.Spooled:
				r.Phase, r.LastSign = Spooled, at
			case st.Batch > r.Batch || st.Step != r.Step:
				r.Batch, r.Step, r.LastSign = max(r.Batch, st.Batch), st.Step, at
			}
		}
		if pm && sts == nil && isMember != nil && r.Phase != Spooled {
			// a post-mortem waits for no rank whose agent is gone (dead, held
			// silent, or left) for a poll's time on end: what it stored of its
			// failure is in the run's log, read now, and nothing more can come
			// from it (a rank away for a tick, a member again at the next, is
			// waited for as before)
			if r.Away.IsZero() {
				r.Away = at
			}
			if at.Sub(r.Away) >= w.timers.Poll && at.Sub(r.LastSign) >= w.timers.Poll {
				w.lost[rank] = "not a member of the cluster (its agent is gone), and no snapshot of it in the run's log"
				lost = append(lost, rank)
			}
			continue
		}
		if at.Sub(r.LastSign) > w.timers.Silence && !pm { // a post-mortem has its own short deadline
			why := r.Gone
			if why == "" {
				why = fmt.Sprintf("no sign of life for %v", w.timers.Silence)
			}
			w.lost[rank] = why
			lost = append(lost, rank)
		}
	}
	if len(lost) > 0 {
		s.do(ReadLog{Ranks: lost})
	}
}

// deadline gives up, at the window's deadline, on the ranks not in: the run's
// log is read for their reports first. A rank whose snapshot waits in its spool
// for the store is waited for Timers.Spool more.
func (s *stepper) deadline(at time.Time) {
	w := s.w
	if w.Deadline.IsZero() || at.Before(w.Deadline) {
		return
	}
	why := fmt.Sprintf("not in by the window's deadline (%s)", w.Deadline.Format(time.TimeOnly))
	if !w.Planned.IsZero() {
		why = fmt.Sprintf("not in by the window's deadline (%s, %v after it was planned)", w.Deadline.Format(time.TimeOnly), w.Deadline.Sub(w.Planned).Round(time.Second))
	}
	if w.Postmortem() {
		why = fmt.Sprintf("no snapshot within the post-mortem's deadline of %v", w.timers.Postmortem)
	}
	var lost []int
	for _, rank := range w.Outstanding() {
		r := w.Ranks[rank]
		if _, ok := w.lost[rank]; ok {
			continue
		}
		if r.Phase == Spooled {
			if at.Before(w.Deadline.Add(w.timers.Spool)) {
				continue
			}
			w.lost[rank] = fmt.Sprintf("its snapshot waited in its spool for the store past the window's deadline and %v more", w.timers.Spool)
		} else {
			w.lost[rank] = why
		}
		lost = append(lost, rank)
	}
	if len(lost) > 0 {
		s.do(ReadLog{Ranks: lost})
	}
}

// logRead takes what the run's log holds of the ranks read: a report is the
// rank's snapshot (its result never reached the leader); a rank about to be
// called missing without one is missing now.
func (s *stepper) logRead(e LogRead) {
	w := s.w
	for _, rank := range sortedKeys(e.Reports) {
		r := w.Ranks[rank]
		res := e.Reports[rank]
		if r == nil || r.Phase == LeftOut || r.Result != nil || res == nil {
			continue
		}
		if r.out() || r.Phase == Missing && w.Phase == Merging {
			r.LastSign = e.At
			s.take(rank, res, r.Batch)
		}
	}
	read := map[int]bool{}
	for _, rank := range e.Ranks {
		read[rank] = true
		if why, ok := w.lost[rank]; ok && w.Ranks[rank].out() {
			s.miss(rank, why, pb.Step_STEP_MISSING)
		}
	}
	if !e.OK {
		w.confirmed = false
	} else {
		w.confirmed = true
		for rank, r := range w.Ranks {
			if r.Phase == Missing && r.Result == nil && !read[rank] {
				w.confirmed = false // called missing without its report looked for
			}
		}
	}
	if w.confirming {
		w.confirming = false
		if !e.OK {
			s.storeFailed(e.At, "the run's log cannot be read to confirm that no rank stored a snapshot")
			return
		}
		s.conclude(e.At)
	}
}

// advance moves a collecting window on: planned again when ranks were past the
// start, merged once no rank is awaited.
func (s *stepper) advance(at time.Time) {
	w := s.w
	if w.Phase != Collecting {
		return
	}
	if w.canReplan && len(w.passed) > 0 && (s.allAcked() || at.After(w.ackDeadline)) {
		w.canReplan = false
		s.do(Replan{Passed: append([]int(nil), w.passed...)})
		return
	}
	if w.Waiting() || len(w.lost) > 0 {
		return
	}
	w.Phase = Merging
	w.giveUp = at.Add(w.timers.Publish)
	s.classify()
	s.conclude(at)
}

func (s *stepper) allAcked() bool {
	for _, r := range s.w.Ranks {
		if r.out() && !r.Acked && r.Result == nil {
			return false
		}
	}
	return true
}

// classify calls missing the uploaded ranks whose snapshots do not cover the
// window as planned and do not say why (a post-mortem takes what each rank has).
// A snapshot that says it is partial (its trainer stopped in the middle of the
// window, say) is merged as partial: what it recorded is the truth of that rank.
func (s *stepper) classify() {
	w := s.w
	if w.Dumps() {
		return
	}
	for _, rank := range w.Mergeable() {
		r := w.Ranks[rank]
		switch res := r.Result; {
		case res.Partial != "":
		case res.Start != w.Start || res.Stop != w.Stop:
			r.Phase, r.Reason = Missing, fmt.Sprintf("its snapshot covers [%d, %d), the window is [%d, %d)", res.Start, res.Stop, w.Start, w.Stop)
		}
	}
}

// conclude takes the next step of a merging (or answered) window: publish what
// is in, complete an answer, or, with nothing to merge and the run's log read,
// commit the window as failed.
func (s *stepper) conclude(at time.Time) {
	w := s.w
	switch w.Phase {
	case Answered:
		w.inFlight = true
		s.do(Complete{})
		return
	case Merging:
	default:
		return
	}
	if w.failure != "" && w.quiet { // abandoned: committed as failed, whatever came in
		w.inFlight = true
		s.do(CommitFailure{Why: w.failure, Missing: w.MissingReasons()})
		return
	}
	if !w.confirmed {
		// a rank called missing may have stored its snapshot after all (its
		// result never reached this leader, or its trainer was stopped in the
		// middle and it stored what it had): the log says, before the window is
		// published without it or failed for want of it
		var ranks []int
		for rank := 0; rank < w.World; rank++ {
			if r := w.Ranks[rank]; r != nil && r.Phase == Missing && r.Result == nil {
				ranks = append(ranks, rank)
			}
		}
		if len(ranks) > 0 || len(w.Mergeable()) == 0 {
			w.confirming = true
			s.do(ReadLog{Ranks: ranks})
			return
		}
	}
	s.classify()
	if ranks := w.Mergeable(); len(ranks) > 0 {
		if !w.told {
			w.told = true
			s.tell(-1, pb.Step_STEP_PUBLISHING, -1, fmt.Sprintf("merging %d ranks", len(ranks)))
		}
		w.inFlight = true
		s.do(Publish{Ranks: ranks})
		return
	}
	if w.failure == "" {
		w.failure = "no rank stored a snapshot of the window"
		if w.Postmortem() {
			w.failure = "no rank had a snapshot to give: every trainer was stopped with no allocator history recorded (--record-always keeps one for post-mortems)"
		}
	}
	w.inFlight = true
	s.do(CommitFailure{Why: w.failure, Missing: w.MissingReasons()})
}

// answered takes the store's answer to the write in flight. When a newer term is
// in the run's log (superseded), the leader steps down and it returns true.
func (s *stepper) answered(superseded bool) bool {
	s.w.inFlight = false
	if superseded {
		s.w.down = true
		s.do(StepDown{})
	}
	return superseded
}

func (s *stepper) publication(e Publication) {
	w := s.w
	if s.answered(e.Superseded) {
		return
	}
	switch {
	case len(e.Unfit) > 0:
		for _, rank := range sortedKeys(e.Unfit) {
			if r := w.Ranks[rank]; r != nil && r.Phase == Uploaded {
				r.Phase, r.Reason = Missing, e.Unfit[rank]
			}
		}
		s.conclude(e.At)
	case e.Held != nil:
		s.adopt(*e.Held)
	case e.Done:
		w.Phase, w.Final = Published, true
		s.do(WriteOutcome{Phase: Published})
		s.do(TellEnd{})
	case !e.Retryable && w.Phase == Answered:
		// the answer stands; its detail cannot be written
		w.Final, w.Why = true, "the answer is published; the merged pickles and the timeline were not written: "+e.Err
		s.do(WriteOutcome{Phase: Answered, Why: w.Why})
		s.do(TellEnd{})
	case !e.Retryable:
		w.failure = e.Err
		w.confirmed = true // a merge that cannot succeed: its reason is the failure
		w.inFlight = true
		s.do(CommitFailure{Why: e.Err, Missing: w.MissingReasons()})
	default:
		s.storeFailed(e.At, e.Err)
	}
}

func (s *stepper) failureCommitted(e FailureCommitted) {
	w := s.w
	if s.answered(e.Superseded) {
		return
	}
	switch {
	case e.Held != nil:
		s.adopt(*e.Held)
	case e.Err == "":
		w.Phase, w.Final, w.Why = Failed, true, w.failure
		s.do(WriteOutcome{Phase: Failed, Why: w.failure})
		if !w.quiet {
			s.do(TellEnd{})
		}
	case !e.Retryable:
		// the failure cannot be written either: the window stays unfinished
		s.do(Defer{Why: "the window's failure (" + w.failure + ") cannot be committed: " + e.Err})
	default:
		s.storeFailed(e.At, e.Err)
	}
}

// adopt takes the commit another leader made (or this one, in an earlier try).
func (s *stepper) adopt(c Commit) {
	w := s.w
	switch {
	case c.Failed:
		w.Phase, w.Final, w.Why = Failed, true, c.Error
		s.do(WriteOutcome{Phase: Failed, Why: c.Error})
		if !w.quiet {
			s.do(TellEnd{})
		}
	case !c.Pending:
		w.Phase, w.Final = Published, true
		s.do(WriteOutcome{Phase: Published})
		if !w.quiet {
			s.do(TellEnd{})
		}
	default:
		w.Phase = Answered
		if w.quiet {
			// planned again elsewhere, and its answer is out: it is completed
			w.quiet = false
		}
		w.inFlight = true
		s.do(TellAnswer{})
		s.do(Complete{})
	}
}

// storeFailed retries while Timers.Publish allows, then leaves the window for a
// later try.
func (s *stepper) storeFailed(at time.Time, err string) {
	w := s.w
	w.confirmed = false // what the log holds may change meanwhile: it is read again
	if w.giveUp.IsZero() {
		w.giveUp = at.Add(w.timers.Publish)
	}
	if at.Before(w.giveUp) {
		w.tries++
		w.retrying = true
		d := 500 * time.Millisecond << min(w.tries-1, 5)
		s.tell(-1, pb.Step_STEP_RETRYING, -1, err)
		s.do(Retry{After: min(d, 10*time.Second)})
		return
	}
	why := fmt.Sprintf("the store failed for %v while the window was published (%s); the window stays unfinished in the run's log, and the leader publishes it once the store is back", w.timers.Publish, err)
	if w.Phase == Answered {
		why = fmt.Sprintf("the answer is published; the store failed for %v while the merged pickles and the timeline were written (%s): the leader writes them once the store is back", w.timers.Publish, err)
	}
	w.Why = why
	s.do(Defer{Why: why})
}

func sortedKeys[V any](m map[int]V) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}
