package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/internal/gpu"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/syncio"
	"github.com/memsnap/memsnap/metrics"
	"github.com/memsnap/memsnap/naming"
	"github.com/memsnap/memsnap/rankagent"
)

func init() {
	register(&command{
		name:    "agent",
		summary: "run a rank agent beside one training process (optionally launching it: memsnap agent [flags] -- python train.py)",
		usage:   "[flags] [-- COMMAND ARGS...]",
		exits:   "with a COMMAND, the trainer's when it failed (128+N when signal N ended it); else 1 when a window was missed or a snapshot was not uploaded, or at start-up when the store, a name template or the run name can never work (the last line says why); 0 otherwise; 2 a usage error",
		run:     runAgent,
	})
	register(&command{
		name:    "replay",
		summary: "a replay trainer: speak the hook's protocol from a recorded snapshot (tests and demos without a GPU)",
		usage:   "--socket PATH --snapshot FILE [--batches N] [--pace D] [--hold-at B]",
		run:     runReplay,
	})
}

func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f agentFlags
	cmdArgs, err := f.parse(commands["agent"], args, stderr)
	if err != nil {
		return err
	}
	// the logger and the trainer's output share stderr (and stdout): serialise writes
	stderr, stdout = &syncio.Writer{W: stderr}, &syncio.Writer{W: stdout}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	cfg, err := f.agentConfig(ctx, log)
	if err != nil {
		return err
	}
	prov, gerr := gpu.OpenNVML(nil)
	if gerr != nil {
		if f.requireGPU {
			return fmt.Errorf("--require-gpu: %w", gerr)
		}
		log.Info("no GPU information: the agent runs on without NVML", "reason", gerr)
	}
	defer prov.Close()
	cfg.GPU = prov
	a, member, err := f.newAgent(cfg, log)
	if err != nil {
		return err
	}
	stopMetrics, err := serveMetrics(ctx, f.metricsAddr, f.apiToken, f.apiRate, cfg.Identity, a, member, f.lf, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	return runAgentWith(ctx, a, member, cmdArgs, f.drain, cfg.Spool, stdout, stderr, log)
}

// agentFlags are memsnap agent's flags.
type agentFlags struct {
	fs                                                                *flag.FlagSet
	storeURL, runName, folder, spool, filename, remote                string
	rank, localRank, nodeRank, world, localWorld, maxEntries, apiRate int
	overwrite, standalone, requireGPU, recordAlways                   bool
	socket, window, stacks, metricsAddr, apiToken                     string
	figuresEvery, drain                                               time.Duration
	mf                                                                memberFlags
	lf                                                                leaderFlags
	sf                                                                storeFlags
}

