// Package window is a window's life as one state machine: the phases a window
// and each of its ranks go through, the events that move them and the effects
// its leader carries out.
//
//	window:  planned → collecting → merging → answered → published
//	                        ↘           ↘          ↘
//	                         failed (one commit: a failed manifest)
//
//	rank:    expected → acked → recording → spooled → uploaded
//	             ↘ left out (not asked, with the reason)    ↘ missing (with the reason)
//
// It does no I/O and reads no clock: the leader hands Step what happened (an
// ack, a rank's step, a result, a report read from the run's log, a tick of its
// own clock, the outcome of a store write) and carries out the effects Step
// returns (send, read the log, publish, commit, tell the members waiting), as
// etcd's raft is driven through Step and Ready. The leader that plans a window,
// the one that takes an unfinished window over, `memsnap ls` and the members
// waiting for a window all read its state through this package (Derive).
//
// A window's commit point is its manifest in the store, for success and failure
// alike: created once, replaced only from answered to published (If-Match), and
// fenced by the leader's term. The machine commits a window as failed only once
// nothing can still arrive: no rank's snapshot waits in its spool, and the run's
// log was read and holds no report of a missing rank.
package window

import (
	"time"

	"github.com/memsnap/memsnap/internal/pb"
)

// Phase is where a window stands.
type Phase uint8

const (
	// Planned: its plan is in the run's log; the command is going out to the ranks.
	Planned Phase = iota + 1
	// Collecting: the ranks record the window and store their snapshots.
	Collecting
	// Merging: every rank is in or missing; the leader merges and publishes.
	Merging
	// Answered: the answer (summary, report, trace) is committed; the merged
	// pickles and the timeline are still to come.
	Answered
	// Published: committed whole.
	Published
	// Failed: committed as failed, with the reason.
	Failed
)

var phaseNames = [...]string{"", "planned", "collecting", "merging", "answered", "published", "failed"}

func (p Phase) String() string {
	if int(p) < len(phaseNames) && p != 0 {
		return phaseNames[p]
	}
	return "unknown"
}

// Ended reports whether p is an end: published or failed.
func (p Phase) Ended() bool { return p == Published || p == Failed }

// RankPhase is where one rank stands in a window.
type RankPhase uint8

const (
	// Expected: asked to record the window; no word from it yet.
	Expected RankPhase = iota + 1
	// Acked: it took the plan.
	Acked
	// Recording: its trainer is armed for the window or records it.
	Recording
	// Spooled: its snapshot is on its disk and waits for the store.
	Spooled
	// Uploaded: its snapshot is in the store (an end).
	Uploaded
	// Missing: the window goes on without it, for the reason given (an end).
	Missing
	// LeftOut: not asked to record the window (not a member, or its batch was
	// implausible), for the reason given (an end).
	LeftOut
)

var rankPhaseNames = [...]string{"", "expected", "acked", "recording", "spooled", "uploaded", "missing", "left out"}

func (p RankPhase) String() string {
	if int(p) < len(rankPhaseNames) && p != 0 {
		return rankPhaseNames[p]
	}
	return "unknown"
}

// In reports whether the rank is done with the window: its snapshot is in the
// store, or the window goes on without it.
func (p RankPhase) In() bool { return p == Uploaded || p == Missing || p == LeftOut }

// Rank is one rank of a window.
type Rank struct {
	Phase  RankPhase
	Acked  bool
	Step   pb.Step        // the rank's own last word about the window
	Told   pb.Step        // the last of its steps told to the members waiting
	Resent bool           // it never heard of the window, and was sent it again
	Batch  int64          // its trainer's batch, as last heard
	Reason string         // why it is missing or left out
	Result *pb.RankResult // its snapshot once stored (or why it could not be)
	// LastSign is its last sign of life on the leader's clock.
	LastSign time.Time
	// RetryAt is when the command goes to it again (it saw another leader).
	RetryAt time.Time
	// Gone is the reason it is missing if it stays silent ("" : the silence).
	Gone string
	// Away is since when it has not been a member, seen at every tick (zero
	// while it is one): a post-mortem waits Timers.Poll for a rank away.
	Away time.Time
}

// out reports whether the rank is still awaited.
func (r *Rank) out() bool { return !r.Phase.In() }

