package rankagent

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/sidecar"
)

// TestHookUnitTests runs the hook's own Python tests (a stand-in torch, a stand-in agent).
func TestHookUnitTests(t *testing.T) {
	py := testutil.Python(t)
	cmd := exec.Command(py, "-m", "unittest", "discover", "-s", "hook", "-p", "test_*.py")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		t.Fatalf("python hook tests: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// TestHookWithRealAgent runs the real hook in a real Python training loop (with the
// stand-in torch, whose snapshot is a real recorded one) against the real agent.
func TestHookWithRealAgent(t *testing.T) {
	py := testutil.Python(t)
	dir := t.TempDir()
	cfg := DefaultConfig(testID(2))
	cfg.OpenStore = func(context.Context) (store.Store, error) { return store.OpenDir(dir, true) }
	h := startAgent(t, cfg)
	w, err := h.agent.ArmNext(5, 8) // armed before the trainer exists: sent when it connects
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, filepath.Join("hook", "testdata", "train_fake.py"), "30", "0.02", "1")
	cmd.Env = append(os.Environ(),
		"MEMSNAP_SOCKET="+h.agent.Socket(),
		"MEMSNAP_FAKE_SNAPSHOT="+testutil.Snapshot(t, "ddp4/rank2.5.memory_snapshot.pickle"),
		"PYTHONPATH="+filepath.Join("hook", "testdata", "faketorch")+string(os.PathListSeparator)+"hook",
		"RANK=2", "LOCAL_RANK=2", "WORLD_SIZE=4")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("trainer: %v\n%s", err, out)
	}
	r := waitUpload(t, h, 20*time.Second)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if want := fmt.Sprintf("run1/torch_memory_traces/rank2.%d.memory_snapshot.pickle", w.Stop); r.Key != want {
		t.Fatalf("key %q, want %q", r.Key, want)
	}
	st, _ := store.OpenDir(dir, false)
	b, _ := store.ReadAll(context.Background(), st, r.Key)
	if r.Events != 549 || len(b) == 0 {
		t.Fatalf("uploaded %d events (%d bytes), want 549; trainer said:\n%s", r.Events, len(b), out)
	}
	mb, _ := store.ReadAll(context.Background(), st, strings.TrimSuffix(r.Key, ".pickle")+".memsnap.json")
	if !strings.Contains(string(mb), `"batch": 5`) || !strings.Contains(string(mb), `"batch": 7`) || strings.Contains(string(mb), `"batch": 8`) {
		t.Fatalf("batch marks are not exactly 5..7:\n%s", mb)
	}
	if meta, err := sidecar.ParseRankMeta(mb); err != nil || meta.StallUS <= 0 {
		t.Fatalf("the trainer's stall at the window's end is not recorded: %+v %v", meta, err)
	}
	if !strings.Contains(string(out), "('record', 'all', 'all', 'python', 100000)") || !strings.Contains(string(out), "('record', None") {
		t.Fatalf("the hook did not turn history on and off:\n%s", out)
	}
}

// TestHookInstalledWithPip: `pip install ./hook` into a fresh virtual environment
// (offline: the build backend needs only the standard library) gives `import
// memsnap_hook`, and the hook's tests pass against the installed copy (run from a
// folder that holds no memsnap_hook.py, so the source copy cannot be imported).
func TestHookInstalledWithPip(t *testing.T) {
	venv, vpy := newVenv(t)
	if out, err := exec.Command(vpy, "-m", "pip", "install", "--no-index", "--disable-pip-version-check", "./hook").CombinedOutput(); err != nil {
		t.Fatalf("pip install ./hook: %v\n%s", err, out)
	}
	out, err := exec.Command(vpy, "-c", "import memsnap_hook; print(memsnap_hook.__file__)").CombinedOutput()
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(out)), venv) {
		t.Fatalf("import memsnap_hook: %v %s", err, out)
	}
	tests := t.TempDir()
	for _, f := range []string{"test_hook.py", "testdata"} {
		if out, err := exec.Command("cp", "-r", filepath.Join("hook", f), tests).CombinedOutput(); err != nil {
			t.Fatalf("%v %s", err, out)
		}
	}
	cmd := exec.Command(vpy, "-m", "unittest", "discover", "-s", tests, "-p", "test_*.py")
	cmd.Dir = tests
	cmd.Env = append(os.Environ(), "MEMSNAP_HOOK_INSTALLED=1")
	out, err = cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		t.Fatalf("the hook's tests against the installed copy: %v\n%s", err, out)
	}
}

// TestHookInstalledEditable: `pip install -e ./hook` (PEP 660, offline) makes
// `import memsnap_hook` the source file itself, so an edit is seen at once.
func TestHookInstalledEditable(t *testing.T) {
	_, vpy := newVenv(t)
	if out, err := exec.Command(vpy, "-m", "pip", "install", "--no-index", "--disable-pip-version-check", "-e", "./hook").CombinedOutput(); err != nil {
		t.Fatalf("pip install -e ./hook: %v\n%s", err, out)
	}
	src, err := filepath.Abs(filepath.Join("hook", "memsnap_hook.py"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(vpy, "-c", "import memsnap_hook; print(memsnap_hook.__file__)")
	cmd.Dir = t.TempDir() // not beside the source
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != src {
		t.Fatalf("import memsnap_hook: %v %s (want %s)", err, out, src)
	}
}

// newVenv makes a fresh virtual environment; it returns its folder and python.
func newVenv(t *testing.T) (venv, python string) {
	t.Helper()
	py := testutil.Python(t)
	venv = filepath.Join(t.TempDir(), "venv")
	if out, err := exec.Command(py, "-m", "venv", venv).CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("python3 -m venv: %v\n%s", err, out)
		}
		t.Skipf("no venv module (Debian: python3-venv): %v", err)
	}
	return venv, filepath.Join(venv, "bin", "python")
}
