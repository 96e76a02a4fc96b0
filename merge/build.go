package merge

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/render"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// traceBudget is about how many counter points the trace holds for all ranks
// together: each rank gets its share, between 250 and CurvePoints.
const traceBudget = 500_000

// builder writes the merged outputs into temporary files, one rank at a time.
type builder struct {
	cfg     *Config
	turns   []chan struct{} // the first pass: closed when input i may be decoded (decodeTurn)
	tmp     string
	files   map[string]*render.OutFile // the outputs after the pickles
	in      *render.Interner
	pickles *render.PickleParts
	tw      *render.TraceWriter
	pbw     *render.PBWriter
	pbDone  chan struct{} // closed when the rank being written into the timeline is written; nil when none is

	inputs      []Input // the inputs the cut keeps, in rank order
	ranks       []*render.Rank
	byRank      map[int]*rankEntry
	inputOf     map[int]int // rank -> index in inputs
	refs        []publish.InputRef
	nextRank    int // one past the last rank merged
	worldMeta   int
	tracePoints int

	decoded, fromAnalyses []int
	// deferred: no rank's detail is written in the first pass (a progressive
	// merge writes every detail after its answer)
	deferred bool
	// keys are the names the merge publishes under; plain the window's own, which
	// keys differ from when another attempt claimed them (attemptKeys)
	keys, plain map[string]string
	start       time.Time // when the merge began, after its names were settled
}

// rankEntry is what the merge keeps of a rank once its pass is done: what the
// report draws of it, and its input as the claim records it.
type rankEntry struct {
	*render.Rank
	ref publish.InputRef
}

func newBuilder(cfg *Config, tmp string) (*builder, error) {
	b := &builder{cfg: cfg, tmp: tmp, files: map[string]*render.OutFile{}, in: render.NewInterner(), byRank: map[int]*rankEntry{}, inputOf: map[int]int{},
		pickles: &render.PickleParts{Dir: tmp, Cap: cfg.PickleMaxBytes}}
	for _, k := range fixedOutputs {
		f, err := os.Create(filepath.Join(tmp, k))
		if err != nil {
			b.close()
			return nil, fmt.Errorf("merge: %w", err)
		}
		b.files[k] = &render.OutFile{F: f, H: sha256.New()}
	}
	b.tw = render.NewTraceWriter(b.files[publish.OutTrace])
	b.pbw = render.NewPBWriter(b.files[publish.OutPB], b.in)
	for _, in := range cfg.Inputs {
		if in.Rank < 0 || cfg.Ranks.Has(in.Rank) {
			b.inputs = append(b.inputs, in)
		}
	}
	b.tracePoints = min(analysis.CurvePoints, max(250, traceBudget/max(1, len(b.inputs))))
	return b, nil
}

func (b *builder) close() {
	b.pbWait()
	for _, f := range b.files {
		f.F.Close()
	}
	b.pickles.Abort()
}

// InputError is a merge that failed on one input: the caller can leave that rank
// out and merge again. It wraps the cause (a store error stays one).
type InputError struct {
	Rank   int // -1 for a merged timeline
	Source string
	Err    error
}

func (e *InputError) Error() string { return e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }

// admit checks that a rank may be merged next.
func (b *builder) admit(rank int, source string) error {
	if e, ok := b.byRank[rank]; ok {
		return fmt.Errorf("merge: rank %d is in both %s and %s", rank, e.Summary.Source, source)
	}
	if rank < b.nextRank {
		return fmt.Errorf("merge: rank %d of %s arrives after rank %d; pass one merged file per rank range", rank, source, b.nextRank-1)
	}
	if rank >= sidecar.MaxRanks || (b.cfg.WorldSize > 0 && rank >= b.cfg.WorldSize) {
		return fmt.Errorf("merge: rank %d of %s is outside the world size (%d, at most %d)", rank, source, max(b.cfg.WorldSize, 0), sidecar.MaxRanks)
	}
	return nil
}