// parse reads args into f: the flags up to "--", and what follows it (the
// trainer's command), which it returns.
func (f *agentFlags) parse(c *command, args []string, stderr io.Writer) ([]string, error) {
	fs := newFlags(c, stderr)
	f.fs = fs
	fs.StringVar(&f.storeURL, "store", "memsnap-store", "where snapshots go: s3://bucket/prefix or a folder")
	fs.StringVar(&f.runName, "run-name", "", "the run's name (default: $MEMSNAP_RUN_NAME, the launcher's job id, or \"memsnap\")")
	fs.IntVar(&f.rank, "rank", -1, "this rank (default: from torchrun, SLURM or Open MPI's environment)")
	fs.IntVar(&f.localRank, "local-rank", -1, "this rank on its node")
	fs.IntVar(&f.nodeRank, "node-rank", -1, "this node's rank")
	fs.IntVar(&f.world, "world-size", -1, "ranks in the job")
	fs.IntVar(&f.localWorld, "local-world-size", -1, "ranks on this node")
	fs.StringVar(&f.folder, "folder", naming.DefaultFolder, "local folder template (Composer's folder); the spool is <folder>/.memsnap-spool-rank<rank>")
	fs.StringVar(&f.spool, "spool", "", "the spool folder (overrides --folder)")
	fs.StringVar(&f.filename, "filename", naming.DefaultFilename, "snapshot name template, without .pickle (Composer's filename)")
	fs.StringVar(&f.remote, "remote-file-name", naming.DefaultRemoteFileName, "folder template of uploaded snapshots (Composer's remote_file_name)")
	fs.BoolVar(&f.overwrite, "overwrite", false, "replace snapshots that exist in the store")
	fs.StringVar(&f.socket, "socket", "", "the trainer socket (default: per run and local rank, owner-only)")
	fs.StringVar(&f.window, "window", "", "START:STOP: record batches [START, STOP) (standalone agents; a cluster's leader plans windows)")
	fs.BoolVar(&f.standalone, "standalone", false, "no cluster: record only --window (the default for a single rank with nothing to join)")
	f.mf.register(fs)
	f.lf.register(fs)
	fs.BoolVar(&f.requireGPU, "require-gpu", false, "fail the window when the trainer's GPU cannot be read through NVML")
	fs.IntVar(&f.maxEntries, "max-entries", 100000, "allocator history entries torch keeps")
	fs.StringVar(&f.stacks, "stacks", "python", "stacks torch records: python or all")
	fs.BoolVar(&f.recordAlways, "record-always", false, "keep allocator history on from the first batch (bounded by --max-entries), so an OOM post-mortem, and a trigger window at once, show how every rank got there")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at [HOST]:PORT/metrics, PORT plus the local rank (no HOST: loopback only; 0.0.0.0:PORT for every interface)")
	fs.DurationVar(&f.figuresEvery, "figures-every", coordinator.DefaultConfig(rankagent.Identity{}).FiguresInterval, "how often this rank sends its trainer's memory figures to the leader (memsnap top, triggers, the leader's metrics)")
	fs.StringVar(&f.apiToken, "api-token-file", "", "with --metrics-addr: also take POST /api/v1/window and Alertmanager's webhook at /api/v1/alertmanager, with this file's bearer token")
	fs.IntVar(&f.apiRate, "api-windows-per-minute", metrics.DefaultWindowsPerMinute, "with --api-token-file: the most windows this agent's API asks for a minute, whatever their reasons (more are refused with 429)")
	fs.DurationVar(&f.drain, "drain-timeout", 2*time.Minute, "with a COMMAND: how long to wait for uploads after it exits (a second Ctrl-C stops the wait)")
	f.sf.register(fs)
	// flags stop at "--"; what follows is the trainer's command
	var cmdArgs []string
	for i, a := range args {
		if a == "--" {
			args, cmdArgs = args[:i], args[i+1:]
			break
		}
	}
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (put the trainer's command after --)", fs.Arg(0))
	}
	return cmdArgs, nil
}

// agentConfig is the agent's configuration from the flags and the launcher's
// environment, its store checked as far as it can be now.
func (f *agentFlags) agentConfig(ctx context.Context, log *slog.Logger) (rankagent.Config, error) {
	id, err := rankagent.ResolveIdentity(ctx, nil, rankagent.Overrides{RunName: f.runName, Rank: f.rank, LocalRank: f.localRank,
		NodeRank: f.nodeRank, WorldSize: f.world, LocalWorld: f.localWorld})
	if err != nil {
		return rankagent.Config{}, err
	}
	cfg := rankagent.DefaultConfig(id)
	cfg.Filename, cfg.RemoteFileName, cfg.Overwrite = f.filename, f.remote, f.overwrite
	cfg.Socket, cfg.RequireGPU, cfg.MaxEntries, cfg.Stacks, cfg.RecordAlways = f.socket, f.requireGPU, f.maxEntries, f.stacks, f.recordAlways
	cfg.Logger = log
	cfg.Spool = f.spool
	if cfg.Spool == "" {
		if cfg.Spool, err = rankagent.DefaultSpool(f.folder, id); err != nil {
			return rankagent.Config{}, err
		}
	}
	scfg := f.sf.config(f.storeURL, true)
	cfg.OpenStore = func(ctx context.Context) (store.Store, error) { return store.Open(ctx, scfg) }
	// what can be checked now is checked now: a bad URL or refused credentials stop
	// the agent at once; a store that does not answer yet only warns (snapshots
	// wait in the spool until it does)
	if st, err := store.Check(ctx, scfg); err == nil {
		log.Info("store ready", "store", st.String())
		st.Close()
	} else if store.Permanent(err) {
		return rankagent.Config{}, fmt.Errorf("--store %s: %w", f.storeURL, err)
	} else if ctx.Err() == nil {
		log.Warn("the store does not answer yet; snapshots wait in the spool and are uploaded once it does", "store", f.storeURL, "err", err)
	}
	return cfg, nil
}

