package publish

import (
	"fmt"
	"slices"

	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/naming"
)

// Output kinds, and their default names.
const (
	OutPickle  = "pickle"
	OutTrace   = "trace"
	OutSummary = "summary"
	OutHTML    = "html"
	OutPB      = "pb"
	// OutInputs is the claim, written before the outputs: what was merged, with what
	// options. OutManifest is written after them: it publishes the merge.
	OutInputs   = "inputs"
	OutManifest = "manifest"
)

// DefaultOutputBase is the default name (a template) of the merged outputs, before
// their suffixes.
const DefaultOutputBase = "merged"

// OutSuffix is each output kind's suffix, after the outputs' base name.
var OutSuffix = map[string]string{
	OutPickle: ".memory_snapshot.pickle", OutTrace: ".trace.json", OutSummary: ".summary.json",
	OutHTML: ".html", OutPB: ".memsnap.pb", OutInputs: ".inputs.json", OutManifest: ".manifest.json",
}

// Output is one finished output: its kind, its key in the store, its temporary
// file and its SHA-256; Part, for a merged pickle, the ranks it holds.
type Output struct {
	Kind, Key, File, Sum string
	Part                 *analysis.PicklePart
}

// OutputKeys renders the names of the outputs, the claim and the manifest.
func OutputKeys(base string, vars naming.Vars) (map[string]string, error) {
	t, err := naming.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("merge: output name: %w", err)
	}
	b, err := t.RenderKey(vars)
	if err != nil {
		return nil, fmt.Errorf("merge: output name: %w", err)
	}
	out := map[string]string{}
	for k, s := range OutSuffix {
		if out[k], err = naming.CleanKey(b + s); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func contentType(kind string) string {
	switch kind {
	case OutHTML:
		return "text/html; charset=utf-8"
	case OutTrace, OutSummary, OutInputs, OutManifest:
		return "application/json"
	}
	return "application/octet-stream"
}

// CheckWindowName checks a cluster's merged outputs' name template: it names
// {window} (every window of a run needs names of its own) and no variable but
// run_name, window, batch and world_size.
func CheckWindowName(template string) error {
	t, err := naming.Parse(template)
	if err != nil {
		return fmt.Errorf("merged name: %w", err)
	}
	names := t.Names()
	if !slices.Contains(names, "window") {
		return fmt.Errorf("merged name %q does not name {window}: every window of a run needs names of its own", template)
	}
	for _, n := range names {
		switch n {
		case "run_name", "window", "batch", "world_size":
		default:
			return fmt.Errorf("merged name %q names {%s} (it may name run_name, window, batch, world_size)", template, n)
		}
	}
	return nil
}
