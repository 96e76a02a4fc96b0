package commit

import (
	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/merge/publish"
)

// Of is what a window's manifest says of its commit, as the window's machine
// reads it: failed, pending (detail still being written) and the error.
func Of(m *publish.Manifest) *window.Commit {
	return &window.Commit{Failed: m.Failed(), Pending: len(m.Pending) > 0, Error: m.Error}
}
