// Package analysis is what memsnap finds in snapshots: a rank's analysis (its
// peak, the sites and the memory categories at it, its batches, a leak, a
// truncated history), and across ranks the summary that compares them, the
// diff of two ranks and the findings.
package analysis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/memsnap/memsnap/internal/digest"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// AnalysisVersion is the version of RankAnalysis this package writes and reads.
const AnalysisVersion = 1

// Bounds of a rank analysis: what Analyze keeps, and the most ParseAnalysis accepts.
const (
	// CurvePoints is the most points of a rank's allocated/reserved curve an analysis
	// keeps (the maximum of each of as many time buckets, so peaks survive).
	CurvePoints = 2000
	// AnalysisSites is the most allocation sites alive at the peak an analysis names;
	// the rest are summed up in OtherSites.
	AnalysisSites = 100
	// MaxAnalysisBatches is the most batches (and OOMs) an analysis holds.
	MaxAnalysisBatches = 4096
	// MaxAnalysisBytes bounds the size of an analysis file.
	MaxAnalysisBytes = 4 << 20
	// maxSiteName bounds the length of a site's name.
	maxSiteName = 1024
)

// TopSites is how many sites a rank's line of the summary names.
const TopSites = 10

// RankAnalysis is everything the merged summary, the HTML report, the diff and the
// Perfetto trace's counters need from one rank's snapshot: a rank agent computes it
// right after a window (Analyze) and stores it beside the snapshot under
// AnalysisName, so the leader need not decode every rank. Times are the rank's own
// clock (time_us as torch recorded it); the merge aligns them.
type RankAnalysis struct {
	Version int `json:"version"`
	Rank    int `json:"rank"`
	// Snapshot is the size and SHA-256 of the snapshot bytes analysed (as stored).
	Snapshot SnapshotRef `json:"snapshot"`
	Device   int         `json:"device"` // the device trace taken
	Note     string      `json:"note,omitempty"`
	// Events is the number of trace events analysed; TraceStartUS the time of the
	// trace's first event (what --align start subtracts).
	Events       int   `json:"events"`
	TraceStartUS int64 `json:"trace_start_us"`
	FirstEventUS int64 `json:"first_event_us"`
	LastEventUS  int64 `json:"last_event_us"`

	StartAllocatedBytes int64  `json:"start_allocated_bytes"`
	PeakAllocatedBytes  int64  `json:"peak_allocated_bytes"`
	PeakAllocatedUS     int64  `json:"peak_allocated_time_us"`
	PeakBatch           *int64 `json:"peak_allocated_batch,omitempty"`
	// PeakPhase is "forward", "backward" or "optimizer" where the Python stack of the
	// event at the peak (or the nearest earlier event with a stack) shows it.
	PeakPhase         string `json:"peak_phase,omitempty"`
	PeakReservedBytes int64  `json:"peak_reserved_bytes"`
	PeakReservedUS    int64  `json:"peak_reserved_time_us"`
	// FreeAtPeak is the allocator's free memory at the allocated peak.
	FreeAtPeak *Free `json:"free_at_peak,omitempty"`
	// ExpandableSegments: the allocator's segments are expandable ones
	// (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is on).
	ExpandableSegments bool   `json:"expandable_segments,omitempty"`
	EndAllocatedBytes  int64  `json:"end_allocated_bytes"`
	EndReservedBytes   int64  `json:"end_reserved_bytes"`
	BeforeRecording    int64  `json:"allocated_before_recording_bytes"`
	Sites              []Site `json:"sites"`                 // alive at the peak, most bytes first
	OtherSites         *Site  `json:"other_sites,omitempty"` // the sites beyond Sites, together
	// KeptSites are the sites of the blocks allocated inside the window and still
	// allocated at its end, most bytes first (at most KeptSitesMax): what grew.
	KeptSites []Site        `json:"kept_sites,omitempty"`
	OOMs      []OOM         `json:"ooms"`
	Batches   []BatchFigure `json:"batches,omitempty"`
	Curve     Curve         `json:"curve"`
	// Truncated is set when the history reached its cap and lost its oldest
	// events; Leak when allocated bytes grow from batch to batch.
	Truncated *Truncation `json:"truncated,omitempty"`
	Leak      *Leak       `json:"leak,omitempty"`
	// Outside is device memory in use beyond the allocator's reserved bytes, from
	// the NVML samples in the window (nil without samples).
	Outside *OutsideAllocator `json:"outside_allocator,omitempty"`
	// Categories is the memory by category (parameters, gradients, optimizer
	// state, activations, temporaries, unknown) at the peak and at most, and the
	// modules holding the most at the peak; nil without a trace.
	Categories *Categories `json:"categories,omitempty"`
}

