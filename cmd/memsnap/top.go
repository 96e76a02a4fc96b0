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
	return topTables(ctx, stdout, name, ask, *rows, *every)
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
// terminal holds) every period, until ctx ends or the reader goes.
func topTables(ctx context.Context, stdout io.Writer, name string, ask func() (*pb.ClusterView, error), rows int, every time.Duration) error {
	tty := isTerminal(stdout)
	for {
		v, err := ask()
		n := rows
		if n == 0 {
			n = 20
			if h := termHeight(stdout); h > 8 {
				n = h - 7
			}
		}
		var b strings.Builder
		if err != nil {
			fmt.Fprintf(&b, "memsnap top: %v (asking again in %v)\n", err, every)
		} else {
			renderView(&b, name, v, n, time.Now())
		}
		clear := "\n"
		if tty {
			clear = "\x1b[H\x1b[2J" // refresh in place
		}
		if _, err := io.WriteString(stdout, clear+b.String()); err != nil {
			if errors.Is(err, syscall.EPIPE) {
				return nil // the reader is gone (memsnap top | head): leave quietly
			}
			return fmt.Errorf("writing the table: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil // Ctrl-C ends it
		case <-time.After(every):
		}
	}
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

func termHeight(w io.Writer) int {
	if f, ok := w.(*os.File); ok {
		if _, h, err := term.GetSize(int(f.Fd())); err == nil {
			return h
		}
	}
	return 0
}

// staleAfter is how old a rank's figures are when top marks them as old: a few
// report periods.
const staleAfter = 10 * time.Second

// renderView writes the job's memory as a table: a summary of the spread across
// ranks, then the rows ranks with the least headroom, then how many more.
func renderView(w io.Writer, run string, v *pb.ClusterView, rows int, now time.Time) {
	view.Sort(v)
	leader := "no leader answered"
	if v.LeaderRank >= 0 {
		leader = fmt.Sprintf("leader rank %d", v.LeaderRank)
	}
	reporting := max(int(v.Reporting), len(v.Ranks))
	fmt.Fprintf(w, "memsnap top — run %s — %d of %d ranks reporting — %s — %s UTC\n", run, reporting, v.WorldSize, leader, now.UTC().Format(time.TimeOnly))
	if len(v.Ranks) == 0 {
		fmt.Fprintln(w, "no rank has reported its memory yet (the hook reports at a batch's end, the agents every few seconds)")
		return
	}
	fmt.Fprintln(w, spreadLine(v))
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "RANK\tNODE\tBATCH\tALLOCATED\tRESERVED\tPEAK\tHEADROOM\tGROWTH/BATCH\tFRAGMENTED\tAGE\t")
	for i, r := range v.Ranks {
		if i == rows {
			break
		}
		f := r.Figures
		head := "?"
		if f.DeviceTotal > 0 {
			head = fmt.Sprintf("%s %4.1f%%", analysis.HumanBytes(f.Headroom), 100*float64(f.Headroom)/float64(f.DeviceTotal))
		}
		age := (time.Duration(r.AgeMs) * time.Millisecond).Round(time.Second).String()
		if time.Duration(r.AgeMs)*time.Millisecond > staleAfter {
			age += " (old)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Rank, cutNode(r.Node), f.Batch, analysis.HumanBytes(f.Allocated), analysis.HumanBytes(f.Reserved),
			analysis.HumanBytes(f.Peak), head, growthText(f.Growth), analysis.HumanBytes(f.InactiveSplit), age)
	}
	tw.Flush()
	if more := reporting - min(rows, len(v.Ranks)); more > 0 {
		fmt.Fprintf(w, "… and %d more ranks, with more headroom (--rows, or --json for every rank)\n", more)
	}
	if missing := int(v.WorldSize) - reporting; missing > 0 {
		fmt.Fprintf(w, "%d ranks have not reported (no trainer connected, or no batch ended yet)\n", missing)
	}
}

// spreadLine says how the ranks spread in one line: the least headroom and
// whose, the median, and the fastest growth.
func spreadLine(v *pb.ClusterView) string {
	var heads []int64
	for _, r := range v.Ranks {
		if r.Figures.DeviceTotal > 0 {
			heads = append(heads, r.Figures.Headroom)
		}
	}
	var parts []string
	if len(heads) > 0 {
		sort.Slice(heads, func(i, j int) bool { return heads[i] < heads[j] })
		w := v.Ranks[0]
		parts = append(parts, fmt.Sprintf("headroom: least %s (rank %d), median %s, most %s", analysis.HumanBytes(heads[0]), w.Rank,
			analysis.HumanBytes(heads[len(heads)/2]), analysis.HumanBytes(heads[len(heads)-1])))
	}
	fast := v.Ranks[0]
	for _, r := range v.Ranks {
		if r.Figures.Growth > fast.Figures.Growth {
			fast = r
		}
	}
	if fast.Figures.Growth > 0 {
		parts = append(parts, fmt.Sprintf("fastest growth: rank %d, %s", fast.Rank, growthText(fast.Figures.Growth)))
	} else {
		parts = append(parts, "no rank grows")
	}
	return strings.Join(parts, "; ")
}

func growthText(g float64) string {
	switch {
	case g > 0:
		return "+" + analysis.HumanBytes(int64(g))
	case g < 0:
		return "-" + analysis.HumanBytes(int64(-g))
	}
	return "0"
}

func cutNode(n string) string {
	if n == "" {
		return "?"
	}
	if len(n) > 24 {
		return n[:23] + "…"
	}
	return n
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
	}{Run: run, At: now.UTC().Format(time.RFC3339), WorldSize: v.WorldSize, LeaderRank: v.LeaderRank, Reporting: max(int(v.Reporting), len(v.Ranks)), Ranks: []rank{}}
	for _, r := range v.Ranks {
		f := r.Figures
		out.Ranks = append(out.Ranks, rank{r.Rank, r.Node, f.Batch, f.Allocated, f.Reserved, f.Peak, f.InactiveSplit, f.AllocRetries, f.Ooms,
			f.DeviceUsed, f.DeviceTotal, f.Headroom, f.Growth, float64(r.AgeMs) / 1000})
	}
	return out
}
