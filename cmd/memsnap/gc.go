package main

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
)

// Garbage collection for the commands that decode snapshots.
//
// A decode builds a graph of small objects that stays live until the command is
// done with it, so a collection during a decode marks it all and frees nothing: in
// a cold `memsnap inspect` of a 100,000-event snapshot the collector took about a
// third of the CPU time. What a decode builds is bounded by its budget
// (snapshot.Budget), so running it with the collector paused cannot let the heap
// grow without bound. Where the environment sets GOGC, that choice stands.

// A merge decodes ranks ahead while writing earlier ones, so its collections do
// find garbage, but what is live stays small (at most Workers+1 decoded ranks and
// what the outputs share: about 60 MB for 8 ranks of 100,000 events), and so is
// the heap GOGC=100 allows. The collector then runs every few tens of
// megabytes, and what it frees is faulted in again, which is dear in a VM. A
// merge lets its heap grow to mergeHeapFloor before the first collection, and
// after each to mergeHeapPerLive times what it left live (never below the
// floor): the collector off, under a memory limit moved after every collection.
// 8 ranks of 100,000 events (scripts/bench-cli.sh): about a tenth less CPU than
// GOGC=200, with peak RSS about 280 MB instead of 240 MB.
const (
	mergeHeapFloor   = 256 << 20
	mergeHeapPerLive = 4
)

// mergeGC sets the collector's pacing for a merge (unless the environment set
// GOGC or GOMEMLIMIT) and returns the function that restores it.
func mergeGC() func() {
	if gcFromEnv() {
		return func() {}
	}
	if _, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		return func() {}
	}
	prevPct := debug.SetGCPercent(-1)
	prevLimit := debug.SetMemoryLimit(mergeHeapFloor)
	var done atomic.Bool
	watchGC(func() bool {
		if done.Load() {
			return false
		}
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		metrics.Read(s)
		if s[0].Value.Kind() == metrics.KindUint64 {
			live := s[0].Value.Uint64()
			debug.SetMemoryLimit(int64(max(mergeHeapFloor, min(live, math.MaxInt64/mergeHeapPerLive)*mergeHeapPerLive)))
		}
		return true
	})
	return func() {
		done.Store(true)
		debug.SetMemoryLimit(prevLimit)
		debug.SetGCPercent(prevPct)
	}
}

// watchGC calls f after every collection (in a goroutine of its own, as cleanups
// run) until f returns false.
func watchGC(f func() bool) {
	type sentinel struct{ _ [16]byte } // not tiny-allocated, so collected alone
	var arm func()
	arm = func() {
		runtime.AddCleanup(new(sentinel), func(struct{}) {
			if f() {
				arm()
			}
		}, struct{}{})
	}
	arm()
}

func gcFromEnv() bool {
	_, ok := os.LookupEnv("GOGC")
	return ok
}

// gcPause pauses the collector for a command that decodes files one at a time.
type gcPause struct {
	paused bool
	prev   int
}

// pauseGC pauses the collector until resume is called.
func pauseGC() *gcPause {
	if gcFromEnv() {
		return &gcPause{}
	}
	return &gcPause{paused: true, prev: debug.SetGCPercent(-1)}
}

// between collects what the previous file left: between two files little is live,
// so the collection is short.
func (p *gcPause) between() {
	if p.paused {
		runtime.GC()
	}
}

// resume puts back the collector's setting from before pauseGC.
func (p *gcPause) resume() {
	if p.paused {
		debug.SetGCPercent(p.prev)
		p.paused = false
	}
}