// SnapshotRef is a snapshot's size and SHA-256.
type SnapshotRef struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// BatchFigure is a rank's allocated bytes at the start and end of one batch, and
// its peak inside it.
type BatchFigure struct {
	Batch               int64 `json:"batch"`
	StartUS             int64 `json:"start_us"`
	EndUS               int64 `json:"end_us"`
	StartAllocatedBytes int64 `json:"start_allocated_bytes"`
	EndAllocatedBytes   int64 `json:"end_allocated_bytes"`
	PeakAllocatedBytes  int64 `json:"peak_allocated_bytes"`
}

// AnalyzeOptions tune Analyze.
type AnalyzeOptions struct {
	// Rank is the rank analysed; -1 takes it from the metadata (0 without).
	Rank int
	// From and To, when not nil, restrict the analysis to events at or after From
	// and at or before To (the rank's own clock).
	From, To *int64
}

// AnalysisName returns the name of a snapshot's analysis: X.pickle (also .gz,
// .zst) becomes X.analysis.json, beside X.memsnap.json.
func AnalysisName(snapshotName string) string {
	n := strings.TrimSuffix(strings.TrimSuffix(snapshotName, ".gz"), ".zst")
	return strings.TrimSuffix(n, ".pickle") + ".analysis.json"
}

// Analyze decodes one rank's snapshot (a torch pickle, plain, gzip or zstd) and
// analyses it with the rank's metadata (its batch marks; nil when there is none).
// The analysis records data's size and SHA-256.
func Analyze(ctx context.Context, data []byte, meta *sidecar.RankMeta, opts AnalyzeOptions) (*RankAnalysis, error) {
	s, err := snapshot.DecodeAnyContext(ctx, data)
	if err != nil {
		return nil, fmt.Errorf("merge: analysing a snapshot: %w", err)
	}
	a, err := AnalyzeSnapshot(ctx, s, meta, opts)
	if err != nil {
		return nil, err
	}
	a.Snapshot = SnapshotRef{Size: int64(len(data)), SHA256: digest.SHA256Hex(data)}
	return a, nil
}

// AnalyzeSnapshot analyses a decoded snapshot; see Analyze. The result's Snapshot
// reference is left empty.
func AnalyzeSnapshot(ctx context.Context, s *snapshot.Snapshot, meta *sidecar.RankMeta, opts AnalyzeOptions) (*RankAnalysis, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rank := opts.Rank
	if rank < 0 {
		rank = 0
		if meta != nil {
			rank = meta.Rank
		}
	}
	if rank >= sidecar.MaxRanks {
		return nil, fmt.Errorf("merge: rank %d (at most %d)", rank, sidecar.MaxRanks-1)
	}
	r := RankFromSnapshot(s, rank, "")
	r.Meta = meta
	return r.Analysis(Window{From: opts.From, To: opts.To}), nil
}

// RankFromSnapshot picks a snapshot's device trace and its segments.
func RankFromSnapshot(s *snapshot.Snapshot, rank int, source string) *RankData {
	r := &RankData{Rank: rank, Source: source, Snap: s}
	r.Device, r.note = pickDevice(s)
	if r.Device < len(s.DeviceTraces) {
		r.Trace = s.DeviceTraces[r.Device]
	}
	for _, g := range s.Segments {
		if int(g.Device) == r.Device {
			r.Segs = append(r.Segs, g)
		}
	}
	return r
}

// Window is a cut of a rank's trace in its own clock; nil ends are open.
type Window struct{ From, To *int64 }

// Before reports whether t is before the window; After whether it is after it;
// Cut whether the window cuts the trace at all.
func (w Window) Before(t int64) bool { return w.From != nil && t < *w.From }
func (w Window) After(t int64) bool  { return w.To != nil && t > *w.To }
func (w Window) Cut() bool           { return w.From != nil || w.To != nil }

