package merge

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"sync"

	"github.com/memsnap/memsnap/internal/digest"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/render"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// loadedRank is one rank of an input as the first pass hands it on.
type loadedRank struct {
	rank     int
	source   string
	meta     *sidecar.RankMeta
	shift    int64
	w        analysis.Window
	a        *analysis.RankAnalysis
	data     *analysis.RankData // the decoded snapshot, when the rank's detail is written now
	decoded  bool
	fromFile bool // a came from the rank's analysis file
}

// loaded is one input as the first pass read it.
type loaded struct {
	ranks []*loadedRank // one, or several for a .memsnap.pb
	ref   publish.InputRef
	err   error
}

// readAhead is how many inputs the first pass reads ahead of the one it merges,
// at most: reading a rank's metadata and analysis costs little memory (an
// analysis is a few KiB), and at 1,024 ranks a store's latency, paid a few at a
// time, is most of a leader's answer. Decoding stays within Workers of the rank
// merged next (decodeTurn).
func (c *Config) readAhead() int {
	return max(c.Workers, min(32, 4*runtime.GOMAXPROCS(0)))
}

// firstPass reads the inputs, readAhead of them in parallel, and merges them in
// rank order; a snapshot is decoded only within Workers of the input merged next,
// so memory holds at most Workers+1 decoded ranks. Every goroutine it starts has
// ended when it returns.
func (b *builder) firstPass(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	results := make([]chan loaded, len(b.inputs))
	b.turns = make([]chan struct{}, len(b.inputs))
	for i := range results {
		results[i] = make(chan loaded, 1)
		b.turns[i] = make(chan struct{})
	}
	for i := range min(b.cfg.Workers, len(b.turns)) {
		close(b.turns[i])
	}
	sem := make(chan struct{}, b.cfg.readAhead())
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i, in := range b.inputs {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); results[i] <- b.load(ctx, i, in) }()
		}
	}()
	for i := range b.inputs {
		var l loaded
		select {
		case l = <-results[i]:
		case <-ctx.Done():
			return ctx.Err()
		}
		<-sem
		if j := i + b.cfg.Workers; j < len(b.turns) {
			close(b.turns[j])
		}
		if err := b.take(i, l); err != nil {
			return err
		}
	}
	return nil
}

