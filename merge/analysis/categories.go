package analysis

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// What the memory is: the hook, told the trainer's model and optimizers
// (memsnap_hook.watch), stores the address range of every parameter, gradient and
// optimizer-state tensor alive at the snapshot, with its module's name, in the
// snapshot under TensorsKey. The analysis assigns each block alive at a moment to
// the category of the watched tensors inside it, when the block is the one that
// still holds them at the snapshot (it was never freed after); the rest by the
// phase of its allocation's stack (a module's forward: activations; backward or
// optimizer: temporaries; the training loop's own code, outside all three: other,
// named by its site: buffers, caches, data on the device, a leak); and what
// nothing says to "unknown" (allocated before recording, or with no Python stack). Two more rules name blocks freed before the snapshot:
// a block at the address of a gradient the hook saw autograd make during the
// window, of its size, allocated in the batch the hook saw it made in, is that
// gradient (the caching allocator hands the same addresses to other blocks of that
// size in other batches: AdamW's temporaries, the next step's gradients); and a
// block with the address, size and
// allocation site of a surviving block that holds watched tensors held them too
// (the caching allocator gives a tensor made every step the same block).

// TensorsKey is the snapshot's key under which the hook stores the watched
// tensors: {"version": 2, "tensors": [[address, bytes, kind, module], ...],
// "gradients_made": [[address, bytes, module, batch], ...]}: the tensors alive at
// the snapshot, and every gradient autograd made during the window with the batch
// it was made in. Version 1 had no gradients_made; the gradients it saw made were
// in tensors, with no batch.
const TensorsKey = "memsnap_tensors"

// Memory categories.
const (
	CatParameters     = "parameters"
	CatGradients      = "gradients"
	CatOptimizerState = "optimizer_state"
	CatActivations    = "activations"
	CatTemporaries    = "temporaries"
	CatOther          = "other"
	CatUnknown        = "unknown"
)

// CategoryText is a category as a sentence says it ("optimizer state", "other
// allocations").
func CategoryText(c string) string {
	if c == CatOther {
		return "other allocations"
	}
	return strings.ReplaceAll(c, "_", " ")
}

// CategoryNames are the categories in the order they are shown.
var CategoryNames = [...]string{CatParameters, CatGradients, CatOptimizerState, CatActivations, CatTemporaries, CatOther, CatUnknown}

const (
	cParams = iota
	cGrads
	cOptim
	cActs
	cTemps
	cOther
	cUnknown
	nCats
)

// Bounds of what is read from a snapshot's watched tensors and what an analysis
// keeps.
const (
	maxWatched      = 1 << 20 // tensors
	maxModuleName   = 512
	analysisModules = 20 // modules named at the peak
	maxParts        = 64 // shares of one block kept apart (by module)
)

// Categories is a rank's memory by category: at its allocated peak, and the most
// each category held at any moment of the window; and the modules that held the
// most at the peak.
type Categories struct {
	// Watched is how many tensors the hook was told of (0: the trainer never
	// called watch, and only the stacks' phases say anything).
	Watched int              `json:"watched_tensors"`
	AtPeak  map[string]int64 `json:"at_peak"`
	Max     map[string]int64 `json:"max"`
	Modules []ModuleBytes    `json:"modules"` // at the peak, most bytes first
}

// ModuleBytes is what one module held in one category.
type ModuleBytes struct {
	Module   string `json:"module"`
	Category string `json:"category"`
	Bytes    int64  `json:"bytes"`
}

// watched is one tensor the hook stored.
type watched struct {
	addr, size int64
	cat        int
	module     string
}

// gradNote is a gradient the hook saw autograd make during the window.
type gradNote struct {
	addr, size int64
	module     string
	batch      int64 // the batch it was made in; -1: not known (version 1)
}

// noteKey finds the gradients made at an address in a batch (-1: any batch).
type noteKey struct{ addr, batch int64 }

