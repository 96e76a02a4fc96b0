package snapshot

import (
	"runtime"
	"sync"
)

// Prefaulting: a decode's arrays made ready on another core.
//
// A cold decode of a 100,000-event snapshot spends about a fifth of its time
// faulting in the fresh memory it builds into (the kernel maps and zeroes every
// page on its first write). Most of that memory is the slabs of entries and frames
// lists, the frames pointers' chunks and the memo's chunks, all of fixed sizes once
// a decode is past its first few thousand values. A prefaulter makes those arrays
// ahead on a goroutine of its own, clears them (which faults their pages in), and
// hands them over through small queues; the decoder takes one when its own is
// used up, or makes it itself as before when none is ready, so it never waits.
//
// The decoder charges each array to its budget when it takes it, as when it makes
// one. What the prefaulter holds apart from that is bounded: at most
// prefaultQueue+1 arrays of each kind (about 1 MiB in all), dropped when the
// decode ends.

const (
	// prefaultMin is the smallest input given a prefaulter: a smaller decode
	// builds too little for a goroutine to pay off.
	prefaultMin = 1 << 20
	// prefaultQueue is how many arrays of each kind wait ready.
	prefaultQueue = 4
	// slabMax is the size of a slab of entries or frames lists once grown.
	slabMax = 1024
	// fptrChunk is the size of the shared array that frames lists' items are cut from.
	fptrChunk = 4096
)

type prefaulter struct {
	entries chan []TraceEntry
	flists  chan []frameList
	fptrs   chan []*Frame
	memo    chan []val
	done    chan struct{}
	wg      sync.WaitGroup
}

// startPrefault starts a prefaulter for a decode of n bytes, or returns nil where
// it would not pay (a small input, or a single core).
func startPrefault(n int) *prefaulter {
	if n < prefaultMin || runtime.GOMAXPROCS(0) < 2 {
		return nil
	}
	p := &prefaulter{
		entries: make(chan []TraceEntry, prefaultQueue),
		flists:  make(chan []frameList, prefaultQueue),
		fptrs:   make(chan []*Frame, prefaultQueue),
		memo:    make(chan []val, prefaultQueue),
		done:    make(chan struct{}),
	}
	p.wg.Add(1)
	go p.run()
	return p
}

func (p *prefaulter) run() {
	defer p.wg.Done()
	e, f, fp, m := faulted[TraceEntry](slabMax), faulted[frameList](slabMax), faulted[*Frame](fptrChunk), faulted[val](memoChunk)
	for {
		select {
		case p.entries <- e:
			e = faulted[TraceEntry](slabMax)
		case p.flists <- f:
			f = faulted[frameList](slabMax)
		case p.fptrs <- fp:
			fp = faulted[*Frame](fptrChunk)
		case p.memo <- m:
			m = faulted[val](memoChunk)
		case <-p.done:
			return
		}
	}
}

// faulted makes an array of n Ts and writes it through, faulting its pages in.
func faulted[T any](n int) []T {
	s := make([]T, n)
	clear(s)
	return s
}

// stop ends the prefaulter and waits for its goroutine; nil does nothing.
func (p *prefaulter) stop() {
	if p == nil {
		return
	}
	close(p.done)
	p.wg.Wait()
}

// take returns an array ready in d's prefaulter's queue q, or nil when none is
// (or d has no prefaulter).
func take[T any](d *decoder, q func(*prefaulter) chan []T) []T {
	if d.pre == nil {
		return nil
	}
	select {
	case s := <-q(d.pre):
		d.taken++
		return s
	default:
		return nil
	}
}

func (p *prefaulter) entriesQ() chan []TraceEntry { return p.entries }
func (p *prefaulter) flistsQ() chan []frameList   { return p.flists }
func (p *prefaulter) fptrsQ() chan []*Frame       { return p.fptrs }
func (p *prefaulter) memoQ() chan []val           { return p.memo }
