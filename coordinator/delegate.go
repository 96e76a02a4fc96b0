package coordinator

import (
	"fmt"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/coordinator/wire"
	"github.com/memsnap/memsnap/internal/pb"
)

// delegate is memberlist's view of a member: its metadata, the messages it
// receives, and the gossip it piggybacks.
type delegate struct{ c *Coordinator }

var _ memberlist.Delegate = (*delegate)(nil)

func (d *delegate) NodeMeta(limit int) []byte {
	b, err := proto.Marshal(d.c.meta())
	if err != nil || len(b) > limit {
		d.c.log.Error("node metadata does not fit memberlist's limit", "bytes", len(b), "limit", limit, "err", err)
		return nil
	}
	return b
}

// NotifyMsg copies the message and hands it to the dispatcher; it never blocks.
func (d *delegate) NotifyMsg(b []byte) { d.c.enqueue(b) }

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.c.bc.GetBroadcasts(overhead, limit)
}

func (d *delegate) LocalState(join bool) []byte            { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool) {}

// events follows membership.
type events struct{ c *Coordinator }

var _ memberlist.EventDelegate = (*events)(nil)

func (e *events) NotifyJoin(n *memberlist.Node)   { e.c.memberChanged(n, false) }
func (e *events) NotifyLeave(n *memberlist.Node)  { e.c.memberChanged(n, true) }
func (e *events) NotifyUpdate(n *memberlist.Node) { e.c.memberChanged(n, false) }

// alive admits only members of this run whose metadata reads well; the gossip
// key and label keep everyone else out before this.
type alive struct{ c *Coordinator }

var _ memberlist.AliveDelegate = (*alive)(nil)

func (a *alive) NotifyAlive(n *memberlist.Node) error {
	m, err := wire.DecodeMeta(n.Meta)
	if err != nil {
		return fmt.Errorf("coordinator: %s: %w", n.Name, err)
	}
	if m.Run != a.c.cfg.Identity.RunName {
		return fmt.Errorf("coordinator: %s belongs to run %q, not %q", n.Name, m.Run, a.c.cfg.Identity.RunName)
	}
	if m.Rank >= 0 && n.Name != NodeName(m.Run, int(m.Rank)) {
		return fmt.Errorf("coordinator: %s says it is rank %d", n.Name, m.Rank)
	}
	return nil
}

// broadcast is one gossiped message (a plan or a cancel, as a backstop to the
// direct messages); a newer one about the same window replaces it.
type broadcast struct {
	msg    []byte
	window uint64
}

var _ memberlist.Broadcast = (*broadcast)(nil)

func (b *broadcast) Invalidates(o memberlist.Broadcast) bool {
	ob, ok := o.(*broadcast)
	return ok && ob.window <= b.window
}
func (b *broadcast) Message() []byte { return b.msg }
func (b *broadcast) Finished()       {}

// gossip queues env to reach every member through gossip.
func (c *Coordinator) gossip(env *pb.Envelope) {
	b, err := proto.Marshal(env)
	if err != nil {
		return
	}
	c.bc.QueueBroadcast(&broadcast{msg: b, window: env.WindowId})
}
