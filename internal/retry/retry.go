// Package retry is memsnap's one retry policy: which errors may go away by
// themselves, and the jittered exponential wait before trying again.
//
// An error neither this package nor the store knows (a parse error, a bug's)
// is treated oppositely by the two questions memsnap asks of an error:
//
//   - Transient ("may it go away by itself?") answers false: such an error is
//     not waited out. A merge reading its inputs takes it as the input's own
//     failure, not the store's.
//   - store.Permanent ("can retrying never help?") answers false too, and that
//     means it is retried: only what is known to recur is given up at once. An
//     upload queue keeps the snapshot and tries again; a report is written again
//     up to its tries.
//
// A caller that must decide both ways (the leader's retryable) asks Transient,
// then store.Permanent, and decides what is left itself: the leader retries it
// unless it is a rank's input that cannot be read.
package retry

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"time"

	"github.com/memsnap/memsnap/internal/store"
)

// Transient reports whether err may go away by itself: the store unreachable or
// its bucket missing (an operator can fix either while a job waits), a connection
// broken, a deadline passed. An error store.Permanent names is never transient,
// nor is one neither package knows (see the package's doc).
func Transient(err error) bool {
	if err == nil || store.Permanent(err) {
		return false
	}
	if errors.Is(err, store.ErrUnreachable) || errors.Is(err, store.ErrNoBucket) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// Backoff is a wait that doubles from Min up to Max, each wait jittered to
// between half and all of it, so members that lost one server do not all come
// back at once.
type Backoff struct {
	Min, Max time.Duration
	cur      time.Duration
}

// Next is the next wait.
func (b *Backoff) Next() time.Duration {
	switch {
	case b.cur == 0:
		b.cur = b.Min
	default:
		b.cur = min(2*b.cur, b.Max)
	}
	return Jitter(b.cur)
}

// Reset makes the next wait Min again.
func (b *Backoff) Reset() { b.cur = 0 }

// Wait sleeps the next wait; it reports false when ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Jitter is between half of d and d.
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// After is the wait before attempt n+1 (n from 1): Min doubled n-1 times, up to
// Max, jittered.
func After(n int, minWait, maxWait time.Duration) time.Duration {
	d := minWait
	for i := 1; i < n && d < maxWait; i++ {
		d *= 2
	}
	return Jitter(min(d, maxWait))
}
