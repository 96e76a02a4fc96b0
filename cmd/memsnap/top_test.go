package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/memsnap/memsnap/coordinator"
	"github.com/memsnap/memsnap/internal/pb"
)

// renderTop is one frame of top as a table of rows ranks, 80 columns wide, with
// no earlier view and no members known.
func renderTop(run string, v *pb.ClusterView, rows int, now time.Time) string {
	var b strings.Builder
	renderView(&b, topFrame{run: run, view: v, rows: rows, width: topWidth, now: now})
	return b.String()
}

// fits fails the test for every line of out wider than width columns.
func fits(t *testing.T, out string, width int) {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(l); n > width {
			t.Errorf("a line of %d columns: %q\n%s", n, l, out)
		}
	}
}

// TestTopTable: at 1,024 ranks the table shows the ranks with the least
// headroom first, as many as asked, says how many more there are and how the
// ranks spread; --json holds every rank; every line fits 80 columns.
func TestTopTable(t *testing.T) {
	v := &pb.ClusterView{WorldSize: 1030, LeaderRank: 0}
	for r := 0; r < 1024; r++ {
		head := int64(10<<30) + int64((r*7919)%1024)<<20 // every rank a different headroom
		v.Ranks = append(v.Ranks, &pb.RankFigures{Rank: int32(r), Node: fmt.Sprintf("node%03d", r/8), AgeMs: 1500,
			Figures: &pb.Figures{Batch: 100, Allocated: 20 << 30, Reserved: 22 << 30, Peak: 21 << 30, DeviceTotal: 80 << 30, DeviceUsed: 70 << 30, Headroom: head}})
	}
	v.Ranks[517].Figures.Headroom, v.Ranks[517].Figures.Growth = 1<<30, 48<<20
	v.Ranks[3].AgeMs = 60000
	out := renderTop("job42", v, 10, time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC))
	lines := strings.Split(out, "\n")
	if lines[0] != "run job42 · 1023 of 1030 ranks reporting · leader rank 0 · 12:00:00 UTC" {
		t.Fatalf("header: %q", lines[0])
	}
	if !strings.Contains(lines[1], "headroom: least 1.0 GiB (rank 517)") || !strings.Contains(lines[2], "fastest growth: rank 517, +48.0 MiB a batch") {
		t.Fatalf("spread: %q", lines[1:3])
	}
	if f := strings.Fields(lines[5]); f[0] != "517" || f[1] != "node064" || f[6] != "1.0G" || f[7] != "1.2%" || f[8] != "+48.0M" {
		t.Fatalf("the first row is not the least headroom: %q\n%s", lines[5], out)
	}
	rows := 0
	for _, l := range lines[5:] {
		if f := strings.Fields(l); len(f) > 0 && f[0] != "…" && !strings.Contains(l, ": rank") {
			rows++
		}
	}
	if rows != 10 || !strings.Contains(out, "… and 1014 more ranks") || !strings.Contains(out, "late (no figures for 7.5s): rank 3 (1m0s, batch 100)") ||
		!strings.Contains(out, "not reported yet (no trainer connected, or no batch ended): ranks 1024-1029") {
		t.Fatalf("%d rows:\n%s", rows, out)
	}
	fits(t, out, 80)
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
	if out := renderTop("job42", &pb.ClusterView{WorldSize: 4, LeaderRank: 0}, 10, time.Now()); !strings.Contains(out, "no rank has reported its memory yet") {
		t.Fatal(out)
	}
}

