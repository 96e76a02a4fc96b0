package rankagent

import (
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeAPIServer serves one Job (completions n; 0: none; -1: 8, in an answer
// over 4 MiB; -2: 503 Service Unavailable) over TLS on loopback, as
// Kubernetes' API server does, to the holder of token; it points
// serviceAccountDir at a folder holding the pod's token (podToken), the server's
// CA and the namespace, and returns the pod's environment.
func fakeAPIServer(t *testing.T, ns, job string, n int, token, podToken string) func(string) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, `{"kind":"Status","reason":"Forbidden"}`, http.StatusForbidden)
			return
		}
		if r.URL.Path != fmt.Sprintf("/apis/batch/v1/namespaces/%s/jobs/%s", ns, job) {
			http.Error(w, `{"kind":"Status","reason":"NotFound"}`, http.StatusNotFound)
			return
		}
		if n == -2 {
			http.Error(w, `{"kind":"Status","reason":"ServiceUnavailable"}`, http.StatusServiceUnavailable)
			return
		}
		spec := `{"completionMode":"Indexed"}`
		switch {
		case n > 0:
			spec = fmt.Sprintf(`{"completionMode":"Indexed","completions":%d,"parallelism":%d}`, n, n)
		case n == -1:
			spec = fmt.Sprintf(`{"completionMode":"Indexed","completions":8,"padding":%q}`, strings.Repeat("x", 4<<20))
		}
		fmt.Fprintf(w, `{"kind":"Job","apiVersion":"batch/v1","metadata":{"name":%q,"namespace":%q},"spec":%s}`, job, ns, spec)
	}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = l
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	for name, body := range map[string]string{"token": podToken + "\n", "ca.crt": string(ca), "namespace": ns} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	prev := serviceAccountDir
	serviceAccountDir = dir
	t.Cleanup(func() { serviceAccountDir = prev })
	host, port, _ := net.SplitHostPort(l.Addr().String())
	env := map[string]string{"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port, "JOB_COMPLETION_INDEX": "3",
		"HOSTNAME": job + "-3", "MEMSNAP_RUN_NAME": "train-7f3a"}
	return func(k string) string { return env[k] }
}

// TestWorldSizeFromTheJob: in a Kubernetes indexed Job without WORLD_SIZE, the
// world size is the Job's own spec.completions, read from the API server with
// the pod's service account (the manifest states it once); without the right to
// read it, or in a Job without completions, the agent says what to do.
func TestWorldSizeFromTheJob(t *testing.T) {
	getenv := fakeAPIServer(t, "ml", "train", 8, "tok", "tok")
	id, err := ResolveIdentity(context.Background(), getenv, Overrides{Rank: -1, LocalRank: -1, NodeRank: -1, WorldSize: -1, LocalWorld: -1})
	if err != nil || id.WorldSize != 8 || id.Rank != 3 || id.Launcher != "kubernetes" || id.RunName != "train-7f3a" {
		t.Fatalf("identity %+v %v", id, err)
	}
	// WORLD_SIZE, when set, is taken as it is (no API call: the token is wrong)
	bad := fakeAPIServer(t, "ml", "train", 8, "tok", "another")
	withWS := func(k string) string {
		if k == "WORLD_SIZE" {
			return "4"
		}
		return bad(k)
	}
	if id, err := ResolveIdentity(context.Background(), withWS, Overrides{Rank: -1, LocalRank: -1, NodeRank: -1, WorldSize: -1, LocalWorld: -1}); err != nil || id.WorldSize != 4 {
		t.Fatalf("with WORLD_SIZE: %+v %v", id, err)
	}
	for _, c := range []struct {
		name   string
		getenv func() func(string) string
		want   string
	}{
		{"no right to read the Job", func() func(string) string { return fakeAPIServer(t, "ml", "train", 8, "tok", "another") },
			"403 Forbidden: the pod's service account needs get on this Job"},
		{"a Job without completions", func() func(string) string { return fakeAPIServer(t, "ml", "train", 0, "tok", "tok") },
			"spec.completions (<nil>) is no world size"},
		{"an answer over 4 MiB", func() func(string) string { return fakeAPIServer(t, "ml", "train", -1, "tok", "tok") },
			"the API server's answer is larger than 4194304 bytes"},
		{"another Job's name", func() func(string) string {
			g := fakeAPIServer(t, "ml", "train", 8, "tok", "tok")
			return func(k string) string {
				if k == "HOSTNAME" {
					return "eval-3"
				}
				return g(k)
			}
		}, "Job ml/eval: no such Job"},
		{"a hostname that is no <job>-<index>", func() func(string) string {
			g := fakeAPIServer(t, "ml", "train", 8, "tok", "tok")
			return func(k string) string {
				if k == "HOSTNAME" {
					return "trainer"
				}
				return g(k)
			}
		}, "set MEMSNAP_K8S_JOB"},
		{"not in a pod", func() func(string) string {
			return func(k string) string { return map[string]string{"JOB_COMPLETION_INDEX": "3"}[k] }
		}, "not in a Kubernetes pod"},
	} {
		_, err := ResolveIdentity(context.Background(), c.getenv(), Overrides{Rank: -1, LocalRank: -1, NodeRank: -1, WorldSize: -1, LocalWorld: -1})
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "set WORLD_SIZE") {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// TestJobReadStopsWithItsContext: an API server that keeps failing is asked
// again after a wait, but a context that ends stops the waits at once.
func TestJobReadStopsWithItsContext(t *testing.T) {
	getenv := fakeAPIServer(t, "ml", "train", -2, "tok", "tok")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := ResolveIdentity(ctx, getenv, Overrides{Rank: -1, LocalRank: -1, NodeRank: -1, WorldSize: -1, LocalWorld: -1})
	if err == nil || !strings.Contains(err.Error(), "503 Service Unavailable") || time.Since(start) > 2*time.Second {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}
}
