// Package wait polls a condition until it holds or a deadline passes: the one
// way memsnap waits for a state it cannot be told of.
package wait

import (
	"context"
	"time"
)

// Interval is how often Until looks.
const Interval = 20 * time.Millisecond

// Until looks at cond every Interval until it holds (true), or until timeout
// passes or ctx ends (false, with the context's error).
func Until(ctx context.Context, timeout time.Duration, cond func() bool) (bool, error) {
	return Every(ctx, timeout, Interval, cond)
}

// Every looks at cond every period until it holds (true), or until timeout
// passes or ctx ends: then it looks once more and reports what it saw, with the
// context's error.
func Every(ctx context.Context, timeout, period time.Duration, cond func() bool) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(period)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return cond(), ctx.Err()
		case <-t.C:
		}
	}
	return true, nil
}