// addRank merges one rank's analysis: its line of the summary, its process in the
// trace, its curve for the report.
func (b *builder) addRank(lr *loadedRank, ref publish.InputRef) error {
	if err := b.admit(lr.rank, lr.source); err != nil {
		return err
	}
	b.nextRank = lr.rank + 1
	if lr.meta != nil {
		b.worldMeta = max(b.worldMeta, lr.meta.WorldSize)
	}
	e := &rankEntry{Rank: &render.Rank{Summary: rankSummary(lr), Analysis: lr.a, Shift: lr.shift, Window: lr.w}, ref: ref}
	if _, given := b.cfg.Offsets[lr.rank]; b.cfg.Align == AlignOffsets && !given && (lr.meta == nil || lr.meta.ClockOffsetUS == nil) {
		e.Summary.ClockUnmeasured = true
	}
	if lr.meta != nil {
		e.Marks = lr.meta.Batches
	}
	b.writeTraceRank(lr)
	b.ranks = append(b.ranks, e.Rank)
	b.byRank[lr.rank] = e
	if lr.fromFile {
		b.fromAnalyses = append(b.fromAnalyses, lr.rank)
	}
	b.cfg.Logger.Info("merged rank", "of_rank", lr.rank, "events", lr.a.Events, "peak_allocated", analysis.HumanBytes(lr.a.PeakAllocatedBytes),
		"from_analysis", lr.fromFile, "source", lr.source)
	return nil
}

// rankSummary is a rank's line of the summary: its analysis, aligned, with what
// its metadata adds.
func rankSummary(lr *loadedRank) analysis.RankSummary {
	a, sh := lr.a, lr.shift
	at := func(t int64) int64 {
		if a.Events == 0 {
			return 0
		}
		return t + sh
	}
	s := analysis.RankSummary{Rank: lr.rank, Source: lr.source, Device: a.Device, Events: a.Events, ClockOffsetUS: -sh,
		FirstEventUS: at(a.FirstEventUS), LastEventUS: at(a.LastEventUS), StartAllocatedBytes: a.StartAllocatedBytes,
		PeakAllocatedBytes: a.PeakAllocatedBytes, PeakAllocatedTimeUS: at(a.PeakAllocatedUS), PeakAllocatedBatch: a.PeakBatch,
		PeakAllocatedPhase: a.PeakPhase, PeakReservedBytes: a.PeakReservedBytes, PeakReservedTimeUS: at(a.PeakReservedUS),
		EndAllocatedBytes: a.EndAllocatedBytes, EndReservedBytes: a.EndReservedBytes, AllocatedBeforeRecording: a.BeforeRecording,
		TopSites: a.Sites[:min(analysis.TopSites, len(a.Sites))], OOMs: make([]analysis.OOM, len(a.OOMs)), Note: a.Note,
		Truncated: a.Truncated, Leak: a.Leak, OutsideAllocator: a.Outside, Categories: a.Categories, FreeAtPeak: a.FreeAtPeak, KeptSites: a.KeptSites, ExpandableSegments: a.ExpandableSegments}
	for i, o := range a.OOMs {
		o.TimeUS += sh
		s.OOMs[i] = o
	}
	for _, f := range a.Batches {
		f.StartUS, f.EndUS = f.StartUS+sh, f.EndUS+sh
		s.BatchFigures = append(s.BatchFigures, f)
	}
	if m := lr.meta; m != nil {
		for _, bm := range m.Batches {
			s.Batches = append(s.Batches, bm.Batch)
		}
		for _, x := range m.Samples {
			s.PeakNVMLDeviceUsedBytes = max(s.PeakNVMLDeviceUsedBytes, x.DeviceUsedBytes)
		}
		s.StallUS = m.StallUS
		if s.OutsideAllocator == nil {
			s.OutsideAllocator = analysis.OutsideAllocatorOf(a, m.Samples, m.Batches, lr.w)
		}
	}
	return s
}

// writeTraceRank writes a rank's process: its allocated and reserved counters
// (the analysis's curve, at most tracePoints points), OOMs, batches and NVML
// samples.
func (b *builder) writeTraceRank(lr *loadedRank) {
	tw, r, sh := b.tw, lr.rank, lr.shift
	tw.Process(r)
	lastA, lastR := int64(-1), int64(-1)
	for i, p := range analysis.DownsampleCurve(append(analysis.Curve(nil), lr.a.Curve...), b.tracePoints) {
		if i == 0 || p.A != lastA {
			tw.Counter(r, "allocated", p.T+sh, p.A)
			lastA = p.A
		}
		if i == 0 || p.R != lastR {
			tw.Counter(r, "reserved", p.T+sh, p.R)
			lastR = p.R
		}
	}
	for _, o := range lr.a.OOMs {
		o.TimeUS += sh
		tw.OOM(r, o)
	}
	if lr.meta == nil {
		return
	}
	for _, m := range lr.meta.Batches {
		if !lr.w.Before(m.EndUS) && !lr.w.After(m.StartUS) {
			tw.Batch(r, m, sh)
		}
	}
	for _, m := range lr.meta.Samples {
		if lr.w.Before(m.TimeUS) || lr.w.After(m.TimeUS) {
			continue
		}
		tw.Counter(r, "device used (NVML)", m.TimeUS+sh, m.DeviceUsedBytes)
		if m.ProcessUsedBytes > 0 {
			tw.Counter(r, "process used (NVML)", m.TimeUS+sh, m.ProcessUsedBytes)
		}
	}
}

