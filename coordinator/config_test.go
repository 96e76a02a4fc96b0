package coordinator

import (
	"math"
	"testing"
	"time"

	"github.com/memsnap/memsnap/rankagent"
)

// TestProbeTimersBoundSuspicion: production's failure detection declares a
// member dead within MaxSuspicion of its failed probes at any size; up to 100
// ranks on the LAN preset's timers, above that with faster probes, never faster
// than the bound needs.
func TestProbeTimersBoundSuspicion(t *testing.T) {
	for _, n := range []int{1, 8, 64, 100, 101, 256, 1024, 4096, 100000} {
		c := DefaultConfig(rankagent.Identity{RunName: "r", Rank: 0, WorldSize: n})
		ml := c.Memberlist
		// memberlist's suspicion timeout, as its util.go computes it
		nodeScale := math.Max(1, math.Log10(math.Max(1, float64(n))))
		st := time.Duration(ml.SuspicionMult) * time.Duration(nodeScale*1000) * ml.ProbeInterval / 1000
		if st > MaxSuspicion {
			t.Errorf("%d ranks: suspicion timeout %v, over %v (probes every %v)", n, st, MaxSuspicion, ml.ProbeInterval)
		}
		if ml.ProbeTimeout <= 0 || ml.ProbeTimeout >= ml.ProbeInterval || ml.ProbeTimeout*2 > ml.ProbeInterval+time.Millisecond {
			t.Errorf("%d ranks: probe timeout %v of an interval %v (the LAN preset's is half)", n, ml.ProbeTimeout, ml.ProbeInterval)
		}
		if n <= 100 {
			if ml.ProbeInterval != time.Second || ml.ProbeTimeout != 500*time.Millisecond {
				t.Errorf("%d ranks: probes every %v, %v to answer; want the LAN preset's 1s, 500ms", n, ml.ProbeInterval, ml.ProbeTimeout)
			}
		} else if st < MaxSuspicion-10*time.Millisecond {
			t.Errorf("%d ranks: suspicion timeout %v: probes every %v are faster than %v needs", n, st, ml.ProbeInterval, MaxSuspicion)
		}
	}
	c := DefaultConfig(rankagent.Identity{RunName: "r", Rank: 0, WorldSize: 1024})
	if got := c.Memberlist.ProbeInterval; got != 664*time.Millisecond {
		t.Errorf("1,024 ranks: probes every %v, want 664ms", got)
	}
	// a client does not know the run's size: the preset's timers
	if got := DefaultConfig(rankagent.Identity{RunName: "r", Rank: -1}).Memberlist.ProbeInterval; got != time.Second {
		t.Errorf("a client probes every %v, want 1s", got)
	}
}
