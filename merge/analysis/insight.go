package analysis

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// Findings about a rank's window beyond its peaks: a history that lost its oldest
// events, memory that grows from batch to batch, and device memory outside
// PyTorch's allocator.

// Truncation says a rank's history lost its oldest events: torch keeps the last
// max_entries events of each device in a ring buffer, and a window that made more
// lost its beginning (peaks there are not seen, and blocks freed later look as if
// they were allocated before recording).
type Truncation struct {
	Events     int `json:"events"`      // the events the device's history held
	MaxEntries int `json:"max_entries"` // the history's cap (--max-entries)
	// MissingUS is how long the window had run when the oldest event kept was
	// recorded (from the first batch mark; 0 without marks).
	MissingUS int64 `json:"missing_us,omitempty"`
	// UnknownFrees counts frees of blocks the history never saw allocated, with
	// their bytes: blocks of the lost part (or allocated before recording).
	UnknownFrees     int   `json:"unknown_frees"`
	UnknownFreeBytes int64 `json:"unknown_free_bytes"`
	// SuggestMaxEntries is a --max-entries that would have held the window: the
	// events kept, scaled from the span they cover to the window's, with a quarter
	// to spare.
	SuggestMaxEntries int `json:"suggest_max_entries"`
}

// Leak says a rank's allocated bytes at the start of its batches grow across the
// window, and which sites allocated blocks in one batch that are still alive at
// the next batch's start and at the window's end.
type Leak struct {
	Batches       int        `json:"batches"`         // batches compared
	GrowthBytes   int64      `json:"growth_bytes"`    // at the last batch's start less at the first's
	PerBatchBytes int64      `json:"per_batch_bytes"` // the growth from one batch's start to the next's (GrowthPerBatch)
	Sites         []LeakSite `json:"sites"`           // most bytes first
}

// LeakSite is one allocation site's blocks that outlive the batch they were
// allocated in (alive at the next batch's start, never freed in the window).
type LeakSite struct {
	Site          string `json:"site"`
	Bytes         int64  `json:"bytes"`
	Blocks        int    `json:"blocks"`
	Batches       int    `json:"batches"`         // how many batches left such blocks
	PerBatchBytes int64  `json:"per_batch_bytes"` // Bytes over Batches
}

// Bounds of the findings.
const (
	// LeakMinBytesPerBatch is the least growth per batch step that flags a leak.
	LeakMinBytesPerBatch = 1 << 20
	// leakSites is the most sites a leak names.
	leakSites = 10
	// maxFindingRanks is the most ranks each kind of finding names one by one.
	maxFindingRanks = 8
)

// Truncation finds whether the rank's history reached its cap (from the
// metadata's max_entries), nil when it did not or the cap is not known.
func (r *RankData) Truncation() *Truncation {
	if r.Meta == nil || r.Meta.MaxEntries <= 0 || len(r.Trace) < r.Meta.MaxEntries {
		return nil
	}
	t := &Truncation{Events: len(r.Trace), MaxEntries: r.Meta.MaxEntries}
	seen := map[int64]bool{}
	for _, e := range r.Trace {
		switch e.Action {
		case snapshot.ActionAlloc:
			seen[e.Addr] = true
		case snapshot.ActionFreeCompleted:
			if !seen[e.Addr] {
				t.UnknownFrees++
				t.UnknownFreeBytes += e.Size
			}
			delete(seen, e.Addr)
		}
	}
	first, last := r.Trace[0].TimeUS, r.Trace[len(r.Trace)-1].TimeUS
	span := float64(last - first)
	want := float64(len(r.Trace)) * 2 // no marks to scale by: twice what was kept
	if m := r.Meta.Batches; len(m) > 0 {
		start, end := m[0].StartUS, m[len(m)-1].EndUS
		if first > start && first-start > 0 { // no overflow from absurd marks
			t.MissingUS = first - start
		}
		if span > 0 && end > start && end-start > 0 {
			want = float64(len(r.Trace)) * float64(end-start) / span
		}
	}
	t.SuggestMaxEntries = roundUpEntries(want * 1.25)
	return t
}

// roundUpEntries rounds n up to two significant digits (a number a user types).
func roundUpEntries(n float64) int {
	if n < 1000 {
		return 1000
	}
	if n > 1e9 {
		return 1e9
	}
	step := 1.0
	for n/step >= 100 {
		step *= 10
	}
	return int(float64(int((n+step-1)/step)) * step)
}