// addDetail writes a rank's full trace (cut to its window) into the pickles and
// the timeline.
func (b *builder) addDetail(r *analysis.RankData) error {
	e := b.byRank[r.Rank]
	r.ShiftUS = e.Shift
	trace := r.Trace
	if e.Window.Cut() {
		trace = nil
		var tail []*snapshot.TraceEntry
		for _, ev := range r.Trace {
			switch {
			case e.Window.After(ev.TimeUS):
				tail = append(tail, ev)
			case !e.Window.Before(ev.TimeUS):
				trace = append(trace, ev)
			}
		}
		// the segments as the cut's end left them, so a viewer replays the cut
		r.Segs = snapshot.SegmentsBefore(r.Segs, tail)
	}
	for _, ev := range trace {
		b.in.FrameList(ev.Frames)
	}
	for _, g := range r.Segs {
		b.in.FrameList(g.Frames)
		for _, bl := range g.Blocks {
			b.in.FrameList(bl.Frames)
		}
	}
	b.in.Forget()
	b.pbWait()
	done, rc, sum := make(chan struct{}), *r, e.Summary
	b.pbDone = done
	go func() { // the timeline is written while the pickle is: they share nothing but the interned frames, read only
		defer close(done)
		b.pbw.Rank(&rc, trace, sum)
	}()
	if err := b.pickles.Add(r, trace); err != nil {
		return err
	}
	r.Snap, r.Trace, r.Segs = nil, nil, nil // let the decoded rank go (once the timeline has it too)
	return nil
}

// pbWait waits for the rank being written into the timeline.
func (b *builder) pbWait() {
	if b.pbDone != nil {
		<-b.pbDone
		b.pbDone = nil
	}
}

// world is the world size: the configured one, else the largest the ranks'
// metadata names, else the highest rank plus one.
func (b *builder) world() (int, error) {
	world := b.cfg.WorldSize
	if world == 0 {
		world = max(b.worldMeta, b.nextRank)
	}
	if world > sidecar.MaxRanks {
		return 0, fmt.Errorf("merge: world size %d is above the %d ranks a merge takes", world, sidecar.MaxRanks)
	}
	if world < b.nextRank {
		return 0, fmt.Errorf("merge: rank %d is outside world size %d", b.nextRank-1, world)
	}
	return world, nil
}

// finish writes every output and returns the summary and the outputs in the
// order they are stored.
func (b *builder) finish(keys map[string]string) (*analysis.Summary, []publish.Output, error) {
	world, err := b.world()
	if err != nil {
		return nil, nil, err
	}
	if err := b.pickles.Finish(world); err != nil {
		return nil, nil, err
	}
	sum := b.summary(world)
	if err := b.tw.Finish(); err != nil {
		return nil, nil, fmt.Errorf("merge: writing the trace: %w", err)
	}
	b.pbWait()
	b.pbw.Header(b.cfg.Align, world, sum.MissingRanks)
	if err := b.pbw.Finish(); err != nil {
		return nil, nil, fmt.Errorf("merge: writing the timeline: %w", err)
	}
	if err := render.WriteHTML(b.files[publish.OutHTML], b.cfg.Title, sum, b.ranks); err != nil {
		return nil, nil, fmt.Errorf("merge: writing the report: %w", err)
	}
	base := strings.TrimSuffix(keys[publish.OutPickle], publish.OutSuffix[publish.OutPickle])
	outs := b.pickles.Outputs(keys[publish.OutPickle], base, b.cfg.PicklePartName)
	sum.Outputs, sum.Pickles = map[string]string{}, []analysis.PicklePart{}
	for _, o := range outs {
		sum.Pickles = append(sum.Pickles, *o.Part)
	}
	for _, k := range fixedOutputs {
		outs = append(outs, publish.Output{Kind: k, Key: keys[k], File: filepath.Join(b.tmp, k)})
	}
	for _, o := range outs {
		sum.Outputs[o.Kind] = o.Key
	}
	if err := b.writeSummary(sum); err != nil {
		return nil, nil, err
	}
	for i := range outs {
		if f, ok := b.files[outs[i].Kind]; ok {
			outs[i].Sum = f.Sum()
		}
	}
	return sum, outs, nil
}

