package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestDemoKeepsUnsentSnapshots: the demo's spools count what was not uploaded
// (and so are kept): snapshots in incoming/, jobs in pending/ and failed/, never
// the hidden half-written ones.
func TestDemoKeepsUnsentSnapshots(t *testing.T) {
	tmp := t.TempDir()
	if n := unsent(tmp); n != 0 {
		t.Fatalf("empty spools: %d", n)
	}
	for _, p := range []string{"spool0/incoming/a.pickle", "spool0/incoming/.b.pickle", "spool1/pending/r1-w1/job.json",
		"spool1/pending/.tmp-r1-w2/job.json", "spool3/failed/r3-w1/error.txt", "spool2/incoming/a.json"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(tmp, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, p), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if n := unsent(tmp); n != 3 {
		t.Fatalf("%d snapshots counted, want 3", n)
	}
}
