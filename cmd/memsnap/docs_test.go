package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
)

// docBlocks returns the fenced code blocks of a Markdown file whose first line
// names them ("# alertmanager.yml"), by that name, as the page writes them.
func docBlocks(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string]string{}
	var cur []string
	in := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && strings.HasPrefix(line, "```"):
			in, cur = true, nil
		case in && strings.TrimSpace(line) == "```":
			in = false
			if len(cur) > 0 && strings.HasPrefix(cur[0], "# ") {
				blocks[strings.Fields(cur[0])[1]] = strings.Join(cur, "\n") + "\n"
			}
		case in:
			cur = append(cur, line)
		}
	}
	return blocks
}

// TestDocsAlerting: the Alertmanager configuration, the Prometheus rule file and
// the Prometheus configuration docs/metrics.md gives pass `amtool check-config`,
// `promtool check rules` and `promtool check config` exactly as the page writes
// them; and amtool refuses the receiver without its route, as it refused the
// page's first version ("no routes provided").
func TestDocsAlerting(t *testing.T) {
	blocks := docBlocks(t, filepath.Join("..", "..", "docs", "metrics.md"))
	names := []string{"alertmanager.yml", "memsnap-rules.yml", "prometheus.yml"}
	for _, n := range names {
		if blocks[n] == "" {
			t.Fatalf("docs/metrics.md has no block that begins with \"# %s\"", n)
		}
	}
	amtool := testutil.LookTool(t, " (Debian's prometheus-alertmanager; .ci/run installs it)", "amtool")
	promtool := testutil.LookTool(t, " (Debian's prometheus; .ci/run installs it)", "promtool")
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(blocks[n]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	check := func(bin string, args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, c := range []struct {
		bin  string
		args []string
	}{
		{amtool, []string{"check-config", "alertmanager.yml"}},
		{promtool, []string{"check", "rules", "memsnap-rules.yml"}},
		{promtool, []string{"check", "config", "prometheus.yml"}},
	} {
		if out, err := check(c.bin, c.args...); err != nil {
			t.Errorf("docs/metrics.md: %s %s: %v\n%s", filepath.Base(c.bin), strings.Join(c.args, " "), err, out)
		}
	}
	// the check would have caught the page's first version: a receiver, no route
	noRoute := blocks["alertmanager.yml"][strings.Index(blocks["alertmanager.yml"], "receivers:"):]
	if err := os.WriteFile(filepath.Join(dir, "noroute.yml"), []byte(noRoute), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := check(amtool, "check-config", "noroute.yml"); err == nil || !strings.Contains(out, "no routes provided") {
		t.Errorf("amtool took a configuration without a route (%v):\n%s", err, out)
	}
}

// TestDocsBuildPath: every page that builds memsnap builds it where the README's
// quick start does (bin/memsnap) and runs it from there, so the pages agree.
func TestDocsBuildPath(t *testing.T) {
	root := filepath.Join("..", "..")
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	builds := 0
	for _, p := range append(pages, filepath.Join(root, "README.md")) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "./memsnap ") && !strings.Contains(line, "./memsnap-") {
				t.Errorf("%s runs ./memsnap, where the README builds bin/memsnap: %q", p, line)
			}
			i := strings.Index(line, "go build -o ")
			if i < 0 || !strings.Contains(line, "./cmd/memsnap") {
				continue
			}
			builds++
			if out := strings.Fields(line[i+len("go build -o "):])[0]; out != "bin/memsnap" {
				t.Errorf("%s builds memsnap as %s, where the README builds bin/memsnap: %q", p, out, line)
			}
		}
	}
	if builds < 2 {
		t.Errorf("found %d pages that build memsnap, want the README and docs/testing.md", builds)
	}
}
