// Package demodata embeds four real per-rank snapshots (a 4-rank DDP job recorded
// with PyTorch 2.11 on an H200, ranks in lockstep over batches [2, 5); rank 3 holds
// an extra 96 MiB buffer) so the demo runs anywhere, with no GPU and no server.
package demodata

import (
	"embed"
	"fmt"
)

//go:embed rank*.5.memory_snapshot.pickle
var files embed.FS

// Ranks is the number of embedded ranks.
const Ranks = 4

// Rank returns rank r's snapshot pickle, as torch wrote it.
func Rank(r int) ([]byte, error) {
	return files.ReadFile(fmt.Sprintf("rank%d.5.memory_snapshot.pickle", r))
}
