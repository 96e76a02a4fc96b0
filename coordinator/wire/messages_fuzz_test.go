package wire

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/merge/sidecar"
)

// envelopeSeeds is one valid envelope of every body type.
func envelopeSeeds() []*pb.Envelope {
	env := func(rank int32, window uint64, body any) *pb.Envelope {
		e := &pb.Envelope{SenderRank: rank, WindowId: window, Sender: "run/rank" + strconv.Itoa(int(max(rank, 0))), Seq: 7} // as coordinator.NodeName names a rank
		switch b := body.(type) {
		case *pb.StatusRequest:
			e.Body = &pb.Envelope_StatusRequest{StatusRequest: b}
		case *pb.Status:
			e.Body = &pb.Envelope_Status{Status: b}
		case *pb.Plan:
			e.Body = &pb.Envelope_Plan{Plan: b}
		case *pb.Ack:
			e.Body = &pb.Envelope_Ack{Ack: b}
		case *pb.Progress:
			e.Body = &pb.Envelope_Progress{Progress: b}
		case *pb.RankResult:
			e.Body = &pb.Envelope_Result{Result: b}
		case *pb.Cancel:
			e.Body = &pb.Envelope_Cancel{Cancel: b}
		case *pb.SnapshotRequest:
			e.Body = &pb.Envelope_Request{Request: b}
		case *pb.WindowResult:
			e.Body = &pb.Envelope_WindowResult{WindowResult: b}
		case *pb.ClockProbe:
			e.Body = &pb.Envelope_ClockProbe{ClockProbe: b}
		case *pb.ClockReply:
			e.Body = &pb.Envelope_ClockReply{ClockReply: b}
		case *pb.Dump:
			e.Body = &pb.Envelope_Dump{Dump: b}
		case *pb.LeaderSilent:
			e.Body = &pb.Envelope_LeaderSilent{LeaderSilent: b}
		case *pb.ClusterView:
			e.Body = &pb.Envelope_View{View: b}
		}
		return e
	}
	res := &pb.RankResult{Key: "run/torch_memory_traces/rank1.8.memory_snapshot.pickle", MetaKey: "run/torch_memory_traces/rank1.8.memory_snapshot.memsnap.json",
		Size: 123456, Sha256: strings.Repeat("ab", 32), Events: 900, Start: 5, Stop: 8, Reason: "window"}
	return []*pb.Envelope{
		env(0, 0, &pb.StatusRequest{}),
		env(1, 3, &pb.Status{Batch: 4, StepUs: 120000, TimeUs: 1700000000000000, Window: 3, Start: 5, Stop: 8, State: pb.Step_STEP_UPLOADED, Result: res, Trainer: true}),
		env(2, 0, &pb.Status{Batch: -1}),
		env(0, 3, &pb.Plan{Start: 5, Stop: 8, Reason: "schedule", WorldSize: 4, Ranks: []int32{0, 1, 2, 3}}),
		env(1, 3, &pb.Ack{Ok: true, Batch: 4}),
		env(1, 3, &pb.Ack{Code: pb.AckCode_ACK_PASSED, Message: "batch 9 is past the window's start 5", Batch: 9}),
		env(2, 3, &pb.Progress{State: pb.Step_STEP_RECORDING, Batch: 6, Rank: 2}),
		env(-1, 3, &pb.Progress{State: pb.Step_STEP_ARMED, Rank: -1}),
		env(0, 3, &pb.Progress{Rank: -1, Batch: -1, Steps: []*pb.RankStep{{Rank: 1, State: pb.Step_STEP_ACKED, Batch: 4}, {Rank: 7, State: pb.Step_STEP_MISSING, Batch: -1, Reason: "no sign of life"}}}),
		env(3, 3, res),
		env(3, 3, &pb.RankResult{Error: "the store refused it", Partial: "the trainer stopped at batch 6", Start: 5, Stop: 8}),
		env(0, 3, &pb.Cancel{Reason: "replan"}),
		env(-1, 0, &pb.SnapshotRequest{Batches: 3, Reason: "request", Watch: true}),
		env(2, 0, &pb.SnapshotRequest{Reason: "oom", FailedRank: 2, Kind: pb.WindowKind_WINDOW_KIND_OOM}),
		env(2, 0, &pb.SnapshotRequest{Reason: "SIGTERM", FailedRank: 2, Kind: pb.WindowKind_WINDOW_KIND_CRASH, Cause: "SIGTERM", AtUs: 1700000000000000}),
		env(0, 3, &pb.WindowResult{State: pb.Outcome_OUTCOME_PUBLISHED, Manifest: "s3://b/run/torch_memory_traces/window3/merged.manifest.json", Store: "s3://b",
			Outputs: []string{"s3://b/run/torch_memory_traces/window3/merged.html"}, Ranks: []int32{0, 1, 3}, Missing: map[int32]string{2: "unreachable"}, Start: 5, Stop: 8}),
		env(0, 3, &pb.WindowResult{State: pb.Outcome_OUTCOME_FAILED, Error: "the store went away"}),
		env(0, 0, &pb.ClockProbe{T0Us: 1700000000000000}),
		env(1, 0, &pb.ClockReply{T0Us: 1700000000000000, TUs: 1700000000000123}),
		env(0, 4, &pb.Dump{Reason: "oom", FailedRank: 2, Kind: pb.WindowKind_WINDOW_KIND_OOM}),
		env(1, 0, &pb.LeaderSilent{Leader: "run/rank0"}),
		env(1, 0, &pb.LeaderSilent{Leader: "run/rank0", Also: []string{"run/rank2"}}),
		env(2, 0, &pb.SnapshotRequest{Reason: "out of memory", FailedRank: 2, Kind: pb.WindowKind_WINDOW_KIND_OOM, Cause: "out of memory", AtUs: 1700000000000000,
			Batch: proto.Int64(120)}),
		env(0, 0, &pb.ClusterView{WorldSize: 4, LeaderRank: 0, Reporting: 1,
			Ranks: []*pb.RankFigures{{Rank: 1, Node: "n1", AgeMs: 900, Figures: &pb.Figures{Batch: 7, Allocated: 1 << 30, DeviceTotal: 80 << 30, Headroom: 70 << 30}}},
			Incidents: []*pb.RankIncident{{Rank: 2, Kind: pb.WindowKind_WINDOW_KIND_OOM, Cause: "out of memory", Batch: 120, AtUs: 1700000000000000, AgeMs: 3000},
				{Rank: 3, Kind: pb.WindowKind_WINDOW_KIND_CRASH, Cause: "SIGKILL", Batch: -1, AtUs: 1700000000000000}}}),
	}
}

