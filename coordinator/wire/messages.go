package wire

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/merge/sidecar"
)

// Limits on what a message may carry: gossip payloads stay small, and a member
// never allocates more than this for one message.
const (
	MaxMessage = 1 << 20
	MaxMeta    = 512
	MaxString  = 4096
	// maxStepUs is the longest step time a time.Duration holds, in microseconds.
	maxStepUs = int64(math.MaxInt64 / time.Microsecond)
	// MaxWindowID bounds window ids, so that the next id never wraps around
	MaxWindowID = uint64(1) << 53
	// MaxViewIncidents bounds the incidents a view carries, and MaxIncidentCause
	// each one's cause: with the view's 4,096 ranks' figures, within MaxMessage.
	MaxViewIncidents = 1024
	MaxIncidentCause = 256
)

var errMalformed = errors.New("coordinator: malformed message")

// DecodeMeta parses and checks a member's metadata.
func DecodeMeta(b []byte) (*pb.NodeMeta, error) {
	if len(b) == 0 || len(b) > MaxMeta {
		return nil, fmt.Errorf("%w: metadata of %d bytes", errMalformed, len(b))
	}
	var m pb.NodeMeta
	if err := proto.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: metadata: %v", errMalformed, err)
	}
	switch {
	case m.Version != 1:
		return nil, fmt.Errorf("%w: metadata version %d", errMalformed, m.Version)
	case m.Run == "" || !utf8.ValidString(m.Run):
		return nil, fmt.Errorf("%w: no run name", errMalformed)
	case m.Rank < -1 || m.Rank >= sidecar.MaxRanks || m.WorldSize < 0 || m.WorldSize > sidecar.MaxRanks:
		return nil, fmt.Errorf("%w: rank %d of world size %d", errMalformed, m.Rank, m.WorldSize)
	case m.Rank >= 0 && m.Rank >= m.WorldSize:
		return nil, fmt.Errorf("%w: rank %d outside world size %d", errMalformed, m.Rank, m.WorldSize)
	case m.LocalRank < 0 || m.NodeRank < 0 || m.LocalRank >= sidecar.MaxRanks || m.NodeRank >= sidecar.MaxRanks:
		return nil, fmt.Errorf("%w: local rank %d, node rank %d", errMalformed, m.LocalRank, m.NodeRank)
	case m.LastWindow > MaxWindowID || m.Term > MaxWindowID:
		return nil, fmt.Errorf("%w: window id %d, term %d", errMalformed, m.LastWindow, m.Term)
	case !ValidAgent(m.Agent):
		return nil, fmt.Errorf("%w: agent id %q", errMalformed, m.Agent)
	}
	// the wire allows shorter encodings than proto.Marshal writes (an int32 of -1
	// in 5 bytes rather than 10): what is accepted must still fit once re-encoded
	if n := proto.Size(&m); n > MaxMeta {
		return nil, fmt.Errorf("%w: metadata of %d bytes once encoded", errMalformed, n)
	}
	return &m, nil
}

// MaxAgent bounds an agent's id (a member of an earlier version has none).
const MaxAgent = 32

// ValidAgent reports whether id can be an agent's id: empty, or up to MaxAgent
// lowercase hex digits.
func ValidAgent(id string) bool {
	return len(id) <= MaxAgent && strings.Trim(id, "0123456789abcdef") == ""
}

// DecodeEnvelope parses and checks one message.
func DecodeEnvelope(b []byte) (*pb.Envelope, error) {
	if len(b) > MaxMessage {
		return nil, fmt.Errorf("%w: %d bytes", errMalformed, len(b))
	}
	var e pb.Envelope
	if err := proto.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("%w: %v", errMalformed, err)
	}
	if err := CheckEnvelope(&e); err != nil {
		return nil, err
	}
	// as for metadata: what is accepted fits once re-encoded, so it can be relayed
	if n := proto.Size(&e); n > MaxMessage {
		return nil, fmt.Errorf("%w: %d bytes once encoded", errMalformed, n)
	}
	return &e, nil
}

// CheckEnvelope checks one message: its header, then its body, one check per
// message type.
func CheckEnvelope(e *pb.Envelope) error {
	if err := checkHeader(e); err != nil {
		return err
	}
	switch b := e.Body.(type) {
	case *pb.Envelope_Plan:
		return checkPlan(e.WindowId, b.Plan)
	case *pb.Envelope_Status:
		return checkStatus(b.Status)
	case *pb.Envelope_Ack:
		return checkAck(b.Ack)
	case *pb.Envelope_Progress:
		return checkProgress(b.Progress)
	case *pb.Envelope_Result:
		return checkResult(b.Result)
	case *pb.Envelope_Request:
		return checkRequest(b.Request)
	case *pb.Envelope_WindowResult:
		return checkWindowResult(b.WindowResult)
	case *pb.Envelope_Cancel:
		return checkLong(b.Cancel.Reason)
	case *pb.Envelope_Dump:
		return checkDump(b.Dump)
	case *pb.Envelope_Figures:
		return checkFigures(b.Figures)
	case *pb.Envelope_View:
		return checkView(b.View)
	case *pb.Envelope_LeaderSilent:
		if l := b.LeaderSilent.GetLeader(); l == "" || len(l) > 512 || l == e.Sender {
			return bad("a silent leader %q from %q", l, e.Sender)
		}
		also := b.LeaderSilent.GetAlso()
		if len(also) > MaxSilentAlso {
			return bad("a silent leader's notice naming %d more members (at most %d)", len(also), MaxSilentAlso)
		}
		for _, a := range also {
			if a == "" || len(a) > 512 || a == e.Sender || a == b.LeaderSilent.GetLeader() {
				return bad("a silent member %q in a notice from %q", a, e.Sender)
			}
		}
	}
	return nil
}

