package snapshot

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
)

func allSnapshots(t testing.TB) []string {
	files, _ := filepath.Glob(filepath.Join(testutil.RepoRoot(t), "testdata", "snapshots", "*", "*.pickle"))
	if len(files) < 10 {
		t.Fatalf("expected the real snapshots under testdata/snapshots, found %d", len(files))
	}
	return files
}

// pythonFigures runs the reference script on files.
func pythonFigures(t *testing.T, files []string) map[string]map[string]any {
	t.Helper()
	py := testutil.Python(t)
	script := filepath.Join(testutil.RepoRoot(t), "testdata", "figures.py")
	out, err := exec.Command(py, append([]string{script}, files...)...).Output()
	if err != nil {
		t.Fatalf("figures.py: %v", err)
	}
	res := map[string]map[string]any{}
	for i, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		res[files[i]] = m
	}
	return res
}

func TestFiguresMatchPython(t *testing.T) {
	files := allSnapshots(t)
	want := pythonFigures(t, files)
	for _, f := range files {
		t.Run(filepath.Base(filepath.Dir(f))+"/"+filepath.Base(f), func(t *testing.T) {
			s, err := ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			fig := s.ComputeFigures()
			b, _ := json.Marshal(fig)
			var got map[string]any
			json.Unmarshal(b, &got)
			w := want[f]
			delete(w, "file")
			gb, _ := json.Marshal(got)
			wb, _ := json.Marshal(w)
			if !bytes.Equal(gb, wb) {
				t.Fatalf("figures differ:\n got %s\nwant %s", gb, wb)
			}
		})
	}
}

// TestRoundTripPython decodes every real file, encodes it again, and has CPython
// check that both pickles load to equal objects; our file must not be larger.
func TestRoundTripPython(t *testing.T) {
	py := testutil.Python(t)
	dir := t.TempDir()
	var pairs []string
	for i, f := range allSnapshots(t) {
		s, err := ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out, err := EncodeBytes(s)
		if err != nil {
			t.Fatal(err)
		}
		orig, _ := os.ReadFile(f)
		if len(out) > len(orig) {
			t.Errorf("%s: re-encoded %d bytes, torch wrote %d", f, len(out), len(orig))
		}
		p := filepath.Join(dir, filepath.Base(f)+"."+string(rune('a'+i)))
		os.WriteFile(p, out, 0o644)
		pairs = append(pairs, f, p)
		// and our own decoder reads what we wrote, to the same figures
		s2, err := Decode(out)
		if err != nil {
			t.Fatalf("decoding our own output of %s: %v", f, err)
		}
		a, _ := json.Marshal(s.ComputeFigures())
		b, _ := json.Marshal(s2.ComputeFigures())
		if !bytes.Equal(a, b) {
			t.Fatalf("%s: figures changed through a round trip", f)
		}
	}
	script := `import pickle, sys, pickletools
args = sys.argv[1:]
for a, b in zip(args[::2], args[1::2]):
    x = pickle.load(open(a, "rb")); y = pickle.load(open(b, "rb"))
    if x != y:
        print("DIFFERENT", a); sys.exit(1)
    ops = {op.name for op, _, _ in pickletools.genops(open(b, "rb").read())}
    bad = ops & {"BINUNICODE8", "BINBYTES8", "BYTEARRAY8", "NEXT_BUFFER", "READONLY_BUFFER", "BINPUT", "LONG_BINPUT", "LONG4"}
    if bad:
        print("OPCODES", a, bad); sys.exit(1)
print("OK", len(args) // 2)`
	out, err := exec.Command(py, append([]string{"-c", script}, pairs...)...).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "OK") {
		t.Fatalf("python: %v: %s", err, out)
	}
}

func TestCompressed(t *testing.T) {
	f := testutil.Snapshot(t, "ddp4/rank3.5.memory_snapshot.pickle")
	raw, _ := os.ReadFile(f)
	want, _ := Decode(raw)
	dir := t.TempDir()
	gz := filepath.Join(dir, "x.pickle.gz")
	zs := filepath.Join(dir, "x.pickle.zst")
	if err := exec.Command("sh", "-c", "gzip -c "+f+" > "+gz).Run(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{gz, zs} {
		if p == zs {
			if _, err := exec.LookPath("zstd"); err != nil {
				zb := zstdCompress(t, raw)
				os.WriteFile(zs, zb, 0o644)
			} else if err := exec.Command("zstd", "-q", "-f", f, "-o", zs).Run(); err != nil {
				t.Fatal(err)
			}
		}
		s, err := ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.DeviceTraces[0]) != len(want.DeviceTraces[0]) || s.ComputeFigures().Devices[0] != want.ComputeFigures().Devices[0] {
			t.Fatalf("%s decoded differently", p)
		}
	}
}