// TestTopFits80Columns: the widest figures, a long host name, a long run name
// and every kind of silent rank still give lines of at most 80 columns, and
// the table keeps every column.
func TestTopFits80Columns(t *testing.T) {
	v := &pb.ClusterView{WorldSize: 64, LeaderRank: 12}
	for r := 0; r < 40; r++ {
		f := &pb.Figures{Batch: 123456789, Allocated: 1023<<40 + 1<<39, Reserved: 999 << 30, Peak: 1000 << 30, InactiveSplit: 1023 << 20,
			DeviceTotal: 1 << 40, Headroom: 1<<40 - 1, Growth: -float64(999 << 20), Ooms: int64(r % 2)}
		v.Ranks = append(v.Ranks, &pb.RankFigures{Rank: int32(r), Node: "gpu-node-" + strings.Repeat("x", 60), AgeMs: int64(r) * 1000, Figures: f})
	}
	v.Reporting = int32(len(v.Ranks))
	out := renderTop(strings.Repeat("a-very-long-run-name", 5), v, 40, time.Now())
	fits(t, out, 80)
	for _, h := range []string{"RANK", "NODE", "BATCH", "ALLOC", "RESERVED", "PEAK", "HEADROOM", "GROWTH", "FRAG", "AGE"} {
		if !strings.Contains(out, h) {
			t.Errorf("no %s column:\n%s", h, out)
		}
	}
	if !strings.Contains(out, "123456789") || !strings.Contains(out, "gpu-node-x") {
		t.Fatalf("a column lost its figures:\n%s", out)
	}
}

// TestTopSaysWhatBecameOfARank: a rank that ran out of memory is not counted
// as reporting once its figures are late, and is told as out of memory at its
// last batch, in the view and after it left it; a rank whose agent left, one
// whose trainer went, and one that never reported are each told as such.
func TestTopSaysWhatBecameOfARank(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	fig := func(rank int32, batch, ooms, ageMs int64) *pb.RankFigures {
		return &pb.RankFigures{Rank: rank, Node: "n", AgeMs: ageMs, Figures: &pb.Figures{Batch: batch, Allocated: 1 << 30, DeviceTotal: 80 << 30, Headroom: 10 << 30, Ooms: ooms}}
	}
	members := func(ranks ...int32) []*pb.NodeMeta {
		ms := []*pb.NodeMeta{{Rank: -1}} // top itself
		for _, r := range ranks {
			ms = append(ms, &pb.NodeMeta{Rank: r, Hostname: "n"})
		}
		return ms
	}
	w := newTopWatch("job42", 2*time.Second)
	step := func(v *pb.ClusterView, ms []*pb.NodeMeta, at time.Time) string {
		var b strings.Builder
		if w.step(&b, v, nil, ms, 10, 80, at) {
			t.Fatalf("ended:\n%s", b.String())
		}
		fits(t, b.String(), 80)
		return b.String()
	}
	step(&pb.ClusterView{WorldSize: 5, Reporting: 4, Ranks: []*pb.RankFigures{fig(0, 118, 0, 1000), fig(1, 118, 0, 1000), fig(2, 118, 0, 1000), fig(3, 118, 0, 1000)}},
		members(0, 1, 2, 3, 4), now)
	// 9 s after rank 3's OOM: its last figures (which count it) are late
	out := step(&pb.ClusterView{WorldSize: 5, Reporting: 4, Ranks: []*pb.RankFigures{fig(0, 120, 0, 1000), fig(1, 120, 0, 1000), fig(2, 120, 0, 1000), fig(3, 120, 1, 9000)}},
		members(0, 1, 2, 3, 4), now.Add(9*time.Second))
	if !strings.Contains(out, " 3 of 5 ranks reporting") || !strings.Contains(out, "out of memory: rank 3 by batch 120") ||
		!strings.Contains(out, "not reported yet (no trainer connected, or no batch ended): rank 4") {
		t.Fatalf("9 s after the OOM:\n%s", out)
	}
	// then its figures leave the view, rank 2's agent leaves, rank 1's trainer goes
	out = step(&pb.ClusterView{WorldSize: 5, Reporting: 1, Ranks: []*pb.RankFigures{fig(0, 125, 0, 1000)}}, members(0, 1, 4), now.Add(30*time.Second))
	for _, want := range []string{" 1 of 5 ranks reporting", "out of memory: rank 3 by batch 120", "left the cluster: rank 2 after batch 120",
		"stopped reporting (no trainer connected?): rank 1 after batch 120", "not reported yet (no trainer connected, or no batch ended): rank 4"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "rank 3 (") || strings.Contains(out, "not reported yet (no trainer connected, or no batch ended): rank 3") {
		t.Errorf("rank 3 told as not reported:\n%s", out)
	}
}

