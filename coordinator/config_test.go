package coordinator

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/rankagent"
)

// TestProbeTimersBoundSuspicion: production's failure detection declares a
// member dead within MaxSuspicion of its failed probes at any size; up to 100
// ranks on the LAN preset's timers, above that with faster probes, never faster
// than the bound needs.
func TestProbeTimersBoundSuspicion(t *testing.T) {
	for _, n := range []int{1, 8, 64, 100, 101, 256, 1024, 4096, 100000} {
		c := DefaultConfig(rankagent.Identity{RunName: "r", Rank: 0, WorldSize: n})
		ml := c.Memberlist
		// memberlist's suspicion timeout, as its util.go computes it
		nodeScale := math.Max(1, math.Log10(math.Max(1, float64(n))))
		st := time.Duration(ml.SuspicionMult) * time.Duration(nodeScale*1000) * ml.ProbeInterval / 1000
		if st > MaxSuspicion {
			t.Errorf("%d ranks: suspicion timeout %v, over %v (probes every %v)", n, st, MaxSuspicion, ml.ProbeInterval)
		}
		if ml.ProbeTimeout <= 0 || ml.ProbeTimeout >= ml.ProbeInterval || ml.ProbeTimeout*2 > ml.ProbeInterval+time.Millisecond {
			t.Errorf("%d ranks: probe timeout %v of an interval %v (the LAN preset's is half)", n, ml.ProbeTimeout, ml.ProbeInterval)
		}
		if n <= 100 {
			if ml.ProbeInterval != time.Second || ml.ProbeTimeout != 500*time.Millisecond {
				t.Errorf("%d ranks: probes every %v, %v to answer; want the LAN preset's 1s, 500ms", n, ml.ProbeInterval, ml.ProbeTimeout)
			}
		} else if st < MaxSuspicion-10*time.Millisecond {
			t.Errorf("%d ranks: suspicion timeout %v: probes every %v are faster than %v needs", n, st, ml.ProbeInterval, MaxSuspicion)
		}
	}
	c := DefaultConfig(rankagent.Identity{RunName: "r", Rank: 0, WorldSize: 1024})
	if got := c.Memberlist.ProbeInterval; got != 664*time.Millisecond {
		t.Errorf("1,024 ranks: probes every %v, want 664ms", got)
	}
	// a client does not know the run's size: the preset's timers
	if got := DefaultConfig(rankagent.Identity{RunName: "r", Rank: -1}).Memberlist.ProbeInterval; got != time.Second {
		t.Errorf("a client probes every %v, want 1s", got)
	}
}

// TestKeyFileModes: a key file is its owner's, and at most readable by its group
// (Kubernetes' fsGroup makes a Secret's file 0440, reached through symbolic
// links): one writable by its group, or open to others, is refused with the fix.
func TestKeyFileModes(t *testing.T) {
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	dir := t.TempDir()
	for _, c := range []struct {
		mode os.FileMode
		ok   bool
	}{{0o600, true}, {0o400, true}, {0o640, true}, {0o440, true}, {0o660, false}, {0o644, false}, {0o604, false}, {0o670, false}} {
		f := filepath.Join(dir, fmt.Sprintf("key%o", c.mode))
		if err := os.WriteFile(f, []byte(key+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f, c.mode); err != nil {
			t.Fatal(err)
		}
		k, err := LoadKey("", f, func(string) string { return "" })
		if c.ok && (err != nil || len(k) != 32) {
			t.Errorf("mode %o: %v", c.mode, err)
		}
		if !c.ok && (err == nil || !strings.Contains(err.Error(), "chmod 600")) {
			t.Errorf("mode %o: accepted (%v)", c.mode, err)
		}
	}
	// a file over 4 KiB is no key file (it was read cut short)
	big := filepath.Join(dir, "big")
	os.WriteFile(big, []byte(key+strings.Repeat("\n", 4096)), 0o600)
	if _, err := LoadKey("", big, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "larger than 4096 bytes") {
		t.Errorf("a key file over 4 KiB: %v", err)
	}
	// as a Secret volume lays it out: key -> ..data/key -> ..2026_12_05/key
	sec := filepath.Join(dir, "secret")
	os.MkdirAll(filepath.Join(sec, "..2026_12_05"), 0o755)
	os.WriteFile(filepath.Join(sec, "..2026_12_05", "key"), []byte(key), 0o440)
	os.Symlink("..2026_12_05", filepath.Join(sec, "..data"))
	os.Symlink(filepath.Join("..data", "key"), filepath.Join(sec, "key"))
	if k, err := LoadKey("", filepath.Join(sec, "key"), func(string) string { return "" }); err != nil || len(k) != 32 {
		t.Fatalf("a Secret's key file: %v", err)
	}
}
