package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/internal/testutil"
)

// TestAgentCommandLaunchesTrainer: `memsnap agent --window 4:7 -- python3 train.py`
// launches a Python trainer with the hook (stand-in torch), records batches [4, 7),
// uploads to the folder store, and exits with the trainer's status.
func TestAgentCommandLaunchesTrainer(t *testing.T) {
	py := testutil.Python(t)
	root := testutil.RepoRoot(t)
	hook := filepath.Join(root, "rankagent", "hook")
	storeDir, spool := t.TempDir(), t.TempDir()
	sockDir, _ := os.MkdirTemp("", "ms")
	defer os.RemoveAll(sockDir)
	t.Setenv("PYTHONPATH", filepath.Join(hook, "testdata", "faketorch")+string(os.PathListSeparator)+hook)
	t.Setenv("MEMSNAP_FAKE_SNAPSHOT", testutil.Snapshot(t, "ddp4/rank1.5.memory_snapshot.pickle"))
	t.Setenv("RANK", "1")
	t.Setenv("LOCAL_RANK", "1")
	t.Setenv("WORLD_SIZE", "2")
	t.Setenv("LOCAL_WORLD_SIZE", "2")
	t.Setenv("TORCHELASTIC_RUN_ID", "job42")
	code, _, stderr := runCLI(t, "agent", "--standalone", "--store", storeDir, "--spool", spool, "--socket", filepath.Join(sockDir, "s"),
		"--window", "4:7", "--", py, filepath.Join(hook, "testdata", "train_fake.py"), "12", "0.02", "1")
	if code != 0 {
		t.Fatalf("agent exited %d:\n%s", code, stderr)
	}
	key := filepath.Join(storeDir, "job42", "torch_memory_traces", "rank1.7.memory_snapshot.pickle")
	if _, err := os.Stat(key); err != nil {
		t.Fatalf("no snapshot at the templated name: %v\n%s", err, stderr)
	}
	code, out, _ := runCLI(t, "inspect", "--json", key)
	if code != 0 || !strings.Contains(out, `"events":{"alloc":183,"free_completed":183,"free_requested":183},"segments":25`) {
		t.Fatalf("inspect: %s", out)
	}
	// the trainer's exit status comes back
	code, _, _ = runCLI(t, "agent", "--standalone", "--store", storeDir, "--spool", spool, "--socket", filepath.Join(sockDir, "s2"), "--", "sh", "-c", "exit 3")
	if code != 3 {
		t.Fatalf("exit status %d, want 3", code)
	}
	// the trainer (and whatever it starts) does not inherit the gossip key
	t.Setenv(coordinator.KeyEnv, "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTEyMzQ=")
	code, out, errOut := runCLI(t, "agent", "--standalone", "--store", storeDir, "--spool", spool, "--socket", filepath.Join(sockDir, "s3"),
		"--", "sh", "-c", `echo "key=[$MEMSNAP_KEY] socket=[$MEMSNAP_SOCKET]"`)
	if code != 0 || !strings.Contains(out, "key=[] socket=["+filepath.Join(sockDir, "s3")+"]") {
		t.Fatalf("the trainer's environment: %d %q %s", code, out, errOut)
	}
}
