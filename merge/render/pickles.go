package render

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// DefaultPickleMaxBytes is the default bound of one merged pickle, from a
// measurement of PyTorch's MemoryViz.js itself (scripts/bench-viewer.sh): in
// Chromium's default tab every view of every one of 64 ranks rendered at 87 MiB
// with a quarter of the tab's 4 GiB heap and at 173 MiB with under half; at 341
// MiB it took three quarters, 11.7 GB of memory and 20 s a view; under node with
// an 8 GB heap a 360 MB pickle ran out of memory and 96 MB parts worked.
const DefaultPickleMaxBytes = 128 << 20

// DefaultPicklePartName is the default template of a part's name, added to the
// outputs' base name when the merged pickle is split: {first} and {last} are the
// part's first and last rank.
const DefaultPicklePartName = ".ranks-{first}-{last}"

// CheckPartName checks a part name template: {first} and {last}, once each, and
// no other field.
func CheckPartName(t string) error {
	rest := strings.NewReplacer("{first}", "", "{last}", "").Replace(t)
	if strings.Count(t, "{first}") != 1 || strings.Count(t, "{last}") != 1 || strings.ContainsAny(rest, "{}/\\") {
		return fmt.Errorf("merge: pickle part name %q: want {first} and {last} once each, no other field and no '/'", t)
	}
	return nil
}

func renderPartName(t string, first, last int) string {
	return strings.NewReplacer("{first}", strconv.Itoa(first), "{last}", strconv.Itoa(last)).Replace(t)
}

// PickleParts writes the merged pickles: ranks are added in rank order, and a
// part is closed before a rank whose bound (pickleCost) would carry it over the
// cap. Parts tile the ranks: the first starts at rank 0, each next one where the
// previous ended, the last ends at the world's last rank.
type PickleParts struct {
	Dir   string
	Cap   int64
	done  []*picklePart
	cur   *picklePart
	count int
}

type picklePart struct {
	out         *OutFile
	path        string
	w           *snapshot.Writer
	first, next int // ranks [first, next) are written
	ranks       []int
	tail        int64 // the bound of what the part writes at its end
	cost        *pickleCost
	segments    []*snapshot.Segment
	settings    snapshot.Value
	annots      []snapshot.Value
	overCap     bool
	size        int64
}

func (pp *PickleParts) open(first int) error {
	path := filepath.Join(pp.Dir, fmt.Sprintf("pickle.%d", pp.count))
	pp.count++
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("merge: %w", err)
	}
	p := &picklePart{out: &OutFile{F: f, H: sha256.New()}, path: path, first: first, next: first, cost: newPickleCost()}
	if p.w, err = snapshot.NewWriter(p.out); err != nil {
		f.Close()
		return err
	}
	pp.cur = p
	return nil
}

// pendingMax bounds what snapshot.Writer holds in memory after a trace: its
// bufio.Writer's 256 KiB and a pickle frame of under 64 KiB.
const pendingMax = 320 << 10

// bound is how large the part can grow to with a rank of the given bounds: what
// reached its file, what the writer may hold, what it writes at its end.
func (p *picklePart) bound(tr, tail int64) int64 {
	return p.out.n + pendingMax + pickleOverhead + p.tail + tr + tail
}

// Add writes rank r's trace (already cut) into the current part, or into a new
// one when it would not fit.
func (pp *PickleParts) Add(r *analysis.RankData, trace []*snapshot.TraceEntry) error {
	if pp.cur == nil {
		if err := pp.open(0); err != nil {
			return err
		}
	}
	p := pp.cur
	tr, tail := p.cost.rank(r, trace)
	tr += emptyTraceCost * int64(r.Rank-p.next)
	if len(p.ranks) > 0 && p.bound(tr, tail) > pp.Cap {
		if err := pp.close(r.Rank); err != nil {
			return err
		}
		if err := pp.open(r.Rank); err != nil {
			return err
		}
		p = pp.cur
		tr, tail = p.cost.rank(r, trace)
	}
	p.cost.commit()
	p.overCap = p.overCap || p.bound(tr, tail) > pp.Cap
	p.tail += tail
	if err := p.pad(r.Rank); err != nil {
		return err
	}
	if err := p.w.Trace(trace, r.ShiftUS); err != nil {
		return err
	}
	p.next++
	p.ranks = append(p.ranks, r.Rank)
	p.keep(r)
	return nil
}