// Analysis computes the rank's analysis over the events inside w.
func (r *RankData) Analysis(w Window) *RankAnalysis {
	a := &RankAnalysis{Version: AnalysisVersion, Rank: r.Rank, Device: r.Device, Note: r.note, Sites: []Site{}, OOMs: []OOM{}}
	endA, endR := r.Snap.AllocatedOrPendingAtEnd(r.Device), r.Snap.ReservedAtEnd(r.Device)
	var netA, netR int64
	for _, e := range r.Trace {
		dA, dR := Deltas(e)
		netA, netR = netA+dA, netR+dR
	}
	if len(r.Trace) > 0 {
		a.TraceStartUS = r.Trace[0].TimeUS
	}
	hist := newHistory(len(r.Trace), endA-netA)
	peakIdx, freeAt := r.walk(a, w, endA-netA, endR-netR, hist)
	if endA-netA < 0 || endR-netR < 0 {
		a.FreeAtPeak = nil // the segments do not hold what the trace made: no free memory is told from them
	}
	r.freeAt(a, freeAt)
	if !w.Cut() {
		a.EndAllocatedBytes, a.EndReservedBytes = endA, endR
	}
	if r.Meta != nil {
		if b, ok := r.Meta.BatchAt(a.PeakAllocatedUS); ok {
			a.PeakBatch = &b
		}
		a.Batches = hist.batchFigures(r.Meta.Batches, w)
		a.Truncated = r.Truncation()
		a.Leak = r.leak(a.Batches, w)
	}
	sites, tracked := r.sitesAt(peakIdx)
	a.BeforeRecording = a.PeakAllocatedBytes - tracked
	if peakIdx < 0 {
		sites, a.BeforeRecording = nil, a.PeakAllocatedBytes // nothing recorded is alive yet
	}
	a.Sites, a.OtherSites = splitSites(sites, AnalysisSites)
	a.KeptSites = r.keptSites(w)
	a.PeakPhase = peakPhase(r.Trace, peakIdx)
	if len(r.Trace) > 0 {
		a.Categories = r.categories(w, peakIdx, endA-netA)
	}
	if r.Meta != nil {
		a.Outside = OutsideAllocatorOf(a, r.Meta.Samples, r.Meta.Batches, w)
	}
	a.Curve = DownsampleCurve(a.Curve, CurvePoints)
	if cap(a.Curve) > 2*len(a.Curve)+64 { // a short curve of a long trace: keep only its points
		a.Curve = slices.Clone(a.Curve)
	}
	return a
}

// walk replays the trace from the allocated and reserved bytes before it, filling
// a's peaks, curve, OOMs and event range for the events inside w, and hist with
// the allocated bytes after every event. It returns the index of the event at the
// allocated peak (-1: the peak is the state before the first event inside w), and
// the events after which the free memory is measured: at the peak, then at each OOM.
func (r *RankData) walk(a *RankAnalysis, w Window, alloc, res int64, hist *history) (int, []int) {
	peakIdx, started := -1, false
	var oomAt []int
	freeIdx := -1 // the event after which the free memory at the peak is
	made := a.Curve == nil && len(r.Trace) > 0
	if made { // a point per event at most, and the first
		a.Curve = make(Curve, 0, len(r.Trace)+1)
	}
	for i, e := range r.Trace {
		t := e.TimeUS
		dA, dR := Deltas(e)
		if w.Before(t) {
			alloc, res = alloc+dA, res+dR
		}
		if w.Before(t) || w.After(t) {
			hist.add(t, alloc)
			continue
		}
		if !started {
			started = true
			a.FirstEventUS, a.StartAllocatedBytes = t, alloc
			a.PeakAllocatedBytes, a.PeakAllocatedUS, a.PeakReservedBytes, a.PeakReservedUS = alloc, t, res, t
			a.FreeAtPeak = &Free{ReservedBytes: res, FreeBytes: res - alloc}
			freeIdx = i - 1
			a.Curve = append(a.Curve, CurvePoint{t, alloc, res})
		}
		a.Events++
		a.LastEventUS = t
		if e.Action == snapshot.ActionOOM {
			a.OOMs = append(a.OOMs, oomOf(t, e.Size, e.DeviceFree, alloc, res))
			oomAt = append(oomAt, i)
			hist.add(t, alloc)
			continue
		}
		alloc, res = alloc+dA, res+dR
		hist.add(t, alloc)
		if dA == 0 && dR == 0 {
			continue
		}
		if alloc > a.PeakAllocatedBytes {
			a.PeakAllocatedBytes, a.PeakAllocatedUS, peakIdx, freeIdx = alloc, t, i, i
			a.FreeAtPeak = &Free{ReservedBytes: res, FreeBytes: res - alloc}
		}
		if res > a.PeakReservedBytes {
			a.PeakReservedBytes, a.PeakReservedUS = res, t
		}
		a.Curve = append(a.Curve, CurvePoint{t, alloc, res})
	}
	if !started {
		a.StartAllocatedBytes, a.PeakAllocatedBytes, a.PeakReservedBytes = alloc, alloc, res
		if made {
			a.Curve = nil
		}
	}
	a.EndAllocatedBytes, a.EndReservedBytes = alloc, res
	return peakIdx, append([]int{freeIdx}, oomAt...)
}

