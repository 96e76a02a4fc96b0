package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"text/tabwriter"

	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/merge/analysis"
)

func init() {
	register(&command{
		name:    "inspect",
		summary: "print a snapshot's figures: events by action, segments, reserved and allocated bytes, peaks",
		usage:   "[--json] FILE|s3://URL...",
		run:     runInspect,
	})
}

// inspectLine is one file's figures as `inspect --json` prints them.
type inspectLine struct {
	File string `json:"file"`
	merge.FileFigures
	// Truncated is set when the sidecar beside the file gives the history's cap
	// and the history reached it
	Truncated *analysis.Truncation `json:"truncated,omitempty"`
}

func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["inspect"], stderr)
	asJSON := fs.Bool("json", false, "print one JSON object per file")
	sf, files, err := parseStore(fs, args, someArgs)
	if err != nil {
		return err
	}
	failed := 0
	enc := json.NewEncoder(stdout)
	gc := pauseGC()
	defer gc.resume()
	var fetch fetched
	defer fetch.done()
	for i, f := range files {
		if i > 0 {
			gc.between()
		}
		local, err := fetch.local(ctx, sf, f)
		if err != nil {
			fmt.Fprintf(stderr, "memsnap inspect: %v\n", err)
			failed++
			continue
		}
		fig, trunc, err := merge.InspectFileHistory(ctx, local)
		if ctx.Err() != nil {
			return fmt.Errorf("stopped at %s: %w", f, ctx.Err())
		}
		if err != nil {
			fmt.Fprintf(stderr, "memsnap inspect: %v\n", err)
			failed++
			continue
		}
		if *asJSON {
			if err := enc.Encode(inspectLine{File: filepath.Base(f), FileFigures: fig, Truncated: trunc}); err != nil {
				return err
			}
			continue
		}
		printFigures(stdout, filepath.Base(f), fig)
		if trunc != nil {
			fmt.Fprintf(stdout, "  %s\n", trunc.Describe())
		}
	}
	if failed > 0 {
		return exitError{1}
	}
	return nil
}

func printFigures(w io.Writer, name string, f merge.FileFigures) {
	fmt.Fprintf(w, "%s\n", name)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  segments\t%d\n", f.Segments)
	fmt.Fprintf(tw, "  reserved\t%s\t(%d bytes)\n", humanBytes(f.ReservedBytes), f.ReservedBytes)
	fmt.Fprintf(tw, "  allocated\t%s\t(%d bytes)\n", humanBytes(f.AllocatedBytes), f.AllocatedBytes)
	for _, a := range f.Actions() {
		fmt.Fprintf(tw, "  events %s\t%d\n", a, f.Events[a])
	}
	tw.Flush()
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "  device\tevents\tallocated\tpeak allocated\t\n")
	for _, d := range f.Devices {
		fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\t\n", d.Device, d.Events, humanBytes(d.AllocatedBytes), humanBytes(d.PeakAllocatedBytes))
	}
	tw.Flush()
}

func humanBytes(n int64) string { return analysis.HumanBytes(n) }