// newAgent makes the agent of cfg, a cluster's member (member) when there is
// more than one rank or somewhere to join, and arms --window.
func (f *agentFlags) newAgent(cfg rankagent.Config, log *slog.Logger) (a *rankagent.Agent, member *coordinator.Rank, err error) {
	id := cfg.Identity
	cluster := !f.standalone && (id.WorldSize > 1 || f.mf.join != "" || os.Getenv(coordinator.JoinEnv) != "")
	if set := setFlags(f.fs, "skip-batches", "interval", "every"); !cluster && len(set) > 0 {
		return nil, nil, fmt.Errorf("%s: a standalone agent has no leader to plan windows from these; it records --window START:STOP (a cluster's leader plans them: --join, or a world size above 1)",
			strings.Join(set, ", "))
	}
	if cluster {
		if f.window != "" {
			return nil, nil, errors.New("--window is for standalone agents; in a cluster the leader plans windows (--skip-batches, --interval, --every, or memsnap snapshot)")
		}
		ccfg, err := f.clusterConfig(id, log)
		if err != nil {
			return nil, nil, err
		}
		ccfg.OpenStore, ccfg.Logger = cfg.OpenStore, log
		if member, err = coordinator.NewRank(cfg, ccfg); err != nil {
			return nil, nil, err
		}
		a = member.Agent
	} else if a, err = rankagent.New(cfg); err != nil {
		return nil, nil, err
	}
	if f.window != "" {
		s, e, ok := strings.Cut(f.window, ":")
		start, err1 := strconv.ParseInt(s, 10, 64)
		stop, err2 := strconv.ParseInt(e, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil, nil, fmt.Errorf("--window %q: want START:STOP", f.window)
		}
		if _, err := a.ArmNext(start, stop); err != nil {
			return nil, nil, err
		}
	} else if !cluster {
		log.Warn("a standalone agent without --window records no batches: only its trainer's snapshot when it runs out of memory or fails " +
			"(--window START:STOP records batches; in a cluster the leader plans windows)")
	}
	return a, member, nil
}

// clusterConfig is the cluster membership's configuration from the flags.
func (f *agentFlags) clusterConfig(id rankagent.Identity, log *slog.Logger) (coordinator.Config, error) {
	ccfg := coordinator.DefaultConfig(id)
	if err := f.mf.apply(&ccfg, id.LocalRank, id.LocalWorldSize); err != nil {
		return ccfg, err
	}
	if len(ccfg.Join) == 0 && id.Rank != 0 {
		return ccfg, errors.New("no cluster to join: pass --join host[:port] (rank 0's agent), or --standalone")
	}
	if err := f.lf.apply(&ccfg); err != nil {
		return ccfg, err
	}
	ccfg.Triggers.Dump = f.recordAlways // a trigger then takes the history that led to it
	if f.figuresEvery < 100*time.Millisecond {
		return ccfg, fmt.Errorf("--figures-every %v: at least 100ms", f.figuresEvery)
	}
	ccfg.FiguresInterval = f.figuresEvery
	log.Info("gossip address chosen", "advertise", ccfg.Memberlist.AdvertiseAddr, "by", f.mf.chose, "bind", ccfg.Memberlist.BindAddr)
	return ccfg, nil
}

