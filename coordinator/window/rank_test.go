package window

import (
	"testing"

	"github.com/memsnap/memsnap/internal/pb"
)

// TestRankSide: the rank's side of its windows, as its status answers say it:
// a plan queues a window new to it; the agent's events move it and give its
// snapshot; a post-mortem's steps stay apart from the window it interrupted; a
// cancel ends only a window not ended; an older window's event changes nothing.
func TestRankSide(t *testing.T) {
	var s RankSide
	s.Planned(4, 10, 13, "run/rank0", 2)
	if l := s.Latest; l.ID != 4 || l.Step != pb.Step_STEP_QUEUED || l.Leader != "run/rank0" || l.Term != 2 {
		t.Fatalf("after the plan: %+v", l)
	}
	s.Planned(4, 10, 13, "run/rank1", 3) // (the same plan again, through gossip)
	s.Observed(4, 10, 13, pb.Step_STEP_RECORDING, nil)
	if l := s.Latest; l.Step != pb.Step_STEP_RECORDING || l.Leader != "run/rank0" {
		t.Fatalf("recording: %+v", l)
	}
	// a post-mortem interrupts it
	if s.Dumped(5, "run/rank0") || !s.Dumped(5, "run/rank0") {
		t.Fatal("a dump command taken twice")
	}
	s.Observed(5, 0, 0, pb.Step_STEP_UPLOADED, &pb.RankResult{Key: "pm"})
	s.Observed(4, 10, 13, pb.Step_STEP_UPLOADED, &pb.RankResult{Key: "w"})
	if l, p := s.Latest, s.Postmortem; l.ID != 4 || l.Result.GetKey() != "w" || p.ID != 5 || p.Result.GetKey() != "pm" {
		t.Fatalf("the window and the post-mortem: %+v %+v", l, p)
	}
	s.Cancelled(4)
	if s.Latest.Step != pb.Step_STEP_UPLOADED {
		t.Fatalf("an ended window cancelled: %v", s.Latest.Step)
	}
	s.Observed(3, 1, 2, pb.Step_STEP_FAILED, nil)  // an older window's late event
	s.Observed(7, 20, 23, pb.Step_STEP_ARMED, nil) // a newer one, heard of through the agent
	if l := s.Latest; l.ID != 7 || l.Step != pb.Step_STEP_ARMED || l.Leader != "" || l.Result != nil {
		t.Fatalf("a newer window: %+v", l)
	}
	s.Cancelled(7)
	if s.Latest.Step != pb.Step_STEP_CANCELLED {
		t.Fatalf("cancelled: %v", s.Latest.Step)
	}
	s.Withdrawn(6)
	s.Withdrawn(7)
	if s.Latest.ID != 0 {
		t.Fatalf("a forged window withdrawn: %+v", s.Latest)
	}
	// the rank's own failure handed to a post-mortem
	s.Dumped(9, "run/rank1")
	s.Handed(9, &pb.RankResult{Error: "no snapshot: the trainer died"}, false)
	if p := s.Postmortem; p.Step != pb.Step_STEP_FAILED || p.Result.GetError() == "" {
		t.Fatalf("a failure with no snapshot handed: %+v", p)
	}
}
