package merge

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/render"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
)

// IsTimeline reports whether a path names a merged timeline (.memsnap.pb).
func IsTimeline(path string) bool { return isPB(path) }

// AnalyzeFile reads one rank for a diff: a snapshot (analysed with the sidecar
// that lies beside it, when one does), a rank analysis (.analysis.json), or rank
// `rank` of a merged timeline (.memsnap.pb; -1 takes its only rank). Only
// regular files are read; reading stops when ctx is done.
func AnalyzeFile(ctx context.Context, path string, rank int) (*analysis.RankAnalysis, error) {
	switch {
	case isPB(path):
		all, err := TimelineAnalyses(ctx, path)
		if err != nil {
			return nil, err
		}
		return pickRank(all, path, rank)
	case strings.HasSuffix(path, ".json"):
		b, err := fileAnalysis(path)(ctx)
		if err == nil && b == nil {
			err = fs.ErrNotExist
		}
		if err != nil {
			return nil, fmt.Errorf("merge: reading %s: %w", path, err)
		}
		a, err := analysis.ParseAnalysis(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return a, nil
	}
	data, err := snapshot.ReadFileBytes(ctx, path)
	if err != nil {
		return nil, err
	}
	meta, err := sidecarOf(ctx, path)
	if err != nil {
		return nil, err
	}
	a, err := analysis.Analyze(ctx, data, meta, analysis.AnalyzeOptions{Rank: max(rank, -1)})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return a, nil
}

// sidecarOf reads the sidecar beside a snapshot file; nil when there is none.
func sidecarOf(ctx context.Context, path string) (*sidecar.RankMeta, error) {
	p := filepath.Join(filepath.Dir(path), sidecar.MetaName(filepath.Base(path)))
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	b, err := snapshot.ReadFileBytes(ctx, p)
	if err != nil {
		return nil, err
	}
	m, err := sidecar.ParseRankMeta(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return m, nil
}

// TimelineAnalyses analyses every rank of a merged timeline, in rank order (times
// in each rank's own clock).
func TimelineAnalyses(ctx context.Context, path string) ([]*analysis.RankAnalysis, error) {
	data, err := snapshot.ReadFileBytes(ctx, path)
	if err != nil {
		return nil, err
	}
	ranks, err := render.RanksFromPB(data, path)
	if err != nil {
		return nil, err
	}
	var out []*analysis.RankAnalysis
	for _, r := range ranks {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		out = append(out, r.Analysis(analysis.Window{}))
	}
	return out, nil
}

func pickRank(all []*analysis.RankAnalysis, path string, rank int) (*analysis.RankAnalysis, error) {
	if rank < 0 {
		if len(all) != 1 {
			return nil, fmt.Errorf("merge: %s holds %d ranks: say which", path, len(all))
		}
		return all[0], nil
	}
	for _, a := range all {
		if a.Rank == rank {
			return a, nil
		}
	}
	return nil, fmt.Errorf("merge: %s holds no rank %d", path, rank)
}

// OutlierAndMedian picks, as a merge's summary does, the outlier and the median
// rank of a window's analyses; false with fewer than two ranks.
func OutlierAndMedian(all []*analysis.RankAnalysis) (outlier, median *analysis.RankAnalysis, ok bool) {
	sums := make([]analysis.RankSummary, len(all))
	by := map[int]*analysis.RankAnalysis{}
	for i, a := range all {
		sums[i] = analysis.RankSummary{Rank: a.Rank, PeakAllocatedBytes: a.PeakAllocatedBytes}
		by[a.Rank] = a
	}
	sp := analysis.ComputeSpread(sums)
	if sp == nil || len(all) < 2 {
		return nil, nil, false
	}
	m, ok := analysis.MedianRank(sums, sp, sp.OutlierRank)
	return by[sp.OutlierRank], by[m], ok
}

// FileLabels names two files for a diff's header: each by its name, and where
// the names are alike by as many of the folders above as tell them apart, so
// two windows' merged.memsnap.pb are named by their windows
// (window3/merged.memsnap.pb#rank3, window7/merged.memsnap.pb#rank3). The
// same file twice is "A: " and "B: " its name.
func FileLabels(a, b string, rank int) (string, string) {
	pa, pb := pathParts(a), pathParts(b)
	for k := 1; k <= max(len(pa), len(pb)); k++ {
		if la, lb := labelOf(a, k, rank), labelOf(b, k, rank); la != lb {
			return la, lb
		}
	}
	l := labelOf(a, 1, rank)
	return "A: " + l, "B: " + l
}

// labelOf is path's last k parts, and the rank taken from a merged timeline.
func labelOf(path string, k, rank int) string {
	parts := pathParts(path)
	l := strings.Join(parts[max(len(parts)-k, 0):], "/")
	if rank >= 0 && isPB(path) {
		l += fmt.Sprintf("#rank%d", rank)
	}
	return l
}

// pathParts splits a file's path or URL at its slashes (either kind), leaving
// out empty parts and ".".
func pathParts(path string) []string {
	parts := strings.FieldsFunc(path, func(r rune) bool { return r == '/' || r == '\\' })
	return slices.DeleteFunc(parts, func(p string) bool { return p == "." })
}
