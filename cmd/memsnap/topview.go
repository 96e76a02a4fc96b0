package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/coordinator/view"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/termtext"
	"github.com/memsnap/memsnap/rankagent"
)

// topWidth is the columns top fits its lines to when it writes to no terminal
// (a terminal's own width otherwise).
const topWidth = 80

// staleAfter is how old a rank's figures are when top counts the rank as not
// reporting and marks them late: one and a half report periods, a report missed.
var staleAfter = coordinator.DefaultConfig(rankagent.Identity{}).FiguresInterval * 3 / 2

// top ends once no rank of the run has been a member for topEndAfter, over at
// least topEndTries tries.
const (
	topEndAfter = 10 * time.Second
	topEndTries = 3
)

// seenRank is a rank's last figures in a view, and when its agent read them.
type seenRank struct {
	f  *pb.RankFigures
	at time.Time
}

// topWatch is what top knows across its refreshes: every rank's last figures,
// so a rank that falls silent is told with what it last said, and how long no
// rank has been a member.
type topWatch struct {
	run          string
	every        time.Duration
	seen         map[int32]seenRank
	incidents    map[int32]*pb.RankIncident // every rank's latest OOM or crash the views told
	noRanks      int                        // consecutive tries that found no rank a member
	noRanksSince time.Time                  // the first of them
}

func newTopWatch(run string, every time.Duration) *topWatch {
	return &topWatch{run: run, every: every, seen: map[int32]seenRank{}, incidents: map[int32]*pb.RankIncident{}}
}

// step writes one refresh to b: the view v (or the error asking for it) with
// members, the cluster's members as this client sees them. It returns true,
// with a closing line in b, once the run has no rank left.
func (w *topWatch) step(b *strings.Builder, v *pb.ClusterView, err error, members []*pb.NodeMeta, rows, width int, now time.Time) bool {
	ranks := memberRanks(members)
	if len(ranks) > 0 {
		w.noRanks = 0
	} else if w.noRanks++; w.noRanks == 1 {
		w.noRanksSince = now
	}
	if w.noRanks >= topEndTries && now.Sub(w.noRanksSince) >= topEndAfter {
		for _, l := range w.endLines(now, width) {
			fmt.Fprintln(b, fitLine(l, width))
		}
		return true
	}
	if err != nil {
		fmt.Fprintln(b, fitLine(fmt.Sprintf("memsnap top: %s (asking again in %v)", termtext.Escape(err.Error(), 0), w.every), width))
		if len(ranks) == 0 {
			fmt.Fprintln(b, fitLine(fmt.Sprintf("no rank is a member: the job may have ended (top ends after %v without one)", topEndAfter), width))
		}
		return false
	}
	for _, r := range v.Ranks {
		w.seen[r.Rank] = seenRank{f: r, at: now.Add(-time.Duration(r.AgeMs) * time.Millisecond)}
	}
	for _, in := range v.Incidents {
		w.incidents[in.Rank] = in
	}
	renderView(b, topFrame{run: w.run, view: v, seen: w.seen, incidents: w.incidents, members: ranks, rows: rows, width: width, now: now})
	return false
}

// endLines are top's last lines: the ranks that ran out of memory, then that
// the run ended.
func (w *topWatch) endLines(now time.Time, width int) []string {
	var oom []string
	for _, r := range seenOrder(w.seen) {
		if f := w.seen[r].f.Figures; f.Ooms > 0 && w.incidents[r] == nil {
			oom = append(oom, fmt.Sprintf("%d by batch %d", r, f.Batch))
		}
	}
	lines := incidentLines(w.incidents, width)
	if len(oom) > 0 {
		noun := "rank "
		if len(oom) > 1 {
			noun = "ranks "
		}
		lines = append(lines, listLine(fateLabels[fateOOM]+": "+noun, oom, width))
	}
	tail := fmt.Sprintf(" ended: no rank has been a member for %v", now.Sub(w.noRanksSince).Round(time.Second))
	end := "run " + termtext.Escape(w.run, max(width-utf8.RuneCountInString(tail)-len("run "), 8)) + tail
	return append(lines, end)
}

// memberRanks are the ranks among members, with their hosts.
func memberRanks(members []*pb.NodeMeta) map[int32]string {
	out := map[int32]string{}
	for _, m := range members {
		if m.Rank >= 0 {
			out[m.Rank] = m.Hostname
		}
	}
	return out
}

