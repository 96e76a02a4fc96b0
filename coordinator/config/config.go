// Package config is a member's configuration (Config) and its presets: what
// the member, its leader and its rank side read, owned by none of them. The
// coordinator package re-exports it (coordinator.Config).
package config

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/memsnap/memsnap/coordinator/view"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/naming"
	"github.com/memsnap/memsnap/rankagent"
)

// DefaultGossipPort is the gossip port of local rank 0; local rank L uses
// DefaultGossipPort+L, so the agents of one host never collide.
const DefaultGossipPort = 7946

// DefaultSuspicionMult is memberlist's suspicion multiplier in DefaultConfig.
const DefaultSuspicionMult = 2

// MaxSuspicion is the longest production's failure detection waits, once a
// member has failed its probes, before declaring it dead (DefaultConfig).
const MaxSuspicion = 4 * time.Second

// ProbeTimers returns the probe interval and timeout for a cluster of n ranks:
// the LAN preset's (interval, timeout) while memberlist's suspicion timeout,
// DefaultSuspicionMult·log10(n) intervals, stays within MaxSuspicion; above
// that (more than 100 ranks) an interval that keeps it there, with the preset's
// ratio of timeout to interval. Each member probes one other per interval, so
// the probes' cost grows as the interval shrinks: 1.5 times the preset's at
// 1,024 ranks.
func ProbeTimers(n int, interval, timeout time.Duration) (time.Duration, time.Duration) {
	st := SuspicionTimeout(DefaultSuspicionMult, n, interval)
	if st <= MaxSuspicion {
		return interval, timeout
	}
	shorter := time.Duration(float64(interval) * float64(MaxSuspicion) / float64(st)).Truncate(time.Millisecond)
	return shorter, time.Duration(float64(timeout) * float64(shorter) / float64(interval)).Truncate(time.Millisecond)
}

// DefaultMergedName is the default name (a template) of a window's merged
// outputs, before their suffixes: beside Composer's remote folder.
const DefaultMergedName = "{run_name}/torch_memory_traces/window{window}/merged"

// Schedule is when the leader records windows by itself, as Composer's
// MemorySnapshot does: batches [Skip, Skip+Length) once, or every Every batches.
type Schedule struct {
	Enabled bool
	Skip    int64 // the first window's start (Composer's skip_batches)
	Every   int64 // 0: once; else a window starts every Every batches
}

