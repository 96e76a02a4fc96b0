package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/runlog"
)

// metricsJob is n real `memsnap agent` processes serving metrics, each beside
// a replay trainer that reports the figures the hook would, rank r leaking
// leak[r] bytes a batch on a 40 GiB device.
type metricsJob struct {
	run, key, store string
	gossip          int
	targets         []string    // each agent's metrics address
	agents          []*exec.Cmd // each agent, its own process group
	base            [][3]int64  // each rank's recorded allocated and reserved bytes at its end, and its peak
}

func startMetricsJob(t *testing.T, leak []int64, extra ...string) *metricsJob {
	n := len(leak)
	code, keyOut, _ := runCLI(t, "keygen")
	if code != 0 {
		t.Fatal("keygen failed")
	}
	j := &metricsJob{key: strings.TrimSpace(keyOut), store: t.TempDir(), run: fmt.Sprintf("metrics%d", time.Now().UnixNano()%1e6), base: make([][3]int64, n)}
	sockDir, _ := os.MkdirTemp("", "ms")
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	j.gossip = testutil.FreePorts(t, n)
	mport := testutil.FreePorts(t, n)
	var agents []*exec.Cmd
	var logs []*testutil.SyncBuffer
	for r := 0; r < n; r++ {
		path := testutil.Snapshot(t, fmt.Sprintf("ddp4/rank%d.5.memory_snapshot.pickle", r))
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		s, err := snapshot.DecodeAny(b)
		if err != nil {
			t.Fatal(err)
		}
		j.base[r] = [3]int64{s.AllocatedAtEnd(0), s.ReservedAtEnd(0), s.ComputeFigures().Devices[0].PeakAllocatedBytes}
		if j.base[r][2] <= j.base[r][0] {
			t.Fatalf("rank %d's recorded snapshot peaks at %d bytes, no more than it ends with: the headroom would not tell the peak from the end", r, j.base[r][2])
		}
		target := fmt.Sprintf("127.0.0.1:%d", mport+r)
		j.targets = append(j.targets, target)
		args := []string{"agent", "--run-name", j.run, "--rank", strconv.Itoa(r), "--local-rank", strconv.Itoa(r), "--world-size", strconv.Itoa(n),
			"--local-world-size", strconv.Itoa(n), "--store", j.store, "--spool", filepath.Join(sockDir, fmt.Sprintf("spool%d", r)),
			"--socket", filepath.Join(sockDir, fmt.Sprintf("s%d", r)), "--bind", "127.0.0.1", "--gossip-port", strconv.Itoa(j.gossip), "--no-schedule",
			"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", mport)} // (plus the local rank)
		args = append(args, extra...)
		if r > 0 {
			args = append(args, "--join", fmt.Sprintf("127.0.0.1:%d", j.gossip))
		}
		args = append(args, "--", os.Args[0], "replay", "--snapshot", path, "--batches", "0", "--pace", "20ms", "--rank", strconv.Itoa(r),
			"--leak-per-batch", strconv.FormatInt(leak[r], 10), "--device-total", "40GiB", "--memory-every", "100ms")
		cmd := memsnapCmd(t, args...)
		cmd.Env = append(cmd.Env, coordinator.KeyEnv+"="+j.key)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		buf := &testutil.SyncBuffer{}
		cmd.Stderr, cmd.Stdout = buf, buf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		agents, logs = append(agents, cmd), append(logs, buf)
	}
	j.agents = agents
	t.Cleanup(func() {
		for _, a := range agents {
			syscall.Kill(-a.Process.Pid, syscall.SIGKILL)
			a.Wait()
		}
		if t.Failed() {
			for i, l := range logs {
				t.Logf("agent %d said:\n%s", i, l)
			}
		}
	})
	return j
}

