package view

import (
	"strings"
	"testing"

	"github.com/memsnap/memsnap/internal/pb"
)

// TestTriggerRank reads back the rank and what it crossed from every reason
// checkTriggers writes, and nothing from reasons it does not.
func TestTriggerRank(t *testing.T) {
	tr := Triggers{GrowthBytes: 1 << 20, GrowthBatches: 2}
	why := tr.Crossed(17, &pb.Figures{Growth: 1 << 20})
	rank, what, ok := TriggerRank(TriggerPrefix + why)
	if !ok || rank != 17 || !strings.HasPrefix(what, "growing 1.0 MiB a batch") {
		t.Fatalf("%q read as rank %d, %q, %v", why, rank, what, ok)
	}
	for _, r := range []string{"", "request", "trigger: rank x: y", "trigger: rank -1: y", "trigger: rank 01: y", "trigger: rank 3", "alert: rank 3: y"} {
		if _, _, ok := TriggerRank(r); ok {
			t.Errorf("%q read as a trigger", r)
		}
	}
}
