package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/runlog"
)

// mpirunPath finds Open MPI's mpirun: a test that needs it fails under CI=true
// without it (.ci/run installs openmpi-bin) and is skipped elsewhere.
func mpirunPath(t *testing.T) string {
	p, err := exec.LookPath("mpirun")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("mpirun is not installed under CI=true (.ci/run installs openmpi-bin)")
		}
		t.Skip("no mpirun (Debian: openmpi-bin)")
	}
	return p
}

// mpiJob starts `mpirun -np n memsnap agent ... -- memsnap replay ...` as a real
// Open MPI job on this host and returns it with its output, its run's name, read
// from what the agents say, and a channel closed when mpirun has exited.
func mpiJob(t *testing.T, n, base int, key string, store string) (*exec.Cmd, *testutil.SyncBuffer, string, <-chan struct{}) {
	bin := mpirunPath(t)
	work := t.TempDir()
	snap := testutil.Snapshot(t, "ddp4/rank0.5.memory_snapshot.pickle")
	args := []string{"--allow-run-as-root", "--oversubscribe", "-np", strconv.Itoa(n), "-x", "MEMSNAP_TEST_MAIN=1", "-x", coordinator.KeyEnv + "=" + key,
		os.Args[0], "agent", "--store", store, "--no-schedule", "--gossip-port", strconv.Itoa(base), "--collect-timeout", "10s", "--drain-timeout", "20s",
		"--", os.Args[0], "replay", "--snapshot", snap, "--batches", "0", "--pace", "20ms", "--hold-at", "5"}
	cmd := exec.Command(bin, args...)
	cmd.Dir = work // the spools go under the run's folder here
	cmd.Env = append(os.Environ(), "MEMSNAP_TEST_MAIN=1", "OMPI_MCA_rmaps_base_oversubscribe=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		// mpirun stops its processes on SIGTERM and exits when they are gone, so
		// nothing writes into the test's folders as they are removed
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("mpirun said:\n%s", out)
		}
	})
	re := regexp.MustCompile(`msg="agent listening" rank=\d+ .* run=(\S+)`)
	run := ""
	testutil.Eventually(t, time.Minute, "the agents to say their run's name", func() bool {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			run = m[1]
		}
		return run != ""
	})
	return cmd, out, run, exited
}

// TestOpenMPIJob: `mpirun -np 3 memsnap agent -- <trainer>` as Open MPI runs it:
// identity from OMPI_COMM_WORLD_*, the head node from Open MPI's HNP address,
// local rank L on the base gossip port + L, and a run name unique to the job
// (from its job id, not the constant "memsnap"); a window asked with `memsnap
// snapshot` is published with every rank. A second job gets another run name.
func TestOpenMPIJob(t *testing.T) {
	store := t.TempDir()
	kb := make([]byte, 32)
	copy(kb, fmt.Sprintf("%032d", time.Now().UnixNano()))
	key := encodeKey(kb)
	base := testutil.FreePorts(t, 3)
	job, out, run, _ := mpiJob(t, 3, base, key, store)
	if !regexp.MustCompile(`^mpi-\d`).MatchString(run) {
		t.Fatalf("run name %q is not the job's", run)
	}
	code, res := 0, struct {
		State string `json:"state"`
		Ranks []int  `json:"ranks"`
	}{}
	cli := memsnapCmd(t, "snapshot", "--join", fmt.Sprintf("127.0.0.1:%d", base), "--run", run, "--batches", "2", "--wait", "--json", "--timeout", "2m")
	cli.Env = append(cli.Env, coordinator.KeyEnv+"="+key)
	var sout, serr bytes.Buffer
	cli.Stdout, cli.Stderr = &sout, &serr
	if err := cli.Run(); err != nil {
		code = cli.ProcessState.ExitCode()
	}
	if err := json.Unmarshal(sout.Bytes(), &res); err != nil || code != 0 || res.State != "published" || fmt.Sprint(res.Ranks) != "[0 1 2]" {
		t.Fatalf("snapshot: exit %d, %v, %q\n%s\nmpirun:\n%s", code, err, sout.String(), serr.String(), out)
	}
	syscall.Kill(-job.Process.Pid, syscall.SIGTERM)
	_, _, run2, _ := mpiJob(t, 3, testutil.FreePorts(t, 3), key, store)
	if run2 == run {
		t.Fatalf("two Open MPI jobs share the run name %q", run)
	}
}

// TestOpenMPITeardownIsNoIncident: mpirun ending its job (SIGTERM, as a
// scheduler or Ctrl-C does) stops every trainer and agent at once; trainers that
// keep no allocator history have nothing to give a post-mortem, so whichever hears
// of it first, no agent calls it an incident and the run's log gains no crash
// post-mortem: the windows asked for are all it holds. The agents go as soon as
// their trainers have.
func TestOpenMPITeardownIsNoIncident(t *testing.T) {
	dir := t.TempDir()
	kb := make([]byte, 32)
	copy(kb, fmt.Sprintf("%032d", time.Now().UnixNano()))
	key := encodeKey(kb)
	base := testutil.FreePorts(t, 4)
	for cycle := 1; cycle <= 2; cycle++ {
		job, out, run, exited := mpiJob(t, 4, base, key, dir)
		cli := memsnapCmd(t, "snapshot", "--join", fmt.Sprintf("127.0.0.1:%d", base), "--run", run, "--batches", "2", "--wait", "--json", "--timeout", "2m")
		cli.Env = append(cli.Env, coordinator.KeyEnv+"="+key)
		var sout, serr bytes.Buffer
		cli.Stdout, cli.Stderr = &sout, &serr
		if err := cli.Run(); err != nil {
			t.Fatalf("snapshot: %v\n%s\n%s", err, sout.String(), serr.String())
		}
		// the trainers are past their window, recording nothing: tear the job down
		start := time.Now()
		job.Process.Signal(syscall.SIGTERM)
		testutil.Eventually(t, 2*time.Minute, "mpirun to end", func() bool {
			select {
			case <-exited:
				return true
			default:
				return false
			}
		})
		t.Logf("cycle %d: mpirun ended %v after SIGTERM", cycle, time.Since(start).Round(10*time.Millisecond))
		if strings.Contains(out.String(), "the trainer is being stopped\"") || strings.Contains(out.String(), "post-mortem\"") {
			t.Errorf("cycle %d: the teardown was called an incident:\n%s", cycle, out)
		}
		st, err := store.OpenDir(dir, false)
		if err != nil {
			t.Fatal(err)
		}
		// (a window planned again with a longer lead leaves the first in the log)
		rl := runlog.New(st, run)
		ids, err := rl.PlanIDs(testutil.Context(t, time.Minute))
		if err != nil || len(ids) == 0 {
			t.Fatalf("cycle %d: the run's log holds windows %v (%v)\n%s", cycle, ids, err, out)
		}
		for _, id := range ids {
			if p, err := rl.ReadPlan(testutil.Context(t, time.Minute), id); err != nil || p.Kind != runlog.KindWindow || p.Reason != "request" {
				t.Fatalf("cycle %d: window %d of the run's log: %+v %v (want only the windows asked for, no post-mortem)\n%s", cycle, id, p, err, out)
			}
		}
	}
}
