package runlog

import "testing"

// TestOrigin: a window's origin and short reason, from its plan's kind and
// reason as the leader, the triggers and the metrics API write them.
func TestOrigin(t *testing.T) {
	three := 3
	for _, c := range []struct {
		plan           Plan
		origin, reason string
	}{
		{Plan{Kind: KindWindow, Reason: "schedule"}, OriginSchedule, ""},
		{Plan{Kind: KindWindow, Reason: "request"}, OriginAsked, ""},
		{Plan{Kind: KindWindow, Reason: "api: loss spike"}, OriginAsked, "loss spike"},
		{Plan{Kind: KindWindow, Reason: "alert: MemsnapLowHeadroom (rank 2)"}, OriginAlert, "MemsnapLowHeadroom (rank 2)"},
		{Plan{Kind: KindTrigger, Reason: "trigger: rank 5: headroom 3.1 GiB (3.9%) < 5%"}, OriginTrigger, "rank 5: headroom 3.1 GiB (3.9%) < 5%"},
		{Plan{Kind: KindWindow, Reason: "trigger: rank 1: growing 16.0 MiB a batch"}, OriginTrigger, "rank 1: growing 16.0 MiB a batch"},
		{Plan{Kind: KindOOM, Reason: "oom post-mortem", FailedRank: &three, Cause: "out of memory"}, OriginPostmortem, "rank 3: out of memory"},
		{Plan{Kind: KindCrash, FailedRank: &three, Cause: "signal: terminated"}, OriginPostmortem, "rank 3: signal: terminated"},
		{Plan{Kind: KindCrash}, OriginPostmortem, ""},
	} {
		if o, r := c.plan.Origin(), c.plan.ShortReason(); o != c.origin || r != c.reason {
			t.Errorf("%s %q: %q, %q; want %q, %q", c.plan.Kind, c.plan.Reason, o, r, c.origin, c.reason)
		}
	}
}