// Timers are the bounds a window runs under.
type Timers struct {
	// Ack is how long the ranks have to take the command once it is out.
	Ack time.Duration
	// Silence is how long a rank may show no sign of life (CollectTimeout).
	Silence time.Duration
	// Poll is how often the outstanding ranks are asked where they stand.
	Poll time.Duration
	// Spool is how long past the deadline a rank whose snapshot waits in its
	// spool for the store is still waited for.
	Spool time.Duration
	// Publish is how long publication retries a failing store before the window
	// is left for a later try (PublishTimeout).
	Publish time.Duration
	// Postmortem is a post-mortem's deadline, for its missing ranks' reason.
	Postmortem time.Duration
}

// retryNotLeader is how soon the command goes again to a rank that saw another
// member as leader (its membership had not caught up yet).
const retryNotLeader = 200 * time.Millisecond

// Window is one window's state machine. Its fields are the leader's to read;
// Step changes them.
type Window struct {
	ID    uint64
	Term  uint64 // the leadership term that runs it
	Kind  pb.WindowKind
	Start int64 // batches [Start, Stop); zero for a post-mortem
	Stop  int64
	// Dump: the ranks give what their trainers hold when asked (Dumps).
	Dump  bool
	World int
	Phase Phase
	Ranks map[int]*Rank
	// Planned and Deadline are on the leader's own clock: Deadline is when the
	// window gives up on the ranks not in (a successor taking the window over
	// counts its duration from when it found it, never from another host's clock).
	Planned  time.Time
	Deadline time.Time
	// Why is a failed window's reason, or why an answered one was not completed.
	Why string
	// Final: the window will not change any more here (ended, or answered with
	// its detail given up).
	Final bool

	timers      Timers
	canReplan   bool
	ackDeadline time.Time
	lastPoll    time.Time
	passed      []int
	hint        int
	lost        map[int]string // ranks about to be called missing once the log is read, and why
	confirmed   bool           // the log was read since the last rank was called missing
	checked     map[uint64]bool
	confirming  bool      // a ReadLog before committing the window as failed is out
	giveUp      time.Time // when publication stops retrying
	tries       int
	retrying    bool   // a Retry is out
	inFlight    bool   // a Publish, Complete or CommitFailure is out
	failure     string // why the window fails, once nothing can arrive
	quiet       bool   // abandoned: its end is told to nobody
	told        bool   // the members waiting were told it is merged
	down        bool   // superseded: nothing more is done
	exit        Exit   // why its leader stops running it (Running while it does not)
	exitWhy     string // Deferred: why
}

// Down reports whether the window's leader stepped down from it.
func (w *Window) Down() bool { return w.down }

// Exit is why the leader running a window stops running it.
type Exit uint8

const (
	// Running: it goes on.
	Running Exit = iota
	// Ended: it will not change any more here (Final).
	Ended
	// Replanned: ranks were past its start; the leader plans it again as a
	// later window (Passed names them) and abandons this one quietly.
	Replanned
	// Deferred: the store failed; it is left unfinished for a later sweep.
	Deferred
	// SteppedDown: a newer term is in the run's log; the window is left to it.
	SteppedDown
)

// Exit reports why the leader stops running the window (Running while it does
// not), and, when Deferred, why. The last of Replanned, Deferred and
// SteppedDown the machine said counts; Ended only when none was said.
func (w *Window) Exit() (Exit, string) { return w.exit, w.exitWhy }

// Passed lists the ranks that were past the window's start when it was planned
// again (Replanned).
func (w *Window) Passed() []int { return append([]int(nil), w.passed...) }

// Found is what a leader taking a window over found of one rank.
type Found struct {
	// Report is its report in the run's log (nil: none).
	Report *pb.RankResult
	// Status is its answer to a poll (nil: it is not a member, or did not answer).
	Status *Status
	// LastHeard is when it was last heard of, for one that is not a member now.
	LastHeard time.Time
	// OtherAgent: the rank's agent now is not the one the window was planned
	// with (it was restarted since, or the run was launched again): one that
	// never heard of the window is not sent it (its trainer's batches now may
	// be another launch's)
	OtherAgent bool
}

// Resume is a window an earlier leader left unfinished, as a leader taking it
// over finds it.
type Resume struct {
	Config
	// Found is what was found of each rank asked (Config.Asked).
	Found map[int]Found
	// At is now; RejoinGrace is how long a rank gone from the cluster may take
	// to come back (counted from when it was last heard of).
	At          time.Time
	RejoinGrace time.Duration
}

