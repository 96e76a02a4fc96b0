package client

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
)

// fakeMember is a cluster as a request sees it: a leader that a test names,
// the messages the request sends, and the replies the test gives it.
type fakeMember struct {
	mu      sync.Mutex
	leader  string
	sent    chan sent
	replies chan *pb.Envelope
}

type sent struct {
	to  string
	env *pb.Envelope
}

func newFake(leader string) *fakeMember {
	return &fakeMember{leader: leader, sent: make(chan sent, 64), replies: make(chan *pb.Envelope, 64)}
}

func (f *fakeMember) Expect(int) (<-chan *pb.Envelope, uint64) { return f.replies, 7 }
func (f *fakeMember) Forget(uint64)                            {}
func (f *fakeMember) Envelope(w uint64) *pb.Envelope {
	return &pb.Envelope{Sender: "client", WindowId: w}
}
func (f *fakeMember) Stopped(error) bool { return false }
func (f *fakeMember) Leader() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.leader
}
func (f *fakeMember) setLeader(l string) {
	f.mu.Lock()
	f.leader = l
	f.mu.Unlock()
}
func (f *fakeMember) Send(to string, env *pb.Envelope) error {
	f.sent <- sent{to, env}
	return nil
}

func (f *fakeMember) next(t *testing.T) sent {
	t.Helper()
	select {
	case s := <-f.sent:
		return s
	case <-time.After(30 * time.Second):
		t.Fatal("the request sent nothing")
	}
	return sent{}
}

// TestRequestFollowsANewLeader: a request whose leader changes after it said
// which window serves it asks the new leader about that window, and ends with
// what the new leader says; a leader that refuses ends it with the reason.
func TestRequestFollowsANewLeader(t *testing.T) {
	f := newFake("a")
	type result struct {
		res *pb.WindowResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := Request(context.Background(), f, 3, RequestOptions{})
		done <- result{res, err}
	}()
	if s := f.next(t); s.to != "a" || s.env.GetRequest() == nil || s.env.WindowId != 0 || s.env.Seq != 7 {
		t.Fatalf("the first ask: %+v", s)
	}
	f.replies <- &pb.Envelope{Sender: "a", Seq: 7, WindowId: 5, Body: &pb.Envelope_Ack{Ack: &pb.Ack{Ok: true}}}
	f.setLeader("b")
	if s := f.next(t); s.to != "b" || s.env.WindowId != 5 {
		t.Fatalf("the ask of the new leader: to %s about window %d, want b about window 5", s.to, s.env.WindowId)
	}
	f.replies <- &pb.Envelope{Sender: "b", Seq: 7, WindowId: 5, Body: &pb.Envelope_WindowResult{WindowResult: &pb.WindowResult{Window: 5, State: pb.Outcome_OUTCOME_PUBLISHED}}}
	if r := <-done; r.err != nil || r.res.Window != 5 || r.res.State != pb.Outcome_OUTCOME_PUBLISHED {
		t.Fatalf("the request's end: %+v %v", r.res, r.err)
	}

	g := newFake("a")
	go func() {
		res, err := Request(context.Background(), g, 3, RequestOptions{})
		done <- result{res, err}
	}()
	g.next(t)
	g.replies <- &pb.Envelope{Sender: "a", Seq: 7, Body: &pb.Envelope_Ack{Ack: &pb.Ack{Message: "a window of 3 batches is too short"}}}
	if r := <-done; !errors.Is(r.err, ErrRefused) || r.res != nil {
		t.Fatalf("a refused request's end: %+v %v", r.res, r.err)
	}
}
