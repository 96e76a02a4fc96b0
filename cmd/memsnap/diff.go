package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/merge/analysis"
)

func init() {
	register(&command{
		name:    "diff",
		summary: "why does one rank (or window) differ: allocation sites alive at each peak, side by side",
		usage: `[flags] A [B]
  A B                   B against A: two snapshots (.pickle, .gz, .zst), rank analyses
                        (.analysis.json) or merged timelines (.memsnap.pb, with --rank),
                        files or s3:// URLs
  MERGED.memsnap.pb     one merged window: --rank (default: the outlier) against --vs
                        (default: the median rank)`,
		run: runDiff,
	})
	register(&command{
		name:    "analyze",
		summary: "analyse one rank's snapshot as a rank agent does (peak, sites, curve, batches) and print it as JSON",
		usage:   "[--rank R] [-o FILE] SNAPSHOT   (a file or an s3:// URL; its .memsnap.json sidecar is used when it lies beside it)",
		run:     runAnalyze,
	})
}

func runDiff(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["diff"], stderr)
	rank := fs.Int("rank", -1, "the rank to take from a merged timeline (from each of two; of one, the rank compared)")
	vs := fs.Int("vs", -1, "with one merged timeline: the rank compared against (default: the median rank)")
	asJSON := fs.Bool("json", false, "print the diff as JSON")
	top := fs.Int("top", 20, "sites shown in the table (0: all)")
	sf, files, err := parseStore(fs, args, func(n int) bool { return n == 1 || n == 2 && *vs < 0 })
	if err != nil {
		return err
	}
	var fetch fetched
	defer fetch.done()
	labels := append([]string(nil), files...)
	for i := range files {
		if files[i], err = fetch.local(ctx, sf, files[i]); err != nil {
			return err
		}
	}
	gc := pauseGC()
	defer gc.resume()
	var d *analysis.RankDiff
	if len(files) == 1 {
		d, err = diffOneTimeline(ctx, files[0], *rank, *vs)
	} else {
		d, err = diffTwo(ctx, files[0], files[1], labels[0], labels[1], *rank)
		if err == nil && d != nil {
			d.Base.Source, d.Other.Source = labels[0], labels[1] // where they are, not their fetched copies
		}
	}
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(d)
	}
	return d.WriteTable(stdout, *top)
}

// diffTwo compares B with A (local files), naming them by where they were
// given (nameA, nameB: a URL, not the fetched copy).
func diffTwo(ctx context.Context, a, b, nameA, nameB string, rank int) (*analysis.RankDiff, error) {
	base, err := merge.AnalyzeFile(ctx, a, rank)
	if err != nil {
		return nil, err
	}
	other, err := merge.AnalyzeFile(ctx, b, rank)
	if err != nil {
		return nil, err
	}
	la, lb := merge.FileLabels(nameA, nameB, rank)
	return analysis.Diff(analysis.DiffInput{Label: la, Source: a, A: base}, analysis.DiffInput{Label: lb, Source: b, A: other}), nil
}

// diffOneTimeline compares two ranks of one merged window.
func diffOneTimeline(ctx context.Context, path string, rank, vs int) (*analysis.RankDiff, error) {
	if !merge.IsTimeline(path) {
		return nil, fmt.Errorf("%s is not a merged timeline (.memsnap.pb): give two files to compare", path)
	}
	all, err := merge.TimelineAnalyses(ctx, path)
	if err != nil {
		return nil, err
	}
	outlier, median, ok := merge.OutlierAndMedian(all)
	if !ok {
		return nil, fmt.Errorf("%s holds fewer than two ranks", path)
	}
	other, base := outlier, median
	for _, a := range all {
		if a.Rank == rank {
			other = a
		}
		if a.Rank == vs {
			base = a
		}
	}
	if (rank >= 0 && other.Rank != rank) || (vs >= 0 && base.Rank != vs) {
		return nil, fmt.Errorf("%s holds no rank %d", path, max(rank, vs))
	}
	label := func(a *analysis.RankAnalysis) string { return fmt.Sprintf("rank %d", a.Rank) }
	return analysis.Diff(analysis.DiffInput{Label: label(base), Source: path, A: base}, analysis.DiffInput{Label: label(other), Source: path, A: other}), nil
}

func runAnalyze(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["analyze"], stderr)
	rank := fs.Int("rank", -1, "the rank (default: the sidecar's, else 0)")
	out := fs.String("o", "-", "where the analysis goes ('-': standard output)")
	sf, files, err := parseStore(fs, args, oneArg)
	if err != nil {
		return err
	}
	var fetch fetched
	defer fetch.done()
	if files[0], err = fetch.local(ctx, sf, files[0]); err != nil {
		return err
	}
	gc := pauseGC()
	defer gc.resume()
	a, err := merge.AnalyzeFile(ctx, files[0], *rank)
	if err != nil {
		return err
	}
	b, err := a.Marshal()
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if *out == "-" {
		_, err = stdout.Write(b)
		return err
	}
	return os.WriteFile(*out, b, 0o644)
}
