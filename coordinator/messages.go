package coordinator

import (
	"errors"
	"fmt"
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
	case m.LocalRank < 0 || m.NodeRank < 0:
		return nil, fmt.Errorf("%w: negative local or node rank", errMalformed)
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
	switch b := e.Body.(type) {
	case *pb.Envelope_Plan:
		if e.WindowId == 0 {
			return bad("plan without a window id")
		}
		if err := window(b.Plan.Start, b.Plan.Stop); err != nil {
			return err
		}
		if len(b.Plan.Ranks) > merge.MaxRanks {
			return bad("plan for %d ranks", len(b.Plan.Ranks))
		}
		return long(b.Plan.Reason)
	case *pb.Envelope_Status:
		return long(b.Status.State)
	case *pb.Envelope_Ack:
		return long(b.Ack.Code, b.Ack.Message)
	case *pb.Envelope_Progress:
		if b.Progress.Rank < -1 || b.Progress.Rank >= merge.MaxRanks {
			return bad("progress of rank %d", b.Progress.Rank)
		}
		return long(b.Progress.State, b.Progress.Reason)
	case *pb.Envelope_Result:
		r := b.Result
		if r.Size < 0 || r.Events < 0 {
			return bad("negative result size")
		}
		return long(r.Key, r.MetaKey, r.Sha256, r.Partial, r.Error, r.Reason)
	case *pb.Envelope_Request:
		if b.Request.Batches < 0 || b.Request.Batches > 1<<20 {
			return bad("a window of %d batches", b.Request.Batches)
		}
		return long(b.Request.Reason)
	case *pb.Envelope_WindowResult:
		if len(b.WindowResult.Missing) > merge.MaxRanks || len(b.WindowResult.Ranks) > merge.MaxRanks || len(b.WindowResult.Outputs) > 64 {
			return bad("a result naming too much")
		}
		return long(b.WindowResult.State, b.WindowResult.Manifest, b.WindowResult.Error, b.WindowResult.Store)
	case *pb.Envelope_Cancel:
		return long(b.Cancel.Reason)
	case *pb.Envelope_Dump:
		return long(b.Dump.Reason)
	}
	return nil
}