// summary builds the summary: the ranks, who is missing, the spread and the diffs.
func (b *builder) summary(world int) *analysis.Summary {
	sum := &analysis.Summary{Version: 1, WorldSize: world, Align: b.cfg.Align, ClockOffsetsUS: map[string]int64{}, MissingRanks: []int{},
		Ranks: make([]analysis.RankSummary, len(b.ranks)), Cut: b.cfg.cutInfo()}
	for i, e := range b.ranks {
		sum.Ranks[i] = e.Summary
		sum.RanksMerged = append(sum.RanksMerged, e.Summary.Rank)
		if e.Summary.ClockUnmeasured {
			sum.ClockUnmeasured = append(sum.ClockUnmeasured, e.Summary.Rank)
			continue
		}
		sum.ClockOffsetsUS[strconv.Itoa(e.Summary.Rank)] = e.Summary.ClockOffsetUS
	}
	for r := 0; r < world; r++ {
		if _, ok := b.byRank[r]; !ok && b.cfg.Ranks.Has(r) {
			sum.MissingRanks = append(sum.MissingRanks, r)
		}
	}
	sum.Spread = analysis.ComputeSpread(sum.Ranks)
	sum.MissingReasons = missingReasons(b.cfg, sum)
	if f := b.cfg.Focus; f != nil && f.Rank >= 0 && f.Rank < world {
		sum.Focus = &analysis.Focus{Rank: f.Rank, Why: f.Why, Elsewhere: f.Elsewhere}
	}
	if len(sum.MissingRanks) > 0 {
		b.cfg.Logger.Warn("ranks missing from the merge", "missing", len(sum.MissingRanks), "world_size", world)
	}
	sum.Diff, sum.DiffsAsked = b.diffs(sum)
	return sum
}

func (b *builder) writeSummary(sum *analysis.Summary) error {
	sb, err := json.MarshalIndent(sum, "", "  ")
	if err != nil {
		return err
	}
	if _, err := b.files[publish.OutSummary].Write(append(sb, '\n')); err != nil {
		return err
	}
	for _, k := range fixedOutputs {
		if err := b.files[k].F.Close(); err != nil {
			return fmt.Errorf("merge: writing %s: %w", k, err)
		}
	}
	return nil
}

// diffs builds the summary's diffs: the outlier against the median rank, and each
// rank asked for against the median rank.
func (b *builder) diffs(sum *analysis.Summary) (*analysis.RankDiff, []analysis.RankDiff) {
	if sum.Spread == nil || len(sum.Ranks) < 2 {
		return nil, nil
	}
	side := func(r int) analysis.DiffInput {
		e := b.byRank[r]
		return analysis.DiffInput{Label: fmt.Sprintf("rank %d", r), Source: e.Summary.Source, A: e.Analysis, ShiftUS: e.Shift}
	}
	out := sum.Spread.OutlierRank
	med, ok := analysis.MedianRank(sum.Ranks, sum.Spread, out)
	if !ok {
		return nil, nil
	}
	var asked []analysis.RankDiff
	seen := map[int]bool{}
	for _, r := range b.cfg.DiffRanks {
		if _, ok := b.byRank[r]; ok && r != med && !seen[r] {
			seen[r] = true
			asked = append(asked, *analysis.Diff(side(med), side(r)))
		}
	}
	return analysis.Diff(side(med), side(out)), asked
}

// missingReasons says why each missing rank is missing: the caller's reason, or
// that no input named it.
func missingReasons(cfg *Config, sum *analysis.Summary) map[string]string {
	if len(sum.MissingRanks) == 0 {
		return nil
	}
	out := map[string]string{}
	for _, r := range sum.MissingRanks {
		why := cfg.MissingReasons[r]
		if why == "" {
			why = "no snapshot"
		}
		out[strconv.Itoa(r)] = why
	}
	return out
}
