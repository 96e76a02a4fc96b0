package client

import (
	"fmt"
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

// TestInOrder: a leader's messages that overtook each other are heard in the
// order it told them; one whose predecessor never comes is heard once orderWait
// has passed; none is ever lost, and each sender is counted apart.
func TestInOrder(t *testing.T) {
	msg := func(from string, order uint64) *pb.Envelope { return &pb.Envelope{Sender: from, Order: order} }
	orders := func(envs []*pb.Envelope) []uint64 {
		var out []uint64
		for _, e := range envs {
			out = append(out, e.Order)
		}
		return out
	}
	var o inOrder
	var heard []uint64
	for _, n := range []uint64{2, 3, 1, 5, 4, 0} {
		heard = append(heard, orders(o.take(msg("a", n)))...)
	}
	if fmt.Sprint(heard) != "[1 2 3 4 5 0]" {
		t.Fatalf("heard %v", heard)
	}
	if o.gap != nil {
		t.Fatal("a gap timer runs with nothing held")
	}
	// 6 never comes: 7 and 8 are heard once the gap timer fires; b is counted apart
	if got := o.take(msg("a", 7)); len(got) != 0 {
		t.Fatalf("7 heard before 6: %v", orders(got))
	}
	if got := orders(o.take(msg("b", 1))); fmt.Sprint(got) != "[1]" {
		t.Fatalf("b's first: %v", got)
	}
	o.take(msg("a", 8))
	if o.gap == nil {
		t.Fatal("no gap timer while messages are held")
	}
	<-o.gap
	if got := orders(o.skip()); fmt.Sprint(got) != "[7 8]" {
		t.Fatalf("after the gap: %v", got)
	}
	// late (6 after all), and a leader that counts anew: heard at once
	if got := orders(o.take(msg("a", 6))); fmt.Sprint(got) != "[6]" {
		t.Fatalf("late: %v", got)
	}
	if got := orders(o.take(msg("a", 1))); fmt.Sprint(got) != "[1]" {
		t.Fatalf("counting anew: %v", got)
	}
	if got := orders(o.take(msg("a", 2))); fmt.Sprint(got) != "[2]" {
		t.Fatalf("counting anew, then: %v", got)
	}
}
