package leader

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

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

// Plausible splits the ranks' batches (rank -> batch; -1: no batch yet) into the
// ranks a window is planned on and those left out: a rank whose batch is more
// than spread from a strict majority's (a trainer reporting batch 10^9, or
// counting backwards) must not make a window no healthy rank reaches. Ranks with
// no batch yet are kept. With no strict majority that agrees (two ranks far
// apart, say) ok is false and why says so: no side can be called the healthy one.
func Plausible(batches map[int]int64, spread int64) (keep []int, far map[int]string, ok bool, why string) {
	type rb struct {
		rank  int
		batch int64
	}
	var known []rb
	for r, b := range batches {
		if b < 0 {
			keep = append(keep, r)
			continue
		}
		known = append(known, rb{r, b})
	}
	sort.Slice(known, func(i, j int) bool {
		return known[i].batch < known[j].batch || known[i].batch == known[j].batch && known[i].rank < known[j].rank
	})
	// the centre with the most ranks within spread of it (a sliding window)
	best, bestN := -1, 0
	for i := range known {
		n := 0
		for _, o := range known {
			if o.batch >= known[i].batch-spread && o.batch <= known[i].batch+spread {
				n++
			}
		}
		if n > bestN {
			best, bestN = i, n
		}
	}
	far = map[int]string{}
	if len(known) > 0 && 2*bestN <= len(known) {
		var parts []string
		for i, k := range known {
			if i == 8 {
				parts = append(parts, fmt.Sprintf("and %d more", len(known)-8))
				break
			}
			parts = append(parts, fmt.Sprintf("rank %d at %d", k.rank, k.batch))
		}
		sort.Ints(keep)
		return keep, far, false, fmt.Sprintf("the ranks' trainers disagree on their batch by more than %d, and no majority of ranks agrees (%s): no side can be told the healthy one, so no window is planned",
			spread, strings.Join(parts, ", "))
	}
	for _, k := range known {
		c := int64(0)
		if best >= 0 {
			c = known[best].batch
		}
		if k.batch < c-spread || k.batch > c+spread {
			far[k.rank] = fmt.Sprintf("left out: its trainer reports batch %d, more than %d batches from the other ranks' (%d of %d ranks are at batches %d±%d)",
				k.batch, spread, bestN, len(known), c, spread)
			continue
		}
		keep = append(keep, k.rank)
	}
	sort.Ints(keep)
	return keep, far, true, ""
}