// MaxSilentAlso bounds the members a silent leader's notice names beside the
// leader: the ranks of one host that come before the sender.
const MaxSilentAlso = 64

// maxFigure bounds every byte count of a rank's figures (1 PiB), as the trainer
// socket does.
const maxFigure = 1 << 50

func checkFigures(f *pb.Figures) error {
	if f == nil {
		return bad("no figures")
	}
	for _, v := range []int64{f.Batch, f.Allocated, f.Reserved, f.Peak, f.InactiveSplit, f.AllocRetries, f.Ooms, f.DeviceUsed, f.DeviceTotal, f.Headroom} {
		if v < 0 || v > maxFigure {
			return bad("a figure of %d", v)
		}
	}
	if math.IsNaN(f.Growth) || math.Abs(f.Growth) > maxFigure {
		return bad("growth %v", f.Growth)
	}
	if f.DeviceTotal > 0 && f.DeviceUsed > f.DeviceTotal {
		return bad("device used %d of %d", f.DeviceUsed, f.DeviceTotal)
	}
	return nil
}

func checkView(v *pb.ClusterView) error {
	if len(v.Ranks) > sidecar.MaxRanks {
		return bad("a view of %d ranks", len(v.Ranks))
	}
	if err := checkRank("leader rank", v.LeaderRank, true); err != nil {
		return err
	}
	if v.WorldSize < 0 || v.WorldSize > sidecar.MaxRanks || v.Reporting < 0 || v.Reporting > sidecar.MaxRanks {
		return bad("world size %d, %d reporting", v.WorldSize, v.Reporting)
	}
	for _, r := range v.Ranks {
		if err := checkRank("rank", r.Rank, false); err != nil {
			return err
		}
		if err := checkFigures(r.Figures); err != nil {
			return err
		}
		if r.AgeMs < 0 || len(r.Node) > 256 {
			return bad("age %d, node of %d bytes", r.AgeMs, len(r.Node))
		}
	}
	return checkIncidents(v.Incidents)
}

// checkIncidents checks a view's incidents: at most MaxViewIncidents, one a
// rank, each an OOM or a crash with a short cause.
func checkIncidents(incs []*pb.RankIncident) error {
	if len(incs) > MaxViewIncidents {
		return bad("a view of %d incidents", len(incs))
	}
	seen := make(map[int32]bool, len(incs))
	for _, in := range incs {
		if err := checkRank("incident of rank", in.Rank, false); err != nil {
			return err
		}
		switch {
		case seen[in.Rank]:
			return bad("two incidents of rank %d", in.Rank)
		case in.Kind != pb.WindowKind_WINDOW_KIND_OOM && in.Kind != pb.WindowKind_WINDOW_KIND_CRASH:
			return bad("an incident of kind %d", in.Kind)
		case len(in.Cause) > MaxIncidentCause:
			return bad("an incident's cause of %d bytes", len(in.Cause))
		case in.Batch < -1 || in.Batch > maxFigure || in.AtUs < 0 || in.AgeMs < 0:
			return bad("an incident at batch %d, %d us, %d ms ago", in.Batch, in.AtUs, in.AgeMs)
		}
		seen[in.Rank] = true
	}
	return nil
}

// bad is a malformed message's error.
func bad(f string, a ...any) error { return fmt.Errorf("%w: %s", errMalformed, fmt.Sprintf(f, a...)) }

// checkHeader checks what every message carries: a body, a sender, ids in range.
func checkHeader(e *pb.Envelope) error {
	switch {
	case e.Body == nil:
		return bad("no body")
	case e.Sender == "" || len(e.Sender) > 512:
		return bad("sender %q", e.Sender)
	case e.SenderRank < -1 || e.SenderRank >= sidecar.MaxRanks:
		return bad("sender rank %d", e.SenderRank)
	case e.WindowId > MaxWindowID || e.Term > MaxWindowID:
		return bad("window id %d, term %d", e.WindowId, e.Term)
	case len(e.ReplyAddr) > 128:
		return bad("reply address of %d bytes", len(e.ReplyAddr))
	}
	return nil
}

// checkEnum checks that v is one of an enum's values.
func checkEnum(what string, v int32, names map[int32]string) error {
	if _, ok := names[v]; !ok {
		return bad("%s %d", what, v)
	}
	return nil
}

// checkLong checks that no string is longer than MaxString.
func checkLong(ss ...string) error {
	for _, s := range ss {
		if len(s) > MaxString {
			return bad("a field of %d bytes", len(s))
		}
	}
	return nil
}