// leak finds whether the rank's allocated bytes at the start of its batches grow
// across the window (figs are the batch figures inside the window, in order) and
// names the sites whose blocks outlive their batch. nil when nothing grows.
func (r *RankData) leak(figs []BatchFigure, w Window) *Leak {
	n := len(figs)
	if n < 3 {
		return nil
	}
	// in time order, whatever order the marks came in
	figs = append([]BatchFigure(nil), figs...)
	sort.SliceStable(figs, func(i, j int) bool { return figs[i].StartUS < figs[j].StartUS })
	grew := 0
	for i := 1; i < n; i++ {
		if figs[i].StartAllocatedBytes > figs[i-1].StartAllocatedBytes {
			grew++
		}
	}
	growth := figs[n-1].StartAllocatedBytes - figs[0].StartAllocatedBytes
	// the pace now, as the live figures measure it: one step may jump (the
	// optimizer's state made at the first step, gradients kept from the first
	// backward) or stay flat
	pts := make([]GrowthPoint, n)
	for i, f := range figs {
		pts[i] = GrowthPoint{Batch: int64(i), Bytes: f.StartAllocatedBytes}
	}
	g, _ := GrowthPerBatch(pts)
	per := int64(math.Round(g))
	if grew < 2 || grew < n-2 || per < LeakMinBytesPerBatch {
		return nil
	}
	l := &Leak{Batches: n, GrowthBytes: growth, PerBatchBytes: per, Sites: []LeakSite{}}
	l.addSites(r.liveBlocks(figs, w), n)
	return l
}

// OutsideAllocator is device memory in use beyond what PyTorch's allocator had
// reserved, from the rank's NVML samples: the CUDA context, NCCL's buffers, other
// libraries' memory and, for the device figures, other processes on the GPU.
type OutsideAllocator struct {
	Samples int `json:"samples"`
	// AtPeakBytes is NVML's device used less the allocator's reserved bytes at the
	// sample nearest the reserved peak; MaxBytes the most over the window.
	AtPeakBytes int64 `json:"at_peak_bytes"`
	MaxBytes    int64 `json:"max_bytes"`
	// The same for this process's own use, where NVML gives it.
	ProcessAtPeakBytes *int64 `json:"process_at_peak_bytes,omitempty"`
	ProcessMaxBytes    *int64 `json:"process_max_bytes,omitempty"`
}

// OutsideAllocatorOf compares the rank's NVML samples inside w with its reserved
// curve (the analysis's, on the rank's own clock). nil without samples.
func OutsideAllocatorOf(a *RankAnalysis, samples []sidecar.MemorySample, marks []sidecar.BatchMark, w Window) *OutsideAllocator {
	if len(a.Curve) == 0 {
		return nil
	}
	// the samples taken while the window recorded: its events and its batches
	lo, hi := a.FirstEventUS, a.LastEventUS
	if len(marks) > 0 {
		lo, hi = min(lo, marks[0].StartUS), max(hi, marks[len(marks)-1].EndUS)
	}
	reservedAt := func(t int64) int64 {
		i := sort.Search(len(a.Curve), func(i int) bool { return a.Curve[i].T > t }) - 1
		if i < 0 {
			i = 0 // before the first event: the reserved bytes then
		}
		return a.Curve[i].R
	}
	var o OutsideAllocator
	best := int64(-1)
	var pAt, pMax int64
	hasProcess := false
	for _, s := range samples {
		if w.Before(s.TimeUS) || w.After(s.TimeUS) || s.TimeUS < lo || s.TimeUS > hi || s.DeviceUsedBytes <= 0 {
			continue
		}
		res := reservedAt(s.TimeUS)
		out := max(s.DeviceUsedBytes-res, 0)
		o.Samples++
		o.MaxBytes = max(o.MaxBytes, out)
		var pOut int64
		if s.ProcessUsedBytes > 0 {
			hasProcess = true
			pOut = max(s.ProcessUsedBytes-res, 0)
			pMax = max(pMax, pOut)
		}
		d := s.TimeUS - a.PeakReservedUS
		if d < 0 {
			d = -d
		}
		if best < 0 || d < best {
			best, o.AtPeakBytes, pAt = d, out, pOut
		}
	}
	if o.Samples == 0 {
		return nil
	}
	if hasProcess {
		o.ProcessAtPeakBytes, o.ProcessMaxBytes = &pAt, &pMax
	}
	return &o
}

