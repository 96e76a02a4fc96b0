package rankside

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/rankagent"
)

// Recorder is what the rank side needs of the rank's agent (rankagent.Agent).
type Recorder interface {
	Arm(w rankagent.Window) error
	Cancel(id uint64, reason string) error
	Progress() (batch int64, step time.Duration)
	Current() (rankagent.Window, rankagent.WindowState, bool)
	SetClockOffset(offset, rtt time.Duration)
	// Dump asks the trainer for a snapshot now, under window id (a post-mortem).
	Dump(id uint64) error
}

// Cluster is what the rank side asks of the member it runs in: its messages,
// who leads, and the window ids and terms the member has seen. Every method is
// safe from any goroutine and takes the member's lock only inside itself.
type Cluster interface {
	Name() string
	// LeaderName is the member this one sees as leader ("" when none).
	LeaderName() string
	// Term is the newest term the member believes; Seen the newest window id
	// it has seen; SawWindow raises that and reports whether id was newer.
	Term() uint64
	Seen() uint64
	SawWindow(id uint64) bool
	// UpdateMeta gossips the member's metadata if it changed.
	UpdateMeta()
	Envelope(window uint64) *pb.Envelope
	Reply(req, env *pb.Envelope, reliable bool)
	// Post sends env to the member named to, off the caller's goroutine.
	Post(to string, env *pb.Envelope, reliable bool)
	// Request sends env to the member named to and waits for its reply.
	Request(ctx context.Context, to string, env *pb.Envelope, reliable bool) (*pb.Envelope, error)
	// Refuse logs (rate-limited) a message this member will not act on;
	// CommandAllowed says whether a command comes from the leader, under a
	// term and window id this member can take.
	Refuse(env *pb.Envelope, why string)
	CommandAllowed(env *pb.Envelope) (pb.AckCode, string)
	// HandleLocal handles env as if it had arrived from the cluster.
	HandleLocal(env *pb.Envelope)
	// Spawn runs f on a goroutine the member waits for at Shutdown (false once stopped).
	Spawn(f func()) bool
	// OutIdle reports whether every message posted has gone out.
	OutIdle() bool
}

// Rank is a rank's side of the cluster: it takes the leader's commands (plans,
// cancels, dumps) to the rank's agent, tells the leader every step of its
// windows and the snapshots it stored, asks for a post-mortem when its trainer
// fails, writes its reports into the run's log when the agent does not, and
// measures its clock against the leader's.
//
// Its state (the rank's latest window and post-mortem, its incident, the
// windows it looked up in the log, its clock offset) is its own, under its own
// lock: no other role reads or writes it. Where its windows stand is one
// machine, window.RankSide, stepped by the commands it takes and its agent's
// events, never set field by field here; the agent's own window in progress is
// the source of those events, and it too is one machine (rankagent/machine.go).
type Rank struct {
	cfg *config.Config
	rec Recorder // nil for a client: it takes no command
	log *slog.Logger
	cl  Cluster
	rep *reporter

	mu      sync.Mutex
	side    window.RankSide // the rank's latest window and post-mortem: its own machine
	inc     *incident       // this rank's trainer's latest OOM or crash
	inLog   uint64          // the newest window id this rank looked up and found in the run's log
	looking map[uint64]bool // windows being looked up (checkNewest)
	offset  clockState
}

type clockState struct {
	offset, rtt time.Duration
	ok          bool
	at          time.Time
}

// New prepares the rank side of a member; rec is nil for a client.
func New(cfg *config.Config, rec Recorder, cl Cluster, log *slog.Logger) *Rank {
	c := &Rank{cfg: cfg, rec: rec, cl: cl, log: log}
	c.rep = newReporter(c)
	return c
}

// RunReporter writes the rank's reports into the run's log until ctx ends.
func (c *Rank) RunReporter(ctx context.Context) { c.rep.run(ctx) }

// ClockOffset is this host's clock minus the leader's and the round trip it was
// measured over, once measured.
func (c *Rank) ClockOffset() (offset, rtt time.Duration, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.offset.offset, c.offset.rtt, c.offset.ok
}

// LastPostmortem is the id of the latest post-mortem this rank took part in.
func (c *Rank) LastPostmortem() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.side.Postmortem.ID
}

func (c *Rank) rank() int32 {
	if c.cfg.Client {
		return -1
	}
	return int32(c.cfg.Identity.Rank)
}