// TestMetricsScrapedByPrometheus: three real `memsnap agent` processes serve
// metrics (--metrics-addr), each beside a replay trainer that reports the memory
// figures the hook would, two of them leaking; a real Prometheus server scrapes
// them, and its answers are the trainers' figures, rank by rank: allocated bytes
// that follow the leak batch by batch, the reserved bytes, the headroom, the
// growth per batch, and the agents' own health (the leader, the members).
func TestMetricsScrapedByPrometheus(t *testing.T) {
	const n = 3
	leak := []int64{0, 1 << 20, 3 << 20}
	const devTotal = int64(40 << 30)
	j := startMetricsJob(t, leak)
	run, key, gossip, targets, base := j.run, j.key, j.gossip, j.targets, j.base
	prom := testutil.StartPrometheus(t, targets)
	host, _ := os.Hostname()

	// one moment's answers: every series of one target comes from one scrape
	type rankFigures map[string]float64
	var got map[int]rankFigures
	var why string
	names := []string{"allocated_bytes", "reserved_bytes", "peak_allocated_bytes", "device_used_bytes", "device_total_bytes", "headroom_bytes",
		"growth_bytes_per_batch", "batch", "leader", "members", "alloc_retries_total", "ooms_total", "inactive_split_bytes"}
	read := func() bool {
		at := time.Now()
		got = map[int]rankFigures{}
		for _, name := range names {
			ss, err := prom.Query("memsnap_"+name, at)
			if err != nil {
				why = err.Error()
				return false
			}
			for _, s := range ss {
				if s.Labels["run"] != run || s.Labels["node"] != host {
					t.Fatalf("memsnap_%s labelled %v, want run=%s node=%s", name, s.Labels, run, host)
				}
				r, err := strconv.Atoi(s.Labels["rank"])
				if err != nil || r < 0 || r >= n {
					t.Fatalf("memsnap_%s labelled %v", name, s.Labels)
				}
				if got[r] == nil {
					got[r] = rankFigures{}
				}
				got[r][name] = s.Value
			}
		}
		for r := 0; r < n; r++ {
			if len(got[r]) != len(names) {
				why = fmt.Sprintf("rank %d has %d of %d series: %v", r, len(got[r]), len(names), got[r])
				return false
			}
		}
		return true
	}
	// the figures of each rank, as its trainer reported them at the end of a batch
	check := func() bool {
		if !read() {
			return false
		}
		for r := 0; r < n; r++ {
			f := got[r]
			batch := int64(f["batch"])
			alloc := base[r][0] + leak[r]*(batch+1)
			peak := base[r][2] + leak[r]*(batch+1)
			res := max(base[r][1], (peak+(2<<20)-1)/(2<<20)*(2<<20))
			want := rankFigures{"allocated_bytes": float64(alloc), "reserved_bytes": float64(res), "peak_allocated_bytes": float64(peak),
				"device_total_bytes": float64(devTotal), "device_used_bytes": float64(res), "headroom_bytes": float64(devTotal - res + max(res-peak, 0)),
				"growth_bytes_per_batch": float64(leak[r]), "alloc_retries_total": 0, "ooms_total": 0, "inactive_split_bytes": 0,
				"members": n, "leader": 0}
			if r == 0 {
				want["leader"] = 1
			}
			for k, v := range want {
				if f[k] != v {
					why = fmt.Sprintf("rank %d at batch %d: memsnap_%s = %v, want %v", r, batch, k, f[k], v)
					return false
				}
			}
		}
		return true
	}
	defer func() {
		if t.Failed() {
			t.Logf("the last mismatch: %s", why)
		}
	}()
	testutil.Eventually(t, 2*time.Minute, "Prometheus's figures to be the trainers'", check)
	// and they move: a leaking rank's allocated bytes are more a moment later
	first := got[2]["allocated_bytes"]
	testutil.Eventually(t, time.Minute, "rank 2's leak to show in a later scrape", func() bool {
		return check() && got[2]["allocated_bytes"] > first
	})
	// the cluster's least headroom is one query away, over every agent's own
	// figures, or from the leader alone, which holds every rank's: rank 2, which
	// leaks the most, is soon the lowest
	testutil.Eventually(t, time.Minute, "rank 2 the lowest headroom, from every agent and from the leader's view", func() bool {
		worst, err := prom.Query("bottomk(1, memsnap_headroom_bytes)", time.Time{})
		if err != nil || len(worst) != 1 || worst[0].Labels["rank"] != "2" {
			why = fmt.Sprintf("bottomk: %v %v", worst, err)
			return false
		}
		lead, err := prom.Query("memsnap_cluster_headroom_min_bytes", time.Time{})
		if err != nil || len(lead) != 1 || lead[0].Labels["rank"] != "2" || lead[0].Labels["instance"] != targets[0] || lead[0].Labels["node"] != host {
			why = fmt.Sprintf("the leader's least headroom: %v %v", lead, err)
			return false
		}
		n, err := prom.Query("memsnap_cluster_ranks_reporting", time.Time{})
		if err != nil || len(n) != 1 || n[0].Value != 3 {
			why = fmt.Sprintf("ranks reporting: %v %v", n, err)
			return false
		}
		return true
	})
	// memsnap top --json, from a machine that reaches one agent: the leader's
	// view, every rank, the least headroom first
	var view struct {
		WorldSize  int `json:"world_size"`
		LeaderRank int `json:"leader_rank"`
		Ranks      []struct {
			Rank      int     `json:"rank"`
			Node      string  `json:"node"`
			Allocated int64   `json:"allocated_bytes"`
			Batch     int64   `json:"batch"`
			Growth    float64 `json:"growth_bytes_per_batch"`
		} `json:"ranks"`
	}
	cmd := memsnapCmd(t, "top", "--json", "--join", fmt.Sprintf("127.0.0.1:%d", gossip+2), "--run", run)
	cmd.Env = append(cmd.Env, coordinator.KeyEnv+"="+key)
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil || json.Unmarshal(out, &view) != nil {
		t.Fatalf("memsnap top --json: %v\n%s%s", err, out, errOut.String())
	}
	if view.WorldSize != n || view.LeaderRank != 0 || len(view.Ranks) != n || view.Ranks[0].Rank != 2 || view.Ranks[0].Node != host ||
		view.Ranks[0].Growth != float64(leak[2]) || view.Ranks[0].Allocated != base[2][0]+leak[2]*(view.Ranks[0].Batch+1) {
		t.Fatalf("memsnap top --json: %s", out)
	}
	// without --json, on a pipe: a table each refresh, until Ctrl-C
	cmd = memsnapCmd(t, "top", "--every", "200ms", "--join", fmt.Sprintf("127.0.0.1:%d", gossip+1), "--run", run)
	cmd.Env = append(cmd.Env, coordinator.KeyEnv+"="+key)
	tbl := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = tbl, tbl
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "two tables from memsnap top", func() bool { return strings.Count(tbl.String(), "RANK") >= 2 })
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil || !strings.Contains(tbl.String(), "3 of 3 ranks reporting · leader rank 0") {
		t.Fatalf("memsnap top: %v\n%s", err, tbl.String())
	}
	// on a pipe whose reader goes (memsnap top | head): it leaves the cluster and
	// exits 0, not killed by SIGPIPE
	cmd = memsnapCmd(t, "top", "--every", "200ms", "--join", fmt.Sprintf("127.0.0.1:%d", gossip+1), "--run", run)
	cmd.Env = append(cmd.Env, coordinator.KeyEnv+"="+key)
	errBuf := &testutil.SyncBuffer{}
	cmd.Stderr = errBuf
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	table := make(chan bool, 1)
	go func() {
		head := bufio.NewScanner(pipe)
		for head.Scan() {
			if strings.Contains(head.Text(), "RANK") {
				table <- true
				return
			}
		}
		table <- false
	}()
	select {
	case ok := <-table:
		if !ok {
			t.Fatalf("memsnap top ended before a table\n%s", errBuf.String())
		}
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatalf("no table from memsnap top within a minute\n%s", errBuf.String())
	}
	pipe.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("memsnap top | head: %v\n%s", err, errBuf.String())
		}
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatalf("memsnap top went on writing to a closed pipe\n%s", errBuf.String())
	}
}