// Config configures one member. DefaultConfig and DefaultLocalConfig fill it;
// validate only checks.
type Config struct {
	// Identity is the rank's place in the job (its run name labels the gossip).
	Identity rankagent.Identity
	// Client makes this member one that is not a rank (the snapshot command): it
	// gossips and can ask for windows, but never leads or records.
	Client bool
	// Memberlist is memberlist's configuration (bind address and port, timers).
	// New sets its Name, Delegate, Events, Ping, Label, SecretKey and Logger.
	Memberlist *memberlist.Config
	// Join lists members to join (host:port). Run retries until one answers, or
	// until JoinTimeout.
	Join []string
	// Resolve resolves a join address's host name into every address it names (a
	// Kubernetes headless service names every pod's): each is joined. Nil:
	// net.LookupIP.
	Resolve func(host string) ([]net.IP, error)
	// JoinTimeout, when above zero, makes Run give up joining after it and return
	// why no member answered (no agent at an address, another key, another run);
	// zero retries until Run's context ends (agents: a rank may start first).
	JoinTimeout time.Duration
	// Readvertise, when set, is asked before each join attempt while this member
	// has joined no one and no one has joined it, for the address to advertise
	// now (ip "" : nothing better yet). It is set when the address was chosen
	// without a join target to go by (the join name did not resolve yet: a
	// Kubernetes pod starts before its headless Service lists it); the first
	// answer is final, and an address other than the one advertised restarts
	// gossip on it (only with memberlist's own network transport).
	Readvertise func() (ip, how string)
	// SecretKey encrypts and authenticates all gossip and messages (16, 24 or 32
	// bytes). A member without it, or of another run, is not admitted.
	SecretKey []byte
	// Insecure allows running without a SecretKey (said loudly in the log).
	Insecure bool
	// WindowBatches is a window's length when none is asked for (Composer's interval).
	WindowBatches int64
	// Schedule is when the leader records windows by itself.
	Schedule Schedule
	// OnOOM makes the leader ask every rank for a snapshot when one hits an OOM.
	OnOOM bool
	// LeadMargin is added to the measured message delay when the leader plans how
	// far ahead a window starts: it covers the plan's fan-out to every rank and
	// the ranks' jitter. A rank the plan reaches too late says so, and the
	// window is planned again with three times the margin, so a margin too short
	// costs a re-plan, not a window (scripts/bench-scale.sh counts re-plans).
	LeadMargin time.Duration
	// StatusTimeout bounds the wait for the ranks' status before a plan.
	StatusTimeout time.Duration
	// FiguresInterval is how often a rank sends its trainer's memory figures to
	// the leader (0: never); the leader's view of the job is that fresh.
	FiguresInterval time.Duration
	// Triggers make the leader plan a window (of kind trigger) as soon as a
	// rank's figures cross one, before an OOM.
	Triggers view.Triggers
	// JoinGrace is how long the leader waits, before planning a window, for ranks
	// that are not members yet; the window goes on without those still absent.
	JoinGrace time.Duration
	// RejoinGrace is how long a leader finishing a window an earlier one left
	// waits for a rank gone from the cluster, counted from when it was last heard
	// from: memberlist takes its shortest suspicion timeout to declare a silent
	// member dead, and an agent restarted under its name takes it back within
	// that time, so the dead leader's own rank, silent for that timeout (4 s
	// on production's timers above 100 ranks) by then, is waited for 1 s more.
	RejoinGrace time.Duration
	// LeaderProbe is how often the leader's successor (the rank member that
	// leads were the leader gone) pings the leader directly, and LeaderSilence
	// how long the leader may answer none of those pings before the successor
	// declares it silent and leads: the ranks elect without a silent leader at
	// once, well before memberlist's failure detection declares it dead (a
	// failed probe, then suspicion: about 5 s). A leader that was only slow is
	// heard from again and leads again; the run's log's terms fence what the
	// successor did meanwhile. Zero LeaderProbe turns the watch off.
	LeaderProbe   time.Duration
	LeaderSilence time.Duration
	// AckTimeout bounds the wait for the ranks' acks of a plan.
	AckTimeout time.Duration
	// CollectTimeout bounds the wait for the ranks' snapshots after the window
	// should have ended; ranks that have not reported by then are merged as missing.
	CollectTimeout time.Duration
	// ClockInterval is how often a rank measures its clock against the leader's
	// (besides right after joining and whenever the leader changes).
	ClockInterval time.Duration
	// PostmortemDeadline bounds how long an OOM or crash post-mortem waits for the
	// ranks' snapshots (a job being torn down is killed soon after it is stopped).
	PostmortemDeadline time.Duration
	// MaxWindowWait bounds how long any window may take from its plan to the last
	// rank's snapshot, however its ranks report progress: past it, the ranks not
	// in are merged as missing. A window's own deadline is shorter when the ranks'
	// step times are known (see windowDeadline).
	MaxWindowWait time.Duration
	// MaxBatchSpread is how far (in batches) a rank's batch may be from the median
	// rank's before the leader leaves it out of a plan as implausible (a trainer
	// reporting batch 10^9 must not make a window no healthy rank reaches).
	MaxBatchSpread int64
	// PublishTimeout bounds how long the leader retries a window's merge and
	// publication through store failures before it tells the members waiting that
	// the window failed for now; the window stays unfinished in the run's log and
	// a later sweep (or leader) publishes it.
	PublishTimeout time.Duration
	// SweepInterval is how often an idle leader looks in the run's log for windows
	// planned but never finished (by an earlier leader, or an earlier launch of
	// the job) and finishes them.
	SweepInterval time.Duration
	// RejoinInterval is the first wait before a rank that sees fewer members than
	// its world size tries its join addresses (and every rank it ever saw) again;
	// it doubles up to 30 s while nothing changes.
	RejoinInterval time.Duration
	// OpenStore opens the store the ranks upload to (and the merged outputs go to).
	OpenStore func(ctx context.Context) (store.Store, error)
	// MergedName is the merged outputs' name template (run_name, window, batch,
	// world_size), before their suffixes.
	MergedName string
	// FullDetailRanks is the largest world whose every rank goes into the merged
	// pickles and timeline; above it they hold only the ranks the diff compares
	// (the summary and the report still show every rank, from the ranks' own
	// analyses, so the leader decodes a few snapshots, not all).
	FullDetailRanks int

	// Now is the wall clock; tests give a member a skewed one.
	Now func() time.Time
	// Logger receives structured logs (memberlist's too); nil discards them.
	Logger *slog.Logger
}