// runAgentWith runs the agent (with its cluster membership) until ctx ends or,
// with a trainer's command, launches it and waits for it and for the uploads.
func runAgentWith(ctx context.Context, a *rankagent.Agent, member *coordinator.Rank, cmdArgs []string, drain time.Duration, spool string,
	stdout, stderr io.Writer, log *slog.Logger) error {
	runAll := a.Run
	idle := func() bool { return true }
	var unfinished func() string
	if member != nil {
		runAll = member.Run
		idle = func() bool { return !member.Coord.Busy() && member.Coord.Settled() }
		unfinished = member.Coord.Unfinished
	}
	if len(cmdArgs) == 0 {
		return runAll(ctx)
	}
	// the trainer gets the signals; the agent lives until its snapshots are up
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	o, err := rankagent.RunWithTrainer(a, rankagent.Trainer{Command: cmdArgs, Stdin: os.Stdin, Stdout: stdout, Stderr: stderr, Hide: []string{coordinator.KeyEnv},
		Signals: sigs, DrainTimeout: drain, Run: runAll, Idle: idle, Unfinished: unfinished, OnExit: func(code int) {
			if !a.Idle() {
				log.Info("the trainer exited; waiting for uploads (Ctrl-C stops the wait)", "status", code, "timeout", drain)
			}
		}})
	if err != nil {
		return err
	}
	switch {
	case o.Stopped:
		log.Warn("stopped while uploading: "+o.String(), "spool", spool)
	case len(o.Problems) > 0:
		log.Error(o.String(), "spool", spool)
	default:
		log.Info(o.String())
	}
	if c := o.Code(); c != 0 {
		return exitError{c}
	}
	return nil
}

func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["replay"], stderr)
	sock := fs.String("socket", os.Getenv("MEMSNAP_SOCKET"), "the agent's trainer socket (default $MEMSNAP_SOCKET)")
	snap := fs.String("snapshot", "", "a recorded torch snapshot to replay")
	batches := fs.Int64("batches", 0, "batches to run (0, the default: until interrupted, so there is time to ask for a window with memsnap snapshot)")
	pace := fs.Duration("pace", 20*time.Millisecond, "the length of one batch")
	defRank, _ := strconv.Atoi(os.Getenv("RANK")) // (a launcher's: torchrun's RANK, as the hook reads it)
	rank := fs.Int("rank", max(defRank, 0), "the rank reported to the agent (default $RANK, else 0)")
	hang := fs.Bool("hang-in-window", false, "stop in the first batch of a window, as a stuck rank would (for tests)")
	failAt := fs.Int64("fail-at", 0, "raise an uncaught exception at the start of this batch, as a failing trainer would: what it recorded goes to the agent as a crash snapshot (for tests)")
	var holds multiFlag
	fs.Var(&holds, "hold-at", "wait before this batch until a window arrives (repeatable)")
	var leak, devTotal bytesFlag
	fs.Var(&leak, "leak-per-batch", "grow the allocated bytes it reports by this much a batch, as a leaking trainer's (64MiB, say)")
	fs.Var(&devTotal, "device-total", "the size of the device its memory reports name (default 80GiB)")
	memEvery := fs.Duration("memory-every", time.Second, "the least time between two memory reports, as the hook's (negative: none)")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	if *sock == "" || *snap == "" {
		fs.Usage()
		return errUsage
	}
	b, err := os.ReadFile(*snap)
	if err != nil {
		return err
	}
	var holdAt []int64
	for _, h := range holds {
		n, err := strconv.ParseInt(h, 10, 64)
		if err != nil || n < 1 {
			return fmt.Errorf("--hold-at %q: want a batch above 0", h)
		}
		holdAt = append(holdAt, n)
	}
	// SIGTERM stops it as it stops a hooked trainer: a crash snapshot of what it
	// recorded, then an exit by the signal's status
	// (the process's context ends on SIGTERM too: the replay answers to its own)
	stop := make(chan string, 1)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	go func() {
		select {
		case s := <-sigs:
			if s == syscall.SIGTERM {
				stop <- "SIGTERM"
				return
			}
			cancel()
		case <-rctx.Done():
		}
	}()
	err = rankagent.Replay(rctx, rankagent.ReplayConfig{Socket: *sock, Snapshot: b, Batches: *batches, Pace: *pace, Rank: *rank, HoldAt: holdAt,
		HangInWindow: *hang, FailAt: *failAt, Stop: stop, LeakPerBatch: leak.n, DeviceTotal: devTotal.n, MemoryEvery: *memEvery})
	switch {
	case errors.Is(err, rankagent.ErrTrainerStopped):
		fmt.Fprintln(stderr, "memsnap replay:", err)
		return exitError{128 + int(syscall.SIGTERM)}
	case errors.Is(err, rankagent.ErrTrainerFailed):
		fmt.Fprintln(stderr, "Traceback (most recent call last):\n  (replay)\n"+strings.TrimPrefix(err.Error(), rankagent.ErrTrainerFailed.Error()+": exception: "))
		return exitError{1}
	}
	return err
}