// Recover starts a window that an earlier leader left unfinished, from the
// run's log and the ranks' answers: a rank's report is its snapshot; a rank that
// still records it, or whose snapshot waits in its spool, is waited for until
// the deadline; one gone from the cluster is waited for a while. The window is
// Collecting; a Tick moves it on.
func Recover(r Resume) *Window {
	w := New(r.Config)
	w.Phase = Collecting
	w.lastPoll = r.At
	w.confirmed = true // the log was read for every rank's report
	for rank := 0; rank < w.World; rank++ {
		s := w.Ranks[rank]
		if s.Phase == LeftOut {
			s.Reason = "not asked to record the window (its leader did not have it as a member)"
			continue
		}
		f := r.Found[rank]
		st := f.Status
		s.LastSign = r.At
		switch {
		case f.Report != nil:
			s.Result = f.Report
			s.Phase = Uploaded
			if f.Report.Error != "" {
				s.Phase, s.Reason = Missing, "its snapshot was not stored: "+f.Report.Error
			}
		case st != nil && st.Window == w.ID && st.Result != nil:
			s.Result = st.Result
			s.Phase = Uploaded
			if st.Result.Error != "" {
				s.Phase, s.Reason = Missing, "its snapshot was not stored: "+st.Result.Error
			}
		case st != nil && st.Spooled:
			s.Phase, s.Batch, s.Acked = Spooled, st.Batch, true
		case st != nil && st.Window == w.ID && !Terminal(st.Step) && r.At.Before(w.Deadline.Add(w.timers.Silence)):
			s.Phase, s.Batch, s.Step, s.Acked = Recording, st.Batch, st.Step, true
		case st != nil && st.Window == w.ID:
			s.Phase, s.Reason = Missing, "the window ended on the rank without a snapshot ("+StepName(st.Step)+")"
		case st != nil && f.OtherAgent && neverHeard(w, st):
			s.Phase, s.Reason = Missing, "its agent started after the window was planned (restarted, or a later launch of the run) and has no recording of it"
		case st != nil && neverHeard(w, st) && r.At.Before(w.Deadline):
			s.Batch = st.Batch
			(&stepper{w: w}).sendAgain(rank, r.At)
		case st == nil && r.At.Before(w.Deadline):
			// not a member now, but it may be rejoining (a restarted member's
			// name is taken for dead a moment): it has RejoinGrace from when it
			// was last heard of to show up
			s.LastSign = f.LastHeard.Add(min(r.RejoinGrace-w.timers.Silence, 0))
			s.Phase, s.Acked = Recording, true
			s.Gone = "not a member now, and no snapshot of it in the run's log"
		case st == nil:
			s.Phase, s.Reason = Missing, "not a member now, and no snapshot of it in the run's log"
		default:
			s.Phase, s.Reason = Missing, "no snapshot of it in the run's log or the rank's spool (the rank stopped before storing one)"
		}
	}
	return w
}

// Terminal reports whether a rank's step is an end of its window (the one
// test of it, for the machine and the rank's side alike).
func Terminal(s pb.Step) bool {
	switch s {
	case pb.Step_STEP_UPLOADED, pb.Step_STEP_MISSED, pb.Step_STEP_FAILED, pb.Step_STEP_CANCELLED:
		return true
	}
	return false
}

// StepName is a step as people read it ("recording", "planned").
func StepName(s pb.Step) string { return pb.Name(s) }

// StepOrder orders a rank's steps in a window, as they happen: queued, sent,
// acked, armed, recording (or stopping), spooled (or partial), then its end
// (uploaded, missed, failed, ...), which all share the last place (EndOrder).
// Steps of the window as a whole are 0.
func StepOrder(s pb.Step) int {
	switch s {
	case pb.Step_STEP_QUEUED:
		return 1
	case pb.Step_STEP_SENT:
		return 2
	case pb.Step_STEP_ACKED:
		return 3
	case pb.Step_STEP_ARMED:
		return 4
	case pb.Step_STEP_RECORDING, pb.Step_STEP_STOPPING:
		return 5
	case pb.Step_STEP_SPOOLED, pb.Step_STEP_PARTIAL:
		return 6
	case pb.Step_STEP_UPLOADED, pb.Step_STEP_MISSED, pb.Step_STEP_PASSED, pb.Step_STEP_FAILED, pb.Step_STEP_CANCELLED, pb.Step_STEP_REFUSED, pb.Step_STEP_MISSING:
		return EndOrder
	}
	return 0
}

// EndOrder is StepOrder of a rank's last step in a window.
const EndOrder = 7

// Config starts a window.
type Config struct {
	ID, Term    uint64
	Kind        pb.WindowKind
	Start, Stop int64
	World       int
	// Asked are the ranks asked to record it, each as last heard (its batch);
	// LeftOut the others of the world, and why.
	Asked   map[int]int64
	LeftOut map[int]string
	Planned time.Time
	// Deadline is when the ranks not in are given up on.
	Deadline time.Time
	Timers   Timers
	// CanReplan: a rank past the start makes the leader plan the window again
	// (once), rather than go on without it.
	CanReplan bool
	// Dump: the ranks give what their trainers hold when asked, as in a
	// post-mortem (a trigger window under --record-always), not planned batches.
	Dump bool
}