// freeAt adds the largest free block at the allocated peak and at the OOMs (after
// the events at: the peak's, then the OOMs') where the segments tell it.
//
// Figures that cannot be (more allocated than reserved, a free block larger
// than all that is free: a damaged snapshot) are left out rather than told.
func (r *RankData) freeAt(a *RankAnalysis, at []int) {
	for _, g := range r.Segs {
		a.ExpandableSegments = a.ExpandableSegments || g.IsExpandable
	}
	f := a.FreeAtPeak
	if f == nil {
		return
	}
	if f.FreeBytes < 0 || f.ReservedBytes < 0 {
		a.FreeAtPeak = nil
		return
	}
	largest, ok := r.largestFree(at)
	if !ok {
		return
	}
	if largest[0] <= f.FreeBytes {
		f.LargestFreeBlockBytes = &largest[0]
	}
	for i := range a.OOMs {
		if o := &a.OOMs[i]; largest[i+1] <= o.ReservedThen-o.AllocatedThen && plausibleSize(&largest[i+1]) {
			o.LargestFreeBlock = &largest[i+1]
		}
	}
}

// sitesAt replays the trace up to event idx and groups the blocks alive then by
// allocation site, most bytes first. It also returns the bytes those blocks hold
// (what is allocated at idx less what was allocated before recording began).
func (r *RankData) sitesAt(idx int) ([]Site, int64) {
	sites := bySite(aliveAfter(r.Trace[:max(min(idx+1, len(r.Trace)), 0)], Window{}, nil))
	var tracked int64
	for _, s := range sites {
		tracked += s.Bytes
	}
	return sites, tracked
}

// bySite groups blocks by their allocation site, most bytes first.
func bySite(blocks map[int64]liveBlock) []Site {
	by := map[string]*Site{}
	for _, b := range blocks {
		name := siteName(b.frames)
		st := by[name]
		if st == nil {
			st = &Site{Site: name}
			by[name] = st
		}
		st.Bytes += b.size
		st.Blocks++
	}
	out := make([]Site, 0, len(by))
	for _, st := range by {
		out = append(out, *st)
	}
	sortSites(out)
	return out
}

// KeptSitesMax is the most sites an analysis's KeptSites names.
const KeptSitesMax = 5

// keptSites groups by site the blocks allocated inside w and still allocated at
// its end (what the window added and kept: a leak's blocks), most bytes first.
func (r *RankData) keptSites(w Window) []Site {
	out := bySite(aliveAfter(r.Trace, w, nil))
	return out[:min(len(out), KeptSitesMax)]
}

func sortSites(s []Site) {
	sort.Slice(s, func(i, j int) bool {
		if s[i].Bytes != s[j].Bytes {
			return s[i].Bytes > s[j].Bytes
		}
		return s[i].Site < s[j].Site
	})
}

// otherSitesName names the sites an analysis leaves out, together.
const otherSitesName = "(other sites)"

// splitSites keeps the first n sites and sums up the rest.
func splitSites(s []Site, n int) ([]Site, *Site) {
	if s == nil {
		s = []Site{}
	}
	if len(s) <= n {
		return s, nil
	}
	rest := &Site{Site: otherSitesName}
	for _, x := range s[n:] {
		rest.Bytes += x.Bytes
		rest.Blocks += x.Blocks
	}
	return s[:n:n], rest
}

// history is the allocated bytes after every event of a trace, for the figures of
// each batch.
type history struct {
	a0  int64   // before the first event
	t   []int64 // time of each event, made non-decreasing
	a   []int64 // allocated bytes after each event
	blk []int64 // the largest of a in each block of histBlock events
}

const histBlock = 256

