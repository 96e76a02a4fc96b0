package merge

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/sidecar"
)

// RankSet is a set of ranks written as ranges, "0-7,63".
type RankSet struct {
	spans [][2]int // sorted, disjoint, inclusive
}

// maxRankSpans bounds how many ranges a RankSet may be written with.
const maxRankSpans = 4096

// ParseRankSet parses "0-7,63" (ranges and single ranks, comma-separated).
func ParseRankSet(s string) (*RankSet, error) {
	var spans [][2]int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		b, err2 := a, error(nil)
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 0 || b < a || b >= sidecar.MaxRanks {
			return nil, fmt.Errorf("merge: ranks %q: %q is not a rank or a range A-B of ranks below %d", s, part, sidecar.MaxRanks)
		}
		spans = append(spans, [2]int{a, b})
		if len(spans) > maxRankSpans {
			return nil, fmt.Errorf("merge: ranks %q: more than %d ranges", s, maxRankSpans)
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i][0] < spans[j][0] })
	out := &RankSet{}
	for _, sp := range spans {
		if n := len(out.spans); n > 0 && sp[0] <= out.spans[n-1][1]+1 {
			out.spans[n-1][1] = max(out.spans[n-1][1], sp[1])
			continue
		}
		out.spans = append(out.spans, sp)
	}
	return out, nil
}

// Has reports whether r is in the set; a nil set holds every rank.
func (s *RankSet) Has(r int) bool {
	if s == nil {
		return true
	}
	i := sort.Search(len(s.spans), func(i int) bool { return s.spans[i][1] >= r })
	return i < len(s.spans) && s.spans[i][0] <= r
}

// String writes the set as ParseRankSet reads it, ranges merged.
func (s *RankSet) String() string {
	if s == nil {
		return ""
	}
	parts := make([]string, len(s.spans))
	for i, sp := range s.spans {
		parts[i] = strconv.Itoa(sp[0])
		if sp[1] != sp[0] {
			parts[i] += "-" + strconv.Itoa(sp[1])
		}
	}
	return strings.Join(parts, ",")
}

// BatchRange is the batches [Start, Stop).
type BatchRange struct {
	Start, Stop int64
}

// ParseBatchRange parses "A:B", the batches [A, B).
func ParseBatchRange(s string) (*BatchRange, error) {
	a, b, ok := strings.Cut(s, ":")
	start, err1 := strconv.ParseInt(a, 10, 64)
	stop, err2 := strconv.ParseInt(b, 10, 64)
	if !ok || err1 != nil || err2 != nil || stop <= start {
		return nil, fmt.Errorf("merge: batches %q: want A:B with A < B (the batches A to B-1)", s)
	}
	return &BatchRange{start, stop}, nil
}

func (b *BatchRange) String() string { return fmt.Sprintf("%d:%d", b.Start, b.Stop) }

// span returns the rank's own-clock time from the start of the range's first
// batch to the end of its last, by the rank's batch marks.
func (b *BatchRange) span(m *sidecar.RankMeta) (from, to int64, ok bool) {
	if m == nil {
		return 0, 0, false
	}
	for _, bm := range m.Batches {
		if bm.Batch < b.Start || bm.Batch >= b.Stop {
			continue
		}
		if !ok {
			from, to, ok = bm.StartUS, bm.EndUS, true
			continue
		}
		from, to = min(from, bm.StartUS), max(to, bm.EndUS)
	}
	return from, to, ok
}

// cutInfo describes the cut of c, or nil when nothing is cut.
func (c *Config) cutInfo() *analysis.CutInfo {
	if c.Ranks == nil && !c.timeCut() {
		return nil
	}
	ci := &analysis.CutInfo{Ranks: c.Ranks.String(), FromUS: c.From, ToUS: c.To}
	if c.Batches != nil {
		ci.Batches = c.Batches.String()
	}
	return ci
}

// timeCut reports whether the ranks' traces are cut in time.
func (c *Config) timeCut() bool { return c.Batches != nil || c.From != nil || c.To != nil }

// window is the part of a rank's trace (its own clock) the merge keeps.
func (c *Config) window(rank int, meta *sidecar.RankMeta, shift int64) (analysis.Window, error) {
	var w analysis.Window
	if c.Batches != nil {
		from, to, ok := c.Batches.span(meta)
		if !ok {
			return w, fmt.Errorf("merge: rank %d has no batch marks for batches %s", rank, c.Batches)
		}
		w = analysis.Window{From: &from, To: &to}
	}
	if c.From != nil {
		f := *c.From - shift
		if w.From == nil || f > *w.From {
			w.From = &f
		}
	}
	if c.To != nil {
		t := *c.To - shift
		if w.To == nil || t < *w.To {
			w.To = &t
		}
	}
	return w, nil
}