// New starts a window in phase Planned.
func New(cfg Config) *Window {
	w := &Window{ID: cfg.ID, Term: cfg.Term, Kind: cfg.Kind, Start: cfg.Start, Stop: cfg.Stop, World: cfg.World, Phase: Planned,
		Ranks: make(map[int]*Rank, cfg.World), Planned: cfg.Planned, Deadline: cfg.Deadline, timers: cfg.Timers, canReplan: cfg.CanReplan, Dump: cfg.Dump,
		lost: map[int]string{}, checked: map[uint64]bool{}}
	for r := 0; r < cfg.World; r++ {
		if b, ok := cfg.Asked[r]; ok {
			w.Ranks[r] = &Rank{Phase: Expected, Batch: b, LastSign: cfg.Planned}
			continue
		}
		why := cfg.LeftOut[r]
		if why == "" {
			why = "not a member of the cluster"
		}
		w.Ranks[r] = &Rank{Phase: LeftOut, Reason: why}
	}
	return w
}

// Postmortem reports whether the window is an OOM or crash post-mortem.
func (w *Window) Postmortem() bool {
	return w.Kind == pb.WindowKind_WINDOW_KIND_OOM || w.Kind == pb.WindowKind_WINDOW_KIND_CRASH
}

// Dumps reports whether the ranks give what their trainers hold when asked, with
// no batches planned: a post-mortem, or a window planned with Dump.
func (w *Window) Dumps() bool { return w.Postmortem() || w.Dump }

// Waiting reports whether a rank is still awaited, without listing them: the
// leader asks after every message, and at 1,024 ranks listing them each time
// took most of the time the acks waited. The rank found last time is looked at
// first.
func (w *Window) Waiting() bool {
	if s := w.Ranks[w.hint]; s != nil && s.out() {
		return true
	}
	for r, s := range w.Ranks {
		if s.out() {
			w.hint = r
			return true
		}
	}
	return false
}

// Outstanding lists the ranks still awaited, ascending.
func (w *Window) Outstanding() []int {
	var out []int
	for r := 0; r < w.World; r++ {
		if s := w.Ranks[r]; s != nil && s.out() {
			out = append(out, r)
		}
	}
	return out
}

// MissingReasons are the ranks the window goes on without, and why.
func (w *Window) MissingReasons() map[int]string {
	out := map[int]string{}
	for r, s := range w.Ranks {
		if s.Phase == Missing || s.Phase == LeftOut {
			out[r] = s.Reason
		}
	}
	return out
}

// Quiet reports whether the window was abandoned quietly (planned again as a
// later window): its end is told to nobody, unless its answer is out.
func (w *Window) Quiet() bool { return w.quiet }

// Mergeable lists the ranks whose stored snapshots the window merges, ascending.
func (w *Window) Mergeable() []int {
	var out []int
	for r := 0; r < w.World; r++ {
		if s := w.Ranks[r]; s != nil && s.Phase == Uploaded {
			out = append(out, r)
		}
	}
	return out
}

// Commit is a window's commit as the store holds it: its manifest.
type Commit struct {
	Failed  bool   // a failed window's manifest
	Pending bool   // answered: the merged pickles and the timeline are to come
	Error   string // a failed window's reason
}

// Derive is a window's phase as the run's log tells it: its commit (nil while
// it has none) and its outcome's state ("published", "failed", or "" while the
// log holds none). final says the window will not change any more: an answer
// whose outcome is written had its detail given up. A window with neither is
// unfinished: Collecting, as far as the log can tell.
func Derive(c *Commit, outcome string) (p Phase, final bool) {
	switch {
	case c != nil && c.Failed:
		return Failed, true
	case c != nil && !c.Pending:
		return Published, true
	case c != nil:
		return Answered, outcome != ""
	case outcome == "failed":
		return Failed, true // a plan no leader could read, or a log of an earlier version
	case outcome == "published":
		return Published, true
	}
	return Collecting, false
}

// Agrees reports whether a window's outcome in the run's log says what its
// commit does (the log is an index of the commits, written after them).
func Agrees(c *Commit, outcome string) bool {
	if outcome == "" || c == nil {
		return true
	}
	if c.Failed {
		return outcome == "failed"
	}
	return outcome == "published"
}
