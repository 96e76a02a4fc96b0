package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/testutil"
)

// runProc runs a memsnap process to its end (at most timeout) and returns its
// exit status and output.
func runProc(t *testing.T, timeout time.Duration, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := memsnapCmd(t, args...)
	cmd.Env = append(cmd.Env, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		t.Fatalf("memsnap %v did not end within %v:\n%s", args, timeout, out.String())
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// TestBadStoresFailAtOnce: an agent given a store it can never use stops at
// start-up with the reason, instead of spooling until its drain times out; one
// whose store does not answer yet warns and runs on.
func TestBadStoresFailAtOnce(t *testing.T) {
	m := testutil.RequireMinIO(t)
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		store []string
		want  string
	}{
		{[]string{"--store", "s3://"}, "no bucket name"},
		{[]string{"--store", "ftp://host/x"}, `unsupported store URL scheme "ftp"`},
		{[]string{"--store", "s3://My_Bucket/x"}, `bucket name "My_Bucket"`},
		{[]string{"--store", "s3://ab/x"}, "3 to 63 characters"},
		{[]string{"--run-name", "../x"}, `the run name "../x" holds '/'`},
		{[]string{"--store", "s3://" + testutil.BucketName(t) + "/x", "--endpoint", m.Endpoint, "--access-key", m.AccessKey, "--secret-key", "wrong"}, "access denied"},
		// folders that can never be one: through a file, a file itself, a pseudo-filesystem
		{[]string{"--store", filepath.Join(file, "store")}, "a part of the path is a file, not a folder"},
		{[]string{"--store", file}, "is a file, not a folder"},
		{[]string{"--store", "/proc/memsnap-store"}, "no folder can be made there"},
	}
	for _, c := range cases {
		dir := t.TempDir()
		args := append([]string{"agent", "--standalone", "--spool", filepath.Join(dir, "spool"), "--socket", filepath.Join(dir, "s")}, c.store...)
		code, out := runProc(t, 30*time.Second, nil, args...)
		if code == 0 || !strings.Contains(out, c.want) {
			t.Errorf("%v: exit %d, want an error saying %q:\n%s", c.store, code, c.want, out)
		}
	}
	// a store that does not answer yet: a warning, and the agent runs
	dir := t.TempDir()
	cmd := memsnapCmd(t, "agent", "--standalone", "--spool", filepath.Join(dir, "spool"), "--socket", filepath.Join(dir, "s"),
		"--store", "s3://somebucket/x", "--endpoint", fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t)), "--access-key", "a", "--secret-key", "b")
	out := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	testutil.Eventually(t, 30*time.Second, "the agent to warn and listen", func() bool {
		s := out.String()
		return strings.Contains(s, "the store does not answer yet") && strings.Contains(s, "agent listening")
	})
}

// TestSnapshotSaysWhatWentWrong: `memsnap snapshot` refuses bad values at once,
// tells a wrong key from a wrong run from an address where nothing listens or
// that does not resolve (as soon as that is known, not at the end of its
// --join-timeout), and exits non-zero when the window failed; with --json every
// failure is one JSON object.
func TestSnapshotSaysWhatWentWrong(t *testing.T) {
	dir := t.TempDir()
	// one rank of two whose trainer gets stuck in every window: nothing is stored
	pc := startProcs(t, 2, procOpts{storeArgs: []string{"--store", dir}, hang: []int{0, 1}, collect: "2s"})
	key := coordinator.KeyEnv + "=" + encodeKey(pc.key)
	join := fmt.Sprintf("127.0.0.1:%d", pc.ports[1])
	for _, b := range []string{"-1", "1000000000000"} {
		code, out := runProc(t, 10*time.Second, []string{key}, "snapshot", "--join", join, "--run", pc.run, "--batches", b)
		if code == 0 || !strings.Contains(out, "a window is 1 to") {
			t.Errorf("--batches %s: exit %d:\n%s", b, code, out)
		}
	}
	other := make([]byte, 32)
	copy(other, "another key, another key, anoth")
	for _, c := range []struct {
		env       []string
		join, run string
		want      string
	}{
		{[]string{coordinator.KeyEnv + "=" + encodeKey(other)}, join, pc.run, "use another key"},
		{[]string{key}, join, "another-run", "belong to another run"},
		{[]string{key}, fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t)), pc.run, "nothing listens at the join address"},
		{[]string{key}, "nosuchhost.invalid:7946", pc.run, "does not resolve"},
	} {
		// known at once, told at once: long before the join time-out
		start := time.Now()
		code, out := runProc(t, 60*time.Second, c.env, "snapshot", "--join", c.join, "--run", c.run, "--join-timeout", "10m", "--json")
		if code == 0 || !strings.Contains(out, c.want) || !strings.Contains(out, `{"state":"error","error":"joining the cluster`) {
			t.Errorf("join %s run %s: exit %d after %v, want %q, and one JSON object:\n%s", c.join, c.run, code, time.Since(start).Round(time.Millisecond), c.want, out)
		}
		t.Logf("join %s run %s: told after %v", c.join, c.run, time.Since(start).Round(time.Millisecond))
	}
	// the cluster refused the member with another key, and said so
	testutil.Eventually(t, 10*time.Second, "a logged refusal", func() bool {
		return strings.Contains(pc.logs[1].String(), "refused gossip that this run's key cannot decrypt")
	})
	pc.client(2) // both trainers hold before the window
	for _, args := range [][]string{{"--wait"}, {"--wait", "--json"}} {
		code, out := runProc(t, 2*time.Minute, []string{key}, append([]string{"snapshot", "--join", join, "--run", pc.run, "--batches", "2"}, args...)...)
		if code == 0 || !strings.Contains(out, "no rank stored a snapshot") {
			t.Errorf("a failed window, %v: exit %d:\n%s", args, code, out)
		}
		if args[len(args)-1] == "--json" && !strings.Contains(out, `"state":"failed"`) {
			t.Errorf("--json: %s", out)
		}
	}
}

