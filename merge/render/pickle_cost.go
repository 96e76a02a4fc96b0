package render

import (
	"slices"

	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// pickleCost bounds from above what snapshot.Writer writes for a part's ranks, so
// a part can be closed before it outgrows its cap. Every bound assumes the longest
// form the encoder uses: 5 bytes for a memo reference, 10 for an integer, a
// string's bytes plus 6 the first time the part writes it; frames (memoised by
// identity) and strings (by value) are counted in full only the first time.
type pickleCost struct {
	strs    map[string]struct{}
	frames  map[*snapshot.Frame]struct{}
	objs    map[any]struct{}
	newStrs map[string]struct{}
	newFr   map[*snapshot.Frame]struct{}
	newObjs map[any]struct{}
	settled bool // the part has its allocator settings
	pendSet bool

	// Shortcuts that give the same bound with fewer map lookups, valid within one
	// rank call: the frames list counted last, when it held no nil frame (every
	// frame of it is then counted as written, so an equal list costs a reference
	// per frame, as the encoder writes it), and the strings counted last (each is
	// then counted as written). Consecutive entries mostly repeat both.
	lastFr []*snapshot.Frame
	recent [8]string
	nRecent,
	nextR int
	slow bool // no shortcuts (tests check the shortcuts change nothing)
}

const (
	refCost        = 5    // LONG_BINGET
	intCost        = 10   // LONG1 of 8 bytes
	dictCost       = 3    // EMPTY_DICT, MARK, SETITEMS
	memoCost       = 1    // MEMOIZE
	emptyTraceCost = 3    // EMPTY_LIST, and APPENDS+MARK every 1000 traces
	pickleOverhead = 4096 // the header, the top-level keys and every field name's first write
	batchCost      = 2    // MARK and APPENDS/SETITEMS per 1000 items
)

func newPickleCost() *pickleCost {
	return &pickleCost{strs: map[string]struct{}{}, frames: map[*snapshot.Frame]struct{}{}, objs: map[any]struct{}{}}
}

// rank bounds rank r's contribution: its trace (written now), and what the part
// writes at its end for it (tail): its segments, its annotations and (for the
// part's first rank that has them) the allocator settings; both with the frame
// headers (9 bytes every 64 KiB) on top. Nothing is counted as written until
// commit.
func (c *pickleCost) rank(r *analysis.RankData, trace []*snapshot.TraceEntry) (tr, tail int64) {
	c.newStrs, c.newFr, c.newObjs, c.pendSet = map[string]struct{}{}, map[*snapshot.Frame]struct{}{}, map[any]struct{}{}, false
	c.lastFr, c.nRecent, c.nextR = nil, 0, 0
	n := emptyTraceCost + listCost(len(trace))
	for _, e := range trace {
		n += c.entry(e)
	}
	tr, n = n+n>>12+9, 0
	n += listCost(len(r.Segs))
	for _, g := range r.Segs {
		n += c.segment(g)
	}
	if !c.settled && r.Snap.Has&snapshot.SnapAllocatorSettings != 0 {
		n += c.value(r.Snap.AllocatorSettings, 0)
		c.pendSet = true
	}
	if l, ok := r.Snap.ExternalAnnotations.(*snapshot.List); ok {
		for _, a := range l.Items {
			n += c.value(a, 0) + c.str("rank") + intCost + batchCost + dictCost + memoCost
		}
	}
	return tr, n + n>>12 + 9
}

// commit counts what the last rank call saw as written.
func (c *pickleCost) commit() {
	for s := range c.newStrs {
		c.strs[s] = struct{}{}
	}
	for f := range c.newFr {
		c.frames[f] = struct{}{}
	}
	for o := range c.newObjs {
		c.objs[o] = struct{}{}
	}
	c.settled = c.settled || c.pendSet
}

func listCost(n int) int64 { return 1 + batchCost*int64(n/1000+1) }

func (c *pickleCost) str(s string) int64 {
	for i := 0; i < c.nRecent; i++ {
		if c.recent[i] == s {
			return refCost
		}
	}
	if !c.slow {
		c.recent[c.nextR] = s
		c.nextR = (c.nextR + 1) % len(c.recent)
		c.nRecent = max(c.nRecent, c.nextR)
	}
	if _, ok := c.strs[s]; ok {
		return refCost
	}
	if _, ok := c.newStrs[s]; ok {
		return refCost
	}
	c.newStrs[s] = struct{}{}
	return int64(len(s)) + 6
}

func (c *pickleCost) entry(e *snapshot.TraceEntry) int64 {
	n := int64(dictCost) + refCost*int64(9+len(e.Extra)) + 5*intCost
	n += c.str(e.Action) + c.str(e.CompileContext) + c.str(e.UserMetadata)
	n += c.frameList(e.Frames) + c.extras(e.Extra)
	return n
}

func (c *pickleCost) frameList(fs []*snapshot.Frame) int64 {
	n := listCost(len(fs))
	if len(fs) > 0 && slices.Equal(fs, c.lastFr) {
		return n + refCost*int64(len(fs))
	}
	whole := true
	for _, f := range fs {
		n += c.frame(f)
		whole = whole && f != nil
	}
	if whole && !c.slow {
		c.lastFr = fs
	}
	return n
}

func (c *pickleCost) frame(f *snapshot.Frame) int64 {
	if f == nil {
		return 1
	}
	if _, ok := c.frames[f]; ok {
		return refCost
	}
	if _, ok := c.newFr[f]; ok {
		return refCost
	}
	c.newFr[f] = struct{}{}
	return dictCost + 1 + memoCost + refCost*int64(3+len(f.Extra)) + c.str(f.Name) + c.str(f.Filename) + intCost + c.extras(f.Extra)
}

func (c *pickleCost) segment(g *snapshot.Segment) int64 {
	n := int64(dictCost) + refCost*int64(12+len(g.Extra)) + 7*intCost + 1
	n += c.str(g.SegmentType) + c.value(g.SegmentPoolID, 0) + c.frameList(g.Frames) + c.extras(g.Extra)
	n += listCost(len(g.Blocks))
	for _, b := range g.Blocks {
		n += dictCost + refCost*int64(5+len(b.Extra)) + 3*intCost + c.str(b.State) + c.frameList(b.Frames) + c.extras(b.Extra)
	}
	return n
}

func (c *pickleCost) extras(x []snapshot.Item) int64 {
	var n int64
	for _, it := range x {
		n += c.value(it.Key, 0) + c.value(it.Value, 0)
	}
	if len(x) > 0 {
		n += batchCost * int64(len(x)/1000+1)
	}
	return n
}

// value bounds a generic value; containers already counted are a reference.
func (c *pickleCost) value(v snapshot.Value, depth int) int64 {
	if depth > 600 {
		return 0 // the encoder refuses values this deep
	}
	switch x := v.(type) {
	case nil, bool:
		return 1
	case int64, int:
		return intCost
	case float64:
		return 9
	case string:
		return c.str(x)
	case *snapshot.Frame:
		return c.frame(x)
	case *snapshot.TraceEntry:
		return c.entry(x)
	case *snapshot.Segment:
		return c.segment(x)
	case snapshot.Tuple:
		if len(x) == 0 {
			return 1
		}
		return c.container(&x[0], len(x), func(i int) int64 { return c.value(x[i], depth+1) })
	case *snapshot.List:
		return c.container(x, len(x.Items), func(i int) int64 { return c.value(x.Items[i], depth+1) })
	case *snapshot.Dict:
		return c.container(x, len(x.Items), func(i int) int64 {
			return c.value(x.Items[i].Key, depth+1) + c.value(x.Items[i].Value, depth+1)
		})
	}
	return 64 // a type the encoder refuses
}

func (c *pickleCost) container(id any, n int, item func(i int) int64) int64 {
	if _, ok := c.objs[id]; ok {
		return refCost
	}
	if _, ok := c.newObjs[id]; ok {
		return refCost
	}
	c.newObjs[id] = struct{}{}
	total := int64(dictCost+memoCost) + batchCost*int64(n/1000+1)
	for i := 0; i < n; i++ {
		total += item(i)
	}
	return total
}
