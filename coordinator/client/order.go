package client

import (
	"time"

	"github.com/memsnap/memsnap/internal/pb"
)

// orderWait is how long a leader's message that came before one told earlier
// (Envelope.Order) is held for the one it overtook.
const orderWait = 250 * time.Millisecond

// inOrder puts a leader's messages about a request back in the order it told
// them (each travels on a stream of its own, and may overtake the one before).
// A message is never lost: one whose predecessor does not come within orderWait
// goes on without it, and one older than expected (late, or from a leader that
// restarted and counts anew) is passed on at once.
type inOrder struct {
	next map[string]uint64                  // by sender: the order expected next
	held map[string]map[uint64]*pb.Envelope // by sender and order
	gap  <-chan time.Time                   // fires orderWait after a message is held
}

func (o *inOrder) take(env *pb.Envelope) []*pb.Envelope {
	if env.Order == 0 {
		return []*pb.Envelope{env}
	}
	if o.next == nil {
		o.next, o.held = map[string]uint64{}, map[string]map[uint64]*pb.Envelope{}
	}
	from := env.Sender
	next := max(o.next[from], 1)
	switch {
	case env.Order == 1 && next > 1: // a leader that counts anew
		o.next[from], o.held[from] = 2, nil
		o.arm()
		return []*pb.Envelope{env}
	case env.Order < next:
		return []*pb.Envelope{env}
	case env.Order > next:
		if o.held[from] == nil {
			o.held[from] = map[uint64]*pb.Envelope{}
		}
		if len(o.held[from]) < 1<<16 {
			o.held[from][env.Order] = env
		}
		o.arm()
		return nil
	}
	o.next[from] = next
	return o.release(from, []*pb.Envelope{env})
}

// release passes on from's message at o.next[from] (out holds it) and those held
// after it without a gap.
func (o *inOrder) release(from string, out []*pb.Envelope) []*pb.Envelope {
	n := o.next[from] + 1
	for {
		env, ok := o.held[from][n]
		if !ok {
			break
		}
		out = append(out, env)
		delete(o.held[from], n)
		n++
	}
	o.next[from] = n
	o.arm()
	return out
}

// arm keeps the gap timer running while a message is held, and only then.
func (o *inOrder) arm() {
	for _, held := range o.held {
		if len(held) > 0 {
			if o.gap == nil {
				o.gap = time.After(orderWait)
			}
			return
		}
	}
	o.gap = nil
}

// skip gives up waiting for the messages held ones overtook.
func (o *inOrder) skip() []*pb.Envelope {
	o.gap = nil // (release arms it again while anything is still held)
	var out []*pb.Envelope
	for from, held := range o.held {
		if len(held) == 0 {
			continue
		}
		first := uint64(0)
		for n := range held {
			if first == 0 || n < first {
				first = n
			}
		}
		o.next[from] = first
		env := held[first]
		delete(held, first)
		out = o.release(from, append(out, env))
	}
	return out
}
