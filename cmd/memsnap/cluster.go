package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/rankagent"
)

func init() {
	register(&command{
		name:    "snapshot",
		summary: "ask a running cluster for a window now; show every rank's progress; print where the merged outputs are",
		usage:   "[--join ADDR] [--run NAME] [--batches N] [--wait] [--json]",
		run:     runSnapshot,
	})
	register(&command{
		name:    "keygen",
		summary: "print a new gossip key (give the same one to every agent and to memsnap snapshot)",
		usage:   "",
		run:     runKeygen,
	})
}

// memberFlags are the flags of every member of a cluster.
type memberFlags struct {
	join, bind, advertise string
	port                  int
	key, keyFile          string
	insecure              bool
}

func (f *memberFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.join, "join", "", "members to join, host[:port],... (default: $MEMSNAP_JOIN, torchrun's MASTER_ADDR, SLURM's first node, Open MPI's head node)")
	fs.StringVar(&f.bind, "bind", "", "the address gossip listens on (default 0.0.0.0, or 127.0.0.1 when every member to join is on loopback)")
	fs.StringVar(&f.advertise, "advertise", "", "the address other members reach this one at (default: the first private address)")
	fs.IntVar(&f.port, "gossip-port", -1, fmt.Sprintf("the gossip port (default %d + the local rank; 0 picks a free one)", coordinator.DefaultGossipPort))
	fs.StringVar(&f.key, "key", "", "the gossip key, base64 (default: --key-file, or $"+coordinator.KeyEnv+"; make one with memsnap keygen)")
	fs.StringVar(&f.keyFile, "key-file", "", "a file holding the gossip key (mode 600)")
	fs.BoolVar(&f.insecure, "insecure", false, "run without a gossip key: no encryption, anyone who reaches the port can join")
}

// apply fills a coordinator configuration from the flags.
func (f *memberFlags) apply(cfg *coordinator.Config, localWorld int) error {
	key, err := coordinator.LoadKey(f.key, f.keyFile, nil)
	if err != nil {
		return err
	}
	cfg.SecretKey, cfg.Insecure = key, f.insecure
	base := coordinator.DefaultGossipPort
	if f.join != "" {
		if cfg.Join, err = coordinator.ParseJoin(f.join, base); err != nil {
			return err
		}
	} else if cfg.Join, _, err = coordinator.JoinAddrs(nil, base, localWorld); err != nil {
		return err
	}
	if f.port >= 0 {
		cfg.Memberlist.BindPort, cfg.Memberlist.AdvertisePort = f.port, f.port
	}
	switch {
	case f.bind != "":
		cfg.Memberlist.BindAddr = f.bind
	case len(cfg.Join) > 0 && allLoopback(cfg.Join):
		cfg.Memberlist.BindAddr = "127.0.0.1"
	}
	if f.advertise != "" {
		cfg.Memberlist.AdvertiseAddr = f.advertise
	} else if cfg.Memberlist.BindAddr != "0.0.0.0" && cfg.Memberlist.BindAddr != "" {
		cfg.Memberlist.AdvertiseAddr = cfg.Memberlist.BindAddr
	}
	return nil
}

func allLoopback(addrs []string) bool {
	for _, a := range addrs {
		h, _, err := net.SplitHostPort(a)
		if err != nil {
			return false
		}
		if h == "localhost" {
			continue
		}
		ip := net.ParseIP(h)
		if ip == nil || !ip.IsLoopback() {
			return false
		}
	}
	return true
}

// leaderFlags are the flags of what a rank does when it leads.
type leaderFlags struct {
	skip, interval, every int64
	noSchedule            bool
	noPostmortem          bool
	mergedName            string
	collect               time.Duration
}

