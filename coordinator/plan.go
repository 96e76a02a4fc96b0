package coordinator

import "time"

// RankStatus is what the leader knows of one rank when it plans a window.
type RankStatus struct {
	Rank  int
	Batch int64         // the trainer's batch when the rank answered (-1: none yet)
	Step  time.Duration // its measured step time (0: unknown)
	// Delay is how long the plan may take to reach the rank's trainer, counted
	// from when the rank reported Batch: the time since its answer plus the
	// measured round trip.
	Delay time.Duration
}

// unknownStepLead is how many batches ahead a window starts for a rank whose step
// time is not known yet.
const unknownStepLead = 3

// PlanWindow returns the window [start, stop) of length batches, starting no
// earlier than minStart, such that every rank is still before start when the plan
// reaches it: a rank in batch b with step time s needs the plan before batch
// b+k begins, at least (k-1)*s from its report, so k = 1 + ceil((delay+margin)/s).
// The lead comes from the measured step times and delays, not from a constant.
func PlanWindow(ranks []RankStatus, length, minStart int64, margin time.Duration) (start, stop int64) {
	start = max(minStart, 0)
	for _, r := range ranks {
		lead := int64(unknownStepLead)
		if r.Step > 0 {
			need := r.Delay + margin
			lead = 1 + int64((need+r.Step-1)/r.Step)
		}
		start = max(start, max(r.Batch, -1)+lead)
	}
	return start, start + length
}
