package view

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/runlog"
)

// Triggers are the thresholds that make the leader take a window before an OOM:
// as soon as a rank's figures (FiguresOf) cross one, the leader plans a window of
// every rank, of kind trigger, whose reason names the rank and what it crossed.
// At most one every Cooldown.
type Triggers struct {
	// HeadroomBytes and HeadroomRatio: a rank whose headroom falls below either
	// (0: not set; the ratio is of its device's size).
	HeadroomBytes int64
	HeadroomRatio float64
	// GrowthBytes over GrowthBatches: a rank whose allocated bytes grow at least
	// this much over that many batches (a leak), at its measured growth per batch.
	GrowthBytes   int64
	GrowthBatches int64
	// Cooldown is the least time between two trigger windows.
	Cooldown time.Duration
	// Dump: a trigger asks every rank for the allocator history its trainer
	// keeps (--record-always) at once, as a post-mortem does, rather than
	// planning batches to come: the window holds what led to the crossing.
	Dump bool
}

// Enabled reports whether any threshold is set.
func (t Triggers) Enabled() bool {
	return t.HeadroomBytes > 0 || t.HeadroomRatio > 0 || t.GrowthBytes > 0
}

// Crossed says which of t's thresholds the rank's figures cross, as a reason a
// person reads ("" when none): "rank 5: headroom 3.1 GiB (3.9%) < 5%, growing
// 48.0 MiB a batch".
func (t Triggers) Crossed(rank int, f *pb.Figures) string {
	var parts []string
	if f.DeviceTotal > 0 {
		pct := 100 * float64(f.Headroom) / float64(f.DeviceTotal)
		switch {
		case t.HeadroomRatio > 0 && float64(f.Headroom) < t.HeadroomRatio*float64(f.DeviceTotal):
			parts = append(parts, fmt.Sprintf("headroom %s (%.1f%%) < %g%%", analysis.HumanBytes(f.Headroom), pct, 100*t.HeadroomRatio))
		case t.HeadroomBytes > 0 && f.Headroom < t.HeadroomBytes:
			parts = append(parts, fmt.Sprintf("headroom %s (%.1f%%) < %s", analysis.HumanBytes(f.Headroom), pct, analysis.HumanBytes(t.HeadroomBytes)))
		}
	}
	n := max(t.GrowthBatches, 1)
	grows := t.GrowthBytes > 0 && f.Growth*float64(n) >= float64(t.GrowthBytes)
	if len(parts) == 0 && !grows {
		return ""
	}
	switch {
	case grows:
		parts = append(parts, fmt.Sprintf("growing %s (%s or more over %d batches)", analysis.GrowthText(f.Growth), analysis.HumanBytes(t.GrowthBytes), n))
	case f.Growth > 0:
		parts = append(parts, "growing "+analysis.GrowthText(f.Growth))
	}
	return fmt.Sprintf("rank %d: %s", rank, strings.Join(parts, ", "))
}

// TriggerPrefix begins the reason of every trigger window: "trigger: " and what
// Crossed said.
const TriggerPrefix = runlog.ReasonTrigger

// TriggerRank reads a trigger window's reason back ("trigger: rank 5: headroom
// …"): the rank that crossed, and what it crossed ("headroom …").
func TriggerRank(reason string) (rank int, why string, ok bool) {
	rest, found := strings.CutPrefix(reason, TriggerPrefix+"rank ")
	if !found {
		return 0, "", false
	}
	num, why, found := strings.Cut(rest, ": ")
	n, err := strconv.Atoi(num)
	if !found || err != nil || n < 0 || num != strconv.Itoa(n) {
		return 0, "", false
	}
	return n, why, true
}
