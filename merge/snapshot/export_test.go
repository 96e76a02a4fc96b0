package snapshot

import "context"

// DecodeTaking decodes data as Decode does, with a prefaulter (pre) or without,
// and says how many arrays the decode took from it.
func DecodeTaking(data []byte, pre bool) (*Snapshot, int, error) {
	d := newDecoder(context.Background(), data, Budget(len(data)))
	if pre {
		d.pre = startPrefault(len(data))
		defer d.pre.stop()
	}
	s, err := d.run()
	return s, d.taken, err
}

// PrefaultMin is the smallest input given a prefaulter.
const PrefaultMin = prefaultMin