// serveMetrics checks the flags of live memory and serves the metrics (and the
// window endpoint, with a token file) while the agent runs; stop ends them.
func serveMetrics(ctx context.Context, addrFlag, tokenFile string, apiRate int, id rankagent.Identity, a *rankagent.Agent, member *coordinator.Rank,
	lf leaderFlags, log *slog.Logger) (stop func(), err error) {
	stop = func() {}
	if tokenFile != "" && addrFlag == "" {
		return stop, errors.New("--api-token-file: the window endpoint is served on --metrics-addr; give one")
	}
	if member == nil && (lf.headroom != "" || lf.growth != "") {
		return stop, errors.New("--trigger-headroom, --trigger-growth: a standalone agent has no leader to plan a trigger's window (run in a cluster: --join, or a world size above 1)")
	}
	if addrFlag == "" {
		return stop, nil
	}
	src := metrics.Source{Run: id.RunName, Rank: id.Rank, Node: hostname(), Memory: a.Memory, Stats: a.Stats, SpoolBytes: a.SpoolBytes}
	if member != nil {
		src.Members, src.Term, src.Leading, src.View = member.Coord.NumMembers, member.Coord.Term, member.Coord.IsLeader, member.Coord.View
		src.Silences = member.Coord.Silences
	}
	var api *metrics.API
	if tokenFile != "" {
		if member == nil {
			return stop, errors.New("--api-token-file: a standalone agent has no leader to ask for a window")
		}
		if apiRate < 1 {
			return stop, fmt.Errorf("--api-windows-per-minute %d: at least 1", apiRate)
		}
		tok, err := metrics.LoadToken(tokenFile)
		if err != nil {
			return stop, err
		}
		api = &metrics.API{Token: tok, Cooldown: lf.cooldown, WindowsPerMinute: apiRate, Ask: askWindow(ctx, member.Coord, log)}
	}
	addr, err := metrics.ForLocalRank(addrFlag, id.LocalRank)
	if err != nil {
		return stop, err
	}
	ms, err := metrics.Listen(addr, src, api, log)
	if err != nil {
		return stop, err
	}
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go ms.Serve(mctx)
	log.Info("metrics served", "url", "http://"+ms.Addr()+"/metrics")
	return cancel, nil
}

// askWindow asks coord's leader for a window with a reason, in the background:
// it returns once the request is on its way (an error only when no leader is
// known), and logs how the request ends (planned, or why not).
func askWindow(ctx context.Context, coord *coordinator.Coordinator, log *slog.Logger) func(reason string) error {
	return func(reason string) error {
		if _, ok := coord.Leader(); !ok {
			return coordinator.ErrNoLeader
		}
		go func() {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
			defer cancel()
			planned := make(chan struct{})
			var once sync.Once
			var window uint64
			_, err := coord.Request(rctx, 0, coordinator.RequestOptions{Reason: reason, Detach: planned, Progress: func(u coordinator.Update) {
				if u.State == pb.Step_STEP_PLANNED {
					window = u.Window
					once.Do(func() { close(planned) })
				}
			}})
			switch {
			case errors.Is(err, coordinator.ErrDetached):
				log.Info("a window was planned as asked through the API", "window", window, "reason", reason)
			case err != nil:
				log.Warn("the window asked for through the API was not planned", "reason", reason, "err", err)
			}
		}()
		return nil
	}
}

// hostname names this node in metrics ("" when the system cannot say).
func hostname() string {
	h, _ := os.Hostname()
	return h
}

// setFlags returns those of names given on the command line, as --name.
func setFlags(fs *flag.FlagSet, names ...string) []string {
	var set []string
	fs.Visit(func(f *flag.Flag) {
		if slices.Contains(names, f.Name) {
			set = append(set, "--"+f.Name)
		}
	})
	return set
}
