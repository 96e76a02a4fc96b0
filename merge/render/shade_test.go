package render

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/merge/analysis"
)

// near says whether a style's colour is within 12 of hex's in every channel.
func near(t *testing.T, style, prop, hex string) bool {
	t.Helper()
	m := regexp.MustCompile(`(?:^|;)` + prop + `:#([0-9a-f]{6})`).FindStringSubmatch(style)
	if m == nil {
		t.Fatalf("style %q has no %s", style, prop)
	}
	for i := 0; i < 6; i += 2 {
		a, _ := strconv.ParseInt(m[1][i:i+2], 16, 0)
		b, _ := strconv.ParseInt(hex[i:i+2], 16, 0)
		if a-b > 12 || b-a > 12 {
			return false
		}
	}
	return true
}

// TestDiffColourScalesWithSize: in the report's diff tables a difference is
// coloured by its size against the largest shown: the demo's 445.5 KiB beside
// its 96.8 MiB was drawn in the same red; now the large one is full red (bold,
// on a tinted cell) and the small one nearly the text's grey, and less is green.
func TestDiffColourScalesWithSize(t *testing.T) {
	const KiB = 1 << 10
	big, small := int64(99123*KiB), int64(891*KiB/2) // 96.8 MiB, 445.5 KiB
	d := &analysis.RankDiff{Base: analysis.DiffSide{Label: "rank 1", Rank: 1}, Other: analysis.DiffSide{Label: "rank 3", Rank: 3}, PeakDeltaBytes: big,
		Categories: []analysis.CategoryDiff{{Category: analysis.CatOther, OtherBytes: big, DeltaBytes: big}, {Category: analysis.CatUnknown, OtherBytes: small, DeltaBytes: small}},
		Sites:      []analysis.SiteDiff{{Site: "a (x.py:1)", OtherBytes: big, DeltaBytes: big}, {Site: "b (x.py:2)", BaseBytes: small, DeltaBytes: -small}}}
	var b bytes.Buffer
	if err := WriteHTML(&b, "t", &analysis.Summary{Diff: d}, nil); err != nil {
		t.Fatal(err)
	}
	styles := map[string]string{}
	for _, c := range regexp.MustCompile(`<td class="(up|down)" style="([^"]*)">([^<]*)</td>`).FindAllStringSubmatch(b.String(), -1) {
		styles[c[1]+" "+c[3]] = c[2]
	}
	strong, weak, less := styles["up &#43;96.8 MiB"], styles["up &#43;445.5 KiB"], styles["down -445.5 KiB"]
	if strong == "" || weak == "" || less == "" {
		t.Fatalf("difference cells %q; want +96.8 MiB, +445.5 KiB and -445.5 KiB coloured", styles)
	}
	if !near(t, strong, "color", "cf222e") || !strings.Contains(strong, "font-weight:600") || near(t, strong, "background-color", "ffffff") {
		t.Errorf("96.8 MiB, the largest: %s; want full red, bold, a tinted cell", strong)
	}
	for _, s := range []string{weak, less} {
		if !near(t, s, "color", "57606a") || strings.Contains(s, "font-weight") || !near(t, s, "background-color", "ffffff") {
			t.Errorf("445.5 KiB beside 96.8 MiB: %s; want nearly the text's grey, not bold, no tint", s)
		}
	}
	if s := string(deltaStyle(-big, big)); !near(t, s, "color", "1a7f37") {
		t.Errorf("the largest decrease: %s, want full green", s)
	}
	if s := string(deltaStyle(big/4, big)); near(t, s, "color", "57606a") || near(t, s, "color", "cf222e") {
		t.Errorf("a quarter of the largest: %s, want between grey and red", s)
	}
	if deltaStyle(0, big) != "" || deltaStyle(5, 0) != "" {
		t.Error("no difference, or no scale, is coloured")
	}
}
