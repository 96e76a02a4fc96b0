package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/memsnap/memsnap/internal/demodata"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/naming"
	"github.com/memsnap/memsnap/rankagent"
)

func init() {
	register(&command{
		name:    "demo",
		summary: "the whole job on embedded data: 4 rank agents record one window from replay trainers, upload to a folder, merge",
		usage:   "[--out DIR]",
		run:     runDemo,
	})
}

// runDemo runs four real rank agents, each with a replay trainer that answers the
// window [3, 6) with a real recorded snapshot (a 4-rank DDP job, PyTorch 2.11,
// H200), uploads to a folder store, and merges the four snapshots.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["demo"], stderr)
	out := fs.String("out", "memsnap-demo", "the folder store the demo writes to")
	quiet := fs.Bool("q", false, "no progress on stderr")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	level := slog.LevelInfo
	if *quiet {
		level = slog.LevelWarn
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	st, err := store.OpenDir(*out, true)
	if err != nil {
		return err
	}
	run := fmt.Sprintf("demo-%s", time.Now().UTC().Format("20060102-150405"))
	sockDir, err := os.MkdirTemp("", "memsnap-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(sockDir)

	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	const start, stop = 3, 6
	uploads := make(chan rankagent.UploadResult, demodata.Ranks)
	var wg sync.WaitGroup
	agentCtx, stopAgents := context.WithCancel(ctx)
	defer func() { stopAgents(); wg.Wait() }()
	for r := 0; r < demodata.Ranks; r++ {
		id := rankagent.Identity{RunName: run, Rank: r, LocalRank: r, WorldSize: demodata.Ranks, LocalWorldSize: demodata.Ranks, Launcher: "demo"}
		cfg := rankagent.DefaultConfig(id)
		cfg.OpenStore = func(context.Context) (store.Store, error) { return st, nil }
		cfg.Spool = filepath.Join(sockDir, fmt.Sprintf("spool%d", r))
		cfg.Socket = filepath.Join(sockDir, fmt.Sprintf("r%d.sock", r))
		cfg.Logger = log
		cfg.OnUpload = func(u rankagent.UploadResult) { uploads <- u }
		a, err := rankagent.New(cfg)
		if err != nil {
			return err
		}
		if _, err := a.ArmNext(start, stop); err != nil {
			return err
		}
		snap, err := demodata.Rank(r)
		if err != nil {
			return err
		}
		wg.Add(2)
		go func() { defer wg.Done(); a.Run(agentCtx) }()
		go func(r int) {
			defer wg.Done()
			rankagent.Replay(agentCtx, rankagent.ReplayConfig{Socket: cfg.Socket, Snapshot: snap, Batches: stop + 3, Pace: 25 * time.Millisecond, HoldAt: []int64{start}, Rank: r, UUID: fmt.Sprintf("GPU-demo-%d", r)})
		}(r)
	}
	for i := 0; i < demodata.Ranks; i++ {
		select {
		case u := <-uploads:
			if u.Err != nil {
				return u.Err
			}
		case <-ctx.Done():
			return fmt.Errorf("demo: the agents did not upload in time: %w", ctx.Err())
		}
	}
	stopAgents()
	wg.Wait()

	prefix := filepath.Join(st.Root(), run, "torch_memory_traces")
	res := &merge.Resolver{Template: naming.MustParse(naming.ComposerSnapshotName)}
	ins, err := res.Resolve(ctx, []string{prefix}, nil)
	if err != nil {
		return err
	}
	r, err := merge.Merge(ctx, merge.Config{
		Inputs: ins, Out: st, OutputBase: "{run_name}/merged/merged", Vars: naming.Vars{"run_name": run},
		Title: run + " (replayed 4-rank DDP snapshots, PyTorch 2.11, H200)", Logger: log,
	})
	if err != nil {
		return err
	}
	printMergeResult(stdout, st.String(), r)
	fmt.Fprintf(stdout, "per-rank snapshots: %s\nopen %s in a browser (it needs no network)\n", prefix,
		filepath.Join(st.Root(), filepath.FromSlash(r.Outputs[merge.OutHTML])))
	return nil
}
