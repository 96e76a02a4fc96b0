package coordinator

import (
	"errors"
	"fmt"
	"math"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/merge"
)

// Limits on what a message may carry: gossip payloads stay small, and a member
// never allocates more than this for one message.
const (
	maxMessage = 1 << 20
	maxMeta    = 512
	maxString  = 4096
	// maxStepUs is the longest step time a time.Duration holds, in microseconds.
	maxStepUs = int64(math.MaxInt64 / time.Microsecond)
	// maxWindowID bounds window ids, so that the next id never wraps around
	maxWindowID = uint64(1) << 53
)

var errMalformed = errors.New("coordinator: malformed message")

// decodeMeta parses and checks a member's metadata.
func decodeMeta(b []byte) (*pb.NodeMeta, error) {
	if len(b) == 0 || len(b) > maxMeta {
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
	case m.Rank < -1 || m.Rank >= merge.MaxRanks || m.WorldSize < 0 || m.WorldSize > merge.MaxRanks:
		return nil, fmt.Errorf("%w: rank %d of world size %d", errMalformed, m.Rank, m.WorldSize)
	case m.Rank >= 0 && m.Rank >= m.WorldSize:
		return nil, fmt.Errorf("%w: rank %d outside world size %d", errMalformed, m.Rank, m.WorldSize)
	case m.LocalRank < 0 || m.NodeRank < 0 || m.LocalRank >= merge.MaxRanks || m.NodeRank >= merge.MaxRanks:
		return nil, fmt.Errorf("%w: local rank %d, node rank %d", errMalformed, m.LocalRank, m.NodeRank)
	case m.LastWindow > maxWindowID || m.Term > maxWindowID:
		return nil, fmt.Errorf("%w: window id %d, term %d", errMalformed, m.LastWindow, m.Term)
	}
	// the wire allows shorter encodings than proto.Marshal writes (an int32 of -1
	// in 5 bytes rather than 10): what is accepted must still fit once re-encoded
	if n := proto.Size(&m); n > maxMeta {
		return nil, fmt.Errorf("%w: metadata of %d bytes once encoded", errMalformed, n)
	}
	return &m, nil
}

// decodeEnvelope parses and checks one message.
func decodeEnvelope(b []byte) (*pb.Envelope, error) {
	if len(b) > maxMessage {
		return nil, fmt.Errorf("%w: %d bytes", errMalformed, len(b))
	}
	var e pb.Envelope
	if err := proto.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("%w: %v", errMalformed, err)
	}
	if err := checkEnvelope(&e); err != nil {
		return nil, err
	}
	// as for metadata: what is accepted fits once re-encoded, so it can be relayed
	if n := proto.Size(&e); n > maxMessage {
		return nil, fmt.Errorf("%w: %d bytes once encoded", errMalformed, n)
	}
	return &e, nil
}