func (f *leaderFlags) register(fs *flag.FlagSet) {
	d := coordinator.DefaultConfig(rankagent.Identity{})
	fs.Int64Var(&f.skip, "skip-batches", d.Schedule.Skip, "the scheduled window starts at this batch (Composer's skip_batches)")
	fs.Int64Var(&f.interval, "interval", d.WindowBatches, "batches in a window (Composer's interval)")
	fs.Int64Var(&f.every, "every", 0, "record a window every N batches (0: once, as Composer does)")
	fs.BoolVar(&f.noSchedule, "no-schedule", false, "record only on demand (memsnap snapshot) and on OOM")
	fs.BoolVar(&f.noPostmortem, "no-postmortem", false, "when a rank hits an OOM, do not ask every rank for a snapshot")
	fs.StringVar(&f.mergedName, "merged-name", d.MergedName, "name template of a window's merged outputs (run_name, window, batch, world_size)")
	fs.DurationVar(&f.collect, "collect-timeout", d.CollectTimeout, "a rank silent this long after its window should have ended is merged as missing")
}

func (f *leaderFlags) apply(cfg *coordinator.Config) {
	cfg.Schedule = coordinator.Schedule{Enabled: !f.noSchedule, Skip: f.skip, Every: f.every}
	cfg.OnOOM = !f.noPostmortem
	cfg.WindowBatches, cfg.MergedName, cfg.CollectTimeout = f.interval, f.mergedName, f.collect
}

func runKeygen(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["keygen"], stderr)
	if _, err := parse(fs, args); err != nil {
		return err
	}
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return err
	}
	fmt.Fprintln(stdout, base64.StdEncoding.EncodeToString(k))
	return nil
}

func runSnapshot(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["snapshot"], stderr)
	var mf memberFlags
	mf.register(fs)
	fs.StringVar(&mf.join, "agent", "", "an agent's gossip address (same as --join)")
	run := fs.String("run", "", "the run's name (default: $MEMSNAP_RUN_NAME or the launcher's job id)")
	batches := fs.Int64("batches", 0, "batches in the window (default: the leader's --interval)")
	wait := fs.Bool("wait", false, "wait until the window is merged and published (default: return once it is planned)")
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up after this long")
	verbose := fs.Bool("v", false, "log gossip")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	name := *run
	if name == "" {
		if id, found, _ := rankagent.IdentityFromEnv(nil); found && id.RunName != "" {
			name = id.RunName
		} else {
			name = os.Getenv("MEMSNAP_RUN_NAME")
		}
	}
	if name == "" {
		return errors.New("no run name: pass --run (the agents' --run-name)")
	}
	level := slog.LevelError
	if *verbose {
		level = slog.LevelDebug
	}
	cfg := coordinator.DefaultConfig(rankagent.Identity{RunName: name})
	cfg.Client = true
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg.Memberlist.BindPort, cfg.Memberlist.AdvertisePort = 0, 0
	if err := mf.apply(&cfg, 1); err != nil {
		return err
	}
	if len(cfg.Join) == 0 {
		return errors.New("no agent to ask: pass --join host[:port] (an agent's gossip address)")
	}
	c, err := coordinator.New(cfg, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	runDone := make(chan error, 1)
	go func() { runDone <- c.Run(ctx) }()
	defer func() { cancel(); <-runDone }()
	if _, err := waitFor(ctx, 30*time.Second, func() bool { _, ok := c.Leader(); return ok }); err != nil {
		return fmt.Errorf("no leader answered through %v: %w (is the run name right, and the key the agents use?)", cfg.Join, err)
	}
	p := newProgressPrinter(stderr, *asJSON)
	planned := make(chan struct{})
	var once sync.Once
	res, err := c.Snapshot(ctx, *batches, func(u coordinator.Update) {
		p.update(u)
		if u.State == "planned" && !*wait {
			once.Do(func() { close(planned) })
		}
	}, planned)
	if err != nil && !errors.Is(err, coordinator.ErrDetached) {
		return err
	}
	if res == nil { // planned, not waited for
		fmt.Fprintf(stdout, "window %d planned: %s (memsnap ls shows it once published)\n", p.window, p.batches)
		return nil
	}
	p.done()
	if *asJSON {
		return json.NewEncoder(stdout).Encode(resultJSON(res, p.window))
	}
	if res.State != "published" {
		return fmt.Errorf("window %d failed: %s", p.window, res.Error)
	}
	fmt.Fprintf(stdout, "window %d (batches %d-%d) published: %d ranks merged", p.window, res.Start, res.Stop-1, len(res.Ranks))
	if len(res.Missing) > 0 {
		fmt.Fprintf(stdout, ", %d missing", len(res.Missing))
	}
	fmt.Fprintln(stdout)
	for _, r := range sortedMissing(res.Missing) {
		fmt.Fprintf(stdout, "  rank %d missing: %s\n", r, res.Missing[int32(r)])
	}
	fmt.Fprintf(stdout, "manifest: %s\n", res.Manifest)
	for _, o := range res.Outputs {
		fmt.Fprintf(stdout, "  %s\n", o)
	}
	return nil
}