// brokenEnvelopes are encodings DecodeEnvelope refuses.
func brokenEnvelopes(t testing.TB) [][]byte {
	valid := mustMarshal(t, envelopeSeeds()[3])
	var out [][]byte
	out = append(out,
		nil,
		valid[:len(valid)-1], // truncated
		append(bytes.Clone(valid), 0xff),
		[]byte{0x1a, 0x03, 'a', 0xff, 'b'}, // sender not UTF-8
		protowire.AppendVarint(protowire.AppendTag(nil, 12, protowire.VarintType), 1), // plan with the wrong wire type
	)
	for _, e := range []*pb.Envelope{
		{Sender: "x"}, // no body
		{Body: &pb.Envelope_Cancel{Cancel: &pb.Cancel{}}},                                                                 // no sender
		{Sender: "x", SenderRank: -2, Body: &pb.Envelope_Cancel{Cancel: &pb.Cancel{}}},                                    // sender rank
		{Sender: "x", Body: &pb.Envelope_Plan{Plan: &pb.Plan{Start: 5, Stop: 8}}},                                         // no window id
		{Sender: "x", WindowId: 1, Body: &pb.Envelope_Plan{Plan: &pb.Plan{Start: 8, Stop: 8}}},                            // empty window
		{Sender: "x", WindowId: 1, Body: &pb.Envelope_Plan{Plan: &pb.Plan{Start: 1, Stop: 8, Ranks: []int32{-1}}}},        // negative rank
		{Sender: "x", Body: &pb.Envelope_Progress{Progress: &pb.Progress{Rank: sidecar.MaxRanks}}},                        // rank too large
		{Sender: "x", Body: &pb.Envelope_Progress{Progress: &pb.Progress{Rank: -1, Steps: []*pb.RankStep{{Rank: -1}}}}},   // a step of no rank
		{Sender: "x", Body: &pb.Envelope_Progress{Progress: &pb.Progress{Rank: -1, Steps: []*pb.RankStep{{State: 999}}}}}, // unknown state
		{Sender: "x", Body: &pb.Envelope_Progress{Progress: &pb.Progress{Rank: -1, Steps: []*pb.RankStep{{Reason: strings.Repeat("m", MaxString+1)}}}}},
		{Sender: "x", Body: &pb.Envelope_Request{Request: &pb.SnapshotRequest{Batches: -1}}},                                  // negative length
		{Sender: "x", Body: &pb.Envelope_Result{Result: &pb.RankResult{Size: -1}}},                                            // negative size
		{Sender: "x", Body: &pb.Envelope_Ack{Ack: &pb.Ack{Message: strings.Repeat("m", MaxString+1)}}},                        // long field
		{Sender: "x", Body: &pb.Envelope_WindowResult{WindowResult: &pb.WindowResult{Missing: map[int32]string{-5: "gone"}}}}, // negative rank
		{Sender: "x", Body: &pb.Envelope_Status{Status: &pb.Status{Result: &pb.RankResult{Events: -1}}}},                      // nested result
		{Sender: "x", Body: &pb.Envelope_Status{Status: &pb.Status{Batch: -2}}},                                               // batch before none
		{Sender: "x", Body: &pb.Envelope_Status{Status: &pb.Status{StepUs: maxStepUs + 1}}},                                   // step past a time.Duration
		{Sender: "x", Body: &pb.Envelope_WindowResult{WindowResult: &pb.WindowResult{Outputs: []string{strings.Repeat("o", MaxString+1)}}}},
		{Sender: "x", Body: &pb.Envelope_Dump{Dump: &pb.Dump{FailedRank: -7}}},                      // negative rank
		{Sender: "x", WindowId: MaxWindowID + 1, Body: &pb.Envelope_Cancel{Cancel: &pb.Cancel{}}},   // a window id the next one would wrap past
		{Sender: "x", Body: &pb.Envelope_Status{Status: &pb.Status{Seen: ^uint64(0)}}},              // the same, seen
		{Sender: "x", Body: &pb.Envelope_LeaderSilent{LeaderSilent: &pb.LeaderSilent{}}},            // no leader named
		{Sender: "x", Body: &pb.Envelope_LeaderSilent{LeaderSilent: &pb.LeaderSilent{Leader: "x"}}}, // itself
		{Sender: "x", Body: &pb.Envelope_LeaderSilent{LeaderSilent: &pb.LeaderSilent{Leader: strings.Repeat("l", 513)}}},
		{Sender: "x", Body: &pb.Envelope_LeaderSilent{LeaderSilent: &pb.LeaderSilent{Leader: "l", Also: []string{"x"}}}}, // itself
		{Sender: "x", Body: &pb.Envelope_LeaderSilent{LeaderSilent: &pb.LeaderSilent{Leader: "l", Also: []string{"l"}}}}, // the leader again
		{Sender: "x", Body: &pb.Envelope_LeaderSilent{LeaderSilent: &pb.LeaderSilent{Leader: "l", Also: []string{""}}}},
		{Sender: "x", Body: &pb.Envelope_LeaderSilent{LeaderSilent: &pb.LeaderSilent{Leader: "l", Also: make([]string, MaxSilentAlso+1)}}},
		{Sender: "x", Body: &pb.Envelope_Request{Request: &pb.SnapshotRequest{Kind: pb.WindowKind_WINDOW_KIND_OOM, Batch: proto.Int64(-1)}}},            // a batch before the first
		{Sender: "x", Body: &pb.Envelope_View{View: &pb.ClusterView{Incidents: []*pb.RankIncident{{Rank: 1, Kind: pb.WindowKind_WINDOW_KIND_WINDOW}}}}}, // not an OOM or a crash
		{Sender: "x", Body: &pb.Envelope_View{View: &pb.ClusterView{Incidents: []*pb.RankIncident{{Rank: 1, Kind: pb.WindowKind_WINDOW_KIND_CRASH, Cause: strings.Repeat("c", MaxIncidentCause+1)}}}}},
		{Sender: "x", Body: &pb.Envelope_View{View: &pb.ClusterView{Incidents: []*pb.RankIncident{{Rank: 1, Kind: pb.WindowKind_WINDOW_KIND_OOM, Batch: -2}}}}},
		{Sender: "x", Body: &pb.Envelope_View{View: &pb.ClusterView{Incidents: []*pb.RankIncident{{Rank: -1, Kind: pb.WindowKind_WINDOW_KIND_OOM}}}}},
		{Sender: "x", Body: &pb.Envelope_View{View: &pb.ClusterView{Incidents: []*pb.RankIncident{{Rank: 1, Kind: pb.WindowKind_WINDOW_KIND_OOM}, {Rank: 1, Kind: pb.WindowKind_WINDOW_KIND_CRASH}}}}},
		{Sender: "x", Body: &pb.Envelope_View{View: &pb.ClusterView{Incidents: manyIncidents(MaxViewIncidents + 1)}}},
	} {
		out = append(out, mustMarshal(t, e))
	}
	return out
}

