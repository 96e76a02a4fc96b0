package layout

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
)

const module = "github.com/memsnap/memsnap/"

// TestNoCycleBetweenFolders: drawn folder by folder (coordinator, merge,
// internal, rankagent, ...), the packages' imports form no cycle.
func TestNoCycleBetweenFolders(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	cmd.Dir = testutil.RepoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	edges := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		from := folder(f[0])
		for _, imp := range f[1:] {
			if to := folder(imp); strings.HasPrefix(imp, module) && to != from && !slices.Contains(edges[from], to) {
				edges[from] = append(edges[from], to)
			}
		}
	}
	for start := range edges {
		if path := cycle(edges, start, []string{start}); path != nil {
			t.Fatalf("the folders import one another in a cycle: %s", strings.Join(path, " -> "))
		}
	}
}

func folder(pkg string) string { return strings.SplitN(strings.TrimPrefix(pkg, module), "/", 2)[0] }

// cycle returns a path from path's last folder back to start, nil when none.
func cycle(edges map[string][]string, start string, path []string) []string {
	for _, next := range edges[path[len(path)-1]] {
		if next == start {
			return append(path, next)
		}
		if !slices.Contains(path, next) {
			if p := cycle(edges, start, append(slices.Clone(path), next)); p != nil {
				return p
			}
		}
	}
	return nil
}
