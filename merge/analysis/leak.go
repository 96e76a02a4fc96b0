package analysis

import (
	"sort"

	"github.com/memsnap/memsnap/merge/snapshot"
)

// liveBlock is a block still allocated at the end of a rank's window, and the
// batch that allocated it (-1: before the first batch).
type liveBlock struct {
	size   int64
	frames []*snapshot.Frame
	batch  int
}

// liveBlocks replays the rank's trace inside w to find which batch allocated each
// block still live at its end, by address; figs are the batches, in time order.
func (r *RankData) liveBlocks(figs []BatchFigure, w Window) map[int64]liveBlock {
	n := len(figs)
	starts := make([]int64, n)
	for i, f := range figs {
		starts[i] = f.StartUS
	}
	alive := map[int64]liveBlock{}
	for _, e := range r.Trace {
		if w.Before(e.TimeUS) || w.After(e.TimeUS) {
			continue
		}
		switch e.Action {
		case snapshot.ActionAlloc:
			b := sort.Search(n, func(i int) bool { return starts[i] > e.TimeUS }) - 1
			alive[e.Addr] = liveBlock{e.Size, e.Frames, b}
		case snapshot.ActionFreeCompleted:
			delete(alive, e.Addr)
		}
	}
	return alive
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
