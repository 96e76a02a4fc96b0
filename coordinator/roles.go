package coordinator

import (
	"context"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/memsnap/memsnap/coordinator/leader"
	"github.com/memsnap/memsnap/coordinator/rankside"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/rankagent"
	"github.com/memsnap/memsnap/runlog"
)

// roles is what the leader (coordinator/leader) and the rank side
// (coordinator/rankside) ask of this member: the cluster as it sees it, its
// messages, and the terms and window ids it believes. Each method takes c.mu
// only inside itself, so neither role ever holds a lock of the member's.
type roles struct{ c *Coordinator }

var (
	_ leader.Member    = roles{}
	_ rankside.Cluster = roles{}
)

func (s roles) Name() string                                    { return s.c.name }
func (s roles) Rank() int32                                     { return s.c.rank() }
func (s roles) Term() uint64                                    { return s.c.Term() }
func (s roles) Believe(t uint64) bool                           { return s.c.believe(t) }
func (s roles) BelieveTerm(ctx context.Context, rl *runlog.Log) { s.c.believeTerm(ctx, rl) }
func (s roles) UpdateMeta()                                     { s.c.updateMeta() }
func (s roles) GoneAt(name string, now time.Time) time.Time     { return s.c.goneAt(name, now) }
func (s roles) LastHeard(name string, now time.Time) time.Time  { return s.c.lastHeard(name, now) }
func (s roles) AbsentRanks() (gone, never []int)                { return s.c.absentRanks() }
func (s roles) RankNodes() map[int]*memberlist.Node             { return s.c.rankNodes() }
func (s roles) RankAgents() map[int]string                      { return s.c.rankAgents() }
func (s roles) Node(name string) *memberlist.Node               { return s.c.node(name) }
func (s roles) IsRankMember(env *pb.Envelope) bool              { return s.c.isRankMember(env) }
func (s roles) Envelope(window uint64) *pb.Envelope             { return s.c.envelope(window) }
func (s roles) Forget(seq uint64)                               { s.c.forget(seq) }
func (s roles) HandleLocal(env *pb.Envelope)                    { s.c.handleLocal(env) }
func (s roles) Reply(req, env *pb.Envelope, reliable bool)      { s.c.reply(req, env, reliable) }
func (s roles) Gossip(env *pb.Envelope)                         { s.c.gossip(env) }
func (s roles) Spawn(f func()) bool                             { return s.c.spawn(f) }
func (s roles) StillCrossing(rank int) string                   { return s.c.stillCrossing(rank) }

func (s roles) SendBytes(n *memberlist.Node, b []byte, reliable bool) error {
	return s.c.sendBytes(n, b, reliable)
}

func (s roles) Status(ctx context.Context, ranks []int) map[int]leader.Status {
	return s.c.status(ctx, ranks)
}

func (s roles) ExpectRanks(buf int) (chan *pb.Envelope, uint64) {
	return s.c.expect(buf, s.c.fromRanks())
}

// Began is when Run started.
func (s roles) Began() time.Time {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.began
}

func (s roles) Post(to string, env *pb.Envelope, reliable bool) {
	s.c.post(to, "", env, reliable)
}
func (s roles) Refuse(env *pb.Envelope, why string) { s.c.refuse(env, why) }
func (s roles) CommandAllowed(env *pb.Envelope) (pb.AckCode, string) {
	return s.c.commandAllowed(env)
}
func (s roles) OutIdle() bool { return s.c.out.idle() }

func (s roles) Request(ctx context.Context, to string, env *pb.Envelope, reliable bool) (*pb.Envelope, error) {
	return s.c.request(ctx, to, env, reliable)
}

func (s roles) LeaderName() string {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.leaderName
}

func (s roles) Seen() uint64 {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.lastWindow
}

// SawWindow raises the newest window id this member knows of; it reports
// whether id was newer.
func (s roles) SawWindow(id uint64) bool {
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
