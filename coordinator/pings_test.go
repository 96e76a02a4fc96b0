package coordinator

import (
	"encoding/binary"
	"testing"
)

func TestPingPayload(t *testing.T) {
	for _, n := range []int64{0, 1, 3, 1024} {
		c := &Coordinator{}
		c.nranksSeen.Store(n)
		got, ok := parsePingPayload((&pings{c}).AckPayload())
		if !ok || got != n {
			t.Fatalf("%d ranks: read back %d, %v", n, got, ok)
		}
	}
	for _, b := range [][]byte{nil, {}, {pingVersion}, {2, 3}, {pingVersion, 0x80}, binary.AppendUvarint([]byte{pingVersion}, 1<<40)} {
		if n, ok := parsePingPayload(b); ok {
			t.Fatalf("%x read as %d ranks", b, n)
		}
	}
}

func TestApart(t *testing.T) {
	for _, c := range []struct {
		theirs, ours int64
		want         bool
	}{
		{1, 2, true}, {1, 3, true}, {0, 1024, true}, {400, 1024, true}, // alone, or most ranks missing
		{2, 3, false}, {1000, 1024, false}, {512, 1024, false}, // a join or a few apart
		{3, 3, false}, {5, 3, false}, {1, 1, false}, {0, 0, false}, // as many, or more
	} {
		if got := apart(c.theirs, c.ours); got != c.want {
			t.Errorf("apart(%d, %d) = %v", c.theirs, c.ours, got)
		}
	}
}

// FuzzPingPayload: a probe answer's payload comes from the network; it is read
// without panicking and never as more ranks than a run can have.
func FuzzPingPayload(f *testing.F) {
	f.Add([]byte{pingVersion, 3})
	f.Add([]byte{pingVersion, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, ok := parsePingPayload(b); ok && (n < 0 || n > 1<<31) {
			t.Fatalf("%x read as %d ranks", b, n)
		}
	})
}
