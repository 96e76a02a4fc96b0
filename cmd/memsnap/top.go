package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/coordinator/view"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/wait"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/rankagent"
)

func init() {
	register(&command{
		name:    "top",
		summary: "every rank's memory, live: a table of the job's ranks, the least headroom first",
		usage:   "--join HOST[:PORT] --run NAME (--key-file FILE | --key KEY | $MEMSNAP_KEY) [--every 2s] [--rows N] [--json]",
		run:     runTop,
	})
}

func runTop(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["top"], stderr)
	var cf clientFlags
	cf.register(fs)
	every := fs.Duration("every", 2*time.Second, "how often the table is refreshed")
	rows := fs.Int("rows", 0, "ranks shown, the least headroom first (default: what the terminal holds, else 20)")
	asJSON := fs.Bool("json", false, "print the leader's view once, as one JSON object, and exit")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	name, err := clientRunName(cf.run)
	if err != nil {
		return err
	}
	if *every < 100*time.Millisecond {
		return fmt.Errorf("--every %v: at least 100ms", *every)
	}
	if *rows < 0 {
		return fmt.Errorf("--rows %d: a number of ranks, 0 for what the terminal holds", *rows)
	}
	c, leave, err := joinCluster(ctx, name, &cf.mf, cf.joinTimeout, cf.joinTimeout, "--join-timeout", cf.verbose, stderr)
	if err != nil {
		return err
	}
	defer leave()
	// a closed pipe is a write error to handle, not a signal that kills top before
	// it leaves the cluster
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	defer signal.Stop(pipe)
	ask := func() (*pb.ClusterView, error) {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return c.AskView(actx)
	}
	if *asJSON {
		return topJSON(ctx, stdout, name, ask)
	}
	return topTables(ctx, stdout, name, ask, c.Members, *rows, *every)
}

// topJSON prints the leader's view once, as one JSON object, waiting a little
// for figures (they come every few seconds: the first view may be empty).
func topJSON(ctx context.Context, stdout io.Writer, name string, ask func() (*pb.ClusterView, error)) error {
	var v *pb.ClusterView
	var err error
	wait.Every(ctx, 2*coordinator.DefaultConfig(rankagent.Identity{}).FiguresInterval, 200*time.Millisecond, func() bool {
		v, err = ask()
		return err != nil || len(v.Ranks) > 0
	})
	switch {
	case ctx.Err() != nil:
		return nil
	case err != nil:
		return err
	}
	return json.NewEncoder(stdout).Encode(viewJSON(name, v, time.Now()))
}

// topTables writes the table of the leader's view (rows ranks; 0: what the
// terminal holds) every period, until ctx ends, the reader goes, or the run has
// no rank left (topEnded).
func topTables(ctx context.Context, stdout io.Writer, name string, ask func() (*pb.ClusterView, error), members func() []*pb.NodeMeta,
	rows int, every time.Duration) error {
	tty := isTerminal(stdout)
	w := newTopWatch(name, every)
	for {
		v, err := ask()
		width, height := termSize(stdout)
		var b strings.Builder
		ended := w.step(&b, v, err, members(), topRows(rows, height), width, time.Now())
		clear := "\n"
		if tty && !ended {
			clear = "\x1b[H\x1b[2J" // refresh in place
		}
		if _, err := io.WriteString(stdout, clear+b.String()); err != nil {
			if errors.Is(err, syscall.EPIPE) {
				return nil // the reader is gone (memsnap top | head): leave quietly
			}
			return fmt.Errorf("writing the table: %w", err)
		}
		if ended {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil // Ctrl-C ends it
		case <-time.After(every):
		}
	}
}

// topRows is how many ranks a table shows: those asked for, else what a
// terminal of height lines holds, else 20.
func topRows(rows, height int) int {
	switch {
	case rows > 0:
		return rows
	case height > 13:
		return height - 12 // the header, the spread, the table's head, the silent ranks
	}
	return 20
}

// clientRunName is the run a client command asks about: the flag's, else the
// launcher's job id, else $MEMSNAP_RUN_NAME.
func clientRunName(flagValue string) (string, error) {
	name := flagValue
	if name == "" {
		if id, found, _ := rankagent.IdentityFromEnv(nil); found && id.RunName != "" {
			name = id.RunName
		} else {
			name = os.Getenv("MEMSNAP_RUN_NAME")
		}
	}
	if name == "" {
		return "", errors.New("no run name: pass --run (the agents' --run-name)")
	}
	return name, nil
}

// termSize is the terminal's columns and lines, or topWidth and 0 when w is
// not a terminal.
func termSize(w io.Writer) (width, height int) {
	if f, ok := w.(*os.File); ok {
		if cols, h, err := term.GetSize(int(f.Fd())); err == nil && cols > 0 {
			return cols, h
		}
	}
	return topWidth, 0
}