func newHistory(n int, a0 int64) *history {
	return &history{a0: a0, t: make([]int64, 0, n), a: make([]int64, 0, n)}
}

func (h *history) add(t, a int64) {
	if n := len(h.t); n > 0 && t < h.t[n-1] {
		t = h.t[n-1]
	}
	h.t, h.a = append(h.t, t), append(h.a, a)
}

// at is the allocated bytes after the first k events.
func (h *history) at(k int) int64 {
	if k == 0 {
		return h.a0
	}
	return h.a[k-1]
}

// maxIn is the largest allocated bytes after events i to j-1 (i < j).
func (h *history) maxIn(i, j int) int64 {
	if h.blk == nil {
		for k := 0; k < len(h.a); k += histBlock {
			m := h.a[k]
			for _, v := range h.a[k:min(k+histBlock, len(h.a))] {
				m = max(m, v)
			}
			h.blk = append(h.blk, m)
		}
	}
	m := h.a[i]
	for i < j {
		if i%histBlock == 0 && i+histBlock <= j {
			m = max(m, h.blk[i/histBlock])
			i += histBlock
			continue
		}
		m = max(m, h.a[i])
		i++
	}
	return m
}

// batchFigures computes each batch's allocated bytes at its start (after every
// event before it), at its end (after every event up to it) and its peak, for the
// batches (at most MaxAnalysisBatches) that overlap w.
func (h *history) batchFigures(marks []sidecar.BatchMark, w Window) []BatchFigure {
	var out []BatchFigure
	for _, m := range marks {
		if len(out) == MaxAnalysisBatches {
			break
		}
		if w.After(m.StartUS) || w.Before(m.EndUS) {
			continue
		}
		ks := sort.Search(len(h.t), func(i int) bool { return h.t[i] >= m.StartUS })
		ke := sort.Search(len(h.t), func(i int) bool { return h.t[i] > m.EndUS })
		f := BatchFigure{Batch: m.Batch, StartUS: m.StartUS, EndUS: m.EndUS, StartAllocatedBytes: h.at(ks), EndAllocatedBytes: h.at(ke)}
		f.PeakAllocatedBytes = f.StartAllocatedBytes
		if ks < ke {
			f.PeakAllocatedBytes = max(f.PeakAllocatedBytes, h.maxIn(ks, ke))
		}
		out = append(out, f)
	}
	return out
}

// Marshal encodes the analysis as the JSON ParseAnalysis reads.
func (a *RankAnalysis) Marshal() ([]byte, error) {
	b, err := json.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("merge: encoding an analysis: %w", err)
	}
	return b, nil
}

// ParseAnalysis parses an analysis, which comes from a rank and is checked as
// untrusted input: its size, version, rank, every count against the bounds above,
// the checksum's form, a curve whose time never goes backwards, batches that end
// after they start, known phases. Empty lists come back empty, not nil, as
// Analyze makes them.
func ParseAnalysis(b []byte) (*RankAnalysis, error) {
	if len(b) > MaxAnalysisBytes {
		return nil, fmt.Errorf("merge: an analysis of %d bytes (at most %d)", len(b), MaxAnalysisBytes)
	}
	var a RankAnalysis
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("merge: analysis: %w", err)
	}
	if err := a.check(); err != nil {
		return nil, fmt.Errorf("merge: analysis: %w", err)
	}
	if a.Sites == nil {
		a.Sites = []Site{}
	}
	if a.OOMs == nil {
		a.OOMs = []OOM{}
	}
	if len(a.Batches) == 0 {
		a.Batches = nil
	}
	if a.Curve == nil {
		a.Curve = Curve{}
	}
	return &a, nil
}

// maxPlausibleBytes bounds any byte figure of an analysis (64 PiB): sums of a
// few thousand of them cannot overflow.
const maxPlausibleBytes = 1 << 56

func plausibleBytes(n int64) bool { return n >= -maxPlausibleBytes && n <= maxPlausibleBytes }

// oomOf is an OOM as a trace tells it, its figures that cannot be (a corrupt
// trace's negative or huge sizes) left out as zero, as the analysis's reader
// would refuse them.
func oomOf(t, size, deviceFree, alloc, res int64) OOM {
	if size < 0 || !plausibleBytes(size) {
		size = 0
	}
	if res < 0 || !plausibleBytes(res) {
		res = 0
	}
	return OOM{TimeUS: t, Size: size, DeviceFreeB: deviceFree, AllocatedThen: alloc, ReservedThen: res}
}