func seenOrder(m map[int32]seenRank) []int32 {
	out := make([]int32, 0, len(m))
	for r := range m {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// topFrame is what one refresh shows.
type topFrame struct {
	run       string
	view      *pb.ClusterView
	seen      map[int32]seenRank         // every rank's last figures top saw (nil: none)
	incidents map[int32]*pb.RankIncident // every rank's latest OOM or crash top heard of (nil: none)
	members   map[int32]string           // the ranks that are members, with their hosts (nil: not known)
	rows      int                        // ranks in the table
	width     int                        // columns every line fits in
	now       time.Time
}

// renderView writes the job's memory: a header, how the ranks spread, a table
// of the rows ranks with the least headroom, how many more, and what became of
// the ranks that do not report; every line fits f.width columns.
func renderView(w io.Writer, f topFrame) {
	v := f.view
	view.Sort(v)
	reporting := max(int(v.Reporting), len(v.Ranks))
	fresh := reporting - len(v.Ranks) // reporting, beyond what the view holds
	for _, r := range v.Ranks {
		if !late(r) {
			fresh++
		}
	}
	leader := "no leader answered"
	if v.LeaderRank >= 0 {
		leader = fmt.Sprintf("leader rank %d", v.LeaderRank)
	}
	tail := fmt.Sprintf(" · %d of %d ranks reporting · %s · %s UTC", fresh, v.WorldSize, leader, f.now.UTC().Format(time.TimeOnly))
	run := termtext.Escape(f.run, max(f.width-utf8.RuneCountInString(tail)-len("run "), 8))
	fmt.Fprintln(w, fitLine("run "+run+tail, f.width))
	if len(v.Ranks) == 0 {
		fmt.Fprintln(w, fitLine("no rank has reported its memory yet (the hook reports at a batch's end, the agents every few seconds)", f.width))
	} else {
		for _, l := range spreadLines(v) {
			fmt.Fprintln(w, fitLine(l, f.width))
		}
		fmt.Fprintln(w)
		writeRankTable(w, v.Ranks[:min(f.rows, len(v.Ranks))], f.width)
		if more := reporting - min(f.rows, len(v.Ranks)); more > 0 {
			fmt.Fprintln(w, fitLine(fmt.Sprintf("… and %d more ranks, with more headroom (--rows, or --json for every rank)", more), f.width))
		}
	}
	for _, l := range incidentLines(f.incidents, f.width) {
		fmt.Fprintln(w, fitLine(l, f.width))
	}
	for _, l := range fateLines(fates(v, f.seen, f.members, f.incidents, f.now), f.width) {
		fmt.Fprintln(w, fitLine(l, f.width))
	}
}

// late says whether a rank's figures in the view are older than staleAfter.
func late(r *pb.RankFigures) bool { return time.Duration(r.AgeMs)*time.Millisecond > staleAfter }

// writeRankTable writes the ranks' rows under a header, fitting width: the
// host column is cut, then the columns drawn closer; a line that still does
// not fit is cut.
func writeRankTable(w io.Writer, ranks []*pb.RankFigures, width int) {
	cells := [][]string{{"RANK", "NODE", "BATCH", "ALLOC", "RESERVED", "PEAK", "HEADROOM", "GROWTH", "FRAG", "AGE"}}
	for _, r := range ranks {
		f := r.Figures
		head := "?"
		if f.DeviceTotal > 0 {
			share := 100 * float64(f.Headroom) / float64(f.DeviceTotal)
			head = fmt.Sprintf("%s %.0f%%", shortBytes(f.Headroom), share)
			if share < 9.95 {
				head = fmt.Sprintf("%s %.1f%%", shortBytes(f.Headroom), share) // near the triggers' shares, a tenth matters
			}
		}
		age := (time.Duration(r.AgeMs) * time.Millisecond).Round(time.Second).String()
		if late(r) {
			age += " late"
		}
		cells = append(cells, []string{strconv.Itoa(int(r.Rank)), termtext.Escape(nonEmptyNode(r.Node), 0), strconv.FormatInt(f.Batch, 10),
			shortBytes(f.Allocated), shortBytes(f.Reserved), shortBytes(f.Peak), head, shortGrowth(f.Growth), shortBytes(f.InactiveSplit), age})
	}
	var lines []string
	for _, pad := range []int{2, 1} {
		for nodeW, least := 16, 10-6*(2-pad); ; {
			lines = tableLines(cells, pad, nodeW)
			over := 0
			for _, l := range lines {
				over = max(over, utf8.RuneCountInString(l)-width)
			}
			if over <= 0 {
				pad = 0 // fits: done
				break
			}
			if nodeW <= least {
				break
			}
			nodeW = max(nodeW-over, least)
		}
		if pad == 0 {
			break
		}
	}
	for _, l := range lines {
		fmt.Fprintln(w, fitLine(l, width))
	}
}

func nonEmptyNode(s string) string {
	if s == "" {
		return "?"
	}
	return s
}

// shortGrowth is a growth per batch, signed, in shortBytes's units.
func shortGrowth(g float64) string {
	switch {
	case g > 0:
		return "+" + shortBytes(int64(math.Round(g)))
	case g < 0:
		return "-" + shortBytes(int64(math.Round(-g)))
	}
	return "0"
}

// shortBytes is n in binary units in at most 5 columns: 512B, 20.0G, 512M.
func shortBytes(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%dB", n)
	}
	f := float64(n)
	for _, u := range []string{"K", "M", "G", "T"} {
		f /= 1024
		switch {
		case f < 99.95:
			return fmt.Sprintf("%.1f%s", f, u)
		case f < 1023.5:
			return fmt.Sprintf("%.0f%s", f, u)
		}
	}
	return fmt.Sprintf("%.0fP", f/1024)
}

// fitLine cuts s to n columns (characters), ending with "…" where it cut.
func fitLine(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:max(n-1, 0)]) + "…"
}
