package main

import (
	"os"
	"runtime"
	"runtime/debug"
)

// Garbage collection for the commands that decode snapshots.
//
// A decode builds a graph of small objects that stays live until the command is
// done with it, so a collection during a decode marks it all and frees nothing: in
// a cold `memsnap inspect` of a 100,000-event snapshot the collector took about a
// third of the CPU time. What a decode builds is bounded by its budget
// (snapshot.Budget), so running it with the collector paused cannot let the heap
// grow without bound. Where the environment sets GOGC, that choice stands.

// mergeGCPercent is GOGC for `memsnap merge`, which decodes ranks ahead while
// writing earlier ones, so its collections do find garbage: the heap may grow to
// three times what is live, in exchange for half as many collections (8 ranks of
// 100,000 events: about a fifth less time, for about a tenth more peak memory).
const mergeGCPercent = 200

// mergeGC sets GOGC for a merge (unless the environment set it) and returns the
// function that restores it.
func mergeGC() func() {
	if gcFromEnv() {
		return func() {}
	}
	prev := debug.SetGCPercent(mergeGCPercent)
	return func() { debug.SetGCPercent(prev) }
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
