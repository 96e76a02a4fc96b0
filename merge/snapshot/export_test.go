package snapshot

import "context"

// DecodeTaking decodes data as Decode does, with a prefaulter where Decode would
// start one (pre) or never, and says whether one was started and how many arrays
// the decode took from it; with wait, the decode waits for the prefaulter's
// arrays rather than make its own while none is ready.
func DecodeTaking(data []byte, pre, wait bool) (s *Snapshot, taken int, started bool, err error) {
	d := newDecoder(context.Background(), data, Budget(len(data)))
	d.preDone, d.preWait = !pre, wait
	defer d.pre.stop()
	s, err = d.run()
	return s, d.taken, d.pre.started(), err
}

// PrefaultMin is the smallest input given a prefaulter.
const PrefaultMin = prefaultMin