// plausibleSize: absent, or a size of zero or more that plausibleBytes takes.
func plausibleSize(n *int64) bool { return n == nil || *n >= 0 && plausibleBytes(*n) }

func (a *RankAnalysis) check() error {
	switch {
	case a.Version != AnalysisVersion:
		return fmt.Errorf("version %d is not supported (%d is)", a.Version, AnalysisVersion)
	case a.Rank < 0 || a.Rank >= sidecar.MaxRanks:
		return fmt.Errorf("rank %d", a.Rank)
	case a.Snapshot.Size < 0 || !digest.IsSHA256(a.Snapshot.SHA256):
		return errors.New("the snapshot's size or SHA-256 is malformed")
	case a.Device < 0 || a.Device >= sidecar.MaxRanks || a.Events < 0 || len(a.Note) > maxSiteName:
		return errors.New("a device, event count or note out of range")
	case len(a.Sites) > AnalysisSites || len(a.OOMs) > MaxAnalysisBatches || len(a.Batches) > MaxAnalysisBatches:
		return fmt.Errorf("%d sites, %d OOMs, %d batches", len(a.Sites), len(a.OOMs), len(a.Batches))
	}
	switch a.PeakPhase {
	case "", PhaseForward, PhaseBackward, PhaseOptimizer:
	default:
		return fmt.Errorf("phase %q", a.PeakPhase)
	}
	if len(a.KeptSites) > KeptSitesMax {
		return fmt.Errorf("%d kept sites", len(a.KeptSites))
	}
	for _, s := range slices.Concat(a.Sites, a.KeptSites) {
		if len(s.Site) > maxSiteName || s.Blocks < 0 {
			return errors.New("a site's name is too long or its block count negative")
		}
	}
	for _, o := range a.OOMs {
		if o.Size < 0 || o.ReservedThen < 0 || !plausibleBytes(o.Size) || !plausibleBytes(o.ReservedThen) || !plausibleSize(o.LargestFreeBlock) {
			return errors.New("an OOM's figures are out of range")
		}
	}
	if f := a.FreeAtPeak; f != nil && (f.ReservedBytes < 0 || !plausibleBytes(f.ReservedBytes) || !plausibleBytes(f.FreeBytes) || !plausibleSize(f.LargestFreeBlockBytes)) {
		return errors.New("the free memory at the peak is out of range")
	}
	if o := a.OtherSites; o != nil && (o.Site != otherSitesName || o.Blocks < 0) {
		return errors.New("the other sites are malformed")
	}
	for _, f := range a.Batches {
		if f.EndUS < f.StartUS {
			return fmt.Errorf("batch %d ends before it starts", f.Batch)
		}
	}
	if t := a.Truncated; t != nil && (t.Events < 0 || t.MaxEntries < 0 || t.MissingUS < 0 || t.UnknownFrees < 0 || t.UnknownFreeBytes < 0 || t.SuggestMaxEntries < 0) {
		return errors.New("a truncation with negative figures")
	}
	if o := a.Outside; o != nil && (o.Samples < 0 || o.AtPeakBytes < 0 || o.MaxBytes < 0 ||
		(o.ProcessAtPeakBytes != nil && *o.ProcessAtPeakBytes < 0) || (o.ProcessMaxBytes != nil && *o.ProcessMaxBytes < 0)) {
		return errors.New("memory outside the allocator with negative figures")
	}
	if c := a.Categories; c != nil {
		if err := c.check(); err != nil {
			return err
		}
	}
	if l := a.Leak; l != nil {
		if l.Batches < 0 || len(l.Sites) > leakSites || l.PerBatchBytes < 0 || !plausibleBytes(l.GrowthBytes) || !plausibleBytes(l.PerBatchBytes) {
			return fmt.Errorf("a leak over %d batches naming %d sites, %d bytes a batch", l.Batches, len(l.Sites), l.PerBatchBytes)
		}
		for _, s := range l.Sites {
			if len(s.Site) > maxSiteName || s.Blocks < 0 || s.Batches < 0 || s.Bytes < 0 || !plausibleBytes(s.Bytes) || s.PerBatchBytes < 0 || !plausibleBytes(s.PerBatchBytes) {
				return errors.New("a leak site's name is too long or its figures out of range")
			}
		}
	}
	return nil
}
