package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/internal/demodata"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/wait"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/rankagent"
)

func init() {
	register(&command{
		name:    "demo",
		summary: "the whole job on embedded data: 4 rank agents form a cluster on loopback, one on-demand window, merged and published to a folder",
		usage:   "[--out DIR]",
		run:     runDemo,
	})
}

// demoHold is the batch before which the demo's replay trainers wait for the
// window, so the demo never depends on how fast the machine is.
const demoHold = 4

// runDemo runs four real rank agents as a real memberlist cluster on loopback
// (encrypted with a fresh key), each serving a replay trainer that answers with a
// real recorded snapshot (a 4-rank DDP job, PyTorch 2.11, H200). A member that is
// not a rank asks for one window, as `memsnap snapshot` does; the leader merges the
// ranks from the folder store and publishes the merged outputs.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["demo"], stderr)
	out := fs.String("out", "memsnap-demo", "the folder store the demo writes to")
	quiet := fs.Bool("q", false, "no progress on stderr")
	verbose := fs.Bool("v", false, "log everything the agents do")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	say := func(format string, a ...any) {
		if !*quiet {
			fmt.Fprintf(stderr, format+"\n", a...)
		}
	}
	st, err := store.OpenDir(*out, true)
	if err != nil {
		return err
	}
	run := fmt.Sprintf("demo-%s", time.Now().UTC().Format("20060102-150405"))
	tmp, err := os.MkdirTemp("", "memsnap-demo-")
	if err != nil {
		return err
	}
	defer removeDemoSpools(tmp, stderr)
	key := make([]byte, 32)
	rand.Read(key)

	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	say("starting %d rank agents on loopback (run %s), each with a replay trainer", demodata.Ranks, run)
	lc, err := coordinator.StartLocal(ctx, coordinator.LocalConfig{Run: run, Ranks: demodata.Ranks, Key: key, Logger: log,
		Agent: func(r int) rankagent.Config {
			c := rankagent.DefaultConfig(rankagent.Identity{})
			c.OpenStore = func(context.Context) (store.Store, error) { return st, nil }
			c.Spool = filepath.Join(tmp, fmt.Sprintf("spool%d", r))
			c.Socket = filepath.Join(tmp, fmt.Sprintf("r%d.sock", r))
			c.Logger = log
			return c
		}})
	if err != nil {
		return err
	}
	defer lc.Stop()
	var wg sync.WaitGroup
	tctx, stopTrainers := context.WithCancel(ctx)
	defer func() { stopTrainers(); wg.Wait() }()
	if err := startReplays(tctx, lc, &wg); err != nil {
		return err
	}
	if err := waitHeld(ctx, lc); err != nil {
		return err
	}
	client, stopClient, err := lc.Client(ctx)
	if err != nil {
		return err
	}
	defer stopClient()
	leader, _ := client.Leader()
	say("cluster formed: %d ranks, leader rank %d; asking for a window of 3 batches", len(lc.Ranks), leader)
	p := newProgressPrinter(stderr, *quiet)
	res, err := client.Snapshot(ctx, 3, p.update, nil)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if res.State != pb.Outcome_OUTCOME_PUBLISHED {
		return fmt.Errorf("demo: window %d failed: %s", p.window, res.Error)
	}
	printDemoResult(stdout, res, p.window, st, run)
	return nil
}

// removeDemoSpools removes the demo's spools, unless they hold snapshots that
// were not uploaded (a full disk, a store that failed): those stay for an
// agent to upload.
func removeDemoSpools(tmp string, stderr io.Writer) {
	if n := unsent(tmp); n > 0 {
		fmt.Fprintf(stderr, "memsnap demo: %d snapshot(s) were not uploaded; they stay in %s (an agent started with --spool %s uploads that rank's); remove the folder when done\n",
			n, tmp, filepath.Join(tmp, "spoolR"))
		return
	}
	os.RemoveAll(tmp)
}

// startReplays starts each rank's replay trainer, answering with the rank's
// recorded snapshot until ctx ends; wg counts them.
func startReplays(ctx context.Context, lc *coordinator.LocalCluster, wg *sync.WaitGroup) error {
	for r, rk := range lc.Ranks {
		snap, err := demodata.Rank(r)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rankagent.Replay(ctx, rankagent.ReplayConfig{Socket: rk.Agent.Socket(), Snapshot: snap, Pace: 25 * time.Millisecond,
				HoldAt: []int64{demoHold}, Rank: r, UUID: fmt.Sprintf("GPU-demo-%d", r)})
		}()
	}
	return nil
}

// waitHeld waits until every rank's trainer holds at demoHold, so the window
// asked for next finds them all there.
func waitHeld(ctx context.Context, lc *coordinator.LocalCluster) error {
	if _, err := wait.Until(ctx, time.Minute, func() bool {
		for _, rk := range lc.Ranks {
			if rk.Agent.Batch() != demoHold-1 {
				return false
			}
		}
		return true
	}); err != nil {
		return fmt.Errorf("demo: the replay trainers did not start: %w", err)
	}
	return nil
}

// printDemoResult says what the published window holds and where its outputs
// are.
func printDemoResult(stdout io.Writer, res *pb.WindowResult, window uint64, st *store.Dir, run string) {
	fmt.Fprintf(stdout, "window %d (batches %d-%d) merged from %d ranks and published to %s\n", window, res.Start, res.Stop-1, len(res.Ranks), st)
	for _, r := range sortedMissing(res.Missing) {
		fmt.Fprintf(stdout, "  rank %d missing: %s\n", r, res.Missing[int32(r)])
	}
	if sp := outputEnding(res.Outputs, ".summary.json"); sp != "" {
		if b, err := os.ReadFile(sp); err == nil {
			var sum analysis.Summary
			if json.Unmarshal(b, &sum) == nil {
				printSpread(stdout, &sum)
			}
		}
	}
	fmt.Fprintf(stdout, "per-rank snapshots: %s\n", filepath.Join(st.Root(), run, "torch_memory_traces"))
	fmt.Fprintf(stdout, "manifest: %s\n", res.Manifest)
	if len(res.Outputs) > 0 {
		fmt.Fprintf(stdout, "open %s in a browser (it needs no network)\n", res.Outputs[0])
	}
}

// outputEnding finds the output whose name ends in suffix ("" when none does).
func outputEnding(outputs []string, suffix string) string {
	for _, o := range outputs {
		if strings.HasSuffix(o, suffix) {
			return o
		}
	}
	return ""
}

// unsent counts the snapshots the demo's spools (spool*/ under tmp) still hold:
// waiting in incoming/ or pending/, or refused into failed/.
func unsent(tmp string) int {
	n := 0
	for _, sub := range []string{"incoming/*.pickle", "pending/*", "failed/*"} {
		ms, _ := filepath.Glob(filepath.Join(tmp, "spool*", sub))
		for _, m := range ms {
			if !strings.HasPrefix(filepath.Base(m), ".") {
				n++
			}
		}
	}
	return n
}
