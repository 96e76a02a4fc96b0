package rankagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// The trainer socket protocol, version 1: newline-delimited JSON objects over a Unix
// socket, at most MaxLine bytes each. docs/protocol.md describes it in full.
const (
	ProtocolVersion = 1
	MaxLine         = 64 << 10
	// SocketMarks is the most batch marks a snapshot message carries on the socket;
	// a longer window's marks are only in the message file beside the snapshot
	// (batches_file), which may hold MaxFileMarks in MaxMessageFile bytes.
	SocketMarks    = 256
	MaxFileMarks   = 1 << 20
	MaxMessageFile = 96 << 20
	// MaxCause bounds a stopping trainer's cause, in bytes.
	MaxCause = 512
)

// Message is any message on the trainer socket; which fields apply depends on Type.
type Message struct {
	V    int    `json:"v,omitempty"`
	Type string `json:"type"`

	// hello (hook -> agent)
	PID        int    `json:"pid,omitempty"`
	Rank       *int   `json:"rank,omitempty"`
	LocalRank  *int   `json:"local_rank,omitempty"`
	DeviceUUID string `json:"device_uuid,omitempty"`
	Torch      string `json:"torch,omitempty"`
	Hook       string `json:"hook,omitempty"`

	// batch (hook -> agent): the batch the trainer is in; also in recording and
	// stopping
	Batch  *int64 `json:"batch,omitempty"`
	TimeUS int64  `json:"t_us,omitempty"`

	// stopping (hook -> agent) and a crash snapshot: why the trainer is being
	// stopped ("SIGTERM", "exception: <Type>: <message>", "exit"), at most
	// MaxCause bytes
	Cause string `json:"cause,omitempty"`

	// snapshot / error / armed / recording (hook -> agent)
	Window  uint64      `json:"window,omitempty"`
	Reason  string      `json:"reason,omitempty"` // "window", "oom", "postmortem" or "crash"
	File    string      `json:"file,omitempty"`   // a base name inside the spool's incoming folder
	Batches []BatchMark `json:"batches,omitempty"`
	// BatchesFile says the marks are too many for the socket: they are in the
	// message file beside the snapshot (NAME.json)
	BatchesFile bool   `json:"batches_file,omitempty"`
	Message     string `json:"message,omitempty"`
	Code        string `json:"code,omitempty"` // error: one of the Code* constants
	// snapshot: how long the training thread waited for the snapshot and for
	// history to be turned off at the window's end, in microseconds
	StallUS int64 `json:"stall_us,omitempty"`

	// welcome / window / cancel (agent -> hook); Start and Stop also in a snapshot
	// (hook -> agent): the window the hook recorded
	Spool      string `json:"spool,omitempty"`
	ID         uint64 `json:"id,omitempty"`
	Start      int64  `json:"start,omitempty"`
	Stop       int64  `json:"stop,omitempty"`
	MaxEntries int    `json:"max_entries,omitempty"`
	Stacks     string `json:"stacks,omitempty"`
	// welcome: keep allocator history on from the start (for OOM post-mortems)
	RecordAlways bool `json:"record_always,omitempty"`

	// memory (hook -> agent): the allocator's figures at the end of Batch
	Memory *Memory `json:"memory,omitempty"`
}

// Memory is what a trainer's caching allocator and its device hold, as the hook
// reads them at the end of a batch (torch.cuda.memory_stats and mem_get_info):
// cheap figures, read at most once a second.
type Memory struct {
	Allocated     int64 `json:"allocated"`      // bytes in live tensors (allocated_bytes.all.current)
	Reserved      int64 `json:"reserved"`       // bytes the allocator holds from the device (reserved_bytes.all.current)
	Peak          int64 `json:"peak"`           // the most ever allocated (allocated_bytes.all.peak: since the start, or the trainer's last reset)
	InactiveSplit int64 `json:"inactive_split"` // free bytes inside split blocks: fragmentation (inactive_split_bytes.all.current)
	AllocRetries  int64 `json:"alloc_retries"`  // allocations that freed the cache and tried again (num_alloc_retries)
	OOMs          int64 `json:"ooms"`           // out-of-memory errors (num_ooms)
	DeviceFree    int64 `json:"device_free"`    // free bytes on the device, every process's use counted (cudaMemGetInfo)
	DeviceTotal   int64 `json:"device_total"`   // the device's bytes
	// DeviceLimit is the most the allocator may hold, when the trainer capped it
	// (torch.cuda.set_per_process_memory_fraction: the total times the fraction);
	// 0 when no cap is set, or the hook's torch does not tell it
	DeviceLimit int64 `json:"device_limit,omitempty"`
}