// TestTopEndsWithTheJob: memsnap top, watching a job whose agents all stop,
// says the run ended and exits 0 on its own, rather than asking for a leader
// until Ctrl-C; every line it printed fits 80 columns.
func TestTopEndsWithTheJob(t *testing.T) {
	j := startMetricsJob(t, []int64{0, 0})
	cmd := memsnapCmd(t, "top", "--every", "500ms", "--join", fmt.Sprintf("127.0.0.1:%d", j.gossip), "--run", j.run)
	cmd.Env = append(cmd.Env, coordinator.KeyEnv+"="+j.key)
	out := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	testutil.Eventually(t, time.Minute, "both ranks in memsnap top", func() bool { return strings.Contains(out.String(), "2 of 2 ranks reporting") })
	for _, a := range j.agents {
		syscall.Kill(-a.Process.Pid, syscall.SIGTERM) // the launcher tears the job down
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("memsnap top: %v\n%s", err, out.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("memsnap top went on after the job ended:\n%s", out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "run "+j.run+" ended: no rank has been a member for ") {
		t.Fatalf("the last line: %q\n%s", last, out.String())
	}
	fits(t, out.String(), 80)
}

// TestAlertmanagerWebhook: a rule on memsnap_headroom_ratio in a real Prometheus,
// a real Alertmanager (Debian's) whose webhook is the agent's endpoint with its
// bearer token: the leaking rank's alert fires, and the cluster takes a window of
// every rank whose reason is the alert's name and the rank.
func TestAlertmanagerWebhook(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("memsnap-test-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	j := startMetricsJob(t, []int64{0, 0, 3 << 20}, "--api-token-file", tokenFile)
	// the webhook passes through a proxy that notes when the first alert arrived
	arrived := make(chan time.Time, 1)
	agentAPI, _ := url.Parse("http://" + j.targets[0])
	proxy := httputil.NewSingleHostReverseProxy(agentAPI)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- time.Now():
		default:
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	am := testutil.StartAlertmanager(t, front.URL+"/api/v1/alertmanager", tokenFile)
	rules := `groups:
  - name: memsnap
    interval: 1s
    rules:
      - alert: MemsnapLowHeadroom
        expr: memsnap_headroom_ratio < 0.98
        labels:
          severity: page
`
	testutil.StartPrometheusWith(t, j.targets, rules, am)
	var found string
	testutil.Eventually(t, 2*time.Minute, "a window asked for by the alert, published", func() bool {
		code, out, _ := runCLI(t, "ls", "--json", j.store)
		if code != 0 {
			return false
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, `alert: MemsnapLowHeadroom (rank 2)`) && strings.Contains(line, `"state":"published"`) {
				found = line
				return true
			}
		}
		return false
	})
	t.Logf("%s", found)
	// its findings lead with the rank the alert names
	var row struct {
		Manifest *publish.Manifest `json:"manifest"`
	}
	if err := json.Unmarshal([]byte(found), &row); err != nil || row.Manifest == nil || len(row.Manifest.Findings) == 0 {
		t.Fatalf("the alert's window as ls says it: %v\n%s", err, found)
	}
	if first := row.Manifest.Findings[0]; !strings.HasPrefix(first, "rank 2, which this window was taken for (alerted: MemsnapLowHeadroom (rank 2)") {
		t.Fatalf("the alert's window's first finding is not about rank 2: %q", first)
	}
	// it was planned at once: not after the leader's join grace (5 s under
	// --local, 10 s by default), nor behind other windows; the trainers' batch
	// is 20 ms, and the figure in batches is logged for the docs
	st, err := store.OpenDir(j.store, false)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := runlog.New(st, j.run).ReadPlan(testutil.Context(t, time.Minute), row.Manifest.Window.ID)
	if err != nil {
		t.Fatal(err)
	}
	at := <-arrived
	took := plan.Created.Sub(at)
	t.Logf("the alert's window planned %v after the alert arrived (%.1f batches of 20ms)", took.Round(time.Millisecond), float64(took)/float64(20*time.Millisecond))
	if took > 3*time.Second {
		t.Fatalf("the alert's window was planned %v after the alert arrived", took)
	}
}
