package leader

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/coordinator/wire"
	"github.com/memsnap/memsnap/internal/pb"
)

// TestStepMessages: gathered steps go out in messages that stay far under
// wire.MaxMessage, whatever their reasons' length, and none is lost or repeated.
func TestStepMessages(t *testing.T) {
	for _, tc := range []struct {
		n, reason int
		want      []int
	}{
		{1, 0, []int{1}},
		{stepsPerMessage, 0, []int{stepsPerMessage}},
		{1300, 10, []int{512, 512, 276}},
		{200, wire.MaxString, []int{64, 64, 64, 8}},
	} {
		var steps []*pb.RankStep
		for i := 0; i < tc.n; i++ {
			steps = append(steps, &pb.RankStep{Rank: int32(i), State: pb.Step_STEP_ACKED, Reason: strings.Repeat("r", tc.reason)})
		}
		var got []int
		next := int32(0)
		for _, m := range stepMessages(steps) {
			got = append(got, len(m))
			for _, s := range m {
				if s.Rank != next {
					t.Fatalf("%d steps: rank %d where %d comes", tc.n, s.Rank, next)
				}
				next++
			}
			env := &pb.Envelope{Sender: "r0", Body: &pb.Envelope_Progress{Progress: &pb.Progress{Rank: -1, Steps: m}}}
			if n := proto.Size(env); n > wire.MaxMessage/2 {
				t.Fatalf("a message of %d bytes", n)
			}
			if err := wire.CheckEnvelope(env); err != nil {
				t.Fatal(err)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%d steps of %d-byte reasons: messages of %v, want %v", tc.n, tc.reason, got, tc.want)
		}
	}
	if stepMessages(nil) != nil {
		t.Error("messages of no steps")
	}
}
