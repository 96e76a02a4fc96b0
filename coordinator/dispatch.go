package coordinator

import (
	"context"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/coordinator/wire"
	"github.com/memsnap/memsnap/internal/pb"
)

// enqueue hands a message to the dispatcher; it never blocks (memberlist's
// receive loop calls it).
func (c *Coordinator) enqueue(b []byte) {
	cp := append([]byte(nil), b...)
	select {
	case c.inbox <- cp:
	default:
		c.mu.Lock()
		c.dropped++
		d := c.dropped
		c.mu.Unlock()
		if d == 1 || d%1000 == 0 {
			c.log.Warn("dropping cluster messages: the dispatcher is behind", "dropped", d)
		}
	}
}

// handleLocal delivers a message this member sends to itself.
func (c *Coordinator) handleLocal(env *pb.Envelope) {
	b, err := proto.Marshal(env)
	if err != nil {
		c.log.Warn("a message to this member could not be encoded; dropped", "err", err)
		return
	}
	c.enqueue(b)
}

// dispatch handles queued messages one at a time. It never waits on the network:
// replies go through the outbox.
func (c *Coordinator) dispatch(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case b := <-c.inbox:
			env, err := wire.DecodeEnvelope(b)
			if err != nil {
				c.log.Warn("dropped a malformed cluster message", "err", err, "bytes", len(b))
				continue
			}
			c.handle(env)
		}
	}
}

// isReply reports whether env answers a request (and goes to whoever waits for its
// seq) rather than asking something itself.
func isReply(env *pb.Envelope) bool {
	switch env.Body.(type) {
	case *pb.Envelope_Status, *pb.Envelope_Ack, *pb.Envelope_ClockReply, *pb.Envelope_Progress, *pb.Envelope_WindowResult, *pb.Envelope_View:
		return true
	}
	return false
}

func (c *Coordinator) handle(env *pb.Envelope) {
	if c.nsilent.Load() > 0 {
		// a message under the name of a member held silent: it is pinged at
		// the next round, and a member again once it answers
		c.mu.Lock()
		c.pingSoonLocked(env.Sender)
		c.mu.Unlock()
	}
	c.heardAt(env) // (a member started again at another address: moved.go)
	if env.Seq != 0 && env.GetAck() != nil && c.rs.IncidentAck(env) {
		return
	}
	// a reply somebody waits for, from someone allowed to answer
	if env.Seq != 0 && isReply(env) {
		c.mu.Lock()
		w := c.waiting[env.Seq]
		c.mu.Unlock()
		if w != nil {
			if w.from == nil || w.from(env) {
				select {
				case w.ch <- env:
				default:
				}
			} else {
				c.refuse(env, "a reply from a member that was not asked")
			}
			return
		}
	}
	switch b := env.Body.(type) {
	case *pb.Envelope_StatusRequest:
		c.rs.AnswerStatus(env)
	case *pb.Envelope_Plan:
		c.rs.OnPlan(env, b.Plan)
	case *pb.Envelope_Cancel:
		c.rs.OnCancel(env, b.Cancel)
	case *pb.Envelope_Dump:
		c.rs.OnDump(env, b.Dump)
	case *pb.Envelope_ClockProbe:
		r := c.envelope(0)
		r.Body = &pb.Envelope_ClockReply{ClockReply: &pb.ClockReply{T0Us: b.ClockProbe.T0Us, TUs: c.cfg.Now().UnixMicro()}}
		c.reply(env, r, false)
	case *pb.Envelope_Ack, *pb.Envelope_Progress, *pb.Envelope_Result:
		// a rank's answer about a window: only a rank may give one
		if !c.isRankMember(env) {
			c.refuse(env, "a rank's message from a member that is not that rank")
			return
		}
		c.toLeader(env)
	case *pb.Envelope_Request:
		c.noteIncident(env, b.Request)
		c.toLeader(env)
	case *pb.Envelope_Figures:
		c.onFigures(env, b.Figures)
	case *pb.Envelope_LeaderSilent:
		c.onLeaderSilent(env, b.LeaderSilent)
	case *pb.Envelope_ViewRequest:
		c.answerView(env)
	}
}

// toLeader hands a message to this member's leader loop; a request that reaches
// a member that does not lead is answered with who does.
func (c *Coordinator) toLeader(env *pb.Envelope) {
	c.mu.Lock()
	l := c.lead
	leader := c.leaderName
	c.mu.Unlock()
	if l != nil {
		if !l.WatchNow(env) {
			l.Deliver(env)
		}
		return
	}
	if env.GetRequest() != nil && env.Seq != 0 {
		r := c.envelope(env.WindowId)
		r.Body = &pb.Envelope_Ack{Ack: &pb.Ack{Code: pb.AckCode_ACK_NOT_LEADER, Message: leader}}
		c.reply(env, r, true)
	}
}

// refusals counts the messages this member refused, by why, and says so at most
// once per refusalEvery per reason.
type refusals struct {
	mu    sync.Mutex
	count map[string]int
	said  map[string]time.Time
}

const refusalEvery = 10 * time.Second

// refuse logs a message this member will not act on (at most one line per reason
// per refusalEvery).
func (c *Coordinator) refuse(env *pb.Envelope, why string) {
	c.refused.mu.Lock()
	if c.refused.count == nil {
		c.refused.count, c.refused.said = map[string]int{}, map[string]time.Time{}
	}
	c.refused.count[why]++
	n := c.refused.count[why]
	say := time.Since(c.refused.said[why]) >= refusalEvery
	if say {
		c.refused.said[why], c.refused.count[why] = time.Now(), 0
	}
	c.refused.mu.Unlock()
	if say {
		c.log.Warn("refused a cluster message: "+why, "sender", env.Sender, "sender_rank", env.SenderRank, "window", env.WindowId, "count", n)
	}
}

// commandAllowed says whether a command (a plan, a cancel, a dump) may be obeyed:
// it must come from the member this one derives as leader, with a term no older
// than any this member has seen. Otherwise it returns the code to refuse it with.
func (c *Coordinator) commandAllowed(env *pb.Envelope) (pb.AckCode, string) {
	c.mu.Lock()
	leader, term, seen := c.leaderName, c.term, c.lastWindow
	c.mu.Unlock()
	switch {
	case env.Term < term:
		return pb.AckCode_ACK_STALE_TERM, "a command of term " + strconv.FormatUint(env.Term, 10) + "; this member has seen term " + strconv.FormatUint(term, 10)
	case env.Sender != leader || !c.isRankMember(env):
		return pb.AckCode_ACK_NOT_LEADER, "only the leader may command; this member sees " + leader + " as leader"
	case env.WindowId > seen+maxIDJump:
		return pb.AckCode_ACK_BAD_REQUEST, "window id " + strconv.FormatUint(env.WindowId, 10) + " is far past the newest seen (" + strconv.FormatUint(seen, 10) + ")"
	}
	c.claimTerm(env.Term)
	return pb.AckCode_ACK_OK, ""
}

// maxIDJump bounds how far past the newest window id seen a leader's id may be.
const maxIDJump = 1 << 32