// maxNotesAt bounds the gradient sizes kept for one address in one batch.
const maxNotesAt = 8

// indexNotes indexes the gradient notes by address and batch; with no batch
// marks to place allocations in batches, by address alone.
func indexNotes(notes []gradNote, byBatch bool) map[noteKey][]gradNote {
	idx := map[noteKey][]gradNote{}
	for _, g := range notes {
		k := noteKey{g.addr, -1}
		if byBatch {
			k.batch = g.batch
		}
		l := idx[k]
		if len(l) >= maxNotesAt || slices.ContainsFunc(l, func(o gradNote) bool { return o.size == g.size }) {
			continue
		}
		idx[k] = append(l, g)
	}
	return idx
}

// batchSpans are a rank's batch marks in time order, for placing an event in its
// batch; marks out of order, overlapping or absurd leave none.
type batchSpans []sidecar.BatchMark

func spansOf(meta *sidecar.RankMeta) batchSpans {
	if meta == nil || len(meta.Batches) == 0 {
		return nil
	}
	m := meta.Batches
	for i, b := range m {
		if b.EndUS < b.StartUS || (i > 0 && b.StartUS < m[i-1].EndUS) {
			return nil
		}
	}
	return batchSpans(m)
}

// batchAt is the batch whose marks hold t, or -1.
func (s batchSpans) batchAt(t int64) int64 {
	i := sort.Search(len(s), func(i int) bool { return s[i].EndUS >= t })
	if i < len(s) && s[i].StartUS <= t {
		return s[i].Batch
	}
	return -1
}

// watchedTensors reads the hook's tensors from a snapshot's extra keys (nil when
// there are none) and the gradients it saw made, by address. Malformed entries are
// skipped (they come from the trainer's process, but a snapshot is untrusted
// bytes).
func watchedTensors(s *snapshot.Snapshot) ([]watched, []gradNote) {
	var v snapshot.Value
	for _, it := range s.Extra {
		if k, ok := it.Key.(string); ok && k == TensorsKey {
			v = it.Value
		}
	}
	d, ok := v.(*snapshot.Dict)
	if !ok {
		return nil, nil
	}
	var list, made *snapshot.List
	for _, it := range d.Items {
		switch k, _ := it.Key.(string); k {
		case "tensors":
			list, _ = it.Value.(*snapshot.List)
		case "gradients_made":
			made, _ = it.Value.(*snapshot.List)
		}
	}
	if list == nil {
		return nil, nil
	}
	out := readWatched(list)
	var notes []gradNote
	if made == nil { // version 1: the gradients in tensors, made in some batch
		for _, x := range out {
			if x.cat == cGrads {
				notes = append(notes, gradNote{x.addr, x.size, x.module, -1})
			}
		}
	} else {
		for _, x := range made.Items {
			f := fields(x)
			if len(notes) == maxWatched {
				break
			}
			if len(f) < 4 {
				continue
			}
			addr, size, ok := addrRange(f)
			mod, ok1 := f[2].(string)
			batch, ok2 := f[3].(int64)
			if !ok || !ok1 || !ok2 || batch < 0 {
				continue
			}
			notes = append(notes, gradNote{addr, size, cutName(mod), batch})
		}
	}
	return out, notes
}

// addrRange reads an entry's address and size (its first two fields): positive,
// and not wrapping past the address space's end.
func addrRange(f []snapshot.Value) (addr, size int64, ok bool) {
	addr, ok1 := f[0].(int64)
	size, ok2 := f[1].(int64)
	return addr, size, ok1 && ok2 && addr > 0 && size > 0 && addr <= addr+size
}

// fields are the items of a list or tuple (nil for anything else).
func fields(x snapshot.Value) []snapshot.Value {
	switch t := x.(type) {
	case *snapshot.List:
		return t.Items
	case snapshot.Tuple:
		return t
	}
	return nil
}

