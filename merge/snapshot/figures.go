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
func (s *Snapshot) AllocatedAtEnd(dev int) int64 {
	var n int64
	for _, g := range s.Segments {
		if int(g.Device) != dev {
			continue
		}
		for _, b := range g.Blocks {
			if b.State == BlockActiveAllocated {
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
	for dev, tr := range s.DeviceTraces {
		var cur, hi int64
		for _, e := range tr {
			f.Events[e.Action]++
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
	return f
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
