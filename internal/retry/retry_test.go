package retry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/store"
)

func TestTransient(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("x: %w", store.ErrUnreachable), true},
		{fmt.Errorf("x: %w", store.ErrNoBucket), true},
		{context.DeadlineExceeded, true},
		{fmt.Errorf("x: %w", store.ErrExists), false},
		{fmt.Errorf("x: %w", store.ErrAccess), false},
		{errors.New("something else"), false},
	} {
		if got := Transient(c.err); got != c.want {
			t.Errorf("Transient(%v) = %v", c.err, got)
		}
	}
}

// TestBackoff: the waits double from Min to Max, each jittered within half of it.
func TestBackoff(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		want *= time.Millisecond
		if d := b.Next(); d < want/2 || d > want {
			t.Fatalf("wait %d: %v, want between %v and %v", i, d, want/2, want)
		}
	}
	b.Reset()
	if d := b.Next(); d > 100*time.Millisecond {
		t.Fatalf("after Reset: %v", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if b.Wait(ctx) {
		t.Fatal("Wait returned true with its context ended")
	}
	if d := After(3, 10*time.Millisecond, time.Second); d < 20*time.Millisecond || d > 40*time.Millisecond {
		t.Fatalf("After(3): %v", d)
	}
}
