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
// The prefaulter starts once a decode of a large input has built its first
// thousand entries (its slab of entries has grown to full size), so an input
// refused early, or one that holds no trace, never starts one. The decoder charges
// each array to its budget when it takes it, as when it makes one, and charges
// prefaultHold when it starts the prefaulter: at most that much more is made
// ready and never taken (prefaultQueue+1 arrays of each kind, 1.2 MiB), so the
// budget still bounds all a decode allocates.

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
	// prefaultHold bounds what a prefaulter makes ready that its decode never
	// takes: the arrays in its queues and the one of each kind in hand.
	prefaultHold = (prefaultQueue + 1) * (slabMax*sizeEntry + slabMax*sizeFrameList + fptrChunk*8 + memoChunk*sizeVal)
)

// prefault starts d's prefaulter, once, for a large input on more than one core,
// when its budget has prefaultHold left (else the decode goes on without one).
func (d *decoder) prefault() {
	if d.preDone {
		return
	}
	d.preDone = true
	if len(d.data) < prefaultMin || runtime.GOMAXPROCS(0) < 2 || d.left < prefaultHold {
		return
	}
	d.left -= prefaultHold
	d.pre.start()
}

// prefaulter is a decoder's; its zero value is one not started, whose queues
// (nil channels) never have an array ready.
type prefaulter struct {
	entries chan []TraceEntry
	flists  chan []frameList
	fptrs   chan []*Frame
	memo    chan []val
	done    chan struct{}
	wg      sync.WaitGroup
}

func (p *prefaulter) start() {
	p.entries = make(chan []TraceEntry, prefaultQueue)
	p.flists = make(chan []frameList, prefaultQueue)
	p.fptrs = make(chan []*Frame, prefaultQueue)
	p.memo = make(chan []val, prefaultQueue)
	p.done = make(chan struct{})
	p.wg.Add(1)
	go p.run()
}

func (p *prefaulter) started() bool { return p.done != nil }

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

// stop ends the prefaulter and waits for its goroutine, if it was started.
func (p *prefaulter) stop() {
	if !p.started() {
		return
	}
	close(p.done)
	p.wg.Wait()
}

// take returns an array ready in q, one of d's prefaulter's queues, or nil when
// none is (or the prefaulter was not started).
func take[T any](d *decoder, q chan []T) []T {
	if d.preWait && q != nil { // tests: every array after the start comes from the prefaulter
		d.taken++
		return <-q
	}
	select {
	case s := <-q:
		d.taken++
		return s
	default:
		return nil
	}
}
