package coordinator

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives the tests: every
// goroutine has an owner, and a member that was shut down leaves none behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
