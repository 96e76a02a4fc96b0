package leader

import (
	"context"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/runlog"
)

// Member is what the leader asks of the member it runs in: the cluster as that
// member sees it, its messages, and the terms it believes. The coordinator's
// member implements it; every method is safe to call from any goroutine and
// takes the member's own lock only inside itself.
type Member interface {
	// Name is the member's name; Rank its rank.
	Name() string
	Rank() int32
	// Term is the newest term the member believes the run's log holds;
	// Believe raises it (false when t is older); BelieveTerm reads the log's.
	Term() uint64
	Believe(t uint64) bool
	BelieveTerm(ctx context.Context, rl *runlog.Log)
	// UpdateMeta gossips the member's metadata (the term and newest window) if it changed.
	UpdateMeta()
	// SawWindow tells the member of a window id the log gave out (reporting
	// whether it was newer than any the member had seen).
	SawWindow(id uint64) bool
	// Began is when the member started (agents of one job join within JoinGrace of each other).
	Began() time.Time
	// GoneAt is when the named member left (now while it is a member);
	// LastHeard when it was last heard from.
	GoneAt(name string, now time.Time) time.Time
	LastHeard(name string, now time.Time) time.Time
	// AbsentRanks are the ranks not members now: gone (seen once) and never seen.
	AbsentRanks() (gone, never []int)
	// RankNodes are the live ranks' nodes; RankAgents their agents' ids; Node
	// the named member's node (nil when it is not a member).
	RankNodes() map[int]*memberlist.Node
	RankAgents() map[int]string
	Node(name string) *memberlist.Node
	// IsRankMember reports whether env's sender is the rank member it says it is.
	IsRankMember(env *pb.Envelope) bool
	// Status asks ranks for their status, within the status timeout.
	Status(ctx context.Context, ranks []int) map[int]Status
	// Envelope is a new message of this member about window.
	Envelope(window uint64) *pb.Envelope
	// ExpectRanks registers for the ranks' replies carrying the returned seq
	// (up to buf queued); Forget ends it.
	ExpectRanks(buf int) (chan *pb.Envelope, uint64)
	Forget(seq uint64)
	// HandleLocal handles a command addressed to this member's own rank.
	HandleLocal(env *pb.Envelope)
	// SendBytes sends an encoded envelope to n; Reply answers req; Gossip
	// broadcasts env to every member.
	SendBytes(n *memberlist.Node, b []byte, reliable bool) error
	Reply(req, env *pb.Envelope, reliable bool)
	Gossip(env *pb.Envelope)
	// Spawn runs f on a goroutine the member waits for at Shutdown (false once stopped).
	Spawn(f func()) bool
	// StillCrossing says what rank's latest figures still cross ("" once they do not).
	StillCrossing(rank int) string
}

// Status is a rank's answer to a status request.
type Status struct {
	St   *pb.Status
	RTT  time.Duration
	When time.Time // when the answer arrived
}
