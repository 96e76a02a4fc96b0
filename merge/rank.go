package merge

import (
	"fmt"
	"sort"
	"strings"

	"github.com/memsnap/memsnap/merge/snapshot"
)

// rankData is one rank while the merge holds it: its decoded trace and what the
// merge computes from it. Only the summary part (rankSummary, curve) outlives it.
type rankData struct {
	rank    int
	source  string
	snap    *snapshot.Snapshot
	device  int
	trace   []*snapshot.TraceEntry
	segs    []*snapshot.Segment
	meta    *RankMeta
	shiftUS int64 // added to the rank's time_us to align it
	note    string
}

// OOM is one out-of-memory event.
type OOM struct {
	TimeUS        int64 `json:"time_us"` // aligned
	Size          int64 `json:"size"`
	DeviceFreeB   int64 `json:"device_free_bytes"`
	AllocatedThen int64 `json:"allocated_bytes"`
}

// Site is an allocation site (a Python frame) and what it held alive at a peak.
type Site struct {
	Site   string `json:"site"`
	Bytes  int64  `json:"bytes"`
	Blocks int    `json:"blocks"`
}

// RankSummary is one rank's line of merged.summary.json.
type RankSummary struct {
	Rank                     int     `json:"rank"`
	Source                   string  `json:"source"`
	Device                   int     `json:"device"`
	Events                   int     `json:"events"`
	ClockOffsetUS            int64   `json:"clock_offset_us"`
	FirstEventUS             int64   `json:"first_event_time_us"` // aligned
	LastEventUS              int64   `json:"last_event_time_us"`  // aligned
	StartAllocatedBytes      int64   `json:"start_allocated_bytes"`
	PeakAllocatedBytes       int64   `json:"peak_allocated_bytes"`
	PeakAllocatedTimeUS      int64   `json:"peak_allocated_time_us"` // aligned
	PeakAllocatedBatch       *int64  `json:"peak_allocated_batch"`
	PeakReservedBytes        int64   `json:"peak_reserved_bytes"`
	PeakReservedTimeUS       int64   `json:"peak_reserved_time_us"`
	EndAllocatedBytes        int64   `json:"end_allocated_bytes"`
	EndReservedBytes         int64   `json:"end_reserved_bytes"`
	PeakNVMLDeviceUsedBytes  int64   `json:"peak_nvml_device_used_bytes,omitempty"`
	AllocatedBeforeRecording int64   `json:"allocated_before_recording_bytes"`
	TopSites                 []Site  `json:"top_sites"`
	OOMs                     []OOM   `json:"ooms"`
	Batches                  []int64 `json:"batches,omitempty"`
	StallUS                  int64   `json:"trainer_stall_us,omitempty"` // the training thread's wait at the window's end
	Note                     string  `json:"note,omitempty"`
}

// point is one step of a memory curve (aligned time).
type point struct {
	t int64
	v int64
}

// curve keeps a bounded number of points of a rank's allocated-bytes curve: the
// maximum in each of maxBuckets time buckets, so peaks survive downsampling.
type curve struct {
	pts []point
}

const curveBuckets = 1500

func downsample(pts []point, n int) []point {
	if len(pts) <= n || len(pts) < 2 {
		return pts
	}
	t0, t1 := pts[0].t, pts[len(pts)-1].t
	span := t1 - t0 + 1
	out := make([]point, 0, n+2)
	cur := -1
	for _, p := range pts {
		b := int((p.t - t0) * int64(n) / span)
		if b != cur || len(out) == 0 {
			out = append(out, p)
			cur = b
			continue
		}
		if p.v > out[len(out)-1].v {
			out[len(out)-1].v = p.v
		}
	}
	// keep the final value so the curve ends where the rank ends
	if last := pts[len(pts)-1]; out[len(out)-1].t != last.t {
		out = append(out, last)
	}
	return out
}

// pickDevice chooses the device trace of a rank's snapshot: the one with the most
// events (a rank normally drives one GPU).
func pickDevice(s *snapshot.Snapshot) (int, string) {
	best, n, nonEmpty := 0, -1, 0
	for i, tr := range s.DeviceTraces {
		if len(tr) > 0 {
			nonEmpty++
		}
		if len(tr) > n {
			best, n = i, len(tr)
		}
	}
	if n <= 0 {
		// no trace: take the device that holds segments
		for _, g := range s.Segments {
			return int(g.Device), ""
		}
	}
	note := ""
	if nonEmpty > 1 {
		note = fmt.Sprintf("the snapshot has %d devices with events; device %d (most events) was taken", nonEmpty, best)
	}
	return best, note
}

// deltas returns how an event changes the allocated and the reserved bytes.
func deltas(e *snapshot.TraceEntry) (allocated, reserved int64) {
	switch e.Action {
	case snapshot.ActionAlloc:
		return e.Size, 0
	case snapshot.ActionFreeCompleted:
		return -e.Size, 0
	case snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap:
		return 0, e.Size
	case snapshot.ActionSegmentFree, snapshot.ActionSegmentUnmap:
		return 0, -e.Size
	}
	return 0, 0
}

