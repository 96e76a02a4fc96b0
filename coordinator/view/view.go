package view

import (
	"sort"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/rankagent"
)

// FiguresOf turns a rank agent's memory view into the message's figures.
func FiguresOf(v rankagent.MemoryView) *pb.Figures {
	return &pb.Figures{Batch: v.Batch, Allocated: v.Allocated, Reserved: v.Reserved, Peak: v.Peak, InactiveSplit: v.InactiveSplit,
		AllocRetries: v.AllocRetries, Ooms: v.OOMs, DeviceUsed: v.DeviceUsed, DeviceTotal: v.DeviceTotal, Headroom: v.Headroom,
		Growth: v.Growth, AtUs: v.At.UnixMicro()}
}

// Sort orders a view's ranks by headroom, the lowest first (a rank whose
// device size is unknown last), then by rank.
func Sort(v *pb.ClusterView) {
	sort.Slice(v.Ranks, func(i, j int) bool {
		a, b := v.Ranks[i], v.Ranks[j]
		ka, kb := a.Figures.DeviceTotal > 0, b.Figures.DeviceTotal > 0
		if ka != kb {
			return ka
		}
		if a.Figures.Headroom != b.Figures.Headroom {
			return a.Figures.Headroom < b.Figures.Headroom
		}
		return a.Rank < b.Rank
	})
}