// Describe says a truncation in one line.
func (t *Truncation) Describe() string {
	s := fmt.Sprintf("history truncated: %d events reached --max-entries %d", t.Events, t.MaxEntries)
	if t.MissingUS > 0 {
		s += fmt.Sprintf(", the window's first %s are missing", humanDuration(t.MissingUS))
	}
	return s + fmt.Sprintf("; --max-entries %d would have held it", t.SuggestMaxEntries)
}

// describe says a leak in one line.
func (l *Leak) describe() string {
	s := fmt.Sprintf("allocated grows %s over %d batches", GrowthText(float64(l.PerBatchBytes)), l.Batches)
	if len(l.Sites) > 0 {
		s += fmt.Sprintf("; %s leaves %s", l.Sites[0].Site, GrowthText(float64(l.Sites[0].PerBatchBytes)))
	}
	return s
}

// humanDuration writes microseconds as ms or s.
func humanDuration(us int64) string {
	if us < 1_000_000 {
		return fmt.Sprintf("%.1f ms", float64(us)/1e3)
	}
	return fmt.Sprintf("%.1f s", float64(us)/1e6)
}

// Findings says, one line each, what the summary found beyond the peaks: ranks
// whose history was truncated, ranks whose memory grows from batch to batch, and
// how much device memory lies outside the allocator.
func (s *Summary) Findings() []string {
	var out []string
	if l := s.focusLine(); l != "" {
		out = append(out, l)
	}
	out = append(out, s.peakFindings()...)
	var outside []RankSummary
	truncated, leaking, fragmented := 0, 0, 0
	for _, r := range s.Ranks {
		for _, o := range r.OOMs {
			if o.Fragmented() {
				if fragmented++; fragmented <= maxFindingRanks {
					largest := ""
					if o.LargestFreeBlock != nil {
						largest = ", the largest free block " + HumanBytes(*o.LargestFreeBlock)
					}
					remedy := "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is the usual remedy"
					if r.ExpandableSegments {
						remedy = "expandable segments are on already: fewer long-lived allocations between large ones, or freeing them sooner, leaves larger pieces"
					}
					out = append(out, fmt.Sprintf("rank %d ran out of memory asking for %s while %s was reserved but not allocated%s: enough free memory, "+
						"in pieces none large enough (fragmentation); %s",
						r.Rank, HumanBytes(o.Size), HumanBytes(o.ReservedThen-o.AllocatedThen), largest, remedy))
				}
				break
			}
		}
		if r.Truncated != nil {
			if truncated++; truncated <= maxFindingRanks {
				out = append(out, fmt.Sprintf("rank %d: %s", r.Rank, r.Truncated.Describe()))
			}
		}
		if r.Leak != nil {
			if leaking++; leaking <= maxFindingRanks {
				out = append(out, fmt.Sprintf("rank %d: %s", r.Rank, r.Leak.describe()))
			}
		}
		if r.OutsideAllocator != nil {
			outside = append(outside, r)
		}
	}
	if truncated > maxFindingRanks {
		out = append(out, fmt.Sprintf("%d more ranks' histories truncated (merged.summary.json names every one)", truncated-maxFindingRanks))
	}
	if leaking > maxFindingRanks {
		out = append(out, fmt.Sprintf("%d more ranks grow from batch to batch (merged.summary.json names every one)", leaking-maxFindingRanks))
	}
	if len(outside) > 0 {
		sort.Slice(outside, func(i, j int) bool {
			return outside[i].OutsideAllocator.AtPeakBytes < outside[j].OutsideAllocator.AtPeakBytes
		})
		med, top := outside[(len(outside)-1)/2], outside[len(outside)-1]
		line := fmt.Sprintf("outside the allocator (NVML device used less reserved) at the peak: %s", HumanBytes(top.OutsideAllocator.AtPeakBytes))
		if len(outside) > 1 {
			line = fmt.Sprintf("outside the allocator (NVML device used less reserved) at the peak: median %s, most %s on rank %d",
				HumanBytes(med.OutsideAllocator.AtPeakBytes), HumanBytes(top.OutsideAllocator.AtPeakBytes), top.Rank)
		}
		if p := top.OutsideAllocator.ProcessAtPeakBytes; p != nil {
			line += fmt.Sprintf(" (its own process: %s)", HumanBytes(*p))
		}
		out = append(out, line)
	}
	return out
}