// TestSnapshotInterrupted: Ctrl-C of a waiting `memsnap snapshot` stops it at once,
// non-zero, saying that the window it asked for goes on in the cluster; the
// window is published all the same.
func TestSnapshotInterrupted(t *testing.T) {
	dir := t.TempDir()
	pc := startProcs(t, 2, procOpts{storeArgs: []string{"--store", dir}})
	pc.client(2) // both trainers hold before the window
	key := coordinator.KeyEnv + "=" + encodeKey(pc.key)
	join := fmt.Sprintf("127.0.0.1:%d", pc.ports[1])
	// 200 batches of 20 ms: it records for 4 s
	cmd := memsnapCmd(t, "snapshot", "--join", join, "--run", pc.run, "--batches", "200", "--wait")
	cmd.Env = append(cmd.Env, key)
	out := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	testutil.Eventually(t, time.Minute, "the window planned", func() bool { return strings.Contains(out.String(), "planned") })
	cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("snapshot did not stop on Ctrl-C:\n%s", out)
	}
	if cmd.ProcessState.ExitCode() == 0 || !regexp.MustCompile(`interrupted; window \d+ goes on in the cluster`).MatchString(out.String()) {
		t.Errorf("Ctrl-C: exit %d:\n%s", cmd.ProcessState.ExitCode(), out)
	}
	testutil.Eventually(t, 2*time.Minute, "the window published after Ctrl-C", func() bool {
		ms, _ := filepath.Glob(filepath.Join(dir, "*", "torch_memory_traces", "window1", "merged.manifest.json"))
		return len(ms) == 1
	})
}

// TestProgressThroughAnyMember: a member that joined through a rank that does
// not lead still hears every step of its window from the leader, from the plan
// (with the time the leader gives up on it) to the result.
func TestProgressThroughAnyMember(t *testing.T) {
	dir := t.TempDir()
	pc := startProcs(t, 3, procOpts{storeArgs: []string{"--store", dir}})
	pc.client(3)
	via := pc.clientVia(3, pc.ports[2])
	var planned, acked []string
	var deadline time.Time
	res := ask(t, via, 3, 2*time.Minute, func(u coordinator.Update) {
		switch {
		case u.Rank < 0 && u.State == pb.Step_STEP_PLANNED:
			planned, deadline = append(planned, u.Reason), u.Deadline
		case u.State == pb.Step_STEP_ACKED:
			acked = append(acked, strconv.Itoa(u.Rank))
		}
	})
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || len(planned) != 1 || deadline.IsZero() || len(acked) == 0 {
		t.Fatalf("result %+v, planned %v (deadline %v), acked %v", res, planned, deadline, acked)
	}
	_ = os.Getpid
	_ = syscall.SIGTERM
}

// TestLsCellsArePrintable: text from the store (a rank's reason, a crash's cause)
// cannot move the terminal's cursor, break a row, or fill the screen: it is
// printed escaped, and cut.
func TestLsCellsArePrintable(t *testing.T) {
	got := printable("a\tb\nc\x1b[2Jd\xffe\u0085" + strings.Repeat("x", 1000))
	if strings.ContainsAny(got, "\t\n\x1b\u0085") || !strings.HasPrefix(got, `a\tb\nc\x1b[2Jd\xffe\x85`) || len(got) > 300 {
		t.Fatalf("%q", got)
	}
}

// TestStandaloneRefusesLeaderFlags: a standalone agent given the flags only a
// cluster's leader uses (it would plan nothing from them, and record nothing)
// stops at once, saying to use --window.
func TestStandaloneRefusesLeaderFlags(t *testing.T) {
	dir := t.TempDir()
	code, out := runProc(t, 30*time.Second, nil, "agent", "--standalone", "--store", filepath.Join(dir, "store"), "--spool", filepath.Join(dir, "spool"),
		"--socket", filepath.Join(dir, "s"), "--skip-batches", "5", "--interval", "6", "--", "true")
	if code == 0 || !strings.Contains(out, "--interval, --skip-batches: a standalone agent has no leader to plan windows") || !strings.Contains(out, "--window START:STOP") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	// without --window it runs, and says it records no batches
	code, out = runProc(t, 30*time.Second, nil, "agent", "--standalone", "--store", filepath.Join(dir, "store"), "--spool", filepath.Join(dir, "spool"),
		"--socket", filepath.Join(dir, "s"), "--", "true")
	if code != 0 || !strings.Contains(out, "a standalone agent without --window records no batches") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}
