package wire

import (
	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/runlog"
)

// ReportOf is a rank's result of a window as the run's log keeps it.
func ReportOf(window uint64, rank int, r *pb.RankResult) runlog.Report {
	return runlog.Report{Window: window, Rank: rank, Key: r.Key, MetaKey: r.MetaKey, AnalysisKey: r.AnalysisKey, Size: r.Size, SHA256: r.Sha256,
		Events: r.Events, Start: r.Start, Stop: r.Stop, Reason: r.Reason, Partial: r.Partial, Error: r.Error, Cause: r.Cause}
}

// ResultOfReport is a rank's report in the run's log as the rank's result of
// the window (ReportOf's inverse).
func ResultOfReport(r *runlog.Report) *pb.RankResult {
	return &pb.RankResult{Key: r.Key, MetaKey: r.MetaKey, AnalysisKey: r.AnalysisKey, Size: r.Size, Sha256: r.SHA256, Events: r.Events,
		Start: r.Start, Stop: r.Stop, Reason: r.Reason, Partial: r.Partial, Error: r.Error, Cause: r.Cause}
}