// DefaultConfig is the production preset for a rank (or, with id.Rank < 0, a
// client): memberlist's LAN timers, the rank's own gossip port on every interface.
//
// Two timers differ. The suspicion multiplier is 2, not the LAN preset's 4: a
// member that fails its probes is declared dead after 2·log10(n) probe intervals
// instead of up to 6 times 4·log10(n) while confirmations arrive. And above 100
// ranks (id.WorldSize) the probes come faster than one a second, so that this
// timeout stays at MaxSuspicion (4 s; at 1,024 ranks a probe every 664 ms, 332 ms
// to answer, where 1 s probes would give 6 s): a new leader takes over a window
// within 10 s of the old one's death at any size. A member that is merely slow
// hears that it is suspected and refutes it well within that time; one stalled
// longer is left out of a window (and says why) and refutes its death when it wakes.
func Default(id rankagent.Identity) Config {
	ml := memberlist.DefaultLANConfig()
	ml.SuspicionMult = DefaultSuspicionMult
	ml.ProbeInterval, ml.ProbeTimeout = ProbeTimers(id.WorldSize, ml.ProbeInterval, ml.ProbeTimeout)
	ml.BindPort = DefaultGossipPort + id.LocalRank
	ml.AdvertisePort = ml.BindPort
	ml.DeadNodeReclaimTime = 10 * time.Second // a restarted agent takes its name back
	return Config{
		Identity:        id,
		Memberlist:      ml,
		WindowBatches:   3,
		Schedule:        Schedule{Enabled: true, Skip: 1},
		OnOOM:           true,
		LeadMargin:      300 * time.Millisecond,
		StatusTimeout:   3 * time.Second,
		FiguresInterval: 5 * time.Second,
		JoinGrace:       10 * time.Second,
		RejoinGrace:     5 * time.Second,
		AckTimeout:      10 * time.Second,
		CollectTimeout:  2 * time.Minute,
		LeaderProbe:     200 * time.Millisecond,
		LeaderSilence:   time.Second,
		ClockInterval:   30 * time.Second,
		MergedName:      DefaultMergedName,
		FullDetailRanks: 64,
		Now:             time.Now,

		PostmortemDeadline: 10 * time.Second,
		MaxWindowWait:      30 * time.Minute,
		MaxBatchSpread:     1000,
		PublishTimeout:     10 * time.Minute,
		SweepInterval:      time.Minute,
		RejoinInterval:     2 * time.Second,
	}
}

// DefaultLocalConfig is the preset for a cluster on one machine (tests, the
// demo): loopback, a port the system picks, fast timers.
func DefaultLocal(id rankagent.Identity) Config {
	c := Default(id)
	ml := memberlist.DefaultLocalConfig()
	ml.BindAddr = "127.0.0.1"
	ml.BindPort = 0
	ml.AdvertisePort = 0
	ml.DeadNodeReclaimTime = time.Second
	// fast enough for tests to see a member die in seconds, slow enough that a
	// loaded machine does not declare a live one dead
	ml.ProbeInterval = 500 * time.Millisecond
	ml.ProbeTimeout = 400 * time.Millisecond
	ml.GossipInterval = 20 * time.Millisecond
	ml.PushPullInterval = 2 * time.Second
	ml.SuspicionMult = 3
	c.Memberlist = ml
	c.Schedule.Enabled = false
	c.LeadMargin = 200 * time.Millisecond
	c.StatusTimeout = 2 * time.Second
	c.FiguresInterval = time.Second
	c.JoinGrace = 5 * time.Second
	c.AckTimeout = 5 * time.Second
	c.CollectTimeout = 30 * time.Second
	c.ClockInterval = 2 * time.Second
	c.PostmortemDeadline = 5 * time.Second
	c.LeaderSilence = 1500 * time.Millisecond // (a loaded test machine stalls a process for a second)
	c.MaxWindowWait = 2 * time.Minute
	c.PublishTimeout = time.Minute
	c.SweepInterval = 2 * time.Second
	c.RejoinInterval = 200 * time.Millisecond
	return c
}

