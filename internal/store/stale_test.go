package store

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSweepStale: the temporaries a killed process left in a folder store go at
// the next merge's start; those of a live process, of another host (until a day
// old) and names this code does not make stay.
func TestSweepStale(t *testing.T) {
	root := t.TempDir()
	d, err := OpenDir(root, false)
	if err != nil {
		t.Fatal(err)
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Skip("no `true` to run:", err)
	}
	host := strings.SplitN(ownerTag(), "-", 2)[0]
	mk := func(name string, age time.Duration) string {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "pickle.0"), make([]byte, 1000), 0o644); err != nil {
			t.Fatal(err)
		}
		if age > 0 {
			old := time.Now().Add(-age)
			os.Chtimes(p, old, old)
		}
		return p
	}
	deadTag := tmpPrefix + "dir-" + host + "-" + strconv.Itoa(dead.Process.Pid) + "-"
	gone := []string{
		mk(deadTag+"123", 2*time.Hour),
		mk(tmpPrefix+"dir-otherhost-77-456", 48*time.Hour),
	}
	kept := []string{
		mk(deadTag+"124", time.Minute),                                              // its process may live in another PID namespace: not yet
		mk(tmpPrefix+"dir-"+host+"-"+strconv.Itoa(os.Getpid())+"-789", 2*time.Hour), // this process's: it writes there
		mk(tmpPrefix+"dir-otherhost-77-111", time.Hour),                             // another host's, recent
		mk(tmpPrefix+"dir-12345", 48*time.Hour),                                     // a name of an older memsnap
		mk("run/torch_memory_traces", 48*time.Hour),                                 // objects
	}
	tmp, err := d.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(tmp), tmpPrefix+"dir-"+ownerTag()) {
		t.Fatalf("a temporary folder named %s, not by its owner", tmp)
	}
	for _, p := range gone {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s was left", p)
		}
	}
	for _, p := range append(kept, tmp) {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
	if n, b := SweepStale(root, tmpPrefix+"dir-"); n != 0 || b != 0 {
		t.Errorf("a second sweep removed %d (%d bytes)", n, b)
	}
}
