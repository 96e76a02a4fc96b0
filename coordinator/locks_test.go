package coordinator

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/internal/wait"
	"github.com/memsnap/memsnap/rankagent"
)

// TestAccessorsDuringChurn calls the accessors other code polls (Addr, Members,
// Leader) without pause while members keep joining and leaving. memberlist calls
// back into the coordinator holding its node lock; an accessor that called into
// memberlist holding the coordinator's lock deadlocked the two (CI hung on it).
func TestAccessorsDuringChurn(t *testing.T) {
	key := newKey(t)
	member := func(join []string) (*Coordinator, func()) {
		cfg := DefaultLocalConfig(rankagent.Identity{RunName: "churn"})
		cfg.Client = true
		cfg.SecretKey = key
		cfg.Join = join
		cfg.Logger = testutil.Logger(t)
		return runMember(t, cfg)
	}
	seed, stopSeed := member(nil)
	testutil.Eventually(t, 10*time.Second, "the seed to listen", func() bool { return seed.Addr() != "" })

	// a deadlock would hang every cleanup too, so the churn runs apart and the
	// test reports a hang instead of sitting in it until go test's timeout
	var stop atomic.Bool
	var wg sync.WaitGroup
	calls := make([]atomic.Int64, 2)
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				seed.Addr()
				seed.Members()
				seed.Leader()
				calls[g].Add(1)
			}
		}()
	}
	waitFor := func(what string, cond func() bool) error {
		if ok, _ := wait.Until(context.Background(), 30*time.Second, cond); !ok {
			return fmt.Errorf("timed out waiting for %s", what)
		}
		return nil
	}
	done := make(chan error, 1)
	go func() {
		for range 15 {
			other, stopOther := member([]string{seed.Addr()})
			err := waitFor("the seed to see the member join", func() bool { return len(seed.Members()) == 2 })
			if err == nil {
				err = waitFor("the member to see the seed", func() bool { return len(other.Members()) == 2 })
			}
			stopOther()
			if err == nil {
				err = waitFor("the seed to see the member leave", func() bool { return len(seed.Members()) == 1 })
			}
			if err != nil {
				done <- err
				return
			}
		}
		stop.Store(true)
		wg.Wait()
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("membership churn hung: the coordinator and memberlist deadlocked")
	}
	stopSeed()
	if calls[0].Load() == 0 || calls[1].Load() == 0 {
		t.Fatal("the accessors never ran")
	}
}

// TestShutdownEndsRun: Shutdown while Run's context is still live stops every
// goroutine and makes Run return (it hung in its wait, then Run's Leave panicked
// on a memberlist already shut down).
func TestShutdownEndsRun(t *testing.T) {
	cfg := DefaultLocalConfig(rankagent.Identity{RunName: "shut"})
	cfg.Client = true
	cfg.SecretKey = newKey(t)
	cfg.Logger = testutil.Logger(t)
	c, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	testutil.Eventually(t, 10*time.Second, "the member to listen", func() bool { return c.Addr() != "" })
	shut := make(chan error, 1)
	go func() { shut <- c.Shutdown() }()
	for what, ch := range map[string]chan error{"Shutdown": shut, "Run": ran} {
		select {
		case <-ch:
		case <-time.After(time.Minute):
			t.Fatalf("%s did not return after Shutdown", what)
		}
	}
	if err := c.Leave(time.Second); err == nil {
		t.Fatal("Leave after Shutdown said nothing")
	}
}
