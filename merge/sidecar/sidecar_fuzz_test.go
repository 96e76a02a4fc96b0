package sidecar

import (
	"encoding/json"
	"reflect"
	"strconv"
	"testing"
)

// seedSidecar is a sidecar as a rank agent writes it: rank r of world, window 3
// over batches [5, 8).
func seedSidecar(r, world int) RankMeta {
	off, rtt := int64(-1200+100*r), int64(300)
	m := RankMeta{Version: 1, RunName: "gpt", Rank: r, LocalRank: r % 8, NodeRank: r / 8, WorldSize: world, LocalWorldSize: 8, Hostname: "node001",
		GPU:    &GPUInfo{UUID: "GPU-5c1b3f3e-0000-4000-8000-00000000000" + strconv.Itoa(r%10), Name: "NVIDIA H200", TotalBytes: 150 << 30, PCIBusID: "00000000:19:00.0"},
		Window: &WindowInfo{ID: 3, Start: 5, Stop: 8}, ClockOffsetUS: &off, ClockRTTUS: &rtt, Reason: "window", StallUS: 2500}
	for b := int64(5); b < 8; b++ {
		t := 1700000000000000 + b*150000
		m.Batches = append(m.Batches, BatchMark{Batch: b, StartUS: t, EndUS: t + 140000})
		m.Samples = append(m.Samples, MemorySample{TimeUS: t + 10, DeviceUsedBytes: 40 << 30, ProcessUsedBytes: 38 << 30})
	}
	return m
}

// brokenSidecars are sidecars ParseRankMeta refuses.
var brokenSidecars = []string{
	`{"version":1,"rank":4,"world_size":4}`,
	`{"version":1,"rank":-1,"world_size":4}`,
	`{"version":1,"rank":0,"world_size":-1}`,
	`{"version":1,"rank":65536}`,
	`{"version":1,"rank":0,"world_size":2147483647}`,
	`{"version":1,"rank":0,"batches":[{"batch":5,"start_us":10,"end_us":9}]}`,
	`{"version":1,"rank":0,"stall_us":-1}`,
	`{"version":1,"rank":"0"}`,
	`{"version":1,"rank":1.5}`,
	`{"version":1,"rank":0,"batches":{}}`,
	`{"version":1`,
}

// FuzzParseRankMeta: ParseRankMeta never panics, refuses ranks outside the world
// and batch marks that end before they start, and what it accepts reads the same
// once re-marshalled.
func FuzzParseRankMeta(f *testing.F) {
	for _, m := range []RankMeta{seedSidecar(0, 4), seedSidecar(3, 4), seedSidecar(65535, 65536), {Version: 1, Rank: 2}} {
		b, err := json.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// a partial snapshot's sidecar, and a post-mortem's
	f.Add([]byte(`{"version":1,"run_name":"gpt","rank":1,"local_rank":1,"node_rank":0,"world_size":2,"window":{"id":4,"start":10,"stop":13},` +
		`"batches":[{"batch":10,"start_us":100,"end_us":100}],"partial":"the trainer stopped at batch 11","nvml_samples":[]}`))
	f.Add([]byte(`{"version":1,"rank":0,"world_size":2,"window":{"id":9,"start":0,"stop":0},"reason":"oom","batches":[]}`))
	for _, s := range brokenSidecars {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseRankMeta(b)
		if err != nil {
			if m != nil {
				t.Fatalf("refused with %v but returned metadata", err)
			}
			return
		}
		if m.Rank < 0 || m.Rank >= MaxRanks || m.WorldSize < 0 || m.WorldSize > MaxRanks || (m.WorldSize > 0 && m.Rank >= m.WorldSize) {
			t.Fatalf("accepted rank %d of world size %d", m.Rank, m.WorldSize)
		}
		for _, bm := range m.Batches {
			if bm.EndUS < bm.StartUS {
				t.Fatalf("accepted batch %d ending at %d before its start %d", bm.Batch, bm.EndUS, bm.StartUS)
			}
		}
		if m.StallUS < 0 {
			t.Fatalf("accepted a stall of %d us", m.StallUS)
		}
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("accepted metadata does not marshal: %v", err)
		}
		m2, err := ParseRankMeta(again)
		if err != nil {
			t.Fatalf("accepted metadata, re-marshalled, is refused: %v\n%s", err, again)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("a round trip changed the metadata:\n%#v\n%#v", m, m2)
		}
	})
}

// TestParseSeeds: the broken seeds are refused.
func TestParseSeeds(t *testing.T) {
	for _, s := range brokenSidecars {
		if _, err := ParseRankMeta([]byte(s)); err == nil {
			t.Errorf("accepted %s", s)
		}
	}
}