// decodeTurn waits until input i may be decoded: until it is within Workers of
// the input merged next (the first pass merges in order, so the input merged next
// always may, and no decode waits on one that waits for it).
func (b *builder) decodeTurn(ctx context.Context, i int) error {
	if b.turns == nil {
		return nil
	}
	select {
	case <-b.turns[i]:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// take merges what one input held.
func (b *builder) take(i int, l loaded) error {
	if l.err != nil {
		return &InputError{Rank: b.inputs[i].Rank, Source: b.inputs[i].Source, Err: l.err}
	}
	b.refs = append(b.refs, l.ref)
	for _, lr := range l.ranks {
		if !b.cfg.Ranks.Has(lr.rank) {
			continue
		}
		if err := b.addRank(lr, l.ref); err != nil {
			return err
		}
		b.inputOf[lr.rank] = i
		if lr.decoded {
			b.decoded = append(b.decoded, lr.rank)
		}
		if lr.data != nil {
			if err := b.addDetail(lr.data); err != nil {
				return err
			}
		}
	}
	return nil
}

// load reads one input: its sidecar, its analysis (under FromAnalyses) and, when
// there is no usable analysis or the rank's detail is written now, its snapshot.
func (b *builder) load(ctx context.Context, i int, in Input) loaded {
	if isPB(in.Source) {
		if err := b.decodeTurn(ctx, i); err != nil {
			return loaded{err: err}
		}
		return b.loadTimeline(ctx, in)
	}
	l := loaded{ref: publish.InputRef{Rank: in.Rank, Source: in.Source}}
	lr := &loadedRank{rank: in.Rank, source: in.Source}
	var err error
	if lr.meta, l.ref.MetaSHA256, err = in.readMeta(ctx); err != nil {
		return loaded{err: err}
	}
	if b.cfg.FromAnalyses && !b.cfg.timeCut() && in.analysis != nil {
		lr.a = b.readAnalysis(ctx, in, lr.meta)
	}
	if lr.a != nil {
		lr.fromFile = true
		l.ref.Size, l.ref.SHA256 = lr.a.Snapshot.Size, lr.a.Snapshot.SHA256
	}
	if lr.a == nil || (b.cfg.Detail == DetailAll && !b.deferred) {
		if err := b.decodeTurn(ctx, i); err != nil {
			return loaded{err: err}
		}
		rd, ref, err := decodeInput(ctx, in, lr.a)
		if err != nil {
			return loaded{err: err}
		}
		l.ref.Size, l.ref.SHA256 = ref.Size, ref.SHA256
		rd.Meta, lr.data, lr.decoded = lr.meta, rd, true
	}
	if err := b.settle(lr, l.ref); err != nil {
		return loaded{err: err}
	}
	l.ranks = []*loadedRank{lr}
	return l
}

// settle aligns a loaded rank, cuts it and analyses it when it has no analysis
// yet; the decoded snapshot is kept only when its detail is written now.
func (b *builder) settle(lr *loadedRank, ref publish.InputRef) error {
	if d := lr.data; d != nil {
		var t0 int64
		if len(d.Trace) > 0 {
			t0 = d.Trace[0].TimeUS
		}
		lr.shift = b.cfg.shift(lr.rank, lr.meta, t0, len(d.Trace) > 0)
	} else {
		lr.shift = b.cfg.shift(lr.rank, lr.meta, lr.a.TraceStartUS, lr.a.Events > 0)
	}
	var err error
	if lr.w, err = b.cfg.window(lr.rank, lr.meta, lr.shift); err != nil {
		return err
	}
	if lr.a == nil {
		lr.a = lr.data.Analysis(lr.w)
		lr.a.Snapshot = analysis.SnapshotRef{Size: ref.Size, SHA256: ref.SHA256}
	}
	if b.cfg.Detail != DetailAll || b.deferred {
		lr.data = nil
	}
	return nil
}

// decodeInput reads and decodes a rank's snapshot; when the rank has an analysis,
// the snapshot must be the one it analysed.
func decodeInput(ctx context.Context, in Input, a *analysis.RankAnalysis) (*analysis.RankData, analysis.SnapshotRef, error) {
	data, err := in.load(ctx)
	if err != nil {
		return nil, analysis.SnapshotRef{}, fmt.Errorf("merge: reading %s: %w", in.Source, err)
	}
	ref := analysis.SnapshotRef{Size: int64(len(data)), SHA256: digest.SHA256Hex(data)}
	if a != nil && a.Snapshot != ref {
		return nil, ref, fmt.Errorf("merge: %s is not the snapshot its analysis describes (%d bytes, SHA-256 %s; the analysis says %d bytes, %s)",
			in.Source, ref.Size, ref.SHA256, a.Snapshot.Size, a.Snapshot.SHA256)
	}
	s, err := snapshot.DecodeAnyContext(ctx, data)
	if err != nil {
		return nil, ref, fmt.Errorf("merge: %s: %w", in.Source, err)
	}
	return analysis.RankFromSnapshot(s, in.Rank, in.Source), ref, nil
}

// readAnalysis reads and checks a rank's analysis; nil (with the reason logged)
// when there is none or it cannot be used: malformed, another rank's, or computed
// with other batch marks than the sidecar's.
func (b *builder) readAnalysis(ctx context.Context, in Input, meta *sidecar.RankMeta) *analysis.RankAnalysis {
	var a *analysis.RankAnalysis
	var err error
	if in.pre != nil && in.pre.a != nil {
		a = in.pre.a
	} else {
		raw, rerr := in.analysis(ctx)
		if rerr != nil || raw == nil {
			if rerr != nil {
				b.cfg.Logger.Warn("an analysis cannot be read; decoding the snapshot", "source", in.Source, "err", rerr)
			}
			return nil
		}
		a, err = analysis.ParseAnalysis(raw)
	}
	switch {
	case err != nil:
	case a.Rank != in.Rank:
		err = fmt.Errorf("merge: the analysis is of rank %d", a.Rank)
	case !sameMarks(a.Batches, meta):
		err = fmt.Errorf("merge: the analysis was computed with other batch marks than the sidecar's")
	}
	if err != nil {
		b.cfg.Logger.Warn("an analysis is not used; decoding the snapshot", "source", in.Source, "err", err)
		return nil
	}
	return a
}

// sameMarks reports whether an analysis's batches are the sidecar's marks.
func sameMarks(fs []analysis.BatchFigure, meta *sidecar.RankMeta) bool {
	var marks []sidecar.BatchMark
	if meta != nil {
		marks = meta.Batches[:min(len(meta.Batches), analysis.MaxAnalysisBatches)]
	}
	if len(fs) != len(marks) {
		return false
	}
	for i, m := range marks {
		if fs[i].Batch != m.Batch || fs[i].StartUS != m.StartUS || fs[i].EndUS != m.EndUS {
			return false
		}
	}
	return true
}

// readMeta reads and checks an input's sidecar; nil when it has none.
func (in Input) readMeta(ctx context.Context) (*sidecar.RankMeta, string, error) {
	if in.pre != nil && in.pre.meta != nil {
		if m := in.pre.meta; m.Rank != in.Rank {
			return nil, "", fmt.Errorf("merge: %s is rank %d by its name but its metadata says rank %d", in.Source, in.Rank, m.Rank)
		}
		return in.pre.meta, in.pre.metaSHA, nil
	}
	if in.meta == nil {
		return nil, "", nil
	}
	raw, err := in.meta(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("merge: reading the metadata of %s: %w", in.Source, err)
	}
	if raw == nil {
		return nil, "", nil
	}
	m, err := sidecar.ParseRankMeta(raw)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", in.Source, err)
	}
	if m.Rank != in.Rank {
		return nil, "", fmt.Errorf("merge: %s is rank %d by its name but its metadata says rank %d", in.Source, in.Rank, m.Rank)
	}
	return m, digest.SHA256Hex(raw), nil
}

// loadTimeline reads a merged .memsnap.pb: every rank in it is decoded.
func (b *builder) loadTimeline(ctx context.Context, in Input) loaded {
	data, err := in.load(ctx)
	if err != nil {
		return loaded{err: fmt.Errorf("merge: reading %s: %w", in.Source, err)}
	}
	l := loaded{ref: publish.InputRef{Rank: in.Rank, Source: in.Source, Size: int64(len(data)), SHA256: digest.SHA256Hex(data)}}
	ranks, err := render.RanksFromPB(data, in.Source)
	if err != nil {
		return loaded{err: err}
	}
	for _, rd := range ranks {
		lr := &loadedRank{rank: rd.Rank, source: rd.Source, meta: rd.Meta, data: rd, decoded: true}
		if err := b.settle(lr, publish.InputRef{}); err != nil {
			return loaded{err: err}
		}
		lr.a.Snapshot = analysis.SnapshotRef{}
		l.ranks = append(l.ranks, lr)
	}
	return l
}

// detailPass writes, under DetailDiff, the full traces of the ranks the diffs
// compare, decoding each again in rank order.
func (b *builder) detailPass(ctx context.Context) error {
	if b.cfg.Detail != DetailDiff {
		return nil
	}
	for _, r := range b.diffRanks() {
		rd, err := b.decodeAgain(ctx, r)
		if err != nil {
			in := b.inputs[b.inputOf[r]]
			return &InputError{Rank: in.Rank, Source: in.Source, Err: err}
		}
		b.decoded = append(b.decoded, r)
		if err := b.addDetail(rd); err != nil {
			return err
		}
	}
	return nil
}

// decodeAgain decodes rank r's snapshot a second time: it must be the one the
// first pass recorded in the claim.
func (b *builder) decodeAgain(ctx context.Context, r int) (*analysis.RankData, error) {
	in, e := b.inputs[b.inputOf[r]], b.byRank[r]
	if isPB(in.Source) {
		data, err := in.load(ctx)
		if err != nil {
			return nil, fmt.Errorf("merge: reading %s: %w", in.Source, err)
		}
		if digest.SHA256Hex(data) != e.ref.SHA256 {
			return nil, fmt.Errorf("merge: %s changed during the merge", in.Source)
		}
		ranks, err := render.RanksFromPB(data, in.Source)
		if err != nil {
			return nil, err
		}
		for _, rd := range ranks {
			if rd.Rank == r {
				return rd, nil
			}
		}
		return nil, fmt.Errorf("merge: %s no longer holds rank %d", in.Source, r)
	}
	meta, _, err := in.readMeta(ctx)
	if err != nil {
		return nil, err
	}
	rd, _, err := decodeInput(ctx, in, &analysis.RankAnalysis{Snapshot: analysis.SnapshotRef{Size: e.ref.Size, SHA256: e.ref.SHA256}})
	if err != nil {
		return nil, err
	}
	rd.Meta = meta
	return rd, nil
}

// diffRanks are the ranks the diffs compare, in rank order.
func (b *builder) diffRanks() []int {
	sums := make([]analysis.RankSummary, len(b.ranks))
	for i, e := range b.ranks {
		sums[i] = e.Summary
	}
	set := map[int]bool{}
	if sp := analysis.ComputeSpread(sums); sp != nil {
		set[sp.OutlierRank] = true
		if m, ok := analysis.MedianRank(sums, sp, sp.OutlierRank); ok {
			set[m] = true
		}
	}
	for _, r := range b.cfg.DiffRanks {
		if _, ok := b.byRank[r]; ok {
			set[r] = true
		}
	}
	out := make([]int, 0, len(set))
	for r := range set {
		out = append(out, r)
	}
	sort.Ints(out)
	return out
}
