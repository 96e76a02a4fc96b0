package wait

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	var n atomic.Int32
	ok, err := Until(context.Background(), time.Minute, func() bool { return n.Add(1) >= 3 })
	if !ok || err != nil || n.Load() != 3 {
		t.Fatalf("a condition that comes true: %v %v after %d looks", ok, err, n.Load())
	}
	ok, err = Until(context.Background(), 50*time.Millisecond, func() bool { return false })
	if ok || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a condition that never holds: %v %v", ok, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if ok, err := Until(ctx, time.Minute, func() bool { return false }); ok || !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled context: %v %v", ok, err)
	}
}

// TestEvery: Every looks once a period, and once more when the time is up.
func TestEvery(t *testing.T) {
	var n atomic.Int32
	ok, err := Every(context.Background(), 250*time.Millisecond, 100*time.Millisecond, func() bool { n.Add(1); return false })
	if ok || !errors.Is(err, context.DeadlineExceeded) || n.Load() < 3 || n.Load() > 5 {
		t.Fatalf("a condition that never holds, looked at every 100ms for 250ms: %v %v after %d looks", ok, err, n.Load())
	}
	n.Store(0)
	ok, err = Every(context.Background(), time.Minute, time.Millisecond, func() bool { return n.Add(1) >= 5 })
	if !ok || err != nil || n.Load() != 5 {
		t.Fatalf("a condition that comes true: %v %v after %d looks", ok, err, n.Load())
	}
}
