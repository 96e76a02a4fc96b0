package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/memsnap/memsnap/internal/gpu"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/naming"
	"github.com/memsnap/memsnap/rankagent"
)

func init() {
	register(&command{
		name:    "agent",
		summary: "run a rank agent beside one training process (optionally launching it: memsnap agent [flags] -- python train.py)",
		usage:   "[flags] [-- COMMAND ARGS...]",
		run:     runAgent,
	})
	register(&command{
		name:    "replay",
		summary: "a replay trainer: speak the hook's protocol from a recorded snapshot (tests and demos without a GPU)",
		usage:   "--socket PATH --snapshot FILE [--batches N] [--pace D]",
		run:     runReplay,
	})
}

func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := commands["agent"]
	fs := newFlags(c, stderr)
	storeURL := fs.String("store", "memsnap-store", "where snapshots go: s3://bucket/prefix or a folder")
	runName := fs.String("run-name", "", "the run's name (default: $MEMSNAP_RUN_NAME, the launcher's job id, or \"memsnap\")")
	rank := fs.Int("rank", -1, "this rank (default: from torchrun, SLURM or Open MPI's environment)")
	localRank := fs.Int("local-rank", -1, "this rank on its node")
	nodeRank := fs.Int("node-rank", -1, "this node's rank")
	world := fs.Int("world-size", -1, "ranks in the job")
	localWorld := fs.Int("local-world-size", -1, "ranks on this node")
	folder := fs.String("folder", naming.DefaultFolder, "local folder template (Composer's folder); the spool is <folder>/.memsnap-spool-rank<rank>")
	spoolDir := fs.String("spool", "", "the spool folder (overrides --folder)")
	filename := fs.String("filename", naming.DefaultFilename, "snapshot name template, without .pickle (Composer's filename)")
	remote := fs.String("remote-file-name", naming.DefaultRemoteFileName, "folder template of uploaded snapshots (Composer's remote_file_name)")
	overwrite := fs.Bool("overwrite", false, "replace snapshots that exist in the store")
	sock := fs.String("socket", "", "the trainer socket (default: per run and local rank, owner-only)")
	window := fs.String("window", "", "START:STOP: record batches [START, STOP) without a leader")
	requireGPU := fs.Bool("require-gpu", false, "fail the window when the trainer's GPU cannot be read through NVML")
	maxEntries := fs.Int("max-entries", 100000, "allocator history entries torch keeps")
	stacks := fs.String("stacks", "python", "stacks torch records: python or all")
	drain := fs.Duration("drain-timeout", 2*time.Minute, "with a COMMAND: how long to wait for uploads after it exits")
	var sf storeFlags
	sf.register(fs)
	// flags stop at "--"; what follows is the trainer's command
	var cmdArgs []string
	for i, a := range args {
		if a == "--" {
			args, cmdArgs = args[:i], args[i+1:]
			break
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (put the trainer's command after --)", fs.Arg(0))
	}
	// the logger and the trainer's output share stderr (and stdout): serialise writes
	stderr, stdout = &syncWriter{w: stderr}, &syncWriter{w: stdout}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	id, found, err := rankagent.IdentityFromEnv(nil)
	if err != nil {
		return err
	}
	if !found {
		id = rankagent.Identity{WorldSize: 1, LocalWorldSize: 1, Launcher: "flags"}
		id.RunName = os.Getenv("MEMSNAP_RUN_NAME")
	}
	for _, o := range []struct {
		v   int
		dst *int
	}{{*rank, &id.Rank}, {*localRank, &id.LocalRank}, {*nodeRank, &id.NodeRank}, {*world, &id.WorldSize}, {*localWorld, &id.LocalWorldSize}} {
		if o.v >= 0 {
			*o.dst = o.v
		}
	}
	if *runName != "" {
		id.RunName = *runName
	}
	if id.RunName == "" {
		id.RunName = "memsnap"
	}
	if err := id.Check(); err != nil {
		return err
	}
	cfg := rankagent.DefaultConfig(id)
	cfg.Filename, cfg.RemoteFileName, cfg.Overwrite = *filename, *remote, *overwrite
	cfg.Socket, cfg.RequireGPU, cfg.MaxEntries, cfg.Stacks = *sock, *requireGPU, *maxEntries, *stacks
	cfg.Logger = log
	cfg.Spool = *spoolDir
	if cfg.Spool == "" {
		ft, err := naming.Parse(*folder)
		if err != nil {
			return err
		}
		f, err := ft.Render(naming.Vars{"run_name": id.RunName, "rank": id.Rank, "local_rank": id.LocalRank, "node_rank": id.NodeRank,
			"world_size": id.WorldSize, "local_world_size": max(id.LocalWorldSize, 1)})
		if err != nil {
			return err
		}
		cfg.Spool = filepath.Join(f, fmt.Sprintf(".memsnap-spool-rank%d", id.Rank))
	}
	scfg := sf.config(*storeURL, true)
	cfg.OpenStore = func(ctx context.Context) (store.Store, error) { return store.Open(ctx, scfg) }
	prov, gerr := gpu.OpenNVML(nil)
	if gerr != nil {
		if *requireGPU {
			return fmt.Errorf("--require-gpu: %w", gerr)
		}
		log.Info("no GPU information: the agent runs on without NVML", "reason", gerr)
	}
	defer prov.Close()
	cfg.GPU = prov
	a, err := rankagent.New(cfg)
	if err != nil {
		return err
	}
	if *window != "" {
		s, e, ok := strings.Cut(*window, ":")
		start, err1 := strconv.ParseInt(s, 10, 64)
		stop, err2 := strconv.ParseInt(e, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return fmt.Errorf("--window %q: want START:STOP", *window)
		}
		if _, err := a.Arm(start, stop); err != nil {
			return err
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	if len(cmdArgs) == 0 {
		return <-done
	}
	// launch the trainer with the socket in its environment
	child := exec.Command(cmdArgs[0], cmdArgs[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, stdout, stderr
	child.Env = append(os.Environ(), "MEMSNAP_SOCKET="+a.Socket())
	if err := child.Start(); err != nil {
		cancel()
		<-done
		return fmt.Errorf("starting %s: %w", cmdArgs[0], err)
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		for s := range sigs {
			child.Process.Signal(s)
		}
	}()
	werr := child.Wait()
	deadline := time.Now().Add(*drain)
	for !a.Idle() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if !a.Idle() {
		log.Warn("uploads still pending at exit; they stay in the spool and go up when an agent with this spool starts again", "spool", cfg.Spool)
	}
	cancel()
	<-done
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		return exitError{ee.ExitCode()}
	}
	return werr
}

// syncWriter serialises writes from several goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["replay"], stderr)
	sock := fs.String("socket", os.Getenv("MEMSNAP_SOCKET"), "the agent's trainer socket (default $MEMSNAP_SOCKET)")
	snap := fs.String("snapshot", "", "a recorded torch snapshot to replay")
	batches := fs.Int64("batches", 20, "batches to run (0: until interrupted)")
	pace := fs.Duration("pace", 20*time.Millisecond, "the length of one batch")
	rank := fs.Int("rank", 0, "the rank reported to the agent")
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
	return rankagent.Replay(ctx, rankagent.ReplayConfig{Socket: *sock, Snapshot: b, Batches: *batches, Pace: *pace, Rank: *rank})
}
