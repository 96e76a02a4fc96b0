// Package scripts holds the tests of the shell scripts beside it.
package scripts

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/testutil"
)

// server is a MinIO server `scripts/minio.sh start` began, from what it printed.
type server struct {
	state, endpoint string
	pid             int
}

// minioEnv is an environment for scripts/minio.sh whose cache (holding the MinIO
// binary the tests were given) and temporary folders are the test's own, with no
// MEMSNAP_MINIO_STATE: a shell that did not eval what start printed.
func minioEnv(t *testing.T) []string {
	t.Helper()
	bin := testutil.MinIOBin(t)
	src, err := os.ReadFile("minio.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^MINIO_VERSION="([^"]+)"`).FindSubmatch(src)
	if m == nil {
		t.Fatal("minio.sh names no MINIO_VERSION")
	}
	dir, err := os.MkdirTemp("", "msm") // short: MinIO's paths stay short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	binDir := filepath.Join(dir, "cache", "minio-"+string(m[1]))
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, filepath.Join(binDir, "minio")); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MEMSNAP_MINIO_STATE=") && !strings.HasPrefix(kv, "TMPDIR=") && !strings.HasPrefix(kv, "MEMSNAP_CACHE=") {
			env = append(env, kv)
		}
	}
	return append(env, "MEMSNAP_CACHE="+filepath.Join(dir, "cache"), "TMPDIR="+dir)
}

// minioSh runs scripts/minio.sh with args; it returns stdout, stderr and the exit status.
func minioSh(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"minio.sh"}, args...)...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// start starts a server through the script; the test's end kills it if it runs.
func start(t *testing.T, env []string) server {
	t.Helper()
	out, errs, code := minioSh(t, env, "start")
	if code != 0 {
		t.Fatalf("minio.sh start: status %d\n%s", code, errs)
	}
	var s server
	for _, line := range strings.Split(out, "\n") {
		k, v, _ := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		switch k {
		case "MEMSNAP_MINIO_STATE":
			s.state = v
		case "MEMSNAP_TEST_S3_ENDPOINT":
			s.endpoint = v
		}
	}
	pid, err := os.ReadFile(filepath.Join(s.state, "pid"))
	if err != nil {
		t.Fatalf("minio.sh start printed %q: %v", out, err)
	}
	if s.pid, err = strconv.Atoi(strings.TrimSpace(string(pid))); err != nil || !s.runs() {
		t.Fatalf("minio.sh start: pid %q (%v) does not run", pid, err)
	}
	t.Cleanup(func() {
		if s.runs() {
			syscall.Kill(s.pid, syscall.SIGKILL)
		}
	})
	return s
}

// runs says whether the server's process lives (a zombie does not) and answers.
func (s server) runs() bool {
	if syscall.Kill(s.pid, 0) != nil {
		return false
	}
	if st, err := os.ReadFile("/proc/" + strconv.Itoa(s.pid) + "/stat"); err == nil {
		if f := strings.Fields(string(st)); len(f) > 2 && f[2] == "Z" {
			return false
		}
	}
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(s.endpoint + "/minio/health/live")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// stopped waits until the server neither runs nor keeps its folder.
func (s server) stopped(t *testing.T) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "MinIO pid "+strconv.Itoa(s.pid)+" to stop", func() bool { return !s.runs() })
	if _, err := os.Stat(s.state); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the state folder %s stays (%v)", s.state, err)
	}
}

// TestMinIOStopWithoutEnvironment: `minio.sh stop` in a shell that did not eval
// what start printed finds the server start left running, stops it and says
// which (its pid and address); with nothing left it says so and exits 0; with
// two running it stops neither and names both, and `stop all` stops both.
func TestMinIOStopWithoutEnvironment(t *testing.T) {
	env := minioEnv(t)
	s := start(t, env)
	_, errs, code := minioSh(t, env, "stop")
	want := "stopped MinIO pid " + strconv.Itoa(s.pid) + " on " + strings.TrimPrefix(s.endpoint, "http://")
	if code != 0 || !strings.Contains(errs, want) {
		t.Fatalf("stop: status %d, said %q; want status 0 and %q", code, errs, want)
	}
	s.stopped(t)
	if _, errs, code = minioSh(t, env, "stop"); code != 0 || !strings.Contains(errs, "nothing to stop") {
		t.Fatalf("stop with nothing running: status %d, said %q", code, errs)
	}

	a, b := start(t, env), start(t, env)
	_, errs, code = minioSh(t, env, "stop")
	if code == 0 || !strings.Contains(errs, a.state) || !strings.Contains(errs, b.state) || !a.runs() || !b.runs() {
		t.Fatalf("stop with two running: status %d, said %q; want a failure naming both, both running", code, errs)
	}
	if _, errs, code = minioSh(t, env, "stop", "all"); code != 0 {
		t.Fatalf("stop all: status %d, said %q", code, errs)
	}
	a.stopped(t)
	b.stopped(t)
}

// TestMinIOStopNamedState: with MEMSNAP_MINIO_STATE, as test.sh's trap runs it,
// stop stops that server and leaves another running.
func TestMinIOStopNamedState(t *testing.T) {
	env := minioEnv(t)
	a, b := start(t, env), start(t, env)
	if _, errs, code := minioSh(t, append(env, "MEMSNAP_MINIO_STATE="+a.state), "stop"); code != 0 || !strings.Contains(errs, "stopped MinIO pid "+strconv.Itoa(a.pid)) {
		t.Fatalf("stop: status %d, said %q", code, errs)
	}
	a.stopped(t)
	if !b.runs() {
		t.Fatal("stopping one server stopped the other")
	}
}
