package rankagent

import (
	"runtime"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives the tests: Run waits for
// every goroutine it started, and so do the tests' helpers.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// agentGoroutines returns the stacks of the goroutines running an agent's code
// (its Run, connections, sampler, uploader, spool, event dispatcher).
func agentGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, st := range strings.Split(string(buf), "\n\n") {
		for _, f := range []string{"rankagent.(*Agent).", "rankagent.(*uploader).", "rankagent.(*spool).", "rankagent.(*dispatcher)."} {
			if strings.Contains(st, f) {
				out = append(out, st)
				break
			}
		}
	}
	return out
}

// parked reports whether the goroutine whose stack is st waits (is neither
// running nor runnable) for something other than a mutex.
func parked(st string) bool {
	head, _, _ := strings.Cut(st, "\n")
	return !strings.Contains(head, "[running") && !strings.Contains(head, "[runnable") && !strings.Contains(st, "sync.(*Mutex).Lock")
}