// manyIncidents is n incidents, of ranks 0 to n-1.
func manyIncidents(n int) []*pb.RankIncident {
	out := make([]*pb.RankIncident, n)
	for i := range out {
		out[i] = &pb.RankIncident{Rank: int32(i), Kind: pb.WindowKind_WINDOW_KIND_CRASH}
	}
	return out
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// int32Compact encodes an int32 field as its 32-bit two's complement varint: at
// most 5 bytes, where proto.Marshal writes a negative int32 in 10. Decoders accept
// both.
func int32Compact(num protowire.Number, v int32) []byte {
	return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), uint64(uint32(v)))
}

// unknownField is field 1000 of n bytes in all (tag, length and payload).
func unknownField(n int) []byte {
	tag := protowire.AppendTag(nil, 1000, protowire.BytesType)
	for payload := n - len(tag) - 1; payload >= 0; payload-- {
		b := protowire.AppendBytes(bytes.Clone(tag), make([]byte, payload))
		if len(b) == n {
			return b
		}
	}
	panic("unknownField: no encoding of that size")
}

// checkAccepted checks an accepted envelope against the rules every receiver
// relies on, independently of CheckEnvelope.
func checkAccepted(t *testing.T, e *pb.Envelope) {
	t.Helper()
	inRank := func(what string, r int32, none bool) {
		if r >= sidecar.MaxRanks || r < -1 || (r == -1 && !none) {
			t.Fatalf("accepted %s %d", what, r)
		}
	}
	short := func(ss ...string) {
		for _, s := range ss {
			if len(s) > MaxString || !utf8.ValidString(s) {
				t.Fatalf("accepted a field of %d bytes (valid UTF-8: %v)", len(s), utf8.ValidString(s))
			}
		}
	}
	result := func(r *pb.RankResult) {
		if r.Size < 0 || r.Events < 0 {
			t.Fatalf("accepted result size %d, events %d", r.Size, r.Events)
		}
		short(r.Key, r.MetaKey, r.Sha256, r.Partial, r.Error, r.Reason, r.Cause)
	}
	known := func(what string, v int32, names map[int32]string) {
		if _, ok := names[v]; !ok {
			t.Fatalf("accepted %s %d", what, v)
		}
	}
	if e.Body == nil || e.Sender == "" || len(e.Sender) > 512 || !utf8.ValidString(e.Sender) {
		t.Fatalf("accepted body %T from %q", e.Body, e.Sender)
	}
	inRank("sender rank", e.SenderRank, true)
	switch b := e.Body.(type) {
	case *pb.Envelope_Plan:
		p := b.Plan
		if e.WindowId == 0 || p.Start < 0 || p.Stop <= p.Start || p.WorldSize < 0 || p.WorldSize > sidecar.MaxRanks || len(p.Ranks) > sidecar.MaxRanks {
			t.Fatalf("accepted plan %v of window %d", p, e.WindowId)
		}
		for _, r := range p.Ranks {
			inRank("plan rank", r, false)
		}
		short(p.Reason)
	case *pb.Envelope_Status:
		if b.Status.Batch < -1 || b.Status.StepUs < 0 || b.Status.StepUs > int64(math.MaxInt64/time.Microsecond) {
			t.Fatalf("accepted status of batch %d, step time %d us", b.Status.Batch, b.Status.StepUs)
		}
		if b.Status.Result != nil {
			result(b.Status.Result)
		}
		known("status state", int32(b.Status.State), pb.Step_name)
	case *pb.Envelope_Ack:
		known("ack code", int32(b.Ack.Code), pb.AckCode_name)
		short(b.Ack.Message)
	case *pb.Envelope_Progress:
		inRank("progress rank", b.Progress.Rank, true)
		known("progress state", int32(b.Progress.State), pb.Step_name)
		short(b.Progress.Reason)
		if len(b.Progress.Steps) > sidecar.MaxRanks {
			t.Fatalf("accepted %d steps", len(b.Progress.Steps))
		}
		for _, st := range b.Progress.Steps {
			inRank("step rank", st.Rank, false)
			known("step state", int32(st.State), pb.Step_name)
			short(st.Reason)
		}
	case *pb.Envelope_Result:
		result(b.Result)
	case *pb.Envelope_Request:
		checkAcceptedRequest(t, b.Request)
	case *pb.Envelope_WindowResult:
		checkAcceptedWindowResult(t, b.WindowResult)
	case *pb.Envelope_Cancel:
		short(b.Cancel.Reason)
	case *pb.Envelope_Dump:
		inRank("dump failed rank", b.Dump.FailedRank, true)
		short(b.Dump.Reason)
	case *pb.Envelope_View:
		checkAcceptedIncidents(t, b.View.Incidents)
	}
}