// readWatched reads the tensors alive at the snapshot, sorted by address, each
// storage once.
func readWatched(list *snapshot.List) []watched {
	var out []watched
	for _, x := range list.Items {
		if len(out) == maxWatched {
			break
		}
		f := fields(x)
		if len(f) < 4 {
			continue
		}
		addr, size, ok := addrRange(f)
		kind, ok1 := f[2].(string)
		mod, ok2 := f[3].(string)
		if !ok || !ok1 || !ok2 {
			continue
		}
		c := -1
		switch kind {
		case "parameter":
			c = cParams
		case "gradient":
			c = cGrads
		case "optimizer_state":
			c = cOptim
		}
		if c < 0 {
			continue
		}
		mod = cutName(mod)
		out = append(out, watched{addr, size, c, mod})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].addr < out[j].addr })
	// one storage named twice (tensors sharing it): the first name counts
	dedup := out[:0]
	for i, x := range out {
		if i > 0 && x.addr == out[i-1].addr {
			continue
		}
		dedup = append(dedup, x)
	}
	return dedup
}

// slot is where the allocator put a block: its address and size, and the
// innermost frame of its allocation (frames are shared by identity).
type slot struct {
	addr, size int64
	frame      *snapshot.Frame
}

func slotOf(e *snapshot.TraceEntry) slot {
	s := slot{addr: e.Addr, size: e.Size}
	if len(e.Frames) > 0 {
		s.frame = e.Frames[0]
	}
	return s
}

// part is a share of a block: bytes of one category, held by one module.
type part struct {
	cat    int
	module string
	bytes  int64
}

// inBlock returns the watched tensors' bytes inside [addr, addr+size), by
// category and module, and the bytes left over.
func inBlock(ws []watched, addr, size int64) ([]part, int64) {
	i := sort.Search(len(ws), func(i int) bool { return ws[i].addr >= addr })
	var parts []part
	left := size
	for ; i < len(ws) && ws[i].addr < addr+size && left > 0; i++ {
		n := min(ws[i].size, addr+size-ws[i].addr, left)
		parts = append(parts, part{ws[i].cat, ws[i].module, n})
		left -= n
	}
	if len(parts) > maxParts { // a block holding very many tensors: the rest by category
		var rest [nCats]int64
		for _, p := range parts[maxParts-nCats:] {
			rest[p.cat] += p.bytes
		}
		parts = parts[:maxParts-nCats]
		for c, n := range rest {
			if n > 0 {
				parts = append(parts, part{c, "(other modules)", n})
			}
		}
	}
	// one tensor at the block's start: the allocator's rounding is its too
	if len(parts) == 1 && ws[i-1].addr == addr && left > 0 && left <= roundingSlack(size-left) {
		parts[0].bytes += left
		left = 0
	}
	return parts, left
}

// roundingSlack is how much larger than a tensor the block holding it may be
// (the caching allocator rounds sizes up and may not split a block's tail).
func roundingSlack(n int64) int64 {
	return max(512, min(n/8, 2<<20))
}

// phaseCache remembers the category of the stacks seen last: consecutive
// allocations mostly share their stack (the same frames, by identity).
type phaseCache struct {
	recent [8]struct {
		frames []*snapshot.Frame
		cat    int
		mod    string
	}
	next  int
	kinds map[*snapshot.Frame]uint8
	names map[*snapshot.Frame]string
}

// Kinds of a frame, for phaseCache.
const (
	fkOptimizer = 1 << iota
	fkBackward
	fkPython
	fkForward // a forward frame of the user's code
	fkTorchForward
	fkKnown
)

func (c *phaseCache) kind(f *snapshot.Frame) uint8 {
	if k, ok := c.kinds[f]; ok {
		return k
	}
	k := uint8(fkKnown)
	switch {
	case isOptimizerFrame(f):
		k |= fkOptimizer
	case isBackwardFrame(f):
		k |= fkBackward
	}
	if strings.HasSuffix(f.Filename, ".py") {
		k |= fkPython
	}
	if f.Name == "forward" {
		if strings.Contains(f.Filename, "torch/") {
			k |= fkTorchForward
		} else {
			k |= fkForward
		}
	}
	if c.kinds == nil {
		c.kinds = map[*snapshot.Frame]uint8{}
	}
	c.kinds[f] = k
	return k
}

