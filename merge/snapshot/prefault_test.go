package snapshot_test

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/merge/synth"
)

// TestPrefaultedDecodeIsTheSame: a decode that takes its arrays from a prefaulter
// builds the same snapshot as one that makes them itself (an array handed out
// twice, or not cleared, would mix entries, frames or memo values), takes many of
// them, and leaves no goroutine behind.
func TestPrefaultedDecodeIsTheSame(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	}
	base, err := snapshot.ReadFile(testutil.Snapshot(t, "single/transformer.memory_snapshot.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	data, err := snapshot.EncodeBytes(synth.Grow(base, 40000, 0))
	if err != nil {
		t.Fatal(err)
	}
	if len(data) < snapshot.PrefaultMin {
		t.Fatalf("the input is %d bytes, under the prefaulter's %d", len(data), snapshot.PrefaultMin)
	}
	g0 := runtime.NumGoroutine()
	plain, taken, started, err := snapshot.DecodeTaking(data, false, false)
	if err != nil || taken != 0 || started {
		t.Fatalf("without a prefaulter: %d taken, started %v, %v", taken, started, err)
	}
	// every array after the prefaulter's start taken from it (the decode waits
	// for them), so the test does not depend on how fast it makes them
	pre, taken, started, err := snapshot.DecodeTaking(data, true, true)
	if err != nil || !started {
		t.Fatalf("no prefaulter started (%v)", err)
	}
	// 40,000 entries are about 40 slabs, and as many memo chunks at least
	if taken < 40 {
		t.Errorf("the decode took %d arrays from its prefaulter, want 40 or more", taken)
	}
	a, err := snapshot.EncodeBytes(plain)
	if err != nil {
		t.Fatal(err)
	}
	b, err := snapshot.EncodeBytes(pre)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatalf("the prefaulted decode differs: %d bytes re-encoded, against %d", len(b), len(a))
	}
	if fa, fb := plain.ComputeFigures(), pre.ComputeFigures(); fa.AllocatedBytes != fb.AllocatedBytes || fa.Segments != fb.Segments {
		t.Fatalf("figures differ: %+v, %+v", fa, fb)
	}
	// the same as it runs: arrays taken when ready, else made
	if s, _, _, err := snapshot.DecodeTaking(data, true, false); err != nil {
		t.Fatal(err)
	} else if c, _ := snapshot.EncodeBytes(s); !bytes.Equal(a, c) {
		t.Fatal("a decode that takes ready arrays differs")
	}
	// and through the public entry point
	if s, err := snapshot.Decode(data); err != nil {
		t.Fatal(err)
	} else if c, _ := snapshot.EncodeBytes(s); !bytes.Equal(a, c) {
		t.Fatal("Decode differs from a decode without a prefaulter")
	}
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("the goroutines after the decodes to be as many as before (%d)", g0), func() bool {
		return runtime.NumGoroutine() <= g0
	})
}

// TestNoPrefaulterUnlessItPays: an input under PrefaultMin starts no prefaulter,
// and neither does a large one refused before it has built a thousand entries
// (a prefaulter would make and clear over a megabyte for nothing).
func TestNoPrefaulterUnlessItPays(t *testing.T) {
	base, err := snapshot.ReadFile(testutil.Snapshot(t, "single/transformer.memory_snapshot.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	small, err := snapshot.EncodeBytes(base)
	if err != nil {
		t.Fatal(err)
	}
	if len(small) >= snapshot.PrefaultMin {
		t.Fatalf("the input is %d bytes, not under the prefaulter's %d", len(small), snapshot.PrefaultMin)
	}
	big, err := snapshot.EncodeBytes(synth.Grow(base, 40000, 0))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		data []byte
		ok   bool
	}{
		{"a small snapshot", small, true},
		{"2 MiB of zeros", make([]byte, 2<<20), false},
		{"a large snapshot cut at 64 KiB, padded with zeros", append(append([]byte(nil), big[:64<<10]...), make([]byte, 2<<20)...), false},
	} {
		_, taken, started, err := snapshot.DecodeTaking(tc.data, true, true)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
		if started || taken != 0 {
			t.Errorf("%s: a prefaulter started (%v), %d arrays taken", tc.name, started, taken)
		}
	}
}