// checkAcceptedRequest checks an accepted request, independently of CheckEnvelope.
func checkAcceptedRequest(t *testing.T, r *pb.SnapshotRequest) {
	t.Helper()
	if r.Batches < 0 || r.Batches > 1<<20 || r.Batch != nil && *r.Batch < 0 {
		t.Fatalf("accepted a request for %d batches, at batch %v", r.Batches, r.Batch)
	}
	if r.FailedRank >= sidecar.MaxRanks || r.FailedRank < -1 {
		t.Fatalf("accepted request failed rank %d", r.FailedRank)
	}
	if _, ok := pb.WindowKind_name[int32(r.Kind)]; !ok {
		t.Fatalf("accepted request kind %d", r.Kind)
	}
	acceptedShort(t, r.Reason, r.Cause)
}

// checkAcceptedWindowResult checks an accepted window's result, independently
// of CheckEnvelope.
func checkAcceptedWindowResult(t *testing.T, w *pb.WindowResult) {
	t.Helper()
	if len(w.Outputs) > 64 || len(w.Ranks) > sidecar.MaxRanks || len(w.Missing) > sidecar.MaxRanks {
		t.Fatalf("accepted a result of %d outputs, %d ranks, %d missing", len(w.Outputs), len(w.Ranks), len(w.Missing))
	}
	for _, r := range w.Ranks {
		if r < 0 || r >= sidecar.MaxRanks {
			t.Fatalf("accepted result rank %d", r)
		}
	}
	for r, why := range w.Missing {
		if r < 0 || r >= sidecar.MaxRanks {
			t.Fatalf("accepted missing rank %d", r)
		}
		acceptedShort(t, why)
	}
	acceptedShort(t, w.Outputs...)
	if _, ok := pb.Outcome_name[int32(w.State)]; !ok {
		t.Fatalf("accepted result state %d", w.State)
	}
	acceptedShort(t, w.Manifest, w.Store, w.Error)
}

