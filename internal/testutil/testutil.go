// Package testutil holds helpers shared by memsnap's tests: the MinIO server the
// test script starts, the repository's test data, and polling with a deadline.
package testutil

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/syncio"
	"github.com/memsnap/memsnap/internal/wait"
)

var ports struct {
	sync.Mutex
	given map[int]bool
}

// FreePort returns a loopback port that is free for TCP and UDP now, for a
// process the test starts later. It lies below the kernel's ephemeral range: a
// port the kernel handed out for ":0" and took back is the kind it hands to the
// next ":0" bind (memberlist's, a client's), which then steals it before the
// process binds it.
func FreePort(t testing.TB) int {
	t.Helper()
	return FreePorts(t, 1)
}

// FreePorts returns the first of n consecutive loopback ports that are free for
// TCP and UDP now (a base port whose local ranks listen on base+L), as FreePort.
func FreePorts(t testing.TB, n int) int {
	t.Helper()
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 12000 {
				lo = v
			}
		}
	}
	ports.Lock()
	defer ports.Unlock()
	if ports.given == nil {
		ports.given = map[int]bool{}
	}
	free := func(p int) bool {
		if ports.given[p] {
			return false
		}
		tl, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			return false
		}
		ul, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		tl.Close()
		if err != nil {
			return false
		}
		ul.Close()
		return true
	}
next:
	for range 10000 {
		p := 10000 + rand.IntN(lo-10000-n)
		for i := 0; i < n; i++ {
			if !free(p + i) {
				continue next
			}
		}
		for i := 0; i < n; i++ {
			ports.given[p+i] = true
		}
		return p
	}
	t.Fatal("no free loopback port below the ephemeral range")
	return 0
}

// MinIO is a running MinIO server's endpoint and root credentials.
type MinIO struct {
	Endpoint  string
	AccessKey string
	SecretKey string
}

// RequireMinIO returns the MinIO server scripts/test.sh started (read from
// MEMSNAP_TEST_S3_*). Without one the test is skipped, except under CI=true, where
// it fails: CI must never pass without having run the end-to-end tier.
func RequireMinIO(t testing.TB) MinIO {
	t.Helper()
	m := MinIO{
		Endpoint:  os.Getenv("MEMSNAP_TEST_S3_ENDPOINT"),
		AccessKey: os.Getenv("MEMSNAP_TEST_S3_ACCESS_KEY"),
		SecretKey: os.Getenv("MEMSNAP_TEST_S3_SECRET_KEY"),
	}
	if m.Endpoint == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("MEMSNAP_TEST_S3_ENDPOINT is not set under CI=true: run the tests through scripts/test.sh, which starts MinIO")
		}
		t.Skip("no MinIO: set MEMSNAP_TEST_S3_ENDPOINT (scripts/test.sh does)")
	}
	return m
}

var bucketSeq atomic.Int64

// BucketName returns a bucket name unique to this test run.
func BucketName(t testing.TB) string {
	n := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(n) > 30 {
		n = n[:30]
	}
	n = strings.Trim(n, "-.")
	return fmt.Sprintf("t%d-%d-%s", time.Now().UnixNano()%1e9, bucketSeq.Add(1), n)
}

// RepoRoot returns the repository's root folder (where go.mod is).
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Snapshot returns the path of a real snapshot kept under testdata/snapshots.
func Snapshot(t testing.TB, rel string) string {
	t.Helper()
	p := filepath.Join(RepoRoot(t), "testdata", "snapshots", rel)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("test snapshot %s: %v", rel, err)
	}
	return p
}

// Python returns python3's path. Without it the test is skipped, except under
// CI=true, where it fails: the tests that compare with CPython must run in CI.
func Python(t testing.TB) string {
	t.Helper()
	return lookTool(t, "", "python3")
}

// LookTool returns the path of the first of names found on $PATH. Without any,
// the test is skipped, except under CI=true, where it fails ("NAME is required
// under CI", then ciNote, which says what installs it).
func LookTool(t testing.TB, ciNote string, names ...string) string {
	t.Helper()
	return lookTool(t, ciNote, names...)
}

// lookTool returns the path of the first of names found. Without any, the test
// is skipped, except under CI=true, where it fails ("NAME is required under CI",
// then ciNote).
func lookTool(t testing.TB, ciNote string, names ...string) string {
	t.Helper()
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(names[0] + " is required under CI" + ciNote)
	}
	t.Skip(names[0] + " not found")
	return ""
}

// SyncBuffer is a buffer that processes and goroutines write while a test reads
// it (String): the zero syncio.Writer.
type SyncBuffer = syncio.Writer

// Eventually polls cond until it is true or the deadline passes (wait.Until).
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if ok, _ := wait.Until(context.Background(), timeout, cond); !ok {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Context returns a context cancelled when the test ends or after timeout.
func Context(t testing.TB, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// Logger sends structured logs to t.Log until the test ends and drops them after:
// background goroutines (memberlist's among them) may still log after a Shutdown
// returns, and t.Log after the end panics the whole test binary.
// It also fails the test when a line carries one key twice (a logger made
// With("rank", r) that logs "rank" again reads ambiguously).
func Logger(t testing.TB) *slog.Logger {
	w := LogWriter(t).(*tlogWriter)
	return slog.New(&uniqueKeys{Handler: slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}), w: w})
}