// peakFindings says what the outlier's peak (or a lone rank's) held and which
// category differs most from the rank it is compared with, leading with what is
// known: when most of that peak is unknown (the trainer did not call watch), a
// difference in a known category goes first.
func (s *Summary) peakFindings() []string {
	var out []string
	unknownLeads := false
	for _, r := range s.Ranks {
		if r.Categories != nil && (len(s.Ranks) == 1 || (s.Spread != nil && r.Rank == s.Spread.OutlierRank && len(s.Spread.OutlierRanks) > 0)) {
			out = append(out, fmt.Sprintf("rank %d at its peak of %s: %s", r.Rank, HumanBytes(r.PeakAllocatedBytes), r.Categories.Line()))
			unknownLeads = unknownLeads || r.Categories.unknownLeads()
		}
	}
	if s.Diff == nil {
		return out
	}
	h := s.Diff.CategoryHeadline()
	switch c, ok := s.Diff.headlineCategory(); {
	case h == "":
	case unknownLeads && ok && c.Category != CatUnknown:
		out = append([]string{h}, out...)
	default:
		out = append(out, h)
	}
	return out
}

// Answer is what a window's merge found, a line each: how far the peaks spread
// and which rank is the outlier, then the findings.
func (s *Summary) Answer() []string {
	f := s.Findings()
	sp := s.Spread
	if sp == nil || len(s.Ranks) < 2 {
		return f
	}
	if s.Focus != nil && len(f) > 0 { // the rank the window was taken for first
		return append([]string{f[0], sp.Line()}, f[1:]...)
	}
	return append([]string{sp.Line()}, f...)
}

// focusLine says what the rank the window was taken for did: "rank 2, which this
// window was taken for (crossed a trigger: growing 16.0 MiB a batch): peak 1.2
// GiB; allocated grows 16.0 MiB a batch, left by: leak (train.py:7) 16.0 MiB a
// batch"; without a leak, the sites whose blocks the window allocated and kept,
// or else those at its peak. "" without a focus.
func (s *Summary) focusLine() string {
	f := s.Focus
	if f == nil {
		return ""
	}
	head := fmt.Sprintf("rank %d, which this window was taken for (%s)", f.Rank, f.Why)
	i := slices.IndexFunc(s.Ranks, func(r RankSummary) bool { return r.Rank == f.Rank })
	if i < 0 {
		why := s.MissingReasons[strconv.Itoa(f.Rank)]
		if why == "" {
			why = "not merged"
		}
		if f.Elsewhere != "" {
			why += "; " + f.Elsewhere
		}
		return head + ": its snapshot is missing: " + why
	}
	r := s.Ranks[i]
	line := head + ": peak " + HumanBytes(r.PeakAllocatedBytes)
	if r.Events == 0 {
		return line + "; its snapshot holds no allocator history (an agent keeps one only with --record-always, or while it records a window)"
	}
	if l := r.Leak; l != nil && len(l.Sites) > 0 {
		var parts []string
		for _, st := range l.Sites[:min(3, len(l.Sites))] {
			parts = append(parts, st.Site+" "+GrowthText(float64(st.PerBatchBytes)))
		}
		return line + fmt.Sprintf("; allocated grows %s, left by: %s", GrowthText(float64(l.PerBatchBytes)), strings.Join(parts, ", "))
	}
	if len(r.KeptSites) > 0 {
		return line + "; allocated in the window and kept: " + siteList(r.KeptSites, 3)
	}
	if len(r.TopSites) > 0 {
		return line + "; held most at its peak by: " + siteList(r.TopSites, 3)
	}
	return line
}

// siteList names at most n sites with their bytes and blocks.
func siteList(sites []Site, n int) string {
	var parts []string
	for _, st := range sites[:min(n, len(sites))] {
		blocks := "blocks"
		if st.Blocks == 1 {
			blocks = "block"
		}
		parts = append(parts, fmt.Sprintf("%s %s in %d %s", st.Site, HumanBytes(st.Bytes), st.Blocks, blocks))
	}
	return strings.Join(parts, ", ")
}

// Bounds of a manifest's findings.
const (
	MaxManifestFindings = 32
	MaxFindingBytes     = 1024
)

// ManifestFindings is Answer within a manifest's bounds (MaxManifestFindings lines
// of at most MaxFindingBytes), as the manifest and a window's result carry it.
func (s *Summary) ManifestFindings() []string {
	var out []string
	for _, f := range s.Answer() {
		if len(out) == MaxManifestFindings {
			break
		}
		out = append(out, cutBytes(f, MaxFindingBytes))
	}
	return out
}
