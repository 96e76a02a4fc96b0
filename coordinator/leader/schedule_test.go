package leader

import (
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/rankagent"
	"github.com/memsnap/memsnap/runlog"
)

// TestScheduleFromItsPlan: a leader that stopped after its scheduled window's
// plan and before the record of where the schedule stands leaves the run's log
// with the plan alone. The next leader takes the schedule up from that plan: a
// once-only schedule is done, a repeating one goes on on its grid after it; with
// no scheduled window in the log it starts at Skip. (The repeating one: its
// window [20, 22) on the grid 2 + 8k is followed by the start 26.)
func TestScheduleFromItsPlan(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sch   config.Schedule
		plans []string // the reasons of the plans in the log, oldest first
		want  int64
	}{
		{"once, taken", config.Schedule{Enabled: true, Skip: 2}, []string{"schedule", "request"}, -1},
		{"every 8, taken", config.Schedule{Enabled: true, Skip: 2, Every: 8}, []string{"request", "schedule"}, 26},
		{"once, none yet", config.Schedule{Enabled: true, Skip: 2}, []string{"request"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, rl, ctx := folderLog(t)
			for i, reason := range tc.plans {
				start := int64(10 * (i + 1))
				if _, err := rl.CreatePlan(ctx, runlog.Plan{Leader: "job/rank0", Term: 1, Kind: runlog.KindWindow, Reason: reason, Start: start, Stop: start + 2,
					WorldSize: 2, Ranks: []int{0, 1}, Deadline: time.Now().Add(time.Minute)}, 0, nil); err != nil {
					t.Fatal(err)
				}
			}
			cfg := config.DefaultLocal(rankagent.Identity{RunName: "job", Rank: 0, WorldSize: 2})
			cfg.Schedule = tc.sch
			l := New(&fakeMember{name: "job/rank0", world: 2}, &cfg, testutil.Logger(t))
			l.rl, l.st = rl, st
			l.loadSchedule(ctx)
			l.mu.Lock()
			next := l.next
			l.mu.Unlock()
			if next != tc.want {
				t.Fatalf("the schedule's next start %d, want %d", next, tc.want)
			}
		})
	}
}
