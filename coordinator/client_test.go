package coordinator

import (
	"testing"

	"github.com/memsnap/memsnap/internal/pb"
)

// TestOvertakenProgress: once a window's answer has come, the leader's word that
// it is merging that window's ranks is old news (it was sent before the answer,
// on a stream of its own, and overtaken); every other progress is still told.
func TestOvertakenProgress(t *testing.T) {
	merging := &pb.Progress{Rank: -1, Batch: -1, State: pb.Step_STEP_PUBLISHING, Reason: "merging 4 ranks"}
	for _, tc := range []struct {
		name         string
		p            *pb.Progress
		id, answered uint64
		want         bool
	}{
		{"merging, after the answer", merging, 3, 3, true},
		{"merging, before any answer", merging, 3, 0, false},
		{"merging, another window's answer", merging, 4, 3, false},
		{"a rank's step after the answer", &pb.Progress{Rank: 2, State: pb.Step_STEP_PUBLISHING}, 3, 3, false},
		{"ranks' steps gathered", &pb.Progress{Rank: -1, State: pb.Step_STEP_PUBLISHING, Steps: []*pb.RankStep{{Rank: 1}}}, 3, 3, false},
		{"the window planned", &pb.Progress{Rank: -1, State: pb.Step_STEP_PLANNED}, 3, 3, false},
		{"the window failed", &pb.Progress{Rank: -1, State: pb.Step_STEP_MISSING}, 3, 3, false},
	} {
		if got := overtaken(tc.p, tc.id, tc.answered); got != tc.want {
			t.Errorf("%s: overtaken %v, want %v", tc.name, got, tc.want)
		}
	}
}
