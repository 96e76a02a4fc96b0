package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/coordinator/commit"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/runlog"
)

func init() {
	register(&command{
		name: "finish",
		summary: "publish a run's unfinished windows from the store alone, when no agent is left to lead (the job was torn down): " +
			"every rank whose snapshot the run's log reports is merged, as partial where it recorded part of the window",
		usage: "[flags] s3://bucket/prefix | FOLDER   (the store the agents used)",
		exits: "0 every window finished (published or failed with its reason); 1 it could not (the last line says why); 2 a usage error",
		run:   runFinish,
	})
}

func runFinish(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["finish"], stderr)
	var cfg commit.Config // every run's, but for its Run
	fs.StringVar(&cfg.Run, "run", "", "the run's name (default: every run in the store with unfinished windows)")
	only := fs.String("window", "", "finish only these windows (comma-separated ids)")
	fs.BoolVar(&cfg.Force, "force", false, "finish windows still within their planned deadline too (only once the job's agents are gone: a live leader may be recording them)")
	fs.StringVar(&cfg.MergedName, "merged-name", coordinator.DefaultMergedName, "the merged outputs' name template, as the agents had it: a post-mortem of the "+
		"snapshots ranks stored of their OOM or crash, which no leader took, is published under it")
	sf, rest, err := parseStore(fs, args, oneArg)
	if err != nil {
		return err
	}
	if cfg.Windows, err = windowIDs(*only); err != nil {
		return fmt.Errorf("--window: %w", err)
	}
	if cfg.Store, err = store.Open(ctx, sf.config(rest[0], false)); err != nil {
		return err
	}
	defer cfg.Store.Close()
	runs := []string{cfg.Run}
	if cfg.Run == "" {
		if runs, err = unfinishedRuns(ctx, cfg.Store); err != nil {
			return err
		}
	}
	if len(runs) == 0 {
		fmt.Fprintf(stdout, "no run under %s has an unfinished window\n", rest[0])
		return nil
	}
	host, _ := os.Hostname()
	cfg.Holder = "memsnap finish on " + host
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var errs []error
	for _, r := range runs {
		cfg.Run = r
		res, err := commit.Finish(ctx, cfg)
		printFinished(stdout, r, res)
		switch {
		case errors.Is(err, commit.ErrNoLog):
			errs = append(errs, fmt.Errorf("run %s: no run's log in %s (is it the store the agents used, --store, and the run's name?)", r, rest[0]))
		case err != nil:
			errs = append(errs, fmt.Errorf("run %s: %w", r, err)) // (the other runs are finished all the same)
		case len(res) == 0:
			fmt.Fprintf(stdout, "run %s: nothing to finish\n", r)
		}
	}
	return errors.Join(errs...)
}

// unfinishedRuns are the runs under st whose logs hold a window with no outcome.
func unfinishedRuns(ctx context.Context, st store.Store) ([]string, error) {
	objs, err := st.List(ctx, "")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range runsWithLogs(objs) {
		ids, err := commit.Unfinished(ctx, st, r)
		if err != nil {
			return nil, err
		}
		orphans, err := commit.Orphans(ctx, runlog.New(st, r), time.Now())
		if err != nil {
			return nil, err
		}
		if len(ids) > 0 || len(orphans) > 0 {
			out = append(out, r)
		}
	}
	return out, nil
}

// runsWithLogs are the runs whose logs hold a plan or an incident, sorted.
func runsWithLogs(objs []store.ObjectInfo) []string {
	runs := map[string]bool{}
	for _, o := range objs {
		for _, mark := range []string{"/memsnap/plans/window", "/memsnap/incidents/rank"} {
			if i := strings.Index(o.Key, mark); i > 0 {
				runs[o.Key[:i]] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(runs))
}

func windowIDs(s string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		id, err := strconv.ParseUint(f, 10, 64)
		if err != nil || id == 0 {
			return nil, errors.New("window ids are positive numbers, comma-separated")
		}
		out = append(out, id)
	}
	return out, nil
}

// printFinished says how each window of run ended.
func printFinished(w io.Writer, run string, res []commit.Result) {
	for _, r := range res {
		if r.Left {
			fmt.Fprintf(w, "run %s: %s %d left unfinished: %s\n", run, kindLabel(r.Kind), r.Window, r.Error)
			continue
		}
		fmt.Fprintf(w, "run %s: %s %d %s", run, kindLabel(r.Kind), r.Window, r.State)
		if r.State == "published" {
			fmt.Fprintf(w, " with %d ranks (%s): %s", len(r.Ranks), analysis.RankRanges(r.Ranks), r.Manifest)
			if r.Error != "" {
				fmt.Fprintf(w, " (%s)", r.Error)
			}
		} else {
			fmt.Fprintf(w, ": %s", r.Error)
		}
		fmt.Fprintln(w)
		for _, rank := range sortedRanks(r.Partial) {
			fmt.Fprintf(w, "  rank %d partial: %s\n", rank, r.Partial[rank])
		}
		for _, rank := range sortedRanks(r.Missing) {
			fmt.Fprintf(w, "  rank %d missing: %s\n", rank, r.Missing[rank])
		}
	}
}

func sortedRanks(m map[int]string) []int {
	out := make([]int, 0, len(m))
	for r := range m {
		out = append(out, r)
	}
	sort.Ints(out)
	return out
}