// TestTopEndsWhenNoRankIsLeft: once the job ended (no leader, no rank a
// member) top says so and ends after topEndAfter, over at least topEndTries
// tries, not asking forever; a rank back in time keeps it going.
func TestTopEndsWhenNoRankIsLeft(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	w := newTopWatch("job42", 2*time.Second)
	var b strings.Builder
	w.step(&b, &pb.ClusterView{WorldSize: 2, Reporting: 1, LeaderRank: 0, Ranks: []*pb.RankFigures{{Rank: 1, AgeMs: 500,
		Figures: &pb.Figures{Batch: 7, Ooms: 1}}}}, nil, []*pb.NodeMeta{{Rank: 0}, {Rank: 1}}, 10, 80, now)
	gone := []*pb.NodeMeta{{Rank: -1}}
	tries := 0
	for at := now.Add(2 * time.Second); ; at = at.Add(2 * time.Second) {
		b.Reset()
		tries++
		if tries > 20 {
			t.Fatal("top never ended")
		}
		if at == now.Add(6*time.Second) && w.step(&b, nil, coordinator.ErrNoLeader, []*pb.NodeMeta{{Rank: 0}}, 10, 80, at) {
			t.Fatal("ended with a rank a member")
		} else if at == now.Add(6*time.Second) {
			continue
		}
		if w.step(&b, nil, coordinator.ErrNoLeader, gone, 10, 80, at) {
			break
		}
		if !strings.Contains(b.String(), "coordinator: no leader (asking again in 2s)") || !strings.Contains(b.String(), "no rank is a member") {
			t.Fatalf("try %d:\n%s", tries, b.String())
		}
	}
	want := "out of memory: rank 1 by batch 7\nrun job42 ended: no rank has been a member for 10s"
	if got := strings.TrimSpace(b.String()); got != want || tries != 9 {
		t.Fatalf("after %d tries: %q, want %q", tries, got, want)
	}
}

// TestTopEscapesNames: a member's host name or a run name made of a
// terminal's control sequences is printed escaped, never as they are.
func TestTopEscapesNames(t *testing.T) {
	evil := "\x1b[2J\x1b]0;owned\x07\u202e"
	v := &pb.ClusterView{WorldSize: 1, Reporting: 1, Ranks: []*pb.RankFigures{{Rank: 0, Node: evil, AgeMs: 100,
		Figures: &pb.Figures{Batch: 1, DeviceTotal: 1 << 30, Headroom: 1 << 29}}}}
	out := renderTop("run"+evil, v, 10, time.Now())
	if strings.ContainsAny(out, "\x1b\x07\u202e") || !strings.Contains(out, `run\x1b[2J`) || !strings.Contains(out, `\x1b[2J\x1b]0;`) {
		t.Fatalf("%q", out)
	}
	var b strings.Builder
	w := newTopWatch("job"+evil, time.Second)
	w.step(&b, nil, fmt.Errorf("asking the leader (%s): timeout", evil), []*pb.NodeMeta{{Rank: 0, Hostname: evil}}, 10, 80, time.Now())
	if strings.ContainsAny(b.String(), "\x1b\x07\u202e") {
		t.Fatalf("%q", b.String())
	}
}

