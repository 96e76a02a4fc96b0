// Package synth builds large, realistic snapshots for benchmarks and scale tests by
// repeating a real recorded trace: the frames stay the real ones (shared, as torch
// shares them), addresses and times are shifted so every repetition is distinct.
package synth

import (
	"github.com/memsnap/memsnap/merge/snapshot"
)

// Grow returns a snapshot whose device 0 trace holds at least events entries, made
// by repeating base's first trace; segments are base's. rankSkew (bytes) is added to
// every alloc's size so ranks can differ.
func Grow(base *snapshot.Snapshot, events int, rankSkew int64) *snapshot.Snapshot {
	src := base.DeviceTraces[0]
	if len(src) == 0 {
		return base
	}
	span := src[len(src)-1].TimeUS - src[0].TimeUS + 1000
	out := make([]*snapshot.TraceEntry, 0, events+len(src))
	entries := make([]snapshot.TraceEntry, events+len(src))
	for rep := int64(0); len(out) < events; rep++ {
		for _, e := range src {
			c := &entries[len(out)]
			*c = *e
			c.TimeUS = e.TimeUS + rep*span
			if c.Has&snapshot.EntryAddr != 0 && c.Action != snapshot.ActionSegmentAlloc && c.Action != snapshot.ActionSegmentFree {
				c.Addr = e.Addr + (rep%64)<<20
			}
			if c.Action == snapshot.ActionAlloc || c.Action == snapshot.ActionFreeCompleted || c.Action == snapshot.ActionFreeRequested {
				c.Size += rankSkew
			}
			out = append(out, c)
		}
	}
	s := *base
	s.DeviceTraces = [][]*snapshot.TraceEntry{out}
	return &s
}
