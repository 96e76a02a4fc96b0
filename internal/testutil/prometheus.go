package testutil

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Prometheus is a real Prometheus server (Debian's `prometheus`) a test runs on a
// free loopback port, scraping the targets it was given every second.
type Prometheus struct {
	URL string
	t   testing.TB
}

// StartPrometheus starts Prometheus scraping targets (host:port, /metrics) every
// second; it is stopped when the test ends. Without a `prometheus` binary the
// test is skipped, except under CI=true, where it fails.
func StartPrometheus(t testing.TB, targets []string) *Prometheus {
	t.Helper()
	return StartPrometheusWith(t, targets, "", "")
}

// StartPrometheusWith is StartPrometheus with alerting rules (a rules file's
// YAML, evaluated every second) sent to an Alertmanager at alertmanager
// (host:port); either may be empty.
func StartPrometheusWith(t testing.TB, targets []string, rules, alertmanager string) *Prometheus {
	t.Helper()
	bin := lookTool(t, " (Debian's prometheus package; .ci/run installs it)", "prometheus")
	dir := t.TempDir()
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = strconv.Quote(tg)
	}
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: memsnap\n    static_configs:\n      - targets: [%s]\n",
		strings.Join(quoted, ", "))
	if rules != "" {
		if err := os.WriteFile(filepath.Join(dir, "rules.yml"), []byte(rules), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg += "rule_files: [" + strconv.Quote(filepath.Join(dir, "rules.yml")) + "]\n"
	}
	if alertmanager != "" {
		cfg += "alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: [" + strconv.Quote(alertmanager) + "]\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
	startServer(t, "prometheus", bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr)
	p := &Prometheus{URL: "http://" + addr, t: t}
	waitReady(t, "Prometheus", p.URL+"/-/ready")
	return p
}

// Sample is one series of an instant query: its labels and value.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Query evaluates an instant PromQL query at time at (now when zero).
func (p *Prometheus) Query(query string, at time.Time) ([]Sample, error) {
	v := url.Values{"query": {query}}
	if !at.IsZero() {
		v.Set("time", strconv.FormatFloat(float64(at.UnixMilli())/1000, 'f', 3, 64))
	}
	resp, err := http.Get(p.URL + "/api/v1/query?" + v.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("prometheus: %s", body.Error)
	}
	out := make([]Sample, 0, len(body.Data.Result))
	for _, r := range body.Data.Result {
		s, _ := r.Value[1].(string)
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("prometheus: value %v", r.Value[1])
		}
		out = append(out, Sample{Labels: r.Metric, Value: f})
	}
	return out, nil
}

// StartAlertmanager starts Alertmanager (Debian's prometheus-alertmanager) on a
// free loopback port, without clustering, sending every alert to webhook at
// once (group_wait 1s) with the bearer token in tokenFile; it returns its
// host:port and is stopped when the test ends. Without the binary the test is
// skipped, except under CI=true, where it fails.
func StartAlertmanager(t testing.TB, webhook, tokenFile string) string {
	t.Helper()
	bin := lookTool(t, " (.ci/run installs it)", "prometheus-alertmanager", "alertmanager")
	dir := t.TempDir()
	cfg := fmt.Sprintf(`route:
  receiver: memsnap
  group_by: [alertname]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: memsnap
    webhook_configs:
      - url: %q
        send_resolved: false
        http_config:
          authorization:
            type: Bearer
            credentials_file: %q
`, webhook, tokenFile)
	if err := os.WriteFile(filepath.Join(dir, "alertmanager.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
	startServer(t, "alertmanager", bin, "--config.file="+filepath.Join(dir, "alertmanager.yml"), "--storage.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--cluster.listen-address=")
	waitReady(t, "Alertmanager", "http://"+addr+"/-/ready")
	return addr
}

// waitReady waits until url answers 200 (a server's readiness endpoint).
func waitReady(t testing.TB, what, url string) {
	t.Helper()
	Eventually(t, time.Minute, what+" to be ready", func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// startServer starts bin with args for the test, stopping it when the test ends
// and logging what it said if the test failed.
func startServer(t testing.TB, name, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	log := &SyncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("%s said:\n%s", name, log.String())
		}
	})
}
