package snapshot

import (
	"path/filepath"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
)

func TestRealSnapshotsReplay(t *testing.T) {
	root := testutil.RepoRoot(t)
	files, _ := filepath.Glob(filepath.Join(root, "testdata", "snapshots", "*", "*.pickle"))
	shared, _ := filepath.Glob(filepath.Join(root, "..", "shared", "testdata", "torch-2.11", "*", "*.pickle"))
	for _, f := range append(files, shared...) {
		s, err := ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for d := range s.DeviceTraces {
			if err := s.CheckReplay(d); err != nil {
				t.Errorf("%s device %d: %v", filepath.Base(filepath.Dir(f))+"/"+filepath.Base(f), d, err)
			}
		}
	}
}
