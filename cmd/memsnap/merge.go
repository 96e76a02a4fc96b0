package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/render"
	"github.com/memsnap/memsnap/naming"
)

func init() {
	register(&command{
		name:    "merge",
		summary: "merge per-rank snapshots into one timeline: torch pickle, Perfetto trace, summary, HTML report, protobuf",
		usage:   "[flags] INPUT...   (files, folders, globs, s3://bucket/prefix, or merged .memsnap.pb)",
		run:     runMerge,
	})
}

func runMerge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg merge.Config // the flags that are its fields bind straight into it
	fs := newFlags(commands["merge"], stderr)
	out := fs.String("out", "memsnap-merged", "where the merged outputs go: a folder or s3://bucket/prefix")
	layout := fs.String("layout", "composer", "how ranks are named: composer (rank{rank}.{batch}.memory_snapshot.pickle), torchtitan ({rank:06d}_step_{batch}.pickle) or megatron (..._{rank}.pickle)")
	tmplFlag := fs.String("name-template", "", "a name template that recovers {rank} from an input's file name (overrides --layout)")
	var ranks, vars multiFlag
	fs.Var(&ranks, "rank", "RANK=PATH: take PATH as that rank's snapshot whatever its name (repeatable)")
	fs.StringVar(&cfg.Align, "align", "", "time alignment: wall (each host's clock, the default), start (each rank's first event at zero) or offsets")
	offsets := fs.String("offsets", "", "a JSON file of per-rank clock offsets in microseconds, {\"1\": -35, ...}; implies --align offsets")
	fs.IntVar(&cfg.WorldSize, "world-size", 0, "ranks expected (default: from the ranks' metadata, or the highest rank plus one); absent ones are reported missing")
	fs.StringVar(&cfg.OutputBase, "output-name", publish.DefaultOutputBase, "name template of the outputs, before their suffixes, e.g. '{run_name}/window{window}/merged'")
	fs.Var(&vars, "var", "a value for --output-name, key=value (repeatable)")
	fs.BoolVar(&cfg.Overwrite, "overwrite", false, "replace outputs that exist")
	fs.StringVar(&cfg.Title, "title", "", "a title for the HTML report")
	quiet := fs.Bool("q", false, "no progress on stderr")
	var cut cutFlags
	cut.register(fs)
	sf, inputs, err := parseStore(fs, args, func(n int) bool { return n > 0 || len(ranks) > 0 })
	if err != nil {
		return err
	}
	tmpl, err := rankTemplate(*layout, *tmplFlag)
	if err != nil {
		return err
	}
	if cfg.Vars, err = outputVars(vars); err != nil {
		return err
	}
	if *offsets != "" {
		if cfg.Offsets, err = readOffsets(*offsets); err != nil {
			return err
		}
	}
	level := slog.LevelInfo
	if *quiet {
		level = slog.LevelWarn
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	res := &merge.Resolver{Template: tmpl, OpenStore: func(ctx context.Context, u string) (store.Store, error) {
		return store.Open(ctx, sf.config(u, false))
	}}
	if cfg.Inputs, err = res.Resolve(ctx, inputs, ranks); err != nil {
		return err
	}
	defer mergeGC()()
	if cfg.Out, err = store.Open(ctx, sf.config(*out, true)); err != nil {
		return err
	}
	if err := cut.apply(&cfg); err != nil {
		return err
	}
	r, err := merge.Merge(ctx, cfg)
	if err != nil {
		return err
	}
	printMergeResult(stdout, cfg.Out.String(), r)
	return nil
}

// rankTemplate is the template that recovers ranks from inputs' names: the
// --name-template, else the --layout's.
func rankTemplate(layout, ts string) (*naming.Template, error) {
	if ts == "" {
		var ok bool
		if ts, ok = merge.Layouts[layout]; !ok {
			return nil, fmt.Errorf("unknown --layout %q (composer, torchtitan or megatron)", layout)
		}
	}
	tmpl, err := naming.Parse(ts)
	if err != nil {
		return nil, err
	}
	if !tmpl.Uses("rank") {
		return nil, fmt.Errorf("--name-template %q does not name {rank}", ts)
	}
	return tmpl, nil
}

// outputVars parses the --var key=value pairs.
func outputVars(vars []string) (naming.Vars, error) {
	v := naming.Vars{}
	for _, kv := range vars {
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("--var %q: want key=value", kv)
		}
		var err error
		if v[k], err = naming.ParseValue(k, val); err != nil {
			return nil, err
		}
	}
	return v, nil
}

