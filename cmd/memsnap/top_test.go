package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
)

// TestTopTable: at 1,024 ranks the table shows the ranks with the least
// headroom first, as many as asked, says how many more there are and how the
// ranks spread in one line; --json holds every rank.
func TestTopTable(t *testing.T) {
	v := &pb.ClusterView{WorldSize: 1030, LeaderRank: 0}
	for r := 0; r < 1024; r++ {
		head := int64(10<<30) + int64((r*7919)%1024)<<20 // every rank a different headroom
		v.Ranks = append(v.Ranks, &pb.RankFigures{Rank: int32(r), Node: fmt.Sprintf("node%03d", r/8), AgeMs: 1500,
			Figures: &pb.Figures{Batch: 100, Allocated: 20 << 30, Reserved: 22 << 30, Peak: 21 << 30, DeviceTotal: 80 << 30, DeviceUsed: 70 << 30, Headroom: head}})
	}
	v.Ranks[517].Figures.Headroom, v.Ranks[517].Figures.Growth = 1<<30, 48<<20
	v.Ranks[3].AgeMs = 60000
	var b strings.Builder
	renderView(&b, "job42", v, 10, time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC))
	out := b.String()
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[0], "memsnap top — run job42 — 1024 of 1030 ranks reporting — leader rank 0 — 12:00:00 UTC") {
		t.Fatalf("header: %q", lines[0])
	}
	if !strings.Contains(lines[1], "headroom: least 1.0 GiB (rank 517)") || !strings.Contains(lines[1], "fastest growth: rank 517, +48.0 MiB") {
		t.Fatalf("spread: %q", lines[1])
	}
	if f := strings.Fields(lines[4]); f[0] != "517" || f[1] != "node064" {
		t.Fatalf("the first row is not the least headroom: %q\n%s", lines[4], out)
	}
	rows := 0
	for _, l := range lines[4:] {
		if f := strings.Fields(l); len(f) > 0 && f[0] != "…" && !strings.Contains(l, "ranks have not") {
			rows++
		}
	}
	if rows != 10 || !strings.Contains(out, "… and 1014 more ranks") || !strings.Contains(out, "6 ranks have not reported") {
		t.Fatalf("%d rows:\n%s", rows, out)
	}
	// --json: every rank, the least headroom first
	j, _ := json.Marshal(viewJSON("job42", v, time.Now()))
	var got struct {
		Ranks []struct {
			Rank     int   `json:"rank"`
			Headroom int64 `json:"headroom_bytes"`
		} `json:"ranks"`
	}
	if err := json.Unmarshal(j, &got); err != nil || len(got.Ranks) != 1024 || got.Ranks[0].Rank != 517 || got.Ranks[1].Headroom < got.Ranks[0].Headroom {
		t.Fatalf("%v %d ranks", err, len(got.Ranks))
	}
	// no figures yet: said, not an empty table
	b.Reset()
	renderView(&b, "job42", &pb.ClusterView{WorldSize: 4, LeaderRank: 0}, 10, time.Now())
	if !strings.Contains(b.String(), "no rank has reported its memory yet") {
		t.Fatal(b.String())
	}
}
