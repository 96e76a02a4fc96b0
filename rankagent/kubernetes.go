package rankagent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/memsnap/memsnap/internal/bounded"
	"github.com/memsnap/memsnap/internal/retry"
	"github.com/memsnap/memsnap/merge/sidecar"
)

// serviceAccountDir is where Kubernetes mounts a pod's service account: its
// token, the API server's CA and the pod's namespace (tests point it elsewhere).
var serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// kubernetesJobTimeout bounds reading the Job from the API server, every try.
const kubernetesJobTimeout = 20 * time.Second

// jobCompletions reads the world size of a Kubernetes indexed Job from the Job
// itself (spec.completions), so the manifest states it once: the pod's service
// account must be allowed to get the Job (deploy/kubernetes.yaml's Role). The
// Job's name is $MEMSNAP_K8S_JOB, else the pod's hostname less its
// "-<index>" (an indexed Job's pods are named so); its namespace
// $POD_NAMESPACE, else the service account's.
func jobCompletions(ctx context.Context, getenv func(string) string) (int, error) {
	host, port := getenv("KUBERNETES_SERVICE_HOST"), getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return 0, errors.New("not in a Kubernetes pod (KUBERNETES_SERVICE_HOST is not set)")
	}
	job := getenv("MEMSNAP_K8S_JOB")
	if job == "" {
		h := getenv("HOSTNAME")
		if h == "" {
			h, _ = os.Hostname()
		}
		suffix := "-" + strings.TrimSpace(getenv("JOB_COMPLETION_INDEX"))
		if !strings.HasSuffix(h, suffix) || len(h) == len(suffix) {
			return 0, fmt.Errorf("the pod's hostname %q is not <job>-<index> (set MEMSNAP_K8S_JOB to the Job's name)", h)
		}
		job = strings.TrimSuffix(h, suffix)
	}
	ns := getenv("POD_NAMESPACE")
	if ns == "" {
		b, err := os.ReadFile(filepath.Join(serviceAccountDir, "namespace"))
		if err != nil {
			return 0, fmt.Errorf("the pod's namespace: %w (set POD_NAMESPACE)", err)
		}
		ns = strings.TrimSpace(string(b))
	}
	token, err := os.ReadFile(filepath.Join(serviceAccountDir, "token"))
	if err != nil {
		return 0, fmt.Errorf("no service account token: %w (the pod needs automountServiceAccountToken)", err)
	}
	ca, err := os.ReadFile(filepath.Join(serviceAccountDir, "ca.crt"))
	if err != nil {
		return 0, fmt.Errorf("the API server's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return 0, fmt.Errorf("the API server's CA (%s) holds no certificate", filepath.Join(serviceAccountDir, "ca.crt"))
	}
	client := &http.Client{Timeout: kubernetesJobTimeout, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	u := fmt.Sprintf("https://%s/apis/batch/v1/namespaces/%s/jobs/%s", net.JoinHostPort(host, port), url.PathEscape(ns), url.PathEscape(job))
	wait := retry.Backoff{Min: time.Second, Max: 2 * time.Second}
	for try := 1; ; try++ {
		n, again, err := getCompletions(ctx, client, u, strings.TrimSpace(string(token)))
		if err == nil {
			return n, nil
		}
		if !again || try == 3 || !wait.Wait(ctx) {
			return 0, fmt.Errorf("Job %s/%s: %w", ns, job, err)
		}
	}
}

func getCompletions(ctx context.Context, client *http.Client, u, token string) (n int, again bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, kubernetesJobTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, false, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, true, err
	}
	defer resp.Body.Close()
	body, err := bounded.Read(resp.Body, "the API server's answer", 4<<20)
	if err != nil {
		return 0, !errors.Is(err, bounded.ErrTooLarge), err
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return 0, false, fmt.Errorf("the API server says %s: the pod's service account needs get on this Job (deploy/kubernetes.yaml's Role)", resp.Status)
	case resp.StatusCode == http.StatusNotFound:
		return 0, false, fmt.Errorf("no such Job (%s)", resp.Status)
	case resp.StatusCode != http.StatusOK:
		return 0, resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests, fmt.Errorf("the API server says %s", resp.Status)
	}
	var job struct {
		Spec struct {
			Completions    *int   `json:"completions"`
			CompletionMode string `json:"completionMode"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(body, &job); err != nil {
		return 0, false, fmt.Errorf("the Job is not JSON: %w", err)
	}
	if c := job.Spec.Completions; c == nil || *c < 1 || *c > sidecar.MaxRanks {
		return 0, false, fmt.Errorf("its spec.completions (%v) is no world size (1 to %d)", job.Spec.Completions, sidecar.MaxRanks)
	}
	return *job.Spec.Completions, false, nil
}
