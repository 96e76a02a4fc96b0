package analysis

import (
	"sort"

	"github.com/memsnap/memsnap/merge/snapshot"
)

// liveBlock is a block a replay of the trace found allocated: its size (a
// negative size, which is corrupt, counts as nothing), its frames, and the batch
// that allocated it (-1: before the first batch, or no batches known).
type liveBlock struct {
	size   int64
	frames []*snapshot.Frame
	batch  int
}

// aliveAfter replays events (a rank's trace, or the start of it) and returns
// the blocks still allocated after them, by address: an allocation adds one (a
// later one at the same address replaces it), a completed free removes it. Only
// events inside w count. starts are the batches' start times, in order: the
// batch of a block is the last that started before it was allocated.
func aliveAfter(events []*snapshot.TraceEntry, w Window, starts []int64) map[int64]liveBlock {
	alive := map[int64]liveBlock{}
	for _, e := range events {
		if w.Before(e.TimeUS) || w.After(e.TimeUS) {
			continue
		}
		switch e.Action {
		case snapshot.ActionAlloc:
			b := sort.Search(len(starts), func(i int) bool { return starts[i] > e.TimeUS }) - 1
			alive[e.Addr] = liveBlock{max(e.Size, 0), e.Frames, b}
		case snapshot.ActionFreeCompleted:
			delete(alive, e.Addr)
		}
	}
	return alive
}

// liveBlocks is the blocks allocated inside w and still allocated at its end,
// by address, each with the batch that allocated it; figs are the batches, in
// time order.
func (r *RankData) liveBlocks(figs []BatchFigure, w Window) map[int64]liveBlock {
	starts := make([]int64, len(figs))
	for i, f := range figs {
		starts[i] = f.StartUS
	}
	return aliveAfter(r.Trace, w, starts)
}

// addSites names the sites whose blocks outlive their batch in at least half of
// the n batches, the largest first, at most leakSites of them.
func (l *Leak) addSites(alive map[int64]liveBlock, n int) {
	type acc struct {
		LeakSite
		batches map[int]bool
	}
	by := map[string]*acc{}
	for _, x := range alive {
		// allocated inside a batch that a later batch followed: it outlived its batch
		if x.batch < 0 || x.batch >= n-1 {
			continue
		}
		name := siteName(x.frames)
		s := by[name]
		if s == nil {
			s = &acc{LeakSite: LeakSite{Site: name}, batches: map[int]bool{}}
			by[name] = s
		}
		s.Bytes += x.size
		s.Blocks++
		s.batches[x.batch] = true
	}
	for _, s := range by {
		s.Batches = len(s.batches)
		// a site that leaves blocks behind in at least half the batches
		if s.Batches < 2 || 2*s.Batches < n-1 {
			continue
		}
		s.PerBatchBytes = s.Bytes / int64(s.Batches)
		l.Sites = append(l.Sites, s.LeakSite)
	}
	sort.Slice(l.Sites, func(i, j int) bool {
		if l.Sites[i].Bytes != l.Sites[j].Bytes {
			return l.Sites[i].Bytes > l.Sites[j].Bytes
		}
		return l.Sites[i].Site < l.Sites[j].Site
	})
	if len(l.Sites) > leakSites {
		l.Sites = l.Sites[:leakSites]
	}
}
