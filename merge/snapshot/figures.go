package snapshot

import "sort"

// DeviceFigures are one device's figures (see Figures).
type DeviceFigures struct {
	Device             int   `json:"device"`
	Events             int   `json:"events"`
	AllocatedBytes     int64 `json:"allocated_bytes"`
	PeakAllocatedBytes int64 `json:"peak_allocated_bytes"`
}

// Figures are the reference figures of a snapshot, computed exactly as the project's
// reference script does: events by action, segment count, reserved and allocated
// bytes at snapshot time, and per device the peak of allocated bytes over the trace
// (the allocated bytes at the end minus the trace's net change give the start;
// replaying alloc (+size) and free_completed (-size) from there gives the curve).
type Figures struct {
	Events         map[string]int  `json:"events"`
	Segments       int             `json:"segments"`
	ReservedBytes  int64           `json:"reserved_bytes"`
	AllocatedBytes int64           `json:"allocated_bytes"`
	Devices        []DeviceFigures `json:"devices"`
}

// AllocatedAtEnd returns the bytes in active_allocated blocks of device dev's
// segments at snapshot time.
func (s *Snapshot) AllocatedAtEnd(dev int) int64 { return s.blockBytes(dev, false) }

// BlockActivePendingFree is the state of a block whose free was requested but
// has not completed (the allocator waits for its streams): still allocated.
const BlockActivePendingFree = "active_pending_free"

// AllocatedOrPendingAtEnd is AllocatedAtEnd with the blocks whose free is pending,
// as the trace counts them (a block leaves the allocated bytes at free_completed).
func (s *Snapshot) AllocatedOrPendingAtEnd(dev int) int64 { return s.blockBytes(dev, true) }

func (s *Snapshot) blockBytes(dev int, pending bool) int64 {
	var n int64
	for _, g := range s.Segments {
		if int(g.Device) != dev {
			continue
		}
		for _, b := range g.Blocks {
			if b.State == BlockActiveAllocated || (pending && b.State == BlockActivePendingFree) {
				n += b.Size
			}
		}
	}
	return n
}

// ReservedAtEnd returns the total size of device dev's segments at snapshot time.
func (s *Snapshot) ReservedAtEnd(dev int) int64 {
	var n int64
	for _, g := range s.Segments {
		if int(g.Device) == dev {
			n += g.TotalSize
		}
	}
	return n
}

// ComputeFigures computes the snapshot's Figures.
func (s *Snapshot) ComputeFigures() Figures {
	f := Figures{Events: map[string]int{}, Segments: len(s.Segments), Devices: []DeviceFigures{}}
	for _, g := range s.Segments {
		f.ReservedBytes += g.TotalSize
		for _, b := range g.Blocks {
			if b.State == BlockActiveAllocated {
				f.AllocatedBytes += b.Size
			}
		}
	}
	counts := actionCounts{all: f.Events}
	for dev, tr := range s.DeviceTraces {
		var cur, hi int64
		for _, e := range tr {
			counts.add(e.Action)
			switch e.Action {
			case ActionAlloc:
				cur += e.Size
			case ActionFreeCompleted:
				cur -= e.Size
			}
			hi = max(hi, cur)
		}
		end := s.AllocatedAtEnd(dev)
		f.Devices = append(f.Devices, DeviceFigures{Device: dev, Events: len(tr), AllocatedBytes: end, PeakAllocatedBytes: end - cur + hi})
	}
	counts.flush()
	return f
}

// actionCounts counts events by action. A trace holds a handful of actions, each
// string shared by its events, so a short list compared by value (the shared
// pointer makes that quick) beats hashing every event's action; actions past the
// list's few go to the map.
type actionCounts struct {
	few [8]struct {
		action string
		n      int
	}
	nfew int
	all  map[string]int
}

func (c *actionCounts) add(a string) {
	for i := range c.nfew {
		if c.few[i].action == a {
			c.few[i].n++
			return
		}
	}
	if c.nfew < len(c.few) {
		c.few[c.nfew].action, c.few[c.nfew].n = a, 1
		c.nfew++
		return
	}
	c.all[a]++
}

// flush adds the list's counts to the map.
func (c *actionCounts) flush() {
	for _, x := range c.few[:c.nfew] {
		c.all[x.action] += x.n
	}
	c.nfew = 0
}

// Actions returns the action names of f.Events, sorted.
func (f Figures) Actions() []string {
	out := make([]string, 0, len(f.Events))
	for a := range f.Events {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}