// Validate checks the configuration (and gives a nil Logger one that discards).
func (c *Config) Validate() error {
	if !c.Client {
		if err := c.Identity.Check(); err != nil {
			return err
		}
	}
	if err := naming.CheckRunName(c.Identity.RunName); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	switch {
	case c.Memberlist == nil:
		return errors.New("coordinator: no memberlist configuration")
	case len(c.SecretKey) == 0 && !c.Insecure:
		return errors.New("coordinator: no gossip key: give one (--key, --key-file or MEMSNAP_KEY; `memsnap keygen` makes one) or run with --insecure")
	case len(c.SecretKey) != 0 && len(c.SecretKey) != 16 && len(c.SecretKey) != 24 && len(c.SecretKey) != 32:
		return fmt.Errorf("coordinator: gossip key of %d bytes (16, 24 or 32)", len(c.SecretKey))
	case c.WindowBatches <= 0:
		return fmt.Errorf("coordinator: window of %d batches", c.WindowBatches)
	case c.Schedule.Skip < 0 || c.Schedule.Every < 0:
		return fmt.Errorf("coordinator: schedule %+v", c.Schedule)
	case c.Schedule.Every > 0 && c.Schedule.Every < c.WindowBatches:
		return fmt.Errorf("coordinator: a window every %d batches is shorter than the window (%d)", c.Schedule.Every, c.WindowBatches)
	case c.LeadMargin < 0 || c.StatusTimeout <= 0 || c.JoinGrace < 0 || c.RejoinGrace < 0 || c.AckTimeout <= 0 || c.CollectTimeout <= 0 || c.ClockInterval <= 0 ||
		c.PostmortemDeadline <= 0 || c.MaxWindowWait <= 0 || c.PublishTimeout <= 0 || c.SweepInterval <= 0 || c.RejoinInterval <= 0:
		return errors.New("coordinator: timeouts must be positive")
	case c.LeaderProbe < 0 || c.LeaderProbe > 0 && c.LeaderSilence < 2*c.LeaderProbe:
		return fmt.Errorf("coordinator: a leader silence of %v, pinged every %v (at least two pings)", c.LeaderSilence, c.LeaderProbe)
	case c.MaxBatchSpread <= 0:
		return fmt.Errorf("coordinator: batch spread %d", c.MaxBatchSpread)
	case c.WindowBatches > MaxWindowBatches:
		return fmt.Errorf("coordinator: window of %d batches (at most %d)", c.WindowBatches, MaxWindowBatches)
	case !c.Client && c.OpenStore == nil:
		return errors.New("coordinator: no store")
	case c.Now == nil:
		return errors.New("coordinator: no clock")
	}
	if len(c.Identity.RunName) > MaxRunName {
		return fmt.Errorf("coordinator: run name of %d bytes (at most %d: it goes into every member's gossip metadata)", len(c.Identity.RunName), MaxRunName)
	}
	if err := publish.CheckWindowName(c.MergedName); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// MaxWindowBatches is the longest window a member may ask for.
const MaxWindowBatches = 1 << 20

// MaxRunName keeps a member's metadata inside memberlist's 512 bytes.
const MaxRunName = 160

// SuspicionTimeout is memberlist's shortest suspicion timeout for a cluster of n
// (its suspicionTimeout: the multiplier times log10 of the size, at least 1,
// probe intervals).
func SuspicionTimeout(mult, n int, interval time.Duration) time.Duration {
	scale := math.Max(1, math.Log10(math.Max(1, float64(n))))
	return time.Duration(mult) * time.Duration(scale*1000) * interval / 1000
}

// IncidentHold is how long a rank keeps its incident (an OOM or crash) for a
// post-mortem to take, and how long the leader waits before an incident no
// post-mortem took is an orphan of its own.
func (c *Config) IncidentHold() time.Duration { return c.PostmortemDeadline + 5*time.Second }

// NodeName is a rank's member name: its run and rank.
func NodeName(run string, rank int) string { return run + "/rank" + strconv.Itoa(rank) }
