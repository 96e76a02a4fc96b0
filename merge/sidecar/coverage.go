package sidecar

import "fmt"

// Covers reports how batch marks cover the window's batches [start, stop):
// exact when they are every batch once, in order; run when they are
// consecutive batches within it (what a trainer stopped in the middle
// recorded). The one test of a recording's coverage, for the agent that names
// it, the leader that merges it and memsnap finish.
func Covers(start, stop int64, batches []int64) (exact, run bool) {
	run = stop > start
	for i, b := range batches {
		if b < start || b >= stop || (i > 0 && b != batches[i-1]+1) {
			run = false
			break
		}
	}
	exact = run && int64(len(batches)) == stop-start && (len(batches) == 0 || batches[0] == start)
	return exact, run
}

// Marks are the batches of m's batch marks, in order.
func (m *RankMeta) Marks() []int64 {
	out := make([]int64, len(m.Batches))
	for i, b := range m.Batches {
		out[i] = b.Batch
	}
	return out
}

// Fits says why m is not the sidecar of rank's recording of window id of run,
// covering [start, stop) exactly or, when partial, a run of it; "" when it is.
// A window of dumps (a post-mortem's) has no batches to cover and may be
// another window's recording (the rank's own OOM or crash).
func (m *RankMeta) Fits(rank int, run string, id uint64, start, stop int64, partial, dumps bool) string {
	if !dumps && (m.Window == nil || m.Window.ID != id) {
		return "its metadata names another window"
	}
	if m.Rank != rank || (m.RunName != "" && m.RunName != run) {
		return fmt.Sprintf("its metadata is rank %d's of run %q", m.Rank, m.RunName)
	}
	if dumps {
		return ""
	}
	exact, inRun := Covers(start, stop, m.Marks())
	switch {
	case partial && !inRun:
		return fmt.Sprintf("its partial recording has batches outside a run of the window's [%d, %d)", start, stop)
	case partial || exact:
		return ""
	case len(m.Batches) != int(stop-start):
		return fmt.Sprintf("it recorded %d batches, the window has %d", len(m.Batches), stop-start)
	}
	for i, bm := range m.Batches {
		if bm.Batch != start+int64(i) {
			return fmt.Sprintf("it recorded batch %d where batch %d belongs", bm.Batch, start+int64(i))
		}
	}
	return ""
}
