package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/rankagent"
)

// noLauncher is an environment with no launcher's variables: bare metal.
func noLauncher(string) string { return "" }

// parseAgentLine parses one `memsnap agent` argument list as the agent does and
// resolves its identity with no launcher's environment; it returns the flags, the
// trainer's command and the identity.
func parseAgentLine(t *testing.T, args []string) (*agentFlags, []string, rankagent.Identity) {
	t.Helper()
	if len(args) == 0 || args[0] != "agent" {
		t.Fatalf("not a memsnap agent line: %q", args)
	}
	var f agentFlags
	var stderr bytes.Buffer
	cmdArgs, err := f.parse(commands["agent"], args[1:], &stderr)
	if err != nil {
		t.Fatalf("memsnap agent %q: %v\n%s", args[1:], err, stderr.String())
	}
	id, err := rankagent.ResolveIdentity(context.Background(), noLauncher, rankagent.Overrides{RunName: f.runName, Rank: f.rank,
		LocalRank: f.localRank, NodeRank: f.nodeRank, WorldSize: f.world, LocalWorld: f.localWorld})
	if err != nil {
		t.Fatalf("memsnap agent %q: %v", args[1:], err)
	}
	return &f, cmdArgs, id
}

// TestDocsNoLauncherExample: docs/launchers.md's bare-metal example, run by bash as
// the page writes it (with memsnap standing in to record its arguments), starts
// four agents whose flags parse and name ranks 0 to 3 of one run of 4 ranks on 2
// hosts, each joining node001's two gossip ports, each trainer told its own rank;
// the notebook's agent is a single standalone rank of its run recording a window.
func TestDocsNoLauncherExample(t *testing.T) {
	blocks := docBlocks(t, filepath.Join("..", "..", "docs", "launchers.md"))
	bare, nb := blocks["bare-metal"], blocks["notebook"]
	if bare == "" || nb == "" {
		t.Fatal(`docs/launchers.md has no block that begins with "# bare-metal" or "# notebook"`)
	}
	out := t.TempDir()
	script := "memsnap() { printf '%s\\n' \"$@\" > \"$OUT/$BASHPID\"; }\n" + bare
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Env = append(os.Environ(), "OUT="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bash: %v\n%s", err, b)
	}
	files, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var ranks []int
	for _, fi := range files {
		b, err := os.ReadFile(filepath.Join(out, fi.Name()))
		if err != nil {
			t.Fatal(err)
		}
		f, trainer, id := parseAgentLine(t, strings.Split(strings.TrimSuffix(string(b), "\n"), "\n"))
		ranks = append(ranks, id.Rank)
		if id.RunName != "myrun" || id.WorldSize != 4 || id.LocalWorldSize != 2 || id.NodeRank != id.Rank/2 || id.LocalRank != id.Rank%2 {
			t.Errorf("agent %q: identity %+v", b, id)
		}
		join, err := coordinator.ParseJoin(f.mf.join, coordinator.DefaultGossipPort, id.LocalWorldSize)
		if err != nil || !slices.Equal(join, []string{"node001:7946", "node001:7947"}) {
			t.Errorf("rank %d joins %q (%v), want node001's two ports", id.Rank, join, err)
		}
		for _, kv := range []string{fmt.Sprintf("RANK=%d", id.Rank), fmt.Sprintf("LOCAL_RANK=%d", id.LocalRank), "WORLD_SIZE=4", "MASTER_ADDR=node001"} {
			if len(trainer) == 0 || trainer[0] != "env" || !slices.Contains(trainer, kv) {
				t.Errorf("rank %d's trainer %q is not told %s", id.Rank, trainer, kv)
			}
		}
	}
	slices.Sort(ranks)
	if !slices.Equal(ranks, []int{0, 1, 2, 3}) {
		t.Errorf("the example starts ranks %v, want 0 to 3", ranks)
	}
	var line []string
	for _, l := range strings.Split(nb, "\n") {
		if rest, ok := strings.CutPrefix(l, "memsnap "); ok {
			line = strings.Fields(rest)
		}
	}
	f, trainer, id := parseAgentLine(t, line)
	if id.RunName != "nb" || id.WorldSize != 1 || f.mf.join != "" || f.window != "10:13" || len(trainer) != 0 {
		t.Errorf("the notebook's agent %q: identity %+v, join %q, window %q, command %q", line, id, f.mf.join, f.window, trainer)
	}
}