// acceptedShort fails t for a string longer than MaxString or not UTF-8.
func acceptedShort(t *testing.T, ss ...string) {
	t.Helper()
	for _, s := range ss {
		if len(s) > MaxString || !utf8.ValidString(s) {
			t.Fatalf("accepted a field of %d bytes (valid UTF-8: %v)", len(s), utf8.ValidString(s))
		}
	}
}

// checkAcceptedIncidents checks a view's accepted incidents, independently of
// CheckEnvelope.
func checkAcceptedIncidents(t *testing.T, incs []*pb.RankIncident) {
	t.Helper()
	if len(incs) > MaxViewIncidents {
		t.Fatalf("accepted %d incidents", len(incs))
	}
	ranks := map[int32]bool{}
	for _, in := range incs {
		oomOrCrash := in.Kind == pb.WindowKind_WINDOW_KIND_OOM || in.Kind == pb.WindowKind_WINDOW_KIND_CRASH
		if in.Rank < 0 || in.Rank >= sidecar.MaxRanks || ranks[in.Rank] || !oomOrCrash || len(in.Cause) > MaxIncidentCause || in.Batch < -1 || in.AgeMs < 0 {
			t.Fatalf("accepted incident %v", in)
		}
		ranks[in.Rank] = true
	}
}

// FuzzDecodeEnvelope: DecodeEnvelope never panics, refuses more than MaxMessage
// bytes, and what it accepts obeys its rules and survives a re-encoding unchanged.
func FuzzDecodeEnvelope(f *testing.F) {
	for _, e := range envelopeSeeds() {
		b := mustMarshal(f, e)
		f.Add(b)
		// an unknown field, kept through a round trip
		f.Add(append(bytes.Clone(b), unknownField(9)...))
	}
	for _, b := range brokenEnvelopes(f) {
		f.Add(b)
	}
	// two bodies: the last wins
	f.Add(append(mustMarshal(f, envelopeSeeds()[3]), mustMarshal(f, envelopeSeeds()[10])...))
	// a sender rank of -1 in its 5-byte form
	noRank := envelopeSeeds()[11]
	noRank.SenderRank = 0
	f.Add(append(int32Compact(1, -1), mustMarshal(f, noRank)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := DecodeEnvelope(b)
		if err != nil {
			if e != nil || !errors.Is(err, errMalformed) {
				t.Fatalf("refused with %v but returned %v", err, e)
			}
			return
		}
		if len(b) > MaxMessage {
			t.Fatalf("accepted %d bytes, more than %d", len(b), MaxMessage)
		}
		if err := CheckEnvelope(e); err != nil {
			t.Fatalf("accepted, then refused by CheckEnvelope: %v", err)
		}
		checkAccepted(t, e)
		again, err := proto.Marshal(e)
		if err != nil {
			t.Fatalf("an accepted message does not re-encode: %v", err)
		}
		e2, err := DecodeEnvelope(again)
		if err != nil {
			t.Fatalf("an accepted message, re-encoded (%d bytes from %d), is refused: %v", len(again), len(b), err)
		}
		if !proto.Equal(e, e2) {
			t.Fatalf("a round trip changed the message:\n%v\n%v", e, e2)
		}
	})
}

