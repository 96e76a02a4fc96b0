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

// TestAlertRank: the rank an alert's window is about is the first the reason
// names, as the metrics API writes it; anything else names none.
func TestAlertRank(t *testing.T) {
	for reason, want := range map[string]int{"alert: HeadroomLow (rank 3)": 3, "alert: A (rank 12), B (rank 4)": 12, "alert: Leak (rank 0), Other": 0} {
		if r, ok := AlertRank(reason); !ok || r != want {
			t.Errorf("%q: rank %d %v, want %d", reason, r, ok, want)
		}
	}
	for _, reason := range []string{"alert: HeadroomLow", "api: x (rank 3)", "alert: A (rank -1)", "alert: A (rank 03)", "alert: A (rank 3", "trigger: rank 3: x"} {
		if r, ok := AlertRank(reason); ok {
			t.Errorf("%q names rank %d", reason, r)
		}
	}
}