// maxMemoryBytes bounds every figure of a memory report (1 PiB).
const maxMemoryBytes = 1 << 50

// check refuses figures no allocator reports.
func (m *Memory) check() error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"allocated", m.Allocated}, {"reserved", m.Reserved}, {"peak", m.Peak}, {"inactive_split", m.InactiveSplit},
		{"alloc_retries", m.AllocRetries}, {"ooms", m.OOMs}, {"device_free", m.DeviceFree}, {"device_total", m.DeviceTotal}} {
		if f.v < 0 || f.v > maxMemoryBytes {
			return fmt.Errorf("%s %d is out of range", f.name, f.v)
		}
	}
	if m.DeviceFree > m.DeviceTotal {
		return fmt.Errorf("device_free %d is more than device_total %d", m.DeviceFree, m.DeviceTotal)
	}
	if m.DeviceLimit < 0 || m.DeviceLimit > m.DeviceTotal {
		return fmt.Errorf("device_limit %d is not within device_total %d", m.DeviceLimit, m.DeviceTotal)
	}
	return nil
}

// BatchMark is one batch's wall-clock start and end, in microseconds.
type BatchMark struct {
	Batch   int64 `json:"batch"`
	StartUS int64 `json:"start_us"`
	EndUS   int64 `json:"end_us"`
}

// Error codes a hook sends with an error message, so the agent can tell a window the
// trainer was too late for from one it failed to record.
const (
	CodeStartPassed  = "start_passed"  // the trainer was past the window's start when it arrived
	CodeRecordFailed = "record_failed" // turning allocator history on failed
	CodeDumpFailed   = "dump_failed"   // taking or writing the snapshot failed (a full disk, say)
)

// ErrProtocol is wrapped by every refusal of a trainer message.
var ErrProtocol = errors.New("rankagent: bad trainer message")

// ParseMessage parses and validates one line from the trainer. Anything malformed
// is refused with ErrProtocol; the agent drops such a connection and runs on.
func ParseMessage(line []byte) (*Message, error) {
	return parseMessage(line, MaxLine, 1<<16)
}

// ParseMessageFile parses and validates the snapshot message the hook writes
// beside a snapshot in the spool (NAME.json): a snapshot message whose batch marks
// may be many more than a socket line holds.
func ParseMessageFile(b []byte) (*Message, error) {
	m, err := parseMessage(b, MaxMessageFile, MaxFileMarks)
	if err == nil && (m.Type != "snapshot" || m.BatchesFile) {
		return nil, fmt.Errorf("%w: a message file holds a whole snapshot message", ErrProtocol)
	}
	return m, err
}

func parseMessage(line []byte, maxBytes, maxMarks int) (*Message, error) {
	if len(line) > maxBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrProtocol, len(line), maxBytes)
	}
	var m Message
	dec := json.NewDecoder(strings.NewReader(string(line)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: more than one value on a line", ErrProtocol)
	}
	bad := func(format string, a ...any) (*Message, error) {
		return nil, fmt.Errorf("%w: %s: %s", ErrProtocol, m.Type, fmt.Sprintf(format, a...))
	}
	if err := m.checkType(maxMarks); err != nil {
		return bad("%v", err)
	}
	if len(m.Cause) > MaxCause {
		return bad("cause of %d bytes, more than %d", len(m.Cause), MaxCause)
	}
	if m.Memory != nil && m.Type != "memory" {
		return bad("figures only come in a memory message")
	}
	if m.Cause != "" && m.Type != "stopping" && (m.Type != "snapshot" || m.Reason != "crash") {
		return bad("a cause only comes with stopping or a crash snapshot")
	}
	return &m, nil
}