// classify is the category of a recorded block that holds no watched tensor, by
// its allocation's stack (see stackPhase), with what made it: for activations the
// module whose forward made it (the innermost forward frame outside torch itself,
// the user's module, else the innermost one); for a block the training loop made
// outside any forward, backward or optimizer step (a buffer, a cache, data moved
// to the device), the site that made it: the innermost Python frame outside torch.
// Each frame is classified once.
func (c *phaseCache) classify(frames []*snapshot.Frame) (int, string) {
	python := false
	var fwd, torchFwd, site *snapshot.Frame
	for _, f := range frames {
		if f == nil {
			continue
		}
		k := c.kind(f)
		switch {
		case k&fkOptimizer != 0, k&fkBackward != 0:
			return cTemps, ""
		}
		python = python || k&fkPython != 0
		if k&fkForward != 0 && fwd == nil {
			fwd = f
		}
		if k&fkTorchForward != 0 && torchFwd == nil {
			torchFwd = f
		}
		if k&fkPython != 0 && site == nil && !strings.Contains(f.Filename, "torch/") {
			site = f
		}
	}
	if !python {
		return cUnknown, ""
	}
	if fwd == nil {
		fwd = torchFwd
	}
	if fwd == nil {
		if site == nil {
			return cOther, ""
		}
		return cOther, c.nameOf(site)
	}
	return cActs, c.nameOf(fwd)
}

// nameOf is frame f as a module's or a site's name, made once.
func (c *phaseCache) nameOf(fwd *snapshot.Frame) string {
	name, ok := c.names[fwd]
	if !ok {
		name = cutName(frameName(fwd))
		if c.names == nil {
			c.names = map[*snapshot.Frame]string{}
		}
		c.names[fwd] = name
	}
	return name
}

func (c *phaseCache) cat(frames []*snapshot.Frame) (int, string) {
	for i := range c.recent {
		r := &c.recent[i]
		if r.frames != nil && len(r.frames) == len(frames) && sameFrames(r.frames, frames) {
			return r.cat, r.mod
		}
	}
	cat, mod := c.classify(frames)
	if len(frames) > 0 {
		r := &c.recent[c.next]
		r.frames, r.cat, r.mod = frames, cat, mod
		c.next = (c.next + 1) % len(c.recent)
	}
	return cat, mod
}

func sameFrames(a, b []*snapshot.Frame) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// cutName makes a module's name valid UTF-8 of at most maxModuleName bytes, cut
// at a character's start, as an analysis file holds it.
func cutName(s string) string { return cutBytes(s, maxModuleName) }

// cutBytes makes s valid UTF-8 of at most n bytes, cut at a character's start.
func cutBytes(s string, n int) string {
	return CutUTF8(strings.ToValidUTF8(s, "\uFFFD"), n)
}

// CutUTF8 cuts s to at most n bytes on a character's boundary.
func CutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func frameName(f *snapshot.Frame) string {
	return fmt.Sprintf("%s (%s:%d)", f.Name, f.Filename, f.Line)
}

