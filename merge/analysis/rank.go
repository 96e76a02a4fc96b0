package analysis

import (
	"fmt"
	"strings"

	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// RankData is one decoded rank while the merge holds it: its snapshot, the device
// trace taken and that device's segments.
type RankData struct {
	Rank    int
	Source  string
	Snap    *snapshot.Snapshot
	Device  int
	Trace   []*snapshot.TraceEntry
	Segs    []*snapshot.Segment
	Meta    *sidecar.RankMeta
	ShiftUS int64 // added to the rank's time_us to align it
	note    string
}

// OOM is one out-of-memory event.
type OOM struct {
	TimeUS        int64 `json:"time_us"` // aligned in the summary; the rank's own clock in an analysis
	Size          int64 `json:"size"`
	DeviceFreeB   int64 `json:"device_free_bytes"`
	AllocatedThen int64 `json:"allocated_bytes"`
	// ReservedThen is what the allocator held then: ReservedThen - AllocatedThen
	// was free in its segments, in pieces
	ReservedThen int64 `json:"reserved_bytes,omitempty"`
	// LargestFreeBlock is the largest of those pieces (nil: the segments do not tell).
	LargestFreeBlock *int64 `json:"largest_free_block_bytes,omitempty"`
}

// Fragmented reports whether the OOM asked for less than the allocator held free
// in its segments: the memory was there, in pieces none large enough (where the
// largest piece is known, it is smaller than what was asked for).
func (o OOM) Fragmented() bool {
	return o.Size > 0 && o.AllocatedThen >= 0 && o.ReservedThen <= maxDeviceBytes && o.ReservedThen-o.AllocatedThen >= o.Size &&
		(o.LargestFreeBlock == nil || *o.LargestFreeBlock < o.Size)
}

// maxDeviceBytes bounds what one device's allocator can hold (1 PiB): figures
// above it come from a damaged snapshot.
const maxDeviceBytes = 1 << 50

// Site is an allocation site (a Python frame) and what it held alive at a peak.
type Site struct {
	Site   string `json:"site"`
	Bytes  int64  `json:"bytes"`
	Blocks int    `json:"blocks"`
}

// RankSummary is one rank's line of merged.summary.json.
type RankSummary struct {
	Rank          int    `json:"rank"`
	Source        string `json:"source"`
	Device        int    `json:"device"`
	Events        int    `json:"events"`
	ClockOffsetUS int64  `json:"clock_offset_us"`
	// ClockUnmeasured says the rank's clock offset was never measured (aligned
	// by offsets, its times are its own clock's: an offset of 0 is not claimed)
	ClockUnmeasured     bool   `json:"clock_unmeasured,omitempty"`
	FirstEventUS        int64  `json:"first_event_time_us"` // aligned
	LastEventUS         int64  `json:"last_event_time_us"`  // aligned
	StartAllocatedBytes int64  `json:"start_allocated_bytes"`
	PeakAllocatedBytes  int64  `json:"peak_allocated_bytes"`
	PeakAllocatedTimeUS int64  `json:"peak_allocated_time_us"` // aligned
	PeakAllocatedBatch  *int64 `json:"peak_allocated_batch"`
	PeakReservedBytes   int64  `json:"peak_reserved_bytes"`
	PeakReservedTimeUS  int64  `json:"peak_reserved_time_us"`
	// FreeAtPeak is the allocator's free memory at the allocated peak: reserved but
	// not allocated, and the largest free block.
	FreeAtPeak *Free `json:"free_at_peak,omitempty"`
	// ExpandableSegments: the rank's allocator used expandable segments.
	ExpandableSegments       bool   `json:"expandable_segments,omitempty"`
	EndAllocatedBytes        int64  `json:"end_allocated_bytes"`
	EndReservedBytes         int64  `json:"end_reserved_bytes"`
	PeakNVMLDeviceUsedBytes  int64  `json:"peak_nvml_device_used_bytes,omitempty"`
	AllocatedBeforeRecording int64  `json:"allocated_before_recording_bytes"`
	TopSites                 []Site `json:"top_sites"`
	// KeptSites are the sites of the blocks allocated inside the window and still
	// allocated at its end, most bytes first: what grew.
	KeptSites []Site  `json:"kept_sites,omitempty"`
	OOMs      []OOM   `json:"ooms"`
	Batches   []int64 `json:"batches,omitempty"`
	StallUS   int64   `json:"trainer_stall_us,omitempty"` // the training thread's wait at the window's end
	Note      string  `json:"note,omitempty"`
	// PeakAllocatedPhase is the phase of the training step the peak fell in, where
	// the stacks show it (forward, backward, optimizer).
	PeakAllocatedPhase string `json:"peak_allocated_phase,omitempty"`
	// BatchFigures are the allocated bytes at the start and end of every batch,
	// and the peak inside it (aligned times).
	BatchFigures []BatchFigure `json:"batch_figures,omitempty"`
	// Truncated: the rank's history reached its cap and lost its oldest events.
	Truncated *Truncation `json:"truncated,omitempty"`
	// Leak: the rank's allocated bytes at the start of its batches grow, and the
	// sites whose blocks outlive their batch.
	Leak *Leak `json:"leak,omitempty"`
	// OutsideAllocator is device memory in use beyond the allocator's reserved
	// bytes (why nvidia-smi shows more), from the NVML samples.
	OutsideAllocator *OutsideAllocator `json:"outside_allocator,omitempty"`
	// Categories is the memory by category at the peak and at most, and the
	// modules holding the most at the peak.
	Categories *Categories `json:"categories,omitempty"`
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
		// no trace: take the device that holds segments (one a rank could drive:
		// a damaged snapshot's device can be any number)
		for _, g := range s.Segments {
			if g.Device >= 0 && g.Device < sidecar.MaxRanks {
				return int(g.Device), ""
			}
		}
	}
	note := ""
	if nonEmpty > 1 {
		note = fmt.Sprintf("the snapshot has %d devices with events; device %d (most events) was taken", nonEmpty, best)
	}
	return best, note
}

// Deltas returns how an event changes the allocated and the reserved bytes.
func Deltas(e *snapshot.TraceEntry) (allocated, reserved int64) {
	size := max(e.Size, 0) // a negative size is corrupt: it counts as nothing
	switch e.Action {
	case snapshot.ActionAlloc:
		return size, 0
	case snapshot.ActionFreeCompleted:
		return -size, 0
	case snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap:
		return 0, size
	case snapshot.ActionSegmentFree, snapshot.ActionSegmentUnmap:
		return 0, -size
	}
	return 0, 0
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
