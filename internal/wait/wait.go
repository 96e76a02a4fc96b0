// Package wait polls a condition until it holds or a deadline passes: the one
// way memsnap waits for a state it cannot be told of.
package wait

import (
	"context"
	"time"
)

// Every is how often Until looks.
const Every = 20 * time.Millisecond

// Until looks at cond every Every until it holds (true), or until timeout passes
// or ctx ends (false, with the context's error).
func Until(ctx context.Context, timeout time.Duration, cond func() bool) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(Every)
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
