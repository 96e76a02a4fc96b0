package merge

import (
	"fmt"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/render"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/naming"
)

func chromium(t *testing.T) string {
	t.Helper()
	for _, c := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is required under CI (.ci/run installs it)")
	}
	t.Skip("no chromium")
	return ""
}

// browse loads a file:// page in headless Chromium with the network closed, and
// returns the DOM after its scripts ran and a screenshot.
func browse(t *testing.T, page string) (string, image.Image) {
	t.Helper()
	bin := chromium(t)
	dir := t.TempDir()
	shot := filepath.Join(dir, "shot.png")
	flags := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--host-resolver-rules=MAP * ~NOTFOUND", "--user-data-dir=" + filepath.Join(dir, "profile"),
		"--window-size=1280,1500", "--virtual-time-budget=3000"}
	dom, err := exec.Command(bin, append(flags, "--dump-dom", "file://"+page)...).Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	if out, err := exec.Command(bin, append(flags, "--screenshot="+shot, "file://"+page)...).CombinedOutput(); err != nil {
		t.Fatalf("chromium --screenshot: %v: %s", err, out)
	}
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("MEMSNAP_KEEP_SCREENSHOT") != "" {
		b, _ := os.ReadFile(shot)
		os.WriteFile(os.Getenv("MEMSNAP_KEEP_SCREENSHOT"), b, 0o644)
	}
	return string(dom), img
}

// countColor counts pixels within tol of the colour #rrggbb.
func countColor(img image.Image, hex string, tol int) int {
	var r0, g0, b0 int
	fmt.Sscanf(hex, "#%02x%02x%02x", &r0, &g0, &b0)
	n := 0
	bd := img.Bounds()
	for y := bd.Min.Y; y < bd.Max.Y; y++ {
		for x := bd.Min.X; x < bd.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			if abs(int(r>>8)-r0) <= tol && abs(int(g>>8)-g0) <= tol && abs(int(b>>8)-b0) <= tol {
				n++
			}
		}
	}
	return n
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

var curveRe = regexp.MustCompile(`<path d="M[^"]{20,}" stroke="(#[0-9a-f]{6})" class="curve" data-rank="(\d+)"`)

func TestHTMLReportInChromium(t *testing.T) {
	_, dir := runMerge(t, Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)}), Title: "ddp4"})
	dom, img := browse(t, filepath.Join(dir, "merged.html"))
	curves := curveRe.FindAllStringSubmatch(dom, -1)
	if len(curves) != 4 {
		t.Fatalf("the page drew %d curves, want 4", len(curves))
	}
	for i, c := range curves {
		if c[2] != fmt.Sprint(i) {
			t.Fatalf("curve %d is rank %s", i, c[2])
		}
	}
	if n := strings.Count(dom, "<tr"); n < 5 || !strings.Contains(dom, `<tr class="outlier"><td>3</td>`) {
		t.Fatalf("the peak table is missing or does not mark rank 3 (%d rows)", n)
	}
	// the screenshot shows the outlier's curve and at least one other, and the table's text
	if n := countColor(img, curves[3][1], 10); n < 300 {
		t.Fatalf("rank 3's curve colour covers %d pixels", n)
	}
	others := 0
	for _, c := range curves[:3] {
		if countColor(img, c[1], 10) > 100 {
			others++
		}
	}
	if others == 0 {
		t.Fatal("no other rank's curve is visible")
	}
	if dark := countColor(img, "#1b1f24", 40); dark < 2000 {
		t.Fatalf("little text was rendered (%d dark pixels)", dark)
	}
}

// TestHTMLReport64Ranks: with many ranks the chart is a min/median/max band plus
// the ranks farthest from the median, not a wall of lines.
func TestHTMLReport64Ranks(t *testing.T) {
	src := ddp4(t)
	in := t.TempDir()
	for r := 0; r < 64; r++ {
		b, err := os.ReadFile(filepath.Join(src, fmt.Sprintf("rank%d.5.memory_snapshot.pickle", r%4)))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(in, fmt.Sprintf("rank%d.5.memory_snapshot.pickle", r)), b, 0o644)
	}
	res, dir := runMerge(t, Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{in}), Align: AlignStart})
	if len(res.Summary.Ranks) != 64 || res.Summary.Spread.OutlierRank%4 != 3 {
		t.Fatalf("64 ranks: %d merged, outlier %d", len(res.Summary.Ranks), res.Summary.Spread.OutlierRank)
	}
	dom, img := browse(t, filepath.Join(dir, "merged.html"))
	if !strings.Contains(dom, `class="band"`) || !strings.Contains(dom, `class="median"`) {
		t.Fatal("no band or median drawn for 64 ranks")
	}
	if n := len(curveRe.FindAllString(dom, -1)); n == 0 || n > 4 {
		t.Fatalf("%d individual curves for 64 ranks, want 1 to 4", n)
	}
	if n := countColor(img, "#0969da", 10); n < 300 { // the median line
		t.Fatalf("the median line covers %d pixels", n)
	}
}

