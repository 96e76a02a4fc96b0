package coordinator

import (
	"testing"
	"time"

	"github.com/memsnap/memsnap/rankagent"
)

// TestLastHeard: a member taken away was last heard from memberlist's shortest
// suspicion timeout before (so the grace a successor gives it counts from then),
// never later than now.
func TestLastHeard(t *testing.T) {
	ml := DefaultConfig(rankagent.Identity{}).Memberlist // a probe a second, multiplier 2
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		g    goneMember
		now  time.Time
		want time.Time
	}{
		{goneMember{at: at, members: 1024}, at.Add(time.Second), at.Add(-6020 * time.Millisecond)}, // 2 x log10(1024) probes
		{goneMember{at: at, members: 4}, at, at.Add(-2 * time.Second)},                             // the scale is at least 1
		{goneMember{at: at.Add(time.Minute), members: 8}, at, at},                                  // never after now
	} {
		if got := c.g.lastHeard(ml, c.now); !got.Equal(c.want) {
			t.Errorf("%+v at %v: last heard %v, want %v", c.g, c.now, got, c.want)
		}
	}
}