// categories replays the trace: the bytes of each category after every event,
// their values at the event peakIdx (-1: before the first event) and their most
// inside w, and the modules at the peak.
func (r *RankData) categories(w Window, peakIdx int, startAllocated int64) *Categories {
	ws, notes := watchedTensors(r.Snap)
	tr := r.Trace
	// the gradients the hook saw made, each matched to blocks allocated at its
	// address in its batch (in the rank's clock; without usable marks, in any)
	spans := spansOf(r.Meta)
	grads := gradIndex{spans: spans, idx: indexNotes(notes, spans != nil)}
	survives := survivors(tr, ws)
	made, slots := watchedSlots(tr, ws, survives)
	sums, early, earlyBytes := earlyShares(r.Segs, ws, made)
	// the rest of what was allocated before recording is unknown
	sums[cUnknown] += max(startAllocated-earlyBytes, 0)

	p := &catReplay{
		ws: ws, survives: survives, slots: slots, grads: grads,
		peakIdx: peakIdx, sums: sums, alive: map[int64]catBlock{},
	}
	c := &Categories{Watched: len(ws), AtPeak: map[string]int64{}, Max: map[string]int64{}}
	p.run(tr, w)
	for k, n := range CategoryNames {
		c.AtPeak[n], c.Max[n] = p.atPeak[k], max(p.maxes[k], p.atPeak[k])
	}
	c.Modules = peakModules(early, p.peakAlive)
	return c
}

// gradIndex finds the gradient the hook saw made that a block allocated during
// the window is, so that blocks freed before the snapshot are named too.
type gradIndex struct {
	spans batchSpans
	idx   map[noteKey][]gradNote
}

// at is the module of the gradient made at e's address, in e's batch, of about
// size bytes.
func (g gradIndex) at(e *snapshot.TraceEntry, size int64) (string, bool) {
	k := noteKey{e.Addr, -1}
	if g.spans != nil {
		if k.batch = g.spans.batchAt(e.TimeUS); k.batch < 0 {
			k.batch = -2 // between batches: made by none
		}
	}
	for _, ks := range [...]noteKey{k, {e.Addr, -1}} { // version 1's notes have no batch
		for _, n := range g.idx[ks] {
			if size >= n.size && size <= n.size+roundingSlack(n.size) {
				return n.module, true
			}
		}
	}
	return "", false
}

// survivors marks which allocations still hold their block at the snapshot
// (never freed after); only watched tensors need it.
func survivors(tr []*snapshot.TraceEntry, ws []watched) []bool {
	survives := make([]bool, len(tr))
	freed := map[int64]bool{}
	for i := len(tr) - 1; i >= 0 && len(ws) > 0; i-- {
		e := tr[i]
		switch e.Action {
		case snapshot.ActionFreeCompleted:
			freed[e.Addr] = true
		case snapshot.ActionAlloc:
			survives[i] = !freed[e.Addr]
			delete(freed, e.Addr)
		}
	}
	return survives
}

// watchedSlots finds the addresses of the surviving blocks a recorded
// allocation made, and the slots of those holding watched tensors.
// A surviving block holding watched tensors also names its slot: an earlier
// block of the same address, size and allocation site (the caching allocator
// hands a tensor made every step, such as a gradient, the same block each
// time) held the same tensors then.
func watchedSlots(tr []*snapshot.TraceEntry, ws []watched, survives []bool) (map[int64]bool, map[slot][]part) {
	made := map[int64]bool{}
	slots := map[slot][]part{}
	for i, e := range tr {
		if len(ws) > 0 && e.Action == snapshot.ActionAlloc && survives[i] {
			made[e.Addr] = true
			if parts, _ := inBlock(ws, e.Addr, e.Size); len(parts) > 0 {
				slots[slotOf(e)] = parts
			}
		}
	}
	return made, slots
}

// earlyShares counts the watched tensors in the blocks alive at the snapshot
// that no recorded allocation made: they were there before recording began.
func earlyShares(segs []*snapshot.Segment, ws []watched, made map[int64]bool) (sums [nCats]int64, early []part, earlyBytes int64) {
	for _, g := range segs {
		if len(ws) == 0 {
			break
		}
		for _, b := range g.Blocks {
			if (b.State != snapshot.BlockActiveAllocated && b.State != snapshot.BlockActivePendingFree) || made[b.Address] {
				continue
			}
			parts, _ := inBlock(ws, b.Address, b.Size)
			for _, p := range parts {
				sums[p.cat] += p.bytes
				earlyBytes += p.bytes
			}
			early = append(early, parts...)
		}
	}
	return sums, early, earlyBytes
}

