package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/rankagent"
)

// The test binary is also the memsnap command when MEMSNAP_TEST_MAIN is set, so
// tests run real memsnap processes without building one.
func TestMain(m *testing.M) {
	if os.Getenv("MEMSNAP_TEST_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// memsnapCmd is a real memsnap process.
func memsnapCmd(t *testing.T, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "MEMSNAP_TEST_MAIN=1")
	return cmd
}

func freePort(t *testing.T) int { return testutil.FreePort(t) }

// TestClusterCommands: two real `memsnap agent` processes, each launching a replay
// trainer, form an encrypted cluster on loopback; `memsnap snapshot --wait --json`
// asks for a window and gets the merged outputs' locations; `memsnap ls` lists it;
// SIGTERM stops the agents cleanly.
func TestClusterCommands(t *testing.T) {
	code, keyOut, _ := runCLI(t, "keygen")
	if code != 0 {
		t.Fatal("keygen failed")
	}
	key := strings.TrimSpace(keyOut)
	storeDir := t.TempDir()
	sockDir, _ := os.MkdirTemp("", "ms")
	defer os.RemoveAll(sockDir)
	run := fmt.Sprintf("clitest%d", time.Now().UnixNano()%1e6)
	base := testutil.FreePorts(t, 2) // local rank L listens on base+L
	ports := []int{base, base + 1}
	var agents []*exec.Cmd
	var logs []*testutil.SyncBuffer
	for r := 0; r < 2; r++ {
		snap := testutil.Snapshot(t, fmt.Sprintf("ddp4/rank%d.5.memory_snapshot.pickle", r))
		args := []string{"agent", "--run-name", run, "--rank", strconv.Itoa(r), "--local-rank", strconv.Itoa(r), "--world-size", "2", "--local-world-size", "2",
			"--store", storeDir, "--spool", filepath.Join(sockDir, fmt.Sprintf("spool%d", r)), "--socket", filepath.Join(sockDir, fmt.Sprintf("s%d", r)),
			"--bind", "127.0.0.1", "--gossip-port", strconv.Itoa(base), "--no-schedule", "--collect-timeout", "30s"}
		if r > 0 {
			args = append(args, "--join", fmt.Sprintf("127.0.0.1:%d", ports[0]))
		}
		args = append(args, "--", os.Args[0], "replay", "--snapshot", snap, "--batches", "0", "--pace", "20ms", "--hold-at", "5", "--rank", strconv.Itoa(r))
		cmd := memsnapCmd(t, args...)
		cmd.Env = append(cmd.Env, coordinator.KeyEnv+"="+key)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the cleanup takes its trainer too
		buf := &testutil.SyncBuffer{}
		cmd.Stderr, cmd.Stdout = buf, buf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		agents, logs = append(agents, cmd), append(logs, buf)
	}
	defer func() {
		for _, a := range agents {
			syscall.Kill(-a.Process.Pid, syscall.SIGKILL)
		}
		if t.Failed() {
			for i, l := range logs {
				t.Logf("agent %d said:\n%s", i, l)
			}
		}
	}()
	// wait, as a member that is not a rank, until both trainers hold before batch 5
	kb, _ := coordinator.ParseKey(key)
	ccfg := coordinator.DefaultLocalConfig(rankagent.Identity{RunName: run})
	ccfg.Client, ccfg.SecretKey, ccfg.Join, ccfg.Logger = true, kb, []string{fmt.Sprintf("127.0.0.1:%d", ports[0])}, testutil.Logger(t)
	watcher, err := coordinator.New(ccfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	wdone := make(chan struct{})
	go func() { defer close(wdone); watcher.Run(ctx) }()
	testutil.Eventually(t, 60*time.Second, "both trainers holding", func() bool {
		b, ok := watcher.Batches(ctx)
		return ok && len(b) == 2 && b[0] == 4 && b[1] == 4
	})
	cancel()
	<-wdone

	type result struct {
		Window   uint64   `json:"window"`
		State    string   `json:"state"`
		Start    int64    `json:"start"`
		Stop     int64    `json:"stop"`
		Manifest string   `json:"manifest"`
		Outputs  []string `json:"outputs"`
		Ranks    []int    `json:"ranks"`
		Findings []string `json:"findings"`
		Pending  bool     `json:"pending"`
	}
	snapshot := func(wait string) result {
		snap := memsnapCmd(t, "snapshot", "--join", fmt.Sprintf("127.0.0.1:%d", ports[1]), "--run", run, "--batches", "2", wait, "--json", "--timeout", "2m")
		snap.Env = append(snap.Env, coordinator.KeyEnv+"="+key)
		var sout, serr bytes.Buffer
		snap.Stdout, snap.Stderr = &sout, &serr
		if err := snap.Run(); err != nil {
			t.Fatalf("snapshot: %v\n%s\n%s\nagent 0:\n%s", err, sout.String(), serr.String(), logs[0])
		}
		var res result
		if err := json.Unmarshal(sout.Bytes(), &res); err != nil {
			t.Fatalf("%v: %s", err, sout.String())
		}
		return res
	}
	// --wait: the answer, as soon as it is published (the summary, the report,
	// the trace), while the merged pickles and the timeline are written
	// (the leader's messages may overtake each other: a final result that
	// arrives first is returned as it is)
	first := snapshot("--wait")
	if first.State != "published" || fmt.Sprint(first.Ranks) != "[0 1]" || first.Stop-first.Start != 2 || len(first.Findings) < 2 ||
		(first.Pending && len(first.Outputs) != 3) || (!first.Pending && len(first.Outputs) != 5) {
		t.Fatalf("the answer %+v", first)
	}
	testutil.Eventually(t, time.Minute, "the first window's manifest to name every output", func() bool {
		b, err := os.ReadFile(first.Manifest)
		m, perr := publish.ParseManifest(b)
		return err == nil && perr == nil && len(m.Pending) == 0 && len(m.Outputs) == 5
	})
	// --wait-all: all of it
	res := snapshot("--wait-all")
	if res.State != "published" || fmt.Sprint(res.Ranks) != "[0 1]" || res.Stop-res.Start != 2 || len(res.Outputs) != 5 || res.Pending || res.Window <= first.Window {
		t.Fatalf("result %+v", res)
	}
	// the answer comes with the result: how the peaks spread, what the outlier held
	if len(res.Findings) < 2 || !strings.HasPrefix(res.Findings[0], "peak allocated: median ") || !strings.Contains(strings.Join(res.Findings, "\n"), " at its peak of ") {
		t.Fatalf("findings %q", res.Findings)
	}
	for _, o := range append(res.Outputs, res.Manifest) {
		if _, err := os.Stat(o); err != nil {
			t.Fatal(err)
		}
	}
	// as a user reads it: the progress is the window's story, every rank's step
	// once and in order, and the answer is printed once, then what the rest adds
	plain := memsnapCmd(t, "snapshot", "--join", fmt.Sprintf("127.0.0.1:%d", ports[1]), "--run", run, "--batches", "2", "--wait-all", "--timeout", "2m")
	plain.Env = append(plain.Env, coordinator.KeyEnv+"="+key)
	var pout, perr bytes.Buffer
	plain.Stdout, plain.Stderr = &pout, &perr
	if err := plain.Run(); err != nil {
		t.Fatalf("snapshot --wait-all: %v\n%s\n%s", err, pout.String(), perr.String())
	}
	checkStory(t, perr.String(), 2)
	if n := strings.Count(pout.String(), "peak allocated: median "); n != 1 || strings.Count(pout.String(), "manifest: ") != 1 ||
		!regexp.MustCompile(`(?m)^window \d+ published: the merged pickles and the timeline too$`).MatchString(pout.String()) {
		t.Fatalf("snapshot --wait-all printed:\n%s", pout.String())
	}
	code, out, _ := runCLI(t, "ls", storeDir)
	if code != 0 || !strings.Contains(out, "2/2") || !strings.Contains(out, fmt.Sprintf("%d-%d", res.Start, res.Stop-1)) {
		t.Fatalf("ls: %q", out)
	}
	// SIGTERM (a launcher tearing the job down): the agents pass it to their
	// trainers, which die of it, and exit with the trainer's status, 128+15
	for i, a := range agents {
		a.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- a.Wait() }()
		select {
		case <-done:
			if code := a.ProcessState.ExitCode(); code != 128+int(syscall.SIGTERM) {
				t.Fatalf("agent %d exited %d\n%s", i, code, logs[i])
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("agent %d did not stop on SIGTERM\n%s", i, logs[i])
		}
	}
}

// checkStory checks a window's progress as memsnap snapshot prints it: the
// window planned before any rank's line, each of n ranks acked, armed,
// recording and uploaded in that order and once each, all before the leader
// says it publishes.
func checkStory(t *testing.T, progress string, n int) {
	t.Helper()
	lines := strings.Split(progress, "\n")
	planned, publishing := -1, -1
	steps := map[string][]string{}
	rankLine := regexp.MustCompile(`^  rank (\d+) +(\S+)`)
	for i, l := range lines {
		switch m := rankLine.FindStringSubmatch(l); {
		case regexp.MustCompile(`^window \d+ planned `).MatchString(l):
			planned = i
		case regexp.MustCompile(`^window \d+ publishing`).MatchString(l) && publishing < 0:
			publishing = i
		case m != nil:
			if planned < 0 || publishing >= 0 {
				t.Fatalf("line %d out of the story (planned at %d, publishing at %d):\n%s", i, planned, publishing, progress)
			}
			if m[2] != "spooled" {
				steps[m[1]] = append(steps[m[1]], m[2])
			}
		}
	}
	if planned < 0 || publishing < 0 || len(steps) != n {
		t.Fatalf("planned at %d, publishing at %d, %d ranks:\n%s", planned, publishing, len(steps), progress)
	}
	for r, s := range steps {
		if strings.Join(s, " ") != "acked armed recording uploaded" {
			t.Fatalf("rank %s's story: %v\n%s", r, s, progress)
		}
	}
}