// checkType checks the fields m's type needs, so that parseMessage can refuse
// what is wrong; it cuts an error's message to 4096 bytes.
func (m *Message) checkType(maxMarks int) error {
	switch m.Type {
	case "hello":
		if m.V != ProtocolVersion {
			return fmt.Errorf("protocol version %d, this agent speaks %d", m.V, ProtocolVersion)
		}
		if m.PID <= 0 {
			return fmt.Errorf("pid %d", m.PID)
		}
		if (m.Rank != nil && *m.Rank < 0) || (m.LocalRank != nil && *m.LocalRank < 0) {
			return errors.New("negative rank")
		}
		if len(m.DeviceUUID) > 128 || len(m.Torch) > 128 || len(m.Hook) > 128 {
			return errors.New("a field is too long")
		}
	case "batch":
		if m.Batch == nil || *m.Batch < 0 {
			return errors.New("needs a batch >= 0")
		}
	case "memory":
		if m.Batch == nil || *m.Batch < 0 || *m.Batch > maxMemoryBytes || m.Memory == nil {
			return errors.New("needs a batch from 0 to 2^50 and the figures")
		}
		return m.Memory.check()
	case "stopping":
		if m.Cause == "" {
			return errors.New("no cause")
		}
		if m.TimeUS < 0 || (m.Batch != nil && *m.Batch < 0) {
			return errors.New("negative time or batch")
		}
	case "armed":
		if m.Window == 0 {
			return errors.New("no window id")
		}
	case "recording":
		if m.Window == 0 || m.Batch == nil || *m.Batch < 0 {
			return errors.New("needs a window id and a batch >= 0")
		}
	case "snapshot":
		return m.checkSnapshot(maxMarks)
	case "error":
		if len(m.Message) > 4096 {
			m.Message = m.Message[:4096]
		}
		switch m.Code {
		case "", CodeStartPassed, CodeRecordFailed, CodeDumpFailed:
		default:
			return fmt.Errorf("unknown code %q", m.Code)
		}
	default:
		return errors.New("unknown message type")
	}
	return nil
}

// checkSnapshot checks a snapshot message: its reason, its window and file, and
// at most maxMarks batch marks in order.
func (m *Message) checkSnapshot(maxMarks int) error {
	if m.Reason != "window" && m.Reason != "oom" && m.Reason != "postmortem" && m.Reason != "crash" {
		return fmt.Errorf("reason %q (window, oom, postmortem or crash)", m.Reason)
	}
	// a crash dump names the window it was recording, with its bounds, or
	// none (only record-always history)
	if m.Reason == "crash" && m.Window != 0 && m.Stop <= m.Start {
		return fmt.Errorf("window %d without its bounds", m.Window)
	}
	if m.Reason == "crash" && m.Window == 0 && (m.Start != 0 || m.Stop != 0) {
		return fmt.Errorf("bounds [%d, %d) without a window id", m.Start, m.Stop)
	}
	if m.Reason == "postmortem" && m.Window == 0 {
		return errors.New("a post-mortem without a window id")
	}
	if err := checkSpoolName(m.File); err != nil {
		return err
	}
	if m.Reason == "window" && m.Window == 0 {
		return errors.New("no window id")
	}
	if m.StallUS < 0 {
		return errors.New("negative stall")
	}
	if m.Start < 0 || m.Stop < 0 || (m.Stop != 0 && m.Stop <= m.Start) {
		return fmt.Errorf("window [%d, %d) is empty or negative", m.Start, m.Stop)
	}
	if len(m.Batches) > maxMarks {
		return fmt.Errorf("%d batch marks", len(m.Batches))
	}
	if m.BatchesFile && len(m.Batches) > 0 {
		return errors.New("batch marks both here and in the message file")
	}
	for i, b := range m.Batches {
		if b.Batch < 0 || b.EndUS < b.StartUS || (i > 0 && b.Batch <= m.Batches[i-1].Batch) {
			return fmt.Errorf("batch mark %d is not increasing or ends before it starts", i)
		}
	}
	return nil
}

// checkSpoolName accepts only a plain file name: no folders, no way out of the spool.
func checkSpoolName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("file %q", name)
	case len(name) > 200:
		return fmt.Errorf("file name of %d bytes", len(name))
	case strings.ContainsAny(name, "/\\\x00") || filepath.Base(name) != name:
		return fmt.Errorf("file %q is not a plain name", name)
	case strings.HasPrefix(name, "."):
		return fmt.Errorf("file %q is hidden", name)
	case !strings.HasSuffix(name, ".pickle"):
		return fmt.Errorf("file %q does not end in .pickle", name)
	}
	return nil
}

func encodeMessage(m *Message) []byte {
	b, _ := json.Marshal(m)
	return append(b, '\n')
}