// catBlock is a block alive during categories' replay, with its shares.
type catBlock struct {
	size  int64
	parts []part // several shares (nil: one, in one)
	one   part
}

// catReplay is the state of categories' replay of the trace: the bytes of each
// category now, the blocks alive, and what the window's most and the peak saw.
type catReplay struct {
	ws       []watched
	survives []bool
	slots    map[slot][]part
	grads    gradIndex
	peakIdx  int

	sums      [nCats]int64
	alive     map[int64]catBlock
	phases    phaseCache
	maxes     [nCats]int64
	atPeak    [nCats]int64
	peakAlive map[int64]catBlock
}

// run replays the trace's allocations and frees, noting the most inside w and
// the state at the peak.
func (p *catReplay) run(tr []*snapshot.TraceEntry, w Window) {
	inside := func(t int64) bool { return !w.Before(t) && !w.After(t) }
	first := true
	for i, e := range tr {
		if first && inside(e.TimeUS) {
			first = false
			p.noteMax()
			if p.peakIdx < 0 { // the peak is the state the window starts in
				p.snap(-1)
			}
		}
		size := max(e.Size, 0) // as Deltas counts it
		switch e.Action {
		case snapshot.ActionAlloc:
			p.alloc(i, e, size)
		case snapshot.ActionFreeCompleted:
			p.free(e, size)
		}
		if inside(e.TimeUS) {
			p.noteMax()
		}
		p.snap(i)
	}
	if p.peakIdx < 0 && p.peakAlive == nil { // no event inside the window
		p.snap(-1)
	}
}

// noteMax raises each category's most to its bytes now.
func (p *catReplay) noteMax() {
	for k := range p.maxes {
		p.maxes[k] = max(p.maxes[k], p.sums[k])
	}
}

// snap keeps the state after event i when it is the peak.
func (p *catReplay) snap(i int) {
	if i == p.peakIdx {
		p.atPeak = p.sums
		p.peakAlive = make(map[int64]catBlock, len(p.alive))
		for k, v := range p.alive {
			p.peakAlive[k] = v
		}
	}
}

// sub takes a block's shares off the sums.
func (p *catReplay) sub(l catBlock) {
	if l.parts == nil {
		p.sums[l.one.cat] -= l.one.bytes
		return
	}
	for _, q := range l.parts {
		p.sums[q.cat] -= q.bytes
	}
}

// alloc adds the block event i allocates, split into its shares.
func (p *catReplay) alloc(i int, e *snapshot.TraceEntry, size int64) {
	if l, ok := p.alive[e.Addr]; ok { // allocated twice: the later wins
		p.sub(l)
	}
	parts, left := p.watchedParts(i, e, size)
	if len(parts) == 0 { // the common case: one share, kept inline
		cat, mod := p.phases.cat(e.Frames)
		p.sums[cat] += left
		p.alive[e.Addr] = catBlock{size: size, one: part{cat, mod, left}}
		return
	}
	if left > 0 {
		cat, mod := p.phases.cat(e.Frames)
		parts = append(parts[:len(parts):len(parts)], part{cat, mod, left})
	}
	for _, q := range parts {
		p.sums[q.cat] += q.bytes
	}
	p.alive[e.Addr] = catBlock{size: size, parts: parts}
}

// watchedParts is what of the block event i allocates holds watched tensors or
// a gradient, and the bytes left for its stack's phase to name.
func (p *catReplay) watchedParts(i int, e *snapshot.TraceEntry, size int64) ([]part, int64) {
	var parts []part
	left := size
	if p.survives[i] {
		parts, left = inBlock(p.ws, e.Addr, size)
	} else if sp, ok := p.slots[slotOf(e)]; ok {
		parts = sp
		for _, q := range sp {
			left -= q.bytes
		}
	} else if mod, ok := p.grads.at(e, size); ok {
		// a gradient the hook saw autograd make during the window, unless
		// the block was made by a forward pass (an activation reusing it)
		if cat, _ := p.phases.cat(e.Frames); cat != cActs {
			parts, left = []part{{cGrads, mod, size}}, 0
		}
	}
	return parts, left
}

