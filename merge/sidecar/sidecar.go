// Package sidecar is the rank sidecar: what a rank agent records beside each
// snapshot it stores (X.memsnap.json for X.pickle), and the merge reads back.
package sidecar

import (
	"encoding/json"
	"fmt"
	"strings"
)

// RankMeta is what a rank agent records beside a rank's snapshot (the sidecar
// X.memsnap.json for snapshot X.pickle): who the rank is, its GPU, the window it
// recorded, the wall-clock time of every batch boundary inside the window, its clock
// offset against the leader, and NVML memory samples.
type RankMeta struct {
	Version        int            `json:"version"`
	RunName        string         `json:"run_name,omitempty"`
	Rank           int            `json:"rank"`
	LocalRank      int            `json:"local_rank"`
	NodeRank       int            `json:"node_rank"`
	WorldSize      int            `json:"world_size"`
	LocalWorldSize int            `json:"local_world_size,omitempty"`
	Hostname       string         `json:"hostname,omitempty"`
	GPU            *GPUInfo       `json:"gpu,omitempty"`
	Window         *WindowInfo    `json:"window,omitempty"`
	Batches        []BatchMark    `json:"batches,omitempty"`
	ClockOffsetUS  *int64         `json:"clock_offset_us,omitempty"` // this host's clock minus the leader's
	ClockRTTUS     *int64         `json:"clock_rtt_us,omitempty"`    // the round trip the offset was measured over
	Samples        []MemorySample `json:"nvml_samples,omitempty"`
	// MaxEntries is the cap of torch's history (--max-entries): a device trace that
	// holds this many events lost its oldest ones
	MaxEntries int    `json:"max_entries,omitempty"`
	Reason     string `json:"reason,omitempty"`  // "window", "oom", "postmortem" or "crash"
	Cause      string `json:"cause,omitempty"`   // a crash: how the trainer was stopped
	Partial    string `json:"partial,omitempty"` // why the snapshot does not cover its whole window
	// StallUS is how long the training thread waited at the window's end for the
	// snapshot and for history to be turned off (microseconds; 0 when unknown).
	StallUS int64 `json:"stall_us,omitempty"`
}

// GPUInfo describes the rank's GPU as NVML reports it.
type GPUInfo struct {
	UUID       string `json:"uuid"`
	Name       string `json:"name,omitempty"`
	TotalBytes int64  `json:"total_bytes,omitempty"`
	PCIBusID   string `json:"pci_bus_id,omitempty"`
}

// WindowInfo is the batch window [Start, Stop) a snapshot records.
type WindowInfo struct {
	ID    uint64 `json:"id"`
	Start int64  `json:"start"`
	Stop  int64  `json:"stop"`
}

// BatchMark is one batch's start and end on the rank's own clock (the clock of
// torch's time_us, microseconds since the epoch).
type BatchMark struct {
	Batch   int64 `json:"batch"`
	StartUS int64 `json:"start_us"`
	EndUS   int64 `json:"end_us"`
}

// MemorySample is one NVML reading: the device's used memory and this process's.
type MemorySample struct {
	TimeUS           int64 `json:"t_us"`
	DeviceUsedBytes  int64 `json:"device_used_bytes"`
	ProcessUsedBytes int64 `json:"process_used_bytes,omitempty"`
}

// MaxRanks is the largest world size a merge accepts: a rank number, a world size
// in a sidecar or a timeline, or a flag above it is refused, so a hostile name such
// as rank50000000.5.memory_snapshot.pickle cannot make a merge write gigabytes of
// empty ranks.
const MaxRanks = 1 << 16

// MaxMetaBytes bounds a sidecar read from a store. An agent writes at most
// MaxFileMarks (1 << 20) batch marks and 1 << 20 NVML samples into one, indented:
// about 240 MiB at the most; a larger object is no agent's sidecar.
const MaxMetaBytes = 256 << 20

// MetaName returns the sidecar name for a snapshot name: X.pickle (also .gz, .zst)
// becomes X.memsnap.json.
func MetaName(snapshotName string) string {
	n := strings.TrimSuffix(strings.TrimSuffix(snapshotName, ".gz"), ".zst")
	n = strings.TrimSuffix(n, ".pickle")
	return n + ".memsnap.json"
}

// ParseRankMeta parses a sidecar, refusing malformed ones: a rank outside
// [0, MaxRanks) or outside its world size (when that is known), batch marks that
// end before they start, a negative stall. Batches and samples come back nil when
// empty, as a re-marshalled sidecar (which omits them) reads.
func ParseRankMeta(b []byte) (*RankMeta, error) {
	var m RankMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("merge: rank metadata: %w", err)
	}
	if m.Rank < 0 || m.Rank >= MaxRanks || m.WorldSize < 0 || m.WorldSize > MaxRanks || (m.WorldSize > 0 && m.Rank >= m.WorldSize) {
		return nil, fmt.Errorf("merge: rank metadata: rank %d of world size %d", m.Rank, m.WorldSize)
	}
	for _, b := range m.Batches {
		if b.EndUS < b.StartUS {
			return nil, fmt.Errorf("merge: rank metadata: batch %d ends before it starts", b.Batch)
		}
	}
	if m.StallUS < 0 {
		return nil, fmt.Errorf("merge: rank metadata: a stall of %d us", m.StallUS)
	}
	if m.MaxEntries < 0 {
		return nil, fmt.Errorf("merge: rank metadata: max entries %d", m.MaxEntries)
	}
	if len(m.Batches) == 0 {
		m.Batches = nil
	}
	if len(m.Samples) == 0 {
		m.Samples = nil
	}
	return &m, nil
}

// BatchAt returns the batch whose marks contain t (the rank's own clock), or false.
func (m *RankMeta) BatchAt(t int64) (int64, bool) {
	if m == nil {
		return 0, false
	}
	for _, b := range m.Batches {
		if t >= b.StartUS && t <= b.EndUS {
			return b.Batch, true
		}
	}
	return 0, false
}