// checkRank checks a rank a message names; -1 stands for none where none is allowed.
func checkRank(what string, r int32, none bool) error {
	if r >= sidecar.MaxRanks || r < 0 && !(none && r == -1) {
		return bad("%s %d", what, r)
	}
	return nil
}

func checkPlan(id uint64, p *pb.Plan) error {
	switch {
	case id == 0:
		return bad("plan without a window id")
	case p.Start < 0 || p.Stop <= p.Start:
		return bad("window [%d, %d)", p.Start, p.Stop)
	case p.WorldSize < 0 || p.WorldSize > sidecar.MaxRanks:
		return bad("plan for world size %d", p.WorldSize)
	case len(p.Ranks) > sidecar.MaxRanks:
		return bad("plan for %d ranks", len(p.Ranks))
	}
	for _, r := range p.Ranks {
		if err := checkRank("plan for rank", r, false); err != nil {
			return err
		}
	}
	return checkLong(p.Reason)
}

func checkStatus(s *pb.Status) error {
	switch {
	case s.Window > MaxWindowID || s.Seen > MaxWindowID || s.Term > MaxWindowID:
		return bad("status naming window %d, seen %d, term %d", s.Window, s.Seen, s.Term)
	case len(s.Spooled) > 64:
		return bad("status naming %d spooled windows", len(s.Spooled))
	case s.Batch < -1 || s.StepUs < 0 || s.StepUs > maxStepUs:
		return bad("status of batch %d, step time %d us", s.Batch, s.StepUs)
	}
	if err := checkEnum("status state", int32(s.State), pb.Step_name); err != nil {
		return err
	}
	if s.Result != nil {
		return checkResult(s.Result)
	}
	return nil
}

func checkAck(a *pb.Ack) error {
	if a.Term > MaxWindowID {
		return bad("ack of term %d", a.Term)
	}
	if err := checkEnum("ack code", int32(a.Code), pb.AckCode_name); err != nil {
		return err
	}
	return checkLong(a.Message)
}

func checkProgress(p *pb.Progress) error {
	if err := checkRank("progress of rank", p.Rank, true); err != nil {
		return err
	}
	if err := checkEnum("progress state", int32(p.State), pb.Step_name); err != nil {
		return err
	}
	if p.DeadlineUs < 0 {
		return bad("a deadline of %d", p.DeadlineUs)
	}
	if len(p.Steps) > sidecar.MaxRanks {
		return bad("progress of %d steps", len(p.Steps))
	}
	for _, st := range p.Steps {
		if err := checkRank("progress of rank", st.Rank, false); err != nil {
			return err
		}
		if err := checkEnum("progress state", int32(st.State), pb.Step_name); err != nil {
			return err
		}
		if err := checkLong(st.Reason); err != nil {
			return err
		}
	}
	return checkLong(p.Reason)
}

func checkResult(r *pb.RankResult) error {
	if r.Size < 0 || r.Events < 0 || r.Start < 0 || r.Stop < 0 {
		return bad("negative result figures")
	}
	return checkLong(r.Key, r.MetaKey, r.Sha256, r.Partial, r.Error, r.Reason, r.AnalysisKey, r.Cause)
}

func checkRequest(r *pb.SnapshotRequest) error {
	if r.Batches < 0 || r.Batches > 1<<20 {
		return bad("a window of %d batches", r.Batches)
	}
	if err := checkRank("request naming rank", r.FailedRank, true); err != nil {
		return err
	}
	if err := checkEnum("request kind", int32(r.Kind), pb.WindowKind_name); err != nil {
		return err
	}
	if r.Batch != nil && (*r.Batch < 0 || *r.Batch > maxFigure) {
		return bad("a post-mortem at batch %d", *r.Batch)
	}
	return checkLong(r.Reason, r.Cause)
}

func checkWindowResult(w *pb.WindowResult) error {
	if len(w.Missing) > sidecar.MaxRanks || len(w.Ranks) > sidecar.MaxRanks || len(w.Outputs) > 64 {
		return bad("a result naming too much")
	}
	for _, r := range w.Ranks {
		if err := checkRank("result naming rank", r, false); err != nil {
			return err
		}
	}
	for r, why := range w.Missing {
		if err := checkRank("result naming rank", r, false); err != nil {
			return err
		}
		if err := checkLong(why); err != nil {
			return err
		}
	}
	if err := checkLong(w.Outputs...); err != nil {
		return err
	}
	if w.Window > MaxWindowID {
		return bad("a result of window %d", w.Window)
	}
	if err := checkEnum("result state", int32(w.State), pb.Outcome_name); err != nil {
		return err
	}
	if err := checkEnum("result kind", int32(w.Kind), pb.WindowKind_name); err != nil {
		return err
	}
	return checkLong(w.Manifest, w.Error, w.Store)
}

func checkDump(d *pb.Dump) error {
	if err := checkRank("dump naming rank", d.FailedRank, true); err != nil {
		return err
	}
	if err := checkEnum("dump kind", int32(d.Kind), pb.WindowKind_name); err != nil {
		return err
	}
	return checkLong(d.Reason)
}