// free takes a freed block off the sums.
func (p *catReplay) free(e *snapshot.TraceEntry, size int64) {
	if l, ok := p.alive[e.Addr]; ok {
		p.sub(l)
		delete(p.alive, e.Addr)
	} else {
		// a block from before recording leaves: nothing watched (those
		// are alive at the snapshot), so it was counted unknown
		p.sums[cUnknown] = max(p.sums[cUnknown]-size, 0)
	}
}

// peakModules are the modules at the peak, most bytes first: the watched
// tensors' modules and the forward frames.
func peakModules(early []part, peakAlive map[int64]catBlock) []ModuleBytes {
	mods := map[[2]string]int64{}
	add := func(p part) {
		if p.module != "" {
			mods[[2]string{p.module, CategoryNames[p.cat]}] += p.bytes
		}
	}
	for _, p := range early {
		add(p)
	}
	for _, l := range peakAlive {
		if l.parts == nil {
			add(l.one)
		}
		for _, p := range l.parts {
			add(p)
		}
	}
	out := []ModuleBytes{}
	for k, n := range mods {
		out = append(out, ModuleBytes{Module: k[0], Category: k[1], Bytes: n})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Bytes != b.Bytes {
			return a.Bytes > b.Bytes
		}
		if a.Module != b.Module {
			return a.Module < b.Module
		}
		return a.Category < b.Category
	})
	if len(out) > analysisModules {
		out = out[:analysisModules]
	}
	return out
}

// check refuses categories an analysis file should not hold.
func (c *Categories) check() error {
	if c.Watched < 0 || len(c.Modules) > analysisModules || len(c.AtPeak) > len(CategoryNames) || len(c.Max) > len(CategoryNames) {
		return fmt.Errorf("categories: %d watched, %d modules", c.Watched, len(c.Modules))
	}
	for _, m := range []map[string]int64{c.AtPeak, c.Max} {
		for k, v := range m {
			if !knownCategory(k) || v < 0 || v > maxPlausibleBytes {
				return fmt.Errorf("categories: %q = %d", k, v)
			}
		}
	}
	for _, m := range c.Modules {
		if len(m.Module) > maxModuleName || !knownCategory(m.Category) || m.Bytes < 0 || m.Bytes > maxPlausibleBytes {
			return fmt.Errorf("categories: module %.40q", m.Module)
		}
	}
	return nil
}

func knownCategory(k string) bool {
	for _, n := range CategoryNames {
		if n == k {
			return true
		}
	}
	return false
}

// Line says the categories at the peak in one line ("parameters 256.0 MiB,
// gradients 32.0 MiB, ..."), the empty ones left out.
// unknownLeads says whether the peak held more unknown bytes than bytes of any
// category that is known.
func (c *Categories) unknownLeads() bool {
	u := c.AtPeak[CatUnknown]
	for _, n := range CategoryNames {
		if n != CatUnknown && c.AtPeak[n] >= u {
			return false
		}
	}
	return u > 0
}

func (c *Categories) Line() string {
	var parts []string
	for _, n := range CategoryNames {
		if v := c.AtPeak[n]; v > 0 {
			parts = append(parts, CategoryText(n)+" "+HumanBytes(v))
		}
	}
	if len(parts) == 0 {
		return "nothing allocated"
	}
	s := strings.Join(parts, ", ")
	if c.Watched == 0 {
		s += " (the trainer did not call memsnap_hook.watch: parameters, gradients and optimizer state are not told apart)"
	}
	return s
}