// nodeMetaSeeds are valid metadata of a rank and of a member that is not a rank.
func nodeMetaSeeds() []*pb.NodeMeta {
	return []*pb.NodeMeta{
		{Version: 1, Run: "gpt", Rank: 3, LocalRank: 3, NodeRank: 0, WorldSize: 8, GpuUuid: "GPU-5c1b3f3e-0000-4000-8000-000000000000", LastWindow: 12, Hostname: "node001",
			Term: 4},
		{Version: 1, Run: "gpt", Rank: -1, Hostname: "laptop"},
		{Version: 1, Run: "r", Rank: sidecar.MaxRanks - 1, LocalRank: 7, NodeRank: sidecar.MaxRanks/8 - 1, WorldSize: sidecar.MaxRanks},
		{Version: 1, Run: strings.Repeat("r", 200), Rank: -1, Hostname: strings.Repeat("h", 64)},
	}
}

// FuzzDecodeMeta: DecodeMeta never panics, and what it accepts obeys its rules,
// fits memberlist's limit, and survives a re-encoding unchanged.
func FuzzDecodeMeta(f *testing.F) {
	for _, m := range nodeMetaSeeds() {
		b := mustMarshal(f, m)
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	for _, m := range []*pb.NodeMeta{
		{Run: "gpt", Rank: 0, WorldSize: 1},             // no version
		{Version: 1, Rank: 0, WorldSize: 1},             // no run
		{Version: 1, Run: "gpt", Rank: 4, WorldSize: 4}, // rank outside the world
		{Version: 1, Run: "gpt", Rank: -2},
		{Version: 1, Run: "gpt", Rank: 0, WorldSize: sidecar.MaxRanks + 1},
		{Version: 1, Run: "gpt", Rank: -1, LocalRank: -1},
		{Version: 1, Run: "gpt", Rank: -1, Hostname: strings.Repeat("h", MaxMeta)},
		{Version: 1, Run: "gpt", Rank: -1, Term: MaxWindowID + 1},
		{Version: 1, Run: "gpt", Rank: -1, LastWindow: MaxWindowID + 1},
	} {
		f.Add(mustMarshal(f, m))
	}
	f.Add([]byte{})
	f.Add([]byte{0x12, 0x02, 0xc3, 0x28}) // run not UTF-8
	// a rank of -1 in its 5-byte form, with the rest filling memberlist's limit
	f.Add(metaAtLimit(f))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMeta(b)
		if err != nil {
			if m != nil || !errors.Is(err, errMalformed) {
				t.Fatalf("refused with %v but returned %v", err, m)
			}
			return
		}
		switch {
		case len(b) == 0 || len(b) > MaxMeta:
			t.Fatalf("accepted %d bytes", len(b))
		case m.Version != 1 || m.Run == "" || !utf8.ValidString(m.Run):
			t.Fatalf("accepted version %d, run %q", m.Version, m.Run)
		case m.Rank < -1 || m.Rank >= sidecar.MaxRanks || m.WorldSize < 0 || m.WorldSize > sidecar.MaxRanks || (m.Rank >= 0 && m.Rank >= m.WorldSize):
			t.Fatalf("accepted rank %d of world size %d", m.Rank, m.WorldSize)
		case m.LocalRank < 0 || m.LocalRank >= sidecar.MaxRanks || m.NodeRank < 0 || m.NodeRank >= sidecar.MaxRanks:
			t.Fatalf("accepted local rank %d, node rank %d", m.LocalRank, m.NodeRank)
		case m.LastWindow > MaxWindowID || m.Term > MaxWindowID:
			t.Fatalf("accepted window id %d, term %d", m.LastWindow, m.Term)
		}
		again, err := proto.Marshal(m)
		if err != nil {
			t.Fatalf("accepted metadata does not re-encode: %v", err)
		}
		m2, err := DecodeMeta(again)
		if err != nil {
			t.Fatalf("accepted metadata, re-encoded (%d bytes from %d), is refused: %v", len(again), len(b), err)
		}
		if !proto.Equal(m, m2) {
			t.Fatalf("a round trip changed the metadata:\n%v\n%v", m, m2)
		}
	})
}