// analyze computes the rank's curve, peaks, OOMs and the sites alive at its peak.
// It also emits every change of allocated and reserved bytes through emit (for the
// Perfetto trace); emit may be nil.
func (r *rankData) analyze(emit func(t int64, alloc, reserved int64)) (RankSummary, []point) {
	s := RankSummary{Rank: r.rank, Source: r.source, Device: r.device, Events: len(r.trace), ClockOffsetUS: -r.shiftUS, Note: r.note}
	s.EndAllocatedBytes = r.snap.AllocatedAtEnd(r.device)
	s.EndReservedBytes = r.snap.ReservedAtEnd(r.device)
	var netA, netR int64
	for _, e := range r.trace {
		dA, dR := deltas(e)
		netA, netR = netA+dA, netR+dR
	}
	a, res := s.EndAllocatedBytes-netA, s.EndReservedBytes-netR
	s.StartAllocatedBytes = a
	s.PeakAllocatedBytes, s.PeakReservedBytes = a, res
	peakIdx := -1
	pts := make([]point, 0, len(r.trace)/2+2)
	if len(r.trace) > 0 {
		t0 := r.trace[0].TimeUS + r.shiftUS
		s.FirstEventUS, s.LastEventUS = t0, r.trace[len(r.trace)-1].TimeUS+r.shiftUS
		s.PeakAllocatedTimeUS, s.PeakReservedTimeUS = t0, t0
		pts = append(pts, point{t0, a})
		if emit != nil {
			emit(t0, a, res)
		}
	}
	for i, e := range r.trace {
		t := e.TimeUS + r.shiftUS
		if e.Action == snapshot.ActionOOM {
			s.OOMs = append(s.OOMs, OOM{TimeUS: t, Size: e.Size, DeviceFreeB: e.DeviceFree, AllocatedThen: a})
			continue
		}
		dA, dR := deltas(e)
		if dA == 0 && dR == 0 {
			continue
		}
		a, res = a+dA, res+dR
		if a > s.PeakAllocatedBytes {
			s.PeakAllocatedBytes, s.PeakAllocatedTimeUS, peakIdx = a, t, i
		}
		if res > s.PeakReservedBytes {
			s.PeakReservedBytes, s.PeakReservedTimeUS = res, t
		}
		pts = append(pts, point{t, a})
		if emit != nil {
			emit(t, a, res)
		}
	}
	if b, ok := r.meta.BatchAt(s.PeakAllocatedTimeUS - r.shiftUS); ok {
		s.PeakAllocatedBatch = &b
	}
	if r.meta != nil {
		for _, b := range r.meta.Batches {
			s.Batches = append(s.Batches, b.Batch)
		}
		for _, m := range r.meta.Samples {
			s.PeakNVMLDeviceUsedBytes = max(s.PeakNVMLDeviceUsedBytes, m.DeviceUsedBytes)
		}
		s.StallUS = r.meta.StallUS
	}
	s.TopSites, s.AllocatedBeforeRecording = r.sitesAt(peakIdx, s.PeakAllocatedBytes)
	if s.OOMs == nil {
		s.OOMs = []OOM{}
	}
	return s, downsample(pts, curveBuckets)
}

// sitesAt replays the trace up to event idx and groups the blocks alive then by
// allocation site. Bytes allocated before recording began have no site; they are
// returned separately.
func (r *rankData) sitesAt(idx int, peak int64) ([]Site, int64) {
	type live struct {
		size   int64
		frames []*snapshot.Frame
	}
	alive := map[int64]live{}
	var tracked int64
	for i := 0; i <= idx && i < len(r.trace); i++ {
		e := r.trace[i]
		switch e.Action {
		case snapshot.ActionAlloc:
			alive[e.Addr] = live{e.Size, e.Frames}
			tracked += e.Size
		case snapshot.ActionFreeCompleted:
			if l, ok := alive[e.Addr]; ok {
				delete(alive, e.Addr)
				tracked -= l.size
			}
		}
	}
	if idx < 0 { // the peak is at the start: nothing recorded is alive yet
		return []Site{}, peak
	}
	by := map[string]*Site{}
	for _, l := range alive {
		name := siteName(l.frames)
		st := by[name]
		if st == nil {
			st = &Site{Site: name}
			by[name] = st
		}
		st.Bytes += l.size
		st.Blocks++
	}
	out := make([]Site, 0, len(by))
	for _, st := range by {
		out = append(out, *st)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Bytes != out[j].Bytes {
			return out[i].Bytes > out[j].Bytes
		}
		return out[i].Site < out[j].Site
	})
	if len(out) > 10 {
		out = out[:10]
	}
	return out, peak - tracked
}

// siteName names an allocation by its innermost frame outside torch itself (the
// user's code), or the innermost frame when all are torch's.
func siteName(fr []*snapshot.Frame) string {
	if len(fr) == 0 {
		return "<no Python stack (C++ or another thread)>"
	}
	pick := fr[0]
	for _, f := range fr {
		if f == nil {
			continue
		}
		fn := f.Filename
		if strings.Contains(fn, "/torch/") || strings.HasPrefix(fn, "??") || fn == "" || strings.HasPrefix(f.Name, "<") {
			continue
		}
		pick = f
		break
	}
	if pick == nil {
		return "<no Python stack (C++ or another thread)>"
	}
	return fmt.Sprintf("%s (%s:%d)", pick.Name, shortPath(pick.Filename), pick.Line)
}

func shortPath(p string) string {
	if i := strings.Index(p, "site-packages/"); i >= 0 {
		return p[i+len("site-packages/"):]
	}
	return p
}
