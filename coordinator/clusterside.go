package coordinator

import (
	"context"

	"github.com/memsnap/memsnap/coordinator/rankside"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/rankagent"
)

// clusterSide is what the rank side (coordinator/member) asks of this member.
// Each method takes c.mu only inside itself.
type clusterSide struct{ c *Coordinator }

var _ rankside.Cluster = clusterSide{}

func (s clusterSide) Name() string                               { return s.c.name }
func (s clusterSide) Term() uint64                               { return s.c.Term() }
func (s clusterSide) UpdateMeta()                                { s.c.updateMeta() }
func (s clusterSide) Envelope(window uint64) *pb.Envelope        { return s.c.envelope(window) }
func (s clusterSide) Reply(req, env *pb.Envelope, reliable bool) { s.c.reply(req, env, reliable) }
func (s clusterSide) Post(to string, env *pb.Envelope, reliable bool) {
	s.c.post(to, "", env, reliable)
}
func (s clusterSide) Refuse(env *pb.Envelope, why string) { s.c.refuse(env, why) }
func (s clusterSide) CommandAllowed(env *pb.Envelope) (pb.AckCode, string) {
	return s.c.commandAllowed(env)
}
func (s clusterSide) HandleLocal(env *pb.Envelope) { s.c.handleLocal(env) }
func (s clusterSide) Spawn(f func()) bool          { return s.c.spawn(f) }
func (s clusterSide) OutIdle() bool                { return s.c.out.idle() }

func (s clusterSide) Request(ctx context.Context, to string, env *pb.Envelope, reliable bool) (*pb.Envelope, error) {
	return s.c.request(ctx, to, env, reliable)
}

func (s clusterSide) LeaderName() string {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.leaderName
}

func (s clusterSide) Seen() uint64 {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.lastWindow
}

func (s clusterSide) SawWindow(id uint64) bool {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	newer := id > s.c.lastWindow
	s.c.lastWindow = max(s.c.lastWindow, id)
	return newer
}

// Observe takes the agent's window events (rankagent.Config.OnWindow) and tells
// the leader: every step as progress, and the stored snapshot as the rank's
// result (rankside.Rank.Observe).
func (c *Coordinator) Observe(ev rankagent.WindowEvent) { c.rs.Observe(ev) }

// Settled reports whether this rank has nothing left to hand on
// (rankside.Rank.Settled): an agent whose trainer exited waits for it before it stops.
func (c *Coordinator) Settled() bool { return c.rs.Settled() }
