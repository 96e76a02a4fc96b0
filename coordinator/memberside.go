package coordinator

import (
	"context"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/memsnap/memsnap/coordinator/leader"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/runlog"
)

// memberSide is what the leader (coordinator/leader) asks of this member: the
// cluster as it sees it, its messages and the terms it believes. Each method
// takes c.mu only inside itself, so the leader holds no lock of the member's.
type memberSide struct{ c *Coordinator }

var _ leader.Member = memberSide{}

func (s memberSide) Name() string                                    { return s.c.name }
func (s memberSide) Rank() int32                                     { return s.c.rank() }
func (s memberSide) Term() uint64                                    { return s.c.Term() }
func (s memberSide) Believe(t uint64) bool                           { return s.c.believe(t) }
func (s memberSide) BelieveTerm(ctx context.Context, rl *runlog.Log) { s.c.believeTerm(ctx, rl) }
func (s memberSide) UpdateMeta()                                     { s.c.updateMeta() }
func (s memberSide) GoneAt(name string, now time.Time) time.Time     { return s.c.goneAt(name, now) }
func (s memberSide) LastHeard(name string, now time.Time) time.Time  { return s.c.lastHeard(name, now) }
func (s memberSide) AbsentRanks() (gone, never []int)                { return s.c.absentRanks() }
func (s memberSide) RankNodes() map[int]*memberlist.Node             { return s.c.rankNodes() }
func (s memberSide) RankAgents() map[int]string                      { return s.c.rankAgents() }
func (s memberSide) Node(name string) *memberlist.Node               { return s.c.node(name) }
func (s memberSide) IsRankMember(env *pb.Envelope) bool              { return s.c.isRankMember(env) }
func (s memberSide) Envelope(window uint64) *pb.Envelope             { return s.c.envelope(window) }
func (s memberSide) Forget(seq uint64)                               { s.c.forget(seq) }
func (s memberSide) HandleLocal(env *pb.Envelope)                    { s.c.handleLocal(env) }
func (s memberSide) Reply(req, env *pb.Envelope, reliable bool)      { s.c.reply(req, env, reliable) }
func (s memberSide) Gossip(env *pb.Envelope)                         { s.c.gossip(env) }
func (s memberSide) Spawn(f func()) bool                             { return s.c.spawn(f) }
func (s memberSide) StillCrossing(rank int) string                   { return s.c.stillCrossing(rank) }

func (s memberSide) SendBytes(n *memberlist.Node, b []byte, reliable bool) error {
	return s.c.sendBytes(n, b, reliable)
}

func (s memberSide) Status(ctx context.Context, ranks []int) map[int]leader.Status {
	return s.c.status(ctx, ranks)
}

func (s memberSide) ExpectRanks(buf int) (chan *pb.Envelope, uint64) {
	return s.c.expect(buf, s.c.fromRanks())
}

// SawWindow raises the newest window id this member knows of.
func (s memberSide) SawWindow(id uint64) { clusterSide(s).SawWindow(id) }

// Began is when Run started.
func (s memberSide) Began() time.Time {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.began
}