// keep holds what the part writes at its end: the rank's segments (as device
// rank-first), the first allocator settings, the annotations marked with the rank.
func (p *picklePart) keep(r *analysis.RankData) {
	for _, g := range r.Segs {
		g.Device = int64(r.Rank - p.first)
		p.segments = append(p.segments, g)
	}
	if p.settings == nil && r.Snap.Has&snapshot.SnapAllocatorSettings != 0 {
		p.settings = r.Snap.AllocatorSettings
	}
	if l, ok := r.Snap.ExternalAnnotations.(*snapshot.List); ok {
		for _, a := range l.Items {
			if d, ok := a.(*snapshot.Dict); ok {
				c := &snapshot.Dict{Items: append([]snapshot.Item(nil), d.Items...)}
				c.Set("rank", int64(r.Rank))
				a = c
			}
			p.annots = append(p.annots, a)
		}
	}
}

// pad writes empty traces up to rank (exclusive).
func (p *picklePart) pad(rank int) error {
	for ; p.next < rank; p.next++ {
		if err := p.w.Trace(nil, 0); err != nil {
			return err
		}
	}
	return nil
}

// close pads the current part up to rank end (exclusive) and finishes it.
func (pp *PickleParts) close(end int) error {
	p := pp.cur
	if err := p.pad(end); err != nil {
		return err
	}
	var annotations snapshot.Value
	if p.annots != nil {
		annotations = &snapshot.List{Items: p.annots}
	}
	if err := p.w.Finish(p.segments, p.settings, annotations, nil); err != nil {
		return fmt.Errorf("merge: writing the merged pickle: %w", err)
	}
	st, err := p.out.F.Stat()
	if err != nil {
		return fmt.Errorf("merge: %w", err)
	}
	if err := p.out.F.Close(); err != nil {
		return fmt.Errorf("merge: writing the merged pickle: %w", err)
	}
	p.size, p.segments, p.annots, p.cost = st.Size(), nil, nil, nil
	pp.done = append(pp.done, p)
	pp.cur = nil
	return nil
}

// Finish closes the last part at the world's end; with no rank written, it
// writes one pickle of empty traces.
func (pp *PickleParts) Finish(world int) error {
	if pp.cur == nil && len(pp.done) == 0 {
		if err := pp.open(0); err != nil {
			return err
		}
	}
	if pp.cur != nil {
		return pp.close(max(world, pp.cur.next))
	}
	return nil
}

// Abort closes any part left open.
func (pp *PickleParts) Abort() {
	if pp.cur != nil {
		pp.cur.out.F.Close()
	}
}

// Outputs names the finished parts: one part alone is the plain merged pickle
// (kind OutPickle, key plain); several are named by the part template.
func (pp *PickleParts) Outputs(plain, base, partName string) []publish.Output {
	var out []publish.Output
	for _, p := range pp.done {
		o := publish.Output{Kind: publish.OutPickle, Key: plain, File: p.path, Sum: p.out.Sum()}
		if len(pp.done) > 1 {
			suffix := renderPartName(partName, p.first, p.next-1)
			o.Kind, o.Key = publish.OutPickle+suffix, base+suffix+publish.OutSuffix[publish.OutPickle]
		}
		o.Part = &analysis.PicklePart{Name: o.Key, FirstRank: p.first, LastRank: p.next - 1, Ranks: analysis.RankRanges(p.ranks), Bytes: p.size, OverCap: p.overCap}
		out = append(out, o)
	}
	return out
}
