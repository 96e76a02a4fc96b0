package runlog

import (
	"fmt"
	"strconv"
	"strings"
)

// Origins of a window: what asked for it, as its plan records it (Plan.Origin).
const (
	OriginSchedule   = "schedule"   // the leader's schedule
	OriginTrigger    = "trigger"    // a rank crossed a trigger (its headroom, its growth)
	OriginAlert      = "alert"      // an alert, through the metrics API's Alertmanager webhook
	OriginAsked      = "asked"      // memsnap snapshot, or the metrics API's POST /api/v1/window
	OriginPostmortem = "postmortem" // a rank ran out of memory, or the job was stopped
)

// The reasons a plan records, by who asked: the leader's schedule's, and the
// prefixes of a trigger's (coordinator/view.TriggerPrefix), an alert's and an
// API request's (the metrics API's).
const (
	ReasonSchedule = "schedule"
	ReasonRequest  = "request" // memsnap snapshot's, which gives none
	ReasonTrigger  = "trigger: "
	ReasonAlert    = "alert: "
	ReasonAPI      = "api: "
)

// Origin is what asked for the window: one of the Origin constants.
func (p *Plan) Origin() string {
	switch {
	case p.Kind == KindOOM || p.Kind == KindCrash:
		return OriginPostmortem
	case p.Kind == KindTrigger || strings.HasPrefix(p.Reason, ReasonTrigger):
		// (a trigger that reached a new leader is planned as a window)
		return OriginTrigger
	case strings.HasPrefix(p.Reason, ReasonAlert):
		return OriginAlert
	case p.Reason == ReasonSchedule:
		return OriginSchedule
	}
	return OriginAsked
}

// ShortReason is why the window was taken, without what its origin says
// already: the alerts, what a trigger's rank crossed, an API request's reason;
// for a post-mortem, the rank that failed first and how; "" when there is no
// more to say (the schedule, memsnap snapshot).
func (p *Plan) ShortReason() string {
	if p.Origin() == OriginPostmortem {
		what := p.Cause
		if what == "" && p.Kind == KindOOM {
			what = "out of memory"
		}
		if p.FailedRank != nil {
			return strings.TrimSuffix(fmt.Sprintf("rank %d: %s", *p.FailedRank, what), ": ")
		}
		return what
	}
	for _, prefix := range []string{ReasonTrigger, ReasonAlert, ReasonAPI} {
		if r, ok := strings.CutPrefix(p.Reason, prefix); ok {
			return r
		}
	}
	if p.Reason == ReasonSchedule || p.Reason == ReasonRequest {
		return ""
	}
	return p.Reason
}

// AlertRank is the first rank an alert's window's reason names ("alert:
// HeadroomLow (rank 3), …", as the metrics API writes it): the rank its
// findings lead with.
func AlertRank(reason string) (int, bool) {
	rest, ok := strings.CutPrefix(reason, ReasonAlert)
	if !ok {
		return 0, false
	}
	_, after, ok := strings.Cut(rest, "(rank ")
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(after, ")")
	n, err := strconv.Atoi(num)
	if !ok || err != nil || n < 0 || num != strconv.Itoa(n) {
		return 0, false
	}
	return n, true
}