func sortedMissing(m map[int32]string) []int {
	out := make([]int, 0, len(m))
	for r := range m {
		out = append(out, int(r))
	}
	sort.Ints(out)
	return out
}

func resultJSON(r *pb.WindowResult, window uint64) any {
	missing := map[string]string{}
	for k, v := range r.Missing {
		missing[fmt.Sprint(k)] = v
	}
	ranks := r.Ranks
	if ranks == nil {
		ranks = []int32{}
	}
	return struct {
		Window   uint64            `json:"window"`
		State    string            `json:"state"`
		Start    int64             `json:"start"`
		Stop     int64             `json:"stop"`
		Manifest string            `json:"manifest,omitempty"`
		Outputs  []string          `json:"outputs"`
		Ranks    []int32           `json:"ranks"`
		Missing  map[string]string `json:"missing"`
		Error    string            `json:"error,omitempty"`
	}{window, r.State, r.Start, r.Stop, r.Manifest, r.Outputs, ranks, missing, r.Error}
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-t.C:
		}
	}
	return true, nil
}

// progressPrinter shows a window's progress: a line per rank and step for small
// jobs, a count per step (at most once a second) for large ones.
type progressPrinter struct {
	w       io.Writer
	quiet   bool
	mu      sync.Mutex
	window  uint64
	batches string
	states  map[int]string
	last    time.Time
}

func newProgressPrinter(w io.Writer, quiet bool) *progressPrinter {
	return &progressPrinter{w: w, quiet: quiet, states: map[int]string{}}
}

func (p *progressPrinter) update(u coordinator.Update) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if u.Window != 0 {
		p.window = u.Window
	}
	if u.Rank < 0 {
		if u.State == "planned" {
			p.batches = u.Reason
		}
		if !p.quiet {
			fmt.Fprintf(p.w, "window %d %s %s\n", p.window, u.State, u.Reason)
		}
		return
	}
	// progress travels as datagrams: show a rank's steps only forwards, once each
	if stepOrder[u.State] <= stepOrder[p.states[u.Rank]] && stepOrder[u.State] < stepOrder["uploaded"] {
		return
	}
	p.states[u.Rank] = u.State
	if p.quiet || u.State == "queued" || u.State == "sent" {
		return
	}
	if len(p.states) <= 16 {
		line := fmt.Sprintf("  rank %-3d %-10s", u.Rank, u.State)
		if u.Batch >= 0 {
			line += fmt.Sprintf(" batch %d", u.Batch)
		}
		if u.Reason != "" {
			line += "  " + u.Reason
		}
		fmt.Fprintln(p.w, line)
		return
	}
	if time.Since(p.last) >= time.Second {
		p.summary()
	}
}

// stepOrder orders a rank's steps in a window; the ends of a window share the last place.
var stepOrder = map[string]int{"": 0, "queued": 1, "sent": 2, "acked": 3, "armed": 4, "recording": 5, "spooled": 6, "partial": 6,
	"uploaded": 7, "missed": 7, "passed": 7, "failed": 7, "cancelled": 7, "refused": 7, "missing": 7}

func (p *progressPrinter) summary() {
	counts := map[string]int{}
	for _, s := range p.states {
		counts[s]++
	}
	names := make([]string, 0, len(counts))
	for s := range counts {
		names = append(names, s)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, s := range names {
		parts = append(parts, fmt.Sprintf("%s %d", s, counts[s]))
	}
	fmt.Fprintf(p.w, "window %d: %s\n", p.window, strings.Join(parts, ", "))
	p.last = time.Now()
}

func (p *progressPrinter) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.quiet && len(p.states) > 16 {
		p.summary()
	}
}
