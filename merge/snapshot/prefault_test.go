package snapshot_test

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/synth"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/snapshot"
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
	plain, taken, err := snapshot.DecodeTaking(data, false)
	if err != nil || taken != 0 {
		t.Fatalf("without a prefaulter: %d taken, %v", taken, err)
	}
	pre, taken, err := snapshot.DecodeTaking(data, true)
	if err != nil {
		t.Fatal(err)
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
	// the same through the public entry point
	if s, err := snapshot.Decode(data); err != nil {
		t.Fatal(err)
	} else if c, _ := snapshot.EncodeBytes(s); !bytes.Equal(a, c) {
		t.Fatal("Decode differs from a decode without a prefaulter")
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > g0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after the decodes, %d before", runtime.NumGoroutine(), g0)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSmallDecodeHasNoPrefaulter: an input under PrefaultMin starts no goroutine.
func TestSmallDecodeHasNoPrefaulter(t *testing.T) {
	base, err := snapshot.ReadFile(testutil.Snapshot(t, "single/transformer.memory_snapshot.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	data, err := snapshot.EncodeBytes(base)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) >= snapshot.PrefaultMin {
		t.Fatalf("the input is %d bytes, not under the prefaulter's %d", len(data), snapshot.PrefaultMin)
	}
	if _, taken, err := snapshot.DecodeTaking(data, true); err != nil || taken != 0 {
		t.Fatalf("a %d-byte input: %d arrays taken, %v", len(data), taken, err)
	}
}