// TestTopSaysIncidents: a rank whose OOM or crash the leader's view carries is
// told as "out of memory at batch N" or "crashed: CAUSE" (escaped), ranks told
// alike on one line, not among the other fates; top remembers them once a view
// no longer carries them (a new leader), says them at its end, and --json
// holds them.
func TestTopSaysIncidents(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	fig := func(rank int32, batch, ooms, ageMs int64) *pb.RankFigures {
		return &pb.RankFigures{Rank: rank, Node: "n", AgeMs: ageMs, Figures: &pb.Figures{Batch: batch, Allocated: 1 << 30, DeviceTotal: 80 << 30, Headroom: 10 << 30, Ooms: ooms}}
	}
	crash := func(rank int32, cause string, batch int64) *pb.RankIncident {
		return &pb.RankIncident{Rank: rank, Kind: pb.WindowKind_WINDOW_KIND_CRASH, Cause: cause, Batch: batch, AtUs: now.UnixMicro(), AgeMs: 2000}
	}
	v := &pb.ClusterView{WorldSize: 7, Reporting: 3, LeaderRank: 0, Ranks: []*pb.RankFigures{fig(0, 121, 0, 1000), fig(1, 121, 0, 1000), fig(2, 120, 1, 9000)},
		Incidents: []*pb.RankIncident{{Rank: 2, Kind: pb.WindowKind_WINDOW_KIND_OOM, Cause: "out of memory", Batch: 120, AtUs: now.UnixMicro(), AgeMs: 8000},
			crash(3, "\x1b[2Jkilled", -1), crash(4, "SIGTERM", 88), crash(5, "SIGTERM", 88)}}
	ms := []*pb.NodeMeta{{Rank: 0}, {Rank: 1}, {Rank: 2}, {Rank: 6}}
	w := newTopWatch("job42", 2*time.Second)
	var b strings.Builder
	if w.step(&b, v, nil, ms, 10, 80, now) {
		t.Fatal("ended")
	}
	out := b.String()
	fits(t, out, 80)
	for _, want := range []string{"\nrank 2: out of memory at batch 120\n", "\nrank 3: crashed: \\x1b[2Jkilled\n", "\nranks 4-5: crashed: SIGTERM (batch 88)\n",
		"not reported yet (no trainer connected, or no batch ended): rank 6"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") || strings.Contains(out, "by batch 120") || strings.Contains(out, "not a member") {
		t.Errorf("an incident told raw, or twice:\n%s", out)
	}
	// a new leader heard of none of them: top still tells them, and at its end
	b.Reset()
	w.step(&b, &pb.ClusterView{WorldSize: 7, Reporting: 2, LeaderRank: 1, Ranks: []*pb.RankFigures{fig(0, 125, 0, 1000), fig(1, 125, 0, 1000)}}, nil, ms, 10, 80, now.Add(5*time.Second))
	if !strings.Contains(b.String(), "rank 2: out of memory at batch 120") || !strings.Contains(b.String(), "ranks 4-5: crashed: SIGTERM") {
		t.Fatalf("after a new leader:\n%s", b.String())
	}
	w.noRanksSince = now
	if end := strings.Join(w.endLines(now.Add(time.Minute), 80), "\n"); !strings.HasPrefix(end, "rank 2: out of memory at batch 120\n") || strings.Contains(end, "by batch") {
		t.Fatalf("the end: %q", end)
	}
	raw, err := json.Marshal(viewJSON("job42", v, now))
	if err != nil {
		t.Fatal(err)
	}
	if s := string(raw); !strings.Contains(s, `{"rank":2,"kind":"oom","cause":"out of memory","batch":120,"at":"2026-12-05T12:00:00Z","age_seconds":8}`) ||
		!strings.Contains(s, `"rank":3,"kind":"crash","cause":"\u001b[2Jkilled","batch":-1`) {
		t.Fatalf("--json: %s", s)
	}
}

// TestTopIncidentLinesAreBounded: a teardown that crashed every rank with its
// own cause is told in at most maxIncidentLines lines and one that counts the
// rest.
func TestTopIncidentLinesAreBounded(t *testing.T) {
	incs := map[int32]*pb.RankIncident{}
	for r := int32(0); r < 100; r++ {
		incs[r] = &pb.RankIncident{Rank: r, Kind: pb.WindowKind_WINDOW_KIND_CRASH, Cause: fmt.Sprintf("signal %d", r), Batch: -1}
	}
	lines := incidentLines(incs, 80)
	if len(lines) != maxIncidentLines+1 || lines[0] != "rank 0: crashed: signal 0" || lines[maxIncidentLines] != "… and 94 more ranks out of memory or crashed (--json for every one)" {
		t.Fatalf("%q", lines)
	}
}