func printMergeResult(w io.Writer, where string, r *merge.Result) {
	s := r.Summary
	fmt.Fprintf(w, "merged %d of %d ranks into %s\n", len(s.RanksMerged), s.WorldSize, where)
	if len(s.MissingRanks) > 0 {
		fmt.Fprintf(w, "missing ranks: %v\n", s.MissingRanks)
	}
	printSpread(w, s)
	if d := s.Diff; d != nil && len(d.Sites) > 0 {
		top := d.Sites[0]
		fmt.Fprintf(w, "%s against %s: %s at its peak; most of it: %s (%s)\n", d.Other.Label, d.Base.Label, signedBytes(d.PeakDeltaBytes), printable(top.Site), signedBytes(top.DeltaBytes))
	}
	kinds := make([]string, 0, len(r.Outputs))
	for k := range r.Outputs {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(w, "  %-8s %s\n", k, r.Outputs[k])
	}
}

// printSpread says how far the ranks' peaks spread and which rank is the outlier.
func printSpread(w io.Writer, s *analysis.Summary) {
	if s.Spread != nil && len(s.Ranks) > 1 {
		fmt.Fprintln(w, s.Spread.Line())
	}
	for _, f := range s.Findings() {
		fmt.Fprintln(w, printableN(f, 4096)) // names come from the ranks' files
	}
}

func readOffsets(path string) (map[int]int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var raw map[string]int64
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("--offsets %s: want {\"rank\": microseconds, ...}: %w", path, err)
	}
	out := map[int]int64{}
	for k, v := range raw {
		r, err := strconv.Atoi(k)
		if err != nil || r < 0 {
			return nil, fmt.Errorf("--offsets %s: %q is not a rank", path, k)
		}
		out[r] = v
	}
	return out, nil
}

func signedBytes(n int64) string {
	if n > 0 {
		return "+" + humanBytes(n)
	}
	return humanBytes(n)
}

// cutFlags are merge's flags that choose what is merged and how the pickles are
// split.
type cutFlags struct {
	ranks, batches, detail string
	from, to               int64
	fromSet, toSet         bool
	pickleMax              int64
	partName               string
	analyses               bool
	diffRanks              multiFlag
}

func (c *cutFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.ranks, "ranks", "", "merge only these ranks, e.g. 0-7,63")
	fs.StringVar(&c.batches, "batches", "", "keep only the batches A to B-1 of every rank (A:B, by its batch marks)")
	fs.Func("from", "keep only events at or after this aligned time (microseconds, as the summary's times)", intFlag(&c.from, &c.fromSet))
	fs.Func("to", "keep only events at or before this aligned time (microseconds)", intFlag(&c.to, &c.toSet))
	fs.Int64Var(&c.pickleMax, "pickle-max-bytes", render.DefaultPickleMaxBytes, "the largest merged pickle: ranks are split into groups that fit")
	fs.StringVar(&c.partName, "pickle-part-name", render.DefaultPicklePartName, "how a part of a split pickle is named after --output-name ({first}, {last}: its ranks)")
	fs.BoolVar(&c.analyses, "from-analyses", false, "take each rank's figures from the X.analysis.json beside its snapshot (as rank agents upload them) instead of decoding it")
	fs.StringVar(&c.detail, "detail", "all", "the ranks whose full traces go into the pickles and the timeline: all, or diff (the outlier, the median rank and --diff-rank)")
	fs.Var(&c.diffRanks, "diff-rank", "a rank the summary also compares with the median rank (repeatable)")
}

func intFlag(v *int64, set *bool) func(string) error {
	return func(s string) error {
		n, err := strconv.ParseInt(s, 10, 64)
		*v, *set = n, true
		return err
	}
}

// apply puts the flags into a merge's configuration.
func (c *cutFlags) apply(cfg *merge.Config) error {
	var err error
	if c.ranks != "" {
		if cfg.Ranks, err = merge.ParseRankSet(c.ranks); err != nil {
			return err
		}
	}
	if c.batches != "" {
		if cfg.Batches, err = merge.ParseBatchRange(c.batches); err != nil {
			return err
		}
	}
	if c.fromSet {
		cfg.From = &c.from
	}
	if c.toSet {
		cfg.To = &c.to
	}
	switch c.detail {
	case "all":
		cfg.Detail = merge.DetailAll
	case "diff":
		cfg.Detail = merge.DetailDiff
	default:
		return fmt.Errorf("--detail %q: all or diff", c.detail)
	}
	for _, s := range c.diffRanks {
		r, err := strconv.Atoi(s)
		if err != nil || r < 0 {
			return fmt.Errorf("--diff-rank %q is not a rank", s)
		}
		cfg.DiffRanks = append(cfg.DiffRanks, r)
	}
	if c.pickleMax <= 0 {
		return fmt.Errorf("--pickle-max-bytes %d: want a positive size", c.pickleMax)
	}
	cfg.PickleMaxBytes, cfg.PicklePartName, cfg.FromAnalyses = c.pickleMax, c.partName, c.analyses
	return nil
}