// tableLines lays cells out right-aligned, pad spaces apart, the host column
// (the second) cut to nodeW columns.
func tableLines(cells [][]string, pad, nodeW int) []string {
	var t strings.Builder
	tw := tabwriter.NewWriter(&t, 0, 0, pad, ' ', tabwriter.AlignRight)
	for _, row := range cells {
		for i, c := range row {
			if i == 1 {
				c = fitLine(c, nodeW)
			}
			fmt.Fprint(tw, c+"\t")
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	return strings.Split(strings.TrimSuffix(t.String(), "\n"), "\n")
}

// spreadLines say how the ranks spread: the least headroom and whose, the
// median and the most; and the rank that grows fastest.
func spreadLines(v *pb.ClusterView) []string {
	var heads []int64
	for _, r := range v.Ranks {
		if r.Figures.DeviceTotal > 0 {
			heads = append(heads, r.Figures.Headroom)
		}
	}
	var lines []string
	if len(heads) > 0 {
		sort.Slice(heads, func(i, j int) bool { return heads[i] < heads[j] })
		lines = append(lines, fmt.Sprintf("headroom: least %s (rank %d), median %s, most %s", analysis.HumanBytes(heads[0]), v.Ranks[0].Rank,
			analysis.HumanBytes(heads[len(heads)/2]), analysis.HumanBytes(heads[len(heads)-1])))
	}
	fast := v.Ranks[0]
	for _, r := range v.Ranks {
		if r.Figures.Growth > fast.Figures.Growth {
			fast = r
		}
	}
	if fast.Figures.Growth > 0 {
		lines = append(lines, fmt.Sprintf("fastest growth: rank %d, +%s", fast.Rank, analysis.GrowthText(fast.Figures.Growth)))
	} else {
		lines = append(lines, "no rank grows")
	}
	return lines
}

// viewJSON is the leader's view as --json prints it.
func viewJSON(run string, v *pb.ClusterView, now time.Time) any {
	view.Sort(v)
	type rank struct {
		Rank          int32   `json:"rank"`
		Node          string  `json:"node"`
		Batch         int64   `json:"batch"`
		Allocated     int64   `json:"allocated_bytes"`
		Reserved      int64   `json:"reserved_bytes"`
		Peak          int64   `json:"peak_allocated_bytes"`
		InactiveSplit int64   `json:"inactive_split_bytes"`
		AllocRetries  int64   `json:"alloc_retries"`
		OOMs          int64   `json:"ooms"`
		DeviceUsed    int64   `json:"device_used_bytes"`
		DeviceTotal   int64   `json:"device_total_bytes"`
		Headroom      int64   `json:"headroom_bytes"`
		Growth        float64 `json:"growth_bytes_per_batch"`
		AgeSeconds    float64 `json:"age_seconds"`
	}
	out := struct {
		Run        string `json:"run"`
		At         string `json:"at"`
		WorldSize  int32  `json:"world_size"`
		LeaderRank int32  `json:"leader_rank"`
		Reporting  int    `json:"reporting"` // ranks with figures; ranks holds the lowest headroom first, at most 4,096
		Ranks      []rank `json:"ranks"`
		// the ranks' latest OOM or crash, as the leader heard of it
		Incidents []incidentJSON `json:"incidents"`
	}{Run: run, At: now.UTC().Format(time.RFC3339), WorldSize: v.WorldSize, LeaderRank: v.LeaderRank, Reporting: max(int(v.Reporting), len(v.Ranks)), Ranks: []rank{},
		Incidents: []incidentJSON{}}
	for _, r := range v.Ranks {
		f := r.Figures
		out.Ranks = append(out.Ranks, rank{r.Rank, r.Node, f.Batch, f.Allocated, f.Reserved, f.Peak, f.InactiveSplit, f.AllocRetries, f.Ooms,
			f.DeviceUsed, f.DeviceTotal, f.Headroom, f.Growth, float64(r.AgeMs) / 1000})
	}
	for _, in := range v.Incidents {
		kind := "crash"
		if in.Kind == pb.WindowKind_WINDOW_KIND_OOM {
			kind = "oom"
		}
		out.Incidents = append(out.Incidents, incidentJSON{in.Rank, kind, in.Cause, in.Batch, time.UnixMicro(in.AtUs).UTC().Format(time.RFC3339Nano), float64(in.AgeMs) / 1000})
	}
	return out
}

// incidentJSON is a rank's incident as --json prints it.
type incidentJSON struct {
	Rank       int32   `json:"rank"`
	Kind       string  `json:"kind"` // "oom" or "crash"
	Cause      string  `json:"cause"`
	Batch      int64   `json:"batch"` // -1: not known
	At         string  `json:"at"`    // the rank's clock
	AgeSeconds float64 `json:"age_seconds"`
}
