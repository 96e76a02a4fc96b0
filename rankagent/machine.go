package rankagent

// The window in progress on this rank is one value, onRank, and what happens to it
// is one pure function, step: the agent feeds it the trainer's messages, the
// leader's commands and the trainer's end, and carries out what step returns (the
// event to report, and whether the window is over). No other code sets a window's
// state. It has the shape of the cluster's window machine (coordinator/window),
// on one rank and without a clock: a window only ever moves forward, queued →
// sent → armed → recording, and ends once.

// onRank is the window in progress on this rank and where it stands.
type onRank struct {
	w     Window
	state WindowState // queued, sent, armed or recording
	sent  bool        // sent to the connected trainer
}

// rankEvent is what happens to the window in progress.
type rankEvent int

const (
	evSent      rankEvent = iota // the connected trainer was sent the window
	evUnsent                     // the trainer disconnected: the window goes again to the next one
	evArmed                      // the trainer is before the start, and waits for it
	evRecording                  // the trainer records the window
	evCancelled                  // the leader withdrew it
	evMissed                     // the trainer was past the start
	evFailed                     // it cannot be recorded (the trainer failed, exited, or no GPU)
	evStored                     // the trainer's snapshot of the whole window came
	evCrashed                    // the trainer was stopped during the window; what it recorded came
)

var rankEventNames = [...]string{"sent", "unsent", "armed", "recording", "cancelled", "missed", "failed", "stored", "crashed"}

func (e rankEvent) String() string {
	if int(e) < len(rankEventNames) {
		return rankEventNames[e]
	}
	return "event?"
}

// order is how far a window in progress has come.
var order = map[WindowState]int{WindowQueued: 0, WindowSent: 1, WindowArmed: 2, WindowRecording: 3}

// newOnRank is window w, queued: not yet sent to a trainer.
func newOnRank(w Window) onRank { return onRank{w: w, state: WindowQueued} }

// step is the window after ev: next, the state to report (empty when nothing
// changed, or when the report comes later, as a stored window's upload does),
// and whether the window is over (next is then its last state).
func (s onRank) step(ev rankEvent) (next onRank, report WindowState, over bool) {
	next = s
	forward := func(to WindowState) {
		if order[to] > order[s.state] {
			next.state, report = to, to
		}
	}
	switch ev {
	case evSent:
		next.sent = true
		forward(WindowSent)
	case evUnsent:
		next.sent = false
	case evArmed:
		forward(WindowArmed)
	case evRecording:
		forward(WindowRecording)
	case evCancelled:
		return s, WindowCancelled, true
	case evMissed:
		return s, WindowMissed, true
	case evFailed:
		return s, WindowFailed, true
	case evStored:
		return s, "", true // its upload reports spooled, partial or failed
	case evCrashed:
		return s, WindowPartial, true
	}
	return next, report, false
}

// recording reports whether the trainer has begun recording the window.
func (s onRank) recording() bool { return s.state == WindowRecording }