// uniqueKeys is a handler that reports a record whose attributes (its own and
// its logger's) repeat a key.
type uniqueKeys struct {
	slog.Handler
	w    *tlogWriter
	keys []string
}

func (h *uniqueKeys) WithAttrs(as []slog.Attr) slog.Handler {
	keys := append([]string(nil), h.keys...)
	for _, a := range as {
		keys = append(keys, a.Key)
	}
	return &uniqueKeys{Handler: h.Handler.WithAttrs(as), w: h.w, keys: keys}
}

func (h *uniqueKeys) WithGroup(name string) slog.Handler {
	return &uniqueKeys{Handler: h.Handler.WithGroup(name), w: h.w} // keys in a group are its own
}

func (h *uniqueKeys) Handle(ctx context.Context, r slog.Record) error {
	seen := map[string]bool{}
	for _, k := range h.keys {
		seen[k] = true
	}
	dup := ""
	r.Attrs(func(a slog.Attr) bool {
		if seen[a.Key] && dup == "" {
			dup = a.Key
		}
		seen[a.Key] = true
		return true
	})
	if dup != "" {
		h.w.mu.Lock()
		if !h.w.done {
			h.w.t.Errorf("a log line carries the key %q twice: %q", dup, r.Message)
		}
		h.w.mu.Unlock()
	}
	return h.Handler.Handle(ctx, r)
}

// LogWriter is Logger's writer: lines to t.Log while the test runs.
func LogWriter(t testing.TB) io.Writer {
	w := &tlogWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return w
}

type tlogWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *tlogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// MinIOServer is a MinIO server a test runs itself, so it can stop and restart it
// (the binary is $MEMSNAP_MINIO_BIN, which scripts/test.sh exports).
type MinIOServer struct {
	MinIO
	bin, addr, data string
	certsDir        string       // --certs-dir when it serves HTTPS
	client          *http.Client // asks whether it is live
	cmd             *exec.Cmd
	t               testing.TB
}

// StartMinIO starts a MinIO server of the test's own on a free loopback port with
// a temporary data folder; it is stopped when the test ends. Without
// $MEMSNAP_MINIO_BIN the test is skipped, except under CI=true, where it fails.
func StartMinIO(t testing.TB) *MinIOServer {
	t.Helper()
	return startMinIO(t, TLSFiles{})
}

// StartMinIOTLS is StartMinIO serving HTTPS with tls's server certificate; its
// Endpoint is https://127.0.0.1:PORT.
func StartMinIOTLS(t testing.TB, tls TLSFiles) *MinIOServer {
	t.Helper()
	return startMinIO(t, tls)
}

// MinIOBin is the MinIO binary the tests are given ($MEMSNAP_MINIO_BIN, which
// scripts/test.sh sets); without it the test is skipped, or fails under CI=true.
func MinIOBin(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("MEMSNAP_MINIO_BIN")
	if bin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("MEMSNAP_MINIO_BIN is not set under CI=true: run the tests through scripts/test.sh")
		}
		t.Skip("no MinIO binary: set MEMSNAP_MINIO_BIN (scripts/test.sh does)")
	}
	return bin
}

func startMinIO(t testing.TB, files TLSFiles) *MinIOServer {
	t.Helper()
	bin := MinIOBin(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
	s := &MinIOServer{bin: bin, addr: addr, data: t.TempDir(), t: t, client: http.DefaultClient,
		MinIO: MinIO{Endpoint: "http://" + addr, AccessKey: "memsnap-test", SecretKey: fmt.Sprintf("s%d-secret-key", time.Now().UnixNano())}}
	if files.CertsDir != "" {
		s.certsDir, s.Endpoint = files.CertsDir, "https://"+addr
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: files.Pool}}
		t.Cleanup(tr.CloseIdleConnections)
		s.client = &http.Client{Transport: tr}
	}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Start starts (or restarts) the server on its address and data folder and waits
// until it answers.
func (s *MinIOServer) Start() {
	s.t.Helper()
	args := []string{"server", "--quiet", "--address", s.addr}
	if s.certsDir != "" {
		args = append(args, "--certs-dir", s.certsDir)
	}
	cmd := exec.Command(s.bin, append(args, s.data)...)
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+s.AccessKey, "MINIO_ROOT_PASSWORD="+s.SecretKey, "MINIO_BROWSER=off", "MINIO_UPDATE=off")
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.cmd = cmd
	// live answers before the server can serve requests; cluster only once it can
	Eventually(s.t, 60*time.Second, "MinIO to answer", func() bool {
		resp, err := s.client.Get(s.Endpoint + "/minio/health/cluster")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// Stop kills the server (its data stays for a restart).
func (s *MinIOServer) Stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}
