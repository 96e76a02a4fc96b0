package transport

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives the tests: every
// goroutine has an owner, and a transport that was shut down leaves none behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// memberlist's failure detector: a probe (and its TCP fallback ping) in
		// flight when memberlist shuts down is not told to stop; it ends on its own
		// when the probe's timer fires, up to ProbeInterval times the awareness
		// multiplier (8) later, which a member cut off from the others (a stalled
		// leader) reaches. memberlist's, not ours, and bounded.
		goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"),
		goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode.func1"),
	)
}
