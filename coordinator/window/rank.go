package window

import "github.com/memsnap/memsnap/internal/pb"

// RankSide is a rank's own side of its windows: the machine the rank steps with
// the commands it takes (a plan, a post-mortem's dump, a cancel) and its
// agent's events, and reads for its status answers (the leader's Found and
// Status come from them). It keeps the rank's latest window and its latest
// post-mortem apart: a post-mortem interrupts a window, which goes on, and a
// status answer says where that window stands. It does no I/O; its owner
// steps it under its own lock.
type RankSide struct {
	Latest     RankRecord // the rank's latest window
	Postmortem RankRecord // its latest post-mortem (or trigger's dumps)
}

// RankRecord is where one window stands on this rank.
type RankRecord struct {
	ID          uint64
	Start, Stop int64
	Step        pb.Step
	Result      *pb.RankResult // its snapshot once stored (or why it could not be)
	// Leader and Term name the leader whose command the rank took (a window
	// first heard of through the agent's events names none).
	Leader string
	Term   uint64
}

// Planned: the rank took a leader's plan; a window new to it is queued.
func (s *RankSide) Planned(id uint64, start, stop int64, leader string, term uint64) {
	if s.Latest.ID != id {
		s.Latest = RankRecord{ID: id, Start: start, Stop: stop, Step: pb.Step_STEP_QUEUED, Leader: leader, Term: term}
	}
}

// Dumped: a post-mortem's (or a trigger's) dump command; a window new to it is
// queued. It reports whether the rank had taken it already.
func (s *RankSide) Dumped(id uint64, leader string) (again bool) {
	if s.Postmortem.ID == id {
		return true
	}
	s.Postmortem = RankRecord{ID: id, Step: pb.Step_STEP_QUEUED, Leader: leader}
	return false
}

// Handed: the snapshot the rank's trainer took at its own failure is its part
// of post-mortem id (stored: uploaded), or there is none and res says why
// (failed).
func (s *RankSide) Handed(id uint64, res *pb.RankResult, stored bool) {
	if s.Postmortem.ID != id {
		return
	}
	s.Postmortem.Result, s.Postmortem.Step = res, pb.Step_STEP_UPLOADED
	if !stored {
		s.Postmortem.Step = pb.Step_STEP_FAILED
	}
}

// Cancelled: the leader cancelled window id; a window not ended here is.
func (s *RankSide) Cancelled(id uint64) {
	if s.Latest.ID == id && !Terminal(s.Latest.Step) {
		s.Latest.Step = pb.Step_STEP_CANCELLED
	}
}

// Withdrawn: window id was a forged plan (the run's log does not hold it): the
// rank forgets it.
func (s *RankSide) Withdrawn(id uint64) {
	if s.Latest.ID == id {
		s.Latest = RankRecord{}
	}
}

// Observed: the agent's event about window id (a step, and its snapshot once
// stored). An event of the post-mortem goes to it; one of the latest window,
// or of a newer one (which becomes the latest), to the latest window; an
// event of an older window changes nothing here.
func (s *RankSide) Observed(id uint64, start, stop int64, step pb.Step, res *pb.RankResult) {
	r := &s.Latest
	switch {
	case id == 0:
		return
	case id == s.Postmortem.ID:
		r = &s.Postmortem
	case id > s.Latest.ID:
		s.Latest = RankRecord{ID: id, Start: start, Stop: stop}
	case id < s.Latest.ID:
		return
	}
	r.Step = step
	if res != nil {
		r.Result = res
	}
}