// metaAtLimit is MaxMeta bytes of metadata of a member that is not a rank, its
// rank of -1 written in 5 bytes: 5 bytes more once re-encoded.
func metaAtLimit(t testing.TB) []byte {
	head := append(int32Compact(3, -1), mustMarshal(t, &pb.NodeMeta{Version: 1, Run: "gpt"})...)
	host := strings.Repeat("h", MaxMeta-len(head)-3) // tag and a 2-byte length
	b := append(head, mustMarshal(t, &pb.NodeMeta{Hostname: host})...)
	if len(b) != MaxMeta {
		t.Fatalf("metaAtLimit: %d bytes", len(b))
	}
	return b
}

// TestDecodeLimits: the size limits hold at their edges, for the bytes received
// and for the message once re-encoded.
func TestDecodeLimits(t *testing.T) {
	body := mustMarshal(t, envelopeSeeds()[11])
	at := append(bytes.Clone(body), unknownField(MaxMessage-len(body))...)
	if _, err := DecodeEnvelope(at); err != nil {
		t.Fatalf("a message of exactly %d bytes: %v", len(at), err)
	}
	over := append(bytes.Clone(body), unknownField(MaxMessage+1-len(body))...)
	if _, err := DecodeEnvelope(over); err == nil {
		t.Fatalf("a message of %d bytes was accepted", len(over))
	}
	// MaxMessage bytes received, MaxMessage+5 once the sender rank of -1 is
	// written as proto.Marshal writes it
	noRank := envelopeSeeds()[11]
	noRank.SenderRank = 0
	compact := append(int32Compact(1, -1), mustMarshal(t, noRank)...)
	grown := append(bytes.Clone(compact), unknownField(MaxMessage-len(compact))...)
	if len(grown) != MaxMessage {
		t.Fatalf("%d bytes", len(grown))
	}
	if e, err := DecodeEnvelope(grown); err == nil {
		t.Fatalf("accepted %d bytes that re-encode to %d", len(grown), proto.Size(e))
	}
	if m, err := DecodeMeta(metaAtLimit(t)); err == nil {
		t.Fatalf("accepted %d bytes of metadata that re-encode to %d", MaxMeta, proto.Size(m))
	}
	// the same metadata written as proto.Marshal writes it, at the limit, is accepted
	m := &pb.NodeMeta{Version: 1, Run: "gpt", Rank: -1}
	m.Hostname = strings.Repeat("h", MaxMeta-proto.Size(m)-3)
	if b := mustMarshal(t, m); len(b) != MaxMeta {
		t.Fatalf("%d bytes", len(b))
	} else if _, err := DecodeMeta(b); err != nil {
		t.Fatalf("metadata of exactly %d bytes: %v", MaxMeta, err)
	}
	// every seed is accepted, every broken one refused
	for i, e := range envelopeSeeds() {
		if _, err := DecodeEnvelope(mustMarshal(t, e)); err != nil {
			t.Errorf("seed %d (%T): %v", i, e.Body, err)
		}
	}
	for i, b := range brokenEnvelopes(t) {
		if _, err := DecodeEnvelope(b); err == nil {
			t.Errorf("broken envelope %d was accepted", i)
		}
	}
	for i, m := range nodeMetaSeeds() {
		if _, err := DecodeMeta(mustMarshal(t, m)); err != nil {
			t.Errorf("metadata seed %d: %v", i, err)
		}
	}
}