// writeCounter counts the writes made to it.
type writeCounter struct{ writes, bytes int }

func (w *writeCounter) Write(p []byte) (int, error) {
	w.writes++
	w.bytes += len(p)
	return len(p), nil
}

// TestReportWritesInLargePieces: the report reaches its file in pieces of
// render.HTMLBuffer, not in the template's own pieces of a few bytes (a 1,024-rank
// report was some 30,000 writes, and a leader on a busy machine gave its core up
// at each).
func TestReportWritesInLargePieces(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(ddp4(t), "rank0.5.memory_snapshot.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	a, err := analysis.AnalyzeSnapshot(t.Context(), s, nil, analysis.AnalyzeOptions{Rank: 0})
	if err != nil {
		t.Fatal(err)
	}
	var entries []*render.Rank
	sum := &analysis.Summary{}
	for r := 0; r < 256; r++ {
		ar := *a
		ar.Rank = r
		e := &render.Rank{Summary: rankSummary(&loadedRank{rank: r, source: fmt.Sprintf("rank%d", r), a: &ar}), Analysis: &ar}
		entries = append(entries, e)
		sum.Ranks = append(sum.Ranks, e.Summary)
	}
	sum.Spread = analysis.ComputeSpread(sum.Ranks)
	var w writeCounter
	if err := render.WriteHTML(&w, "pieces", sum, entries); err != nil {
		t.Fatal(err)
	}
	if w.bytes < 2*render.HTMLBuffer {
		t.Fatalf("a 256-rank report of %d bytes: too small to tell", w.bytes)
	}
	if most := w.bytes/render.HTMLBuffer + 1; w.writes > most {
		t.Fatalf("a report of %d bytes in %d writes, want at most %d", w.bytes, w.writes, most)
	}
}

// TestReportWithALaggingRank: a rank whose batches ran 65 s after the others'
// shares no moment of wall time with them; the report opens on the batch axis
// and says why (on wall time every curve would be squeezed to an edge), and on
// the wall-time axis (#axis=time) its batch labels do not overlap. Ranks that
// overlap open on wall time, with no such note.
func TestReportWithALaggingRank(t *testing.T) {
	in := ddp4Marked(t, false)
	_, dir := runMerge(t, Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{in}), Align: AlignOffsets, Offsets: map[int]int64{3: -65_000_000}})
	page := filepath.Join(dir, "merged.html")
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "rank 3 ran its 65.0 s after the others") {
		t.Fatalf("the report does not say why it opens on batches")
	}
	dom, _ := browse(t, page)
	if !strings.Contains(dom, `data-axis="batch"`) || len(curveRe.FindAllString(strings.ReplaceAll(dom, ` picked`, ``), -1)) != 4 {
		t.Fatalf("the chart does not open on the batch axis with 4 curves")
	}
	dom, _ = browse(t, page+"#axis=time")
	if !strings.Contains(dom, `data-axis="time"`) {
		t.Fatal("#axis=time did not choose the wall-time axis")
	}
	labels := regexp.MustCompile(`<text x="([0-9.]+)"[^>]*class="tick batch-label"[^>]*>batch \d+</text>`).FindAllStringSubmatch(dom, -1)
	if len(labels) == 0 {
		t.Fatal("no batch labels on the wall-time axis")
	}
	last := -1e9
	for _, l := range labels {
		x, _ := strconv.ParseFloat(l[1], 64)
		if x-last < 60 {
			t.Fatalf("batch labels %v px apart: %v", x-last, labels)
		}
		last = x
	}
	_, dir = runMerge(t, Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{in}), Align: AlignOffsets})
	b, _ = os.ReadFile(filepath.Join(dir, "merged.html"))
	if strings.Contains(string(b), `id="axis-why"`) || !strings.Contains(string(b), `"axis":"time"`) {
		t.Fatal("ranks that overlap do not open on wall time")
	}
}

// TestReportSaysEachNoteOnce: a note true of every row (no rank's trainer
// called watch) is said once under the table, not on each row.
func TestReportSaysEachNoteOnce(t *testing.T) {
	_, dir := runMerge(t, Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{ddp4(t)})})
	b, err := os.ReadFile(filepath.Join(dir, "merged.html"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "(no memsnap_hook.watch"); n != 0 || strings.Count(string(b), `id="unwatched"`) != 1 {
		t.Fatalf("the watch note appears on %d rows", n)
	}
}
