package rankagent

import (
	"io/fs"
	"path/filepath"
	"time"

	"github.com/memsnap/memsnap/merge/analysis"
)

// The trainer's live memory: the hook reports its allocator's figures at the end
// of a batch, at most once a second (a "memory" message); the agent keeps the
// last few reports and reads the device through NVML when it can. MemoryView is
// what the metrics and the leader's cluster view read.

// MemoryView is one rank's memory now.
type MemoryView struct {
	Batch  int64     // the batch at whose end the figures were read
	At     time.Time // when the agent received them
	Memory           // the hook's figures
	// DeviceUsed and DeviceTotal are the device's bytes in use (every process's)
	// and what CUDA can allocate of it: the hook's cudaMemGetInfo, else NVML's
	// (NVML counts memory the driver keeps for itself in the total: 0.6 GiB more
	// on an H200). When the trainer capped its allocator (Capped:
	// set_per_process_memory_fraction), they are what the allocator holds and its
	// cap: the headroom, and its ratio, are against the cap.
	DeviceUsed, DeviceTotal int64
	Capped                  bool
	// NVMLUsed and NVMLTotal are NVML's figures of the device, when the agent
	// reads it (0 otherwise).
	NVMLUsed, NVMLTotal int64
	// Headroom is how much more this rank's peak can grow before an allocation
	// fails: the device's free bytes plus what the allocator holds beyond its peak
	// (reserved − peak, at least 0). Fragmentation can make it less.
	Headroom int64
	// Growth is the allocated bytes added per batch (at the end of a batch, when a
	// step's temporaries are freed), over the reports kept, as a window measures
	// a leak (analysis.GrowthPerBatch): the pace of the latest steady stretch, so
	// a leak grows it, a one-time step (the optimizer's state made at the first
	// step) does not, and a warm-up before a leak is not averaged in. Zero until
	// growthSteps such steps arrived.
	Growth float64
}

// memoryKeep is how many reports the growth is measured over (at most one a
// second: about a quarter of a minute).
const memoryKeep = 16

type memoryReport struct {
	batch int64
	at    time.Time
	m     Memory
}

// noteMemoryLocked keeps a memory report; a report of an earlier batch than the
// last (a restarted trainer) starts the history again.
func (a *Agent) noteMemoryLocked(batch int64, m Memory) {
	r := memoryReport{batch: batch, at: time.Now(), m: m}
	if n := len(a.mem); n > 0 && batch < a.mem[n-1].batch {
		a.mem = a.mem[:0]
	}
	if len(a.mem) == memoryKeep {
		copy(a.mem, a.mem[1:])
		a.mem = a.mem[:memoryKeep-1]
	}
	a.mem = append(a.mem, r)
}

// Memory returns the trainer's memory as last reported, and false before any
// report (or once the trainer is gone).
func (a *Agent) Memory() (MemoryView, bool) {
	a.mu.Lock()
	if len(a.mem) == 0 {
		a.mu.Unlock()
		return MemoryView{}, false
	}
	last := a.mem[len(a.mem)-1]
	growth := growthOf(a.mem)
	d, pid := a.device, a.hookPID
	a.mu.Unlock()
	v := MemoryView{Batch: last.batch, At: last.at, Memory: last.m}
	v.DeviceTotal, v.DeviceUsed = last.m.DeviceTotal, last.m.DeviceTotal-last.m.DeviceFree
	if d != nil {
		if s, err := d.Sample(pid); err == nil && d.Info().TotalBytes > 0 {
			v.NVMLTotal, v.NVMLUsed = d.Info().TotalBytes, s.DeviceUsedBytes
		}
	}
	if v.DeviceTotal == 0 && v.NVMLTotal > 0 {
		v.DeviceTotal, v.DeviceUsed = v.NVMLTotal, v.NVMLUsed
	}
	free := max(v.DeviceTotal-v.DeviceUsed, 0)
	if lim := last.m.DeviceLimit; lim > 0 && lim < v.DeviceTotal {
		// a capped allocator (set_per_process_memory_fraction) fails past its
		// cap, however much of the device is free: what it may still take is
		// the cap less what it holds, as far as the device has it
		free = min(max(lim-last.m.Reserved, 0), free)
		v.DeviceTotal, v.DeviceUsed, v.Capped = lim, min(last.m.Reserved, lim), true
	}
	v.Headroom = free + max(last.m.Reserved-last.m.Peak, 0)
	v.Growth = growth
	return v, true
}

// growthSteps is how many steps from one report to the next the growth needs:
// with three, one jump among them is not a leak.
const growthSteps = 3

// growthOf is the allocated bytes added per batch over the reports kept
// (analysis.GrowthPerBatch, the estimate a window's leak is measured with); 0
// with fewer than growthSteps steps.
func growthOf(mem []memoryReport) float64 {
	pts := make([]analysis.GrowthPoint, len(mem))
	for i, r := range mem {
		pts[i] = analysis.GrowthPoint{Batch: r.batch, Bytes: r.m.Allocated}
	}
	g, steps := analysis.GrowthPerBatch(pts)
	if steps < growthSteps {
		return 0
	}
	return g
}

// SpoolBytes is the size of what the spool holds: snapshots waiting for the
// store, refused ones, and those being taken in.
func (a *Agent) SpoolBytes() int64 {
	var n int64
	filepath.WalkDir(a.cfg.Spool, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
