// Package merge merges per-rank PyTorch memory snapshots into one combined timeline
// and writes the merged outputs (torch pickle, Perfetto trace, summary, HTML report,
// protobuf timeline): it resolves and reads the inputs, runs the merge's passes and
// publishes the outputs. Its parts have packages of their own: the snapshot model
// and its codec (merge/snapshot), the rank sidecar (merge/sidecar), the analysis of
// snapshots (merge/analysis), the outputs' writers (merge/render) and publication
// (merge/publish).
package merge

import (
	"context"

	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/render"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// FileFigures are the reference figures of one snapshot file.
type FileFigures = snapshot.Figures

// InspectFile is InspectFileContext with a context that is never done.
func InspectFile(path string) (FileFigures, error) {
	return InspectFileContext(context.Background(), path)
}

// InspectFileContext reads a snapshot file (a torch pickle, plain or compressed, or
// a merged .memsnap.pb timeline, whose device i is rank i) and computes its
// figures. Only regular files are read; reading and decoding stop when ctx is done.
func InspectFileContext(ctx context.Context, path string) (FileFigures, error) {
	f, _, err := InspectFileHistory(ctx, path)
	return f, err
}

// InspectFileHistory is InspectFileContext that also says whether the snapshot's
// history was truncated, when a sidecar beside the file (X.memsnap.json) gives
// the history's cap: nil when it was not, or nothing says. A sidecar that cannot
// be read is not an error here (the figures stand without it).
func InspectFileHistory(ctx context.Context, path string) (FileFigures, *analysis.Truncation, error) {
	s, err := render.ReadSnapshotFile(ctx, path)
	if err != nil {
		return FileFigures{}, nil, err
	}
	fig := s.ComputeFigures()
	if isPB(path) {
		return fig, nil, nil
	}
	meta, err := sidecarOf(ctx, path)
	if err != nil || meta == nil || meta.MaxEntries <= 0 {
		return fig, nil, nil
	}
	r := analysis.RankFromSnapshot(s, meta.Rank, path)
	r.Meta = meta
	return fig, r.Truncation(), nil
}
