package rankagent

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives the tests: Run waits for
// every goroutine it started, and so do the tests' helpers.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
