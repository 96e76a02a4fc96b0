package coordinator

import (
	"testing"

	"github.com/memsnap/memsnap/internal/pb"
)

// TestOvertakenProgress: once a window's answer has come, its leader's word that
// it is merging that window's ranks, and the ranks' steps it gathered, are old
// news (sent before the answer, on streams of their own, and overtaken); every
// other progress is still told, and so is a successor's.
func TestOvertakenProgress(t *testing.T) {
	merging := &pb.Progress{Rank: -1, Batch: -1, State: pb.Step_STEP_PUBLISHING, Reason: "merging 4 ranks"}
	env := func(id uint64, sender int32, p *pb.Progress) *pb.Envelope {
		return &pb.Envelope{WindowId: id, SenderRank: sender, Body: &pb.Envelope_Progress{Progress: p}}
	}
	for _, tc := range []struct {
		name     string
		env      *pb.Envelope
		answered uint64
		by       int32
		want     bool
	}{
		{"merging, after the answer", env(3, 0, merging), 3, 0, true},
		{"merging, before any answer", env(3, 0, merging), 0, -1, false},
		{"merging, another window's answer", env(4, 0, merging), 3, 0, false},
		{"merging, said by a successor finishing the window", env(3, 1, merging), 3, 0, false},
		{"a rank's step after the answer", env(3, 0, &pb.Progress{Rank: 2, State: pb.Step_STEP_PUBLISHING}), 3, 0, false},
		{"ranks' steps gathered, after the answer", env(3, 0, &pb.Progress{Rank: -1, Batch: -1, Steps: []*pb.RankStep{{Rank: 1, State: pb.Step_STEP_UPLOADED}}}), 3, 0, true},
		{"ranks' steps gathered, before any answer", env(3, 0, &pb.Progress{Rank: -1, Batch: -1, Steps: []*pb.RankStep{{Rank: 1, State: pb.Step_STEP_UPLOADED}}}), 0, -1, false},
		{"ranks' steps gathered by a successor", env(3, 1, &pb.Progress{Rank: -1, Batch: -1, Steps: []*pb.RankStep{{Rank: 1, State: pb.Step_STEP_UPLOADED}}}), 3, 0, false},
		{"the window planned", env(3, 0, &pb.Progress{Rank: -1, State: pb.Step_STEP_PLANNED}), 3, 0, false},
		{"publication retried", env(3, 0, &pb.Progress{Rank: -1, State: pb.Step_STEP_RETRYING}), 3, 0, false},
		{"not a progress", &pb.Envelope{WindowId: 3, Body: &pb.Envelope_Ack{Ack: &pb.Ack{}}}, 3, 0, false},
	} {
		if got := overtaken(tc.env, tc.answered, tc.by); got != tc.want {
			t.Errorf("%s: overtaken %v, want %v", tc.name, got, tc.want)
		}
	}
}