func checkEnvelope(e *pb.Envelope) error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: %s", errMalformed, fmt.Sprintf(f, a...)) }
	if e.Body == nil {
		return bad("no body")
	}
	if e.Sender == "" || len(e.Sender) > 512 {
		return bad("sender %q", e.Sender)
	}
	if e.SenderRank < -1 || e.SenderRank >= merge.MaxRanks {
		return bad("sender rank %d", e.SenderRank)
	}
	if e.WindowId > maxWindowID || e.Term > maxWindowID {
		return bad("window id %d, term %d", e.WindowId, e.Term)
	}
	if len(e.ReplyAddr) > 128 {
		return bad("reply address of %d bytes", len(e.ReplyAddr))
	}
	enum := func(what string, v int32, names map[int32]string) error {
		if _, ok := names[v]; !ok {
			return bad("%s %d", what, v)
		}
		return nil
	}
	window := func(start, stop int64) error {
		if start < 0 || stop <= start {
			return bad("window [%d, %d)", start, stop)
		}
		return nil
	}
	long := func(ss ...string) error {
		for _, s := range ss {
			if len(s) > maxString {
				return bad("a field of %d bytes", len(s))
			}
		}
		return nil
	}
	// rank checks a rank a message names; -1 stands for none where allowed
	rank := func(what string, r int32, none bool) error {
		if r >= merge.MaxRanks || r < 0 && !(none && r == -1) {
			return bad("%s %d", what, r)
		}
		return nil
	}
	result := func(r *pb.RankResult) error {
		if r.Size < 0 || r.Events < 0 || r.Start < 0 || r.Stop < 0 {
			return bad("negative result figures")
		}
		return long(r.Key, r.MetaKey, r.Sha256, r.Partial, r.Error, r.Reason, r.AnalysisKey, r.Cause)
	}
	switch b := e.Body.(type) {
	case *pb.Envelope_Plan:
		if e.WindowId == 0 {
			return bad("plan without a window id")
		}
		if err := window(b.Plan.Start, b.Plan.Stop); err != nil {
			return err
		}
		if b.Plan.WorldSize < 0 || b.Plan.WorldSize > merge.MaxRanks {
			return bad("plan for world size %d", b.Plan.WorldSize)
		}
		if len(b.Plan.Ranks) > merge.MaxRanks {
			return bad("plan for %d ranks", len(b.Plan.Ranks))
		}
		for _, r := range b.Plan.Ranks {
			if err := rank("plan for rank", r, false); err != nil {
				return err
			}
		}
		return long(b.Plan.Reason)
	case *pb.Envelope_Status:
		if b.Status.Window > maxWindowID || b.Status.Seen > maxWindowID || b.Status.Term > maxWindowID {
			return bad("status naming window %d, seen %d, term %d", b.Status.Window, b.Status.Seen, b.Status.Term)
		}
		if err := enum("status state", int32(b.Status.State), pb.Step_name); err != nil {
			return err
		}
		if len(b.Status.Spooled) > 64 {
			return bad("status naming %d spooled windows", len(b.Status.Spooled))
		}
		if b.Status.Batch < -1 || b.Status.StepUs < 0 || b.Status.StepUs > maxStepUs {
			return bad("status of batch %d, step time %d us", b.Status.Batch, b.Status.StepUs)
		}
		if b.Status.Result != nil {
			if err := result(b.Status.Result); err != nil {
				return err
			}
		}
		return nil
	case *pb.Envelope_Ack:
		if b.Ack.Term > maxWindowID {
			return bad("ack of term %d", b.Ack.Term)
		}
		if err := enum("ack code", int32(b.Ack.Code), pb.AckCode_name); err != nil {
			return err
		}
		return long(b.Ack.Message)
	case *pb.Envelope_Progress:
		if err := rank("progress of rank", b.Progress.Rank, true); err != nil {
			return err
		}
		if err := enum("progress state", int32(b.Progress.State), pb.Step_name); err != nil {
			return err
		}
		if b.Progress.DeadlineUs < 0 {
			return bad("a deadline of %d", b.Progress.DeadlineUs)
		}
		if len(b.Progress.Steps) > merge.MaxRanks {
			return bad("progress of %d steps", len(b.Progress.Steps))
		}
		for _, st := range b.Progress.Steps {
			if err := rank("progress of rank", st.Rank, false); err != nil {
				return err
			}
			if err := enum("progress state", int32(st.State), pb.Step_name); err != nil {
				return err
			}
			if err := long(st.Reason); err != nil {
				return err
			}
		}
		return long(b.Progress.Reason)
	case *pb.Envelope_Result:
		return result(b.Result)
	case *pb.Envelope_Request:
		if b.Request.Batches < 0 || b.Request.Batches > 1<<20 {
			return bad("a window of %d batches", b.Request.Batches)
		}
		if err := rank("request naming rank", b.Request.FailedRank, true); err != nil {
			return err
		}
		if err := enum("request kind", int32(b.Request.Kind), pb.WindowKind_name); err != nil {
			return err
		}
		return long(b.Request.Reason, b.Request.Cause)
	case *pb.Envelope_WindowResult:
		w := b.WindowResult
		if len(w.Missing) > merge.MaxRanks || len(w.Ranks) > merge.MaxRanks || len(w.Outputs) > 64 {
			return bad("a result naming too much")
		}
		for _, r := range w.Ranks {
			if err := rank("result naming rank", r, false); err != nil {
				return err
			}
		}
		for r, why := range w.Missing {
			if err := rank("result naming rank", r, false); err != nil {
				return err
			}
			if err := long(why); err != nil {
				return err
			}
		}
		if err := long(w.Outputs...); err != nil {
			return err
		}
		if w.Window > maxWindowID {
			return bad("a result of window %d", w.Window)
		}
		if err := enum("result state", int32(w.State), pb.Outcome_name); err != nil {
			return err
		}
		if err := enum("result kind", int32(w.Kind), pb.WindowKind_name); err != nil {
			return err
		}
		return long(w.Manifest, w.Error, w.Store)
	case *pb.Envelope_Cancel:
		return long(b.Cancel.Reason)
	case *pb.Envelope_Dump:
		if err := rank("dump naming rank", b.Dump.FailedRank, true); err != nil {
			return err
		}
		if err := enum("dump kind", int32(b.Dump.Kind), pb.WindowKind_name); err != nil {
			return err
		}
		return long(b.Dump.Reason)
	}
	return nil
}
