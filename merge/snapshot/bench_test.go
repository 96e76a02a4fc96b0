package snapshot_test

import (
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/merge/synth"
)

func benchData(b *testing.B, events int) []byte {
	base, err := snapshot.ReadFile(testutil.Snapshot(b, "single/transformer.memory_snapshot.pickle"))
	if err != nil {
		b.Fatal(err)
	}
	data, err := snapshot.EncodeBytes(synth.Grow(base, events, 0))
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// BenchmarkDecode100k decodes a 100,000-event snapshot (scripts/bench-decode.sh
// compares the same work with CPython's unpickler).
func BenchmarkDecode100k(b *testing.B) {
	data := benchData(b, 100000)
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := snapshot.Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncode100k(b *testing.B) {
	s, err := snapshot.Decode(benchData(b, 100000))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := snapshot.EncodeBytes(s); err != nil {
			b.Fatal(err)
		}
	}
}
