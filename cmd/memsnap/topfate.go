package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/termtext"
	"github.com/memsnap/memsnap/merge/analysis"
)

// fate is what became of a rank that does not report fresh figures, as far as
// top can tell from the leader's view, the members and earlier views.
type fate int

const (
	fateOOM    fate = iota // its last figures count an out-of-memory error
	fateLate               // in the view, its figures older than staleAfter
	fateLeft               // it reported, then its agent left the cluster
	fateSilent             // it reported and is a member, its figures gone from the view
	fateNotYet             // a member that has not reported
	fateAbsent             // not a member, never reported
	numFates
)

// fateLabels begin each fate's line.
var fateLabels = [numFates]string{
	fateOOM:    "out of memory",
	fateLate:   "late (no figures for " + staleAfter.String() + ")",
	fateLeft:   "left the cluster",
	fateSilent: "stopped reporting (no trainer connected?)",
	fateNotYet: "not reported yet (no trainer connected, or no batch ended)",
	fateAbsent: "not a member (its agent not started, or gone)",
}

// rankFate is one rank's fate, and what its last figures said.
type rankFate struct {
	rank  int32
	batch int64         // the batch of its last figures (-1: none)
	age   time.Duration // how old they are
}

// fates sorts the ranks of v's job that do not report fresh figures by what
// became of them, rank order within each. seen holds earlier views' figures
// and members the ranks that are members (nil: neither known); the ranks of
// told (their incidents, told by incidentLines) are left out. Ranks a view cut
// to its first ranks does not hold are not judged.
func fates(v *pb.ClusterView, seen map[int32]seenRank, members map[int32]string, told map[int32]*pb.RankIncident, now time.Time) [numFates][]rankFate {
	var out [numFates][]rankFate
	in := map[int32]bool{}
	for r := range told {
		in[r] = true
	}
	for _, r := range v.Ranks {
		in[r.Rank] = true
		if late(r) && told[r.Rank] == nil {
			k := fateLate
			if r.Figures.Ooms > 0 {
				k = fateOOM
			}
			out[k] = append(out[k], rankFate{r.Rank, r.Figures.Batch, time.Duration(r.AgeMs) * time.Millisecond})
		}
	}
	if int(v.Reporting) > len(v.Ranks) {
		return sortFates(out)
	}
	for rank := int32(0); rank < v.WorldSize; rank++ {
		if in[rank] {
			continue
		}
		_, member := members[rank]
		s, ok := seen[rank]
		switch {
		case ok && s.f.Figures.Ooms > 0:
			out[fateOOM] = append(out[fateOOM], rankFate{rank, s.f.Figures.Batch, now.Sub(s.at)})
		case ok && !member && members != nil:
			out[fateLeft] = append(out[fateLeft], rankFate{rank, s.f.Figures.Batch, now.Sub(s.at)})
		case ok:
			out[fateSilent] = append(out[fateSilent], rankFate{rank, s.f.Figures.Batch, now.Sub(s.at)})
		case member || members == nil:
			out[fateNotYet] = append(out[fateNotYet], rankFate{rank, -1, 0})
		default:
			out[fateAbsent] = append(out[fateAbsent], rankFate{rank, -1, 0})
		}
	}
	return sortFates(out)
}

func sortFates(f [numFates][]rankFate) [numFates][]rankFate {
	for _, l := range f {
		sort.Slice(l, func(i, j int) bool { return l[i].rank < l[j].rank })
	}
	return f
}

// fateLines are one line a fate: its label and its ranks, each with its last
// batch where that says more ("out of memory: rank 3 by batch 120"); the
// ranks that never reported as ranges.
func fateLines(f [numFates][]rankFate, width int) []string {
	var lines []string
	for k, l := range f {
		if len(l) == 0 {
			continue
		}
		var items []string
		switch fate(k) {
		case fateNotYet, fateAbsent:
			ranks := make([]int, len(l))
			for i, r := range l {
				ranks[i] = int(r.rank)
			}
			items = []string{analysis.RankRanges(ranks)}
		default:
			for _, r := range l {
				items = append(items, fateItem(fate(k), r))
			}
		}
		noun := "rank "
		if len(l) > 1 {
			noun = "ranks "
		}
		lines = append(lines, listLine(fateLabels[k]+": "+noun, items, width))
	}
	return lines
}

// fateItem is one rank of a fate's line.
func fateItem(k fate, r rankFate) string {
	switch k {
	case fateOOM:
		return fmt.Sprintf("%d by batch %d", r.rank, r.batch)
	case fateLate:
		return fmt.Sprintf("%d (%v, batch %d)", r.rank, r.age.Round(time.Second), r.batch)
	}
	return fmt.Sprintf("%d after batch %d", r.rank, r.batch)
}

// listLine is head and items, comma-separated, as many as fit width columns
// with "and N more" for the rest.
func listLine(head string, items []string, width int) string {
	s := head
	for i, it := range items {
		sep := ""
		if i > 0 {
			sep = ", "
		}
		rest := ""
		if i < len(items)-1 {
			rest = ", and " + strconv.Itoa(len(items)-i-1) + " more"
		}
		if i > 0 && len([]rune(s+sep+it+rest)) > width {
			return s + ", and " + strconv.Itoa(len(items)-i) + " more"
		}
		s += sep + it
	}
	return strings.TrimSuffix(s, " ")
}

// maxIncidentLines is the most lines top gives the ranks' incidents; the rest
// are counted in one more.
const maxIncidentLines = 6

// incidentText says what a rank's incident was: "out of memory at batch 120",
// "crashed: SIGTERM (batch 88)".
func incidentText(in *pb.RankIncident) string {
	if in.Kind == pb.WindowKind_WINDOW_KIND_OOM {
		if in.Batch >= 0 {
			return fmt.Sprintf("out of memory at batch %d", in.Batch)
		}
		return "out of memory"
	}
	s := "crashed"
	if in.Cause != "" {
		s += ": " + termtext.Escape(in.Cause, 64)
	}
	if in.Batch >= 0 {
		s += fmt.Sprintf(" (batch %d)", in.Batch)
	}
	return s
}

// incidentLines are the ranks' incidents, a line each, ranks told alike on one
// line ("ranks 4-7: crashed: SIGTERM (batch 88)"), the lowest rank first, at
// most maxIncidentLines and a line that counts the rest.
func incidentLines(incs map[int32]*pb.RankIncident, width int) []string {
	by := map[string][]int{}
	for r, in := range incs {
		t := incidentText(in)
		by[t] = append(by[t], int(r))
	}
	texts := make([]string, 0, len(by))
	for t, ranks := range by {
		sort.Ints(ranks)
		texts = append(texts, t)
	}
	sort.Slice(texts, func(i, j int) bool { return by[texts[i]][0] < by[texts[j]][0] })
	var lines []string
	for i, t := range texts {
		if i == maxIncidentLines {
			rest := 0
			for _, t := range texts[i:] {
				rest += len(by[t])
			}
			lines = append(lines, fmt.Sprintf("… and %d more ranks out of memory or crashed (--json for every one)", rest))
			break
		}
		noun := "rank "
		if len(by[t]) > 1 {
			noun = "ranks "
		}
		lines = append(lines, fitLine(noun+analysis.RankRanges(by[t])+": "+t, width))
	}
	return lines
}
