package leader

import (
	"testing"
	"time"
)

func TestPlanWindow(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		ranks       []RankStatus
		length, min int64
		margin      time.Duration
		start       int64
	}{
		// batch 10, 100 ms steps, 50 ms delay + 100 ms margin: batch 12 starts at least 100 ms after the report, too soon; 13 at 200 ms
		{[]RankStatus{{Batch: 10, Step: 100 * ms, Delay: 50 * ms}}, 3, 0, 100 * ms, 13},
		// the slowest-to-reach rank decides
		{[]RankStatus{{Batch: 10, Step: 100 * ms, Delay: 10 * ms}, {Batch: 9, Step: 10 * ms, Delay: 500 * ms}}, 2, 0, 0, 60},
		// unknown step time: a fixed lead
		{[]RankStatus{{Batch: -1}}, 3, 0, time.Second, 2},
		// the schedule's start when it is far enough ahead
		{[]RankStatus{{Batch: 0, Step: 100 * ms}}, 3, 50, 100 * ms, 50},
	}
	for i, c := range cases {
		start, stop := PlanWindow(c.ranks, c.length, c.min, c.margin)
		if start != c.start || stop != start+c.length {
			t.Errorf("case %d: [%d, %d), want start %d", i, start, stop, c.start)
		}
	}
}
