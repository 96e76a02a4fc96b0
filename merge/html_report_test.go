package merge

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"image"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/internal/testjob"
	"github.com/memsnap/memsnap/naming"
)

var (
	curveStartRe = regexp.MustCompile(`<path d="M([0-9.]+) [^"]*" stroke="#[0-9a-f]{6}" class="curve[^"]*" data-rank="(\d+)"`)
	diffRowRe    = regexp.MustCompile(`<tr><td class="l">([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td><td class="(up|down|)"(?: style="[^"]*")?>([^<]*)</td><td class="l">([^<]*)</td></tr>`)
)

// TestHTMLDiffAndBatchAxisInChromium: the report shows why rank 3 differs (the
// planted buffer first, rank 3's alone), and on the batch axis (#axis=batch)
// every rank's curve starts where its first batch starts: the left edge, which on
// the wall-time axis only the earliest rank's does.
func TestHTMLDiffAndBatchAxisInChromium(t *testing.T) {
	_, dir := runMerge(t, Config{Inputs: resolve(t, naming.ComposerSnapshotName, []string{ddp4Marked(t, false)}), Title: "ddp4"})
	page := filepath.Join(dir, "merged.html")
	dom, timeShot := browse(t, page)
	if !strings.Contains(dom, "Why rank 3 differs from rank 1 (the median rank)") {
		t.Fatal("the report has no diff of rank 3 against the median rank")
	}
	rows := diffRowRe.FindAllStringSubmatch(dom, -1)
	if len(rows) == 0 || rows[0][1] != html.EscapeString(plantedSite) || rows[0][3] != "96.0 MiB" || rows[0][5] != "+96.0 MiB" || rows[0][4] != "up" || rows[0][6] != "only rank 3" {
		t.Fatalf("the diff's first row: %q", rows)
	}
	if !strings.Contains(dom, `data-axis="time"`) {
		t.Fatal("the chart is not on the time axis by default")
	}
	starts := curveStarts(t, dom)
	if starts["0"] == "86.0" && starts["1"] == "86.0" && starts["2"] == "86.0" && starts["3"] == "86.0" {
		t.Fatalf("on the wall-time axis every rank starts at the left edge: %v", starts)
	}

	dom, batchShot := browse(t, page+"#axis=batch")
	if !strings.Contains(dom, `data-axis="batch"`) || !strings.Contains(dom, "batch + fraction of the batch") {
		t.Fatal("#axis=batch did not put the chart on the batch axis")
	}
	for _, b := range []string{"batch 5", "batch 6", "batch 7", "batch 8"} {
		if !strings.Contains(dom, ">"+b+"</text>") {
			t.Fatalf("the batch axis has no tick %q", b)
		}
	}
	for r, x := range curveStarts(t, dom) {
		if x != "86.0" {
			t.Fatalf("on the batch axis rank %s starts at x=%s, not at batch 5's start", r, x)
		}
	}
	if !strings.Contains(dom, `<button id="axis-batch" type="button" title="each rank's own batches: batch + the fraction of it done" class="on">`) {
		t.Fatal("the batch button is not shown pressed")
	}
	// the screenshot shows the curves on the batch axis, and another picture
	if n := countColor(batchShot, "#cf222e", 10); n < 300 {
		t.Fatalf("rank 1's curve colour covers %d pixels on the batch axis", n)
	}
	if d := differing(timeShot, batchShot); d < 2000 {
		t.Fatalf("the batch axis looks like the time axis (%d pixels differ)", d)
	}
}

func curveStarts(t *testing.T, dom string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range curveStartRe.FindAllStringSubmatch(dom, -1) {
		out[m[2]] = m[1]
	}
	if len(out) != 4 {
		t.Fatalf("%d curves drawn: %v", len(out), out)
	}
	return out
}

// differing counts the pixels that differ between two screenshots.
func differing(a, b image.Image) int {
	n := 0
	bd := a.Bounds().Intersect(b.Bounds())
	for y := bd.Min.Y; y < bd.Max.Y; y++ {
		for x := bd.Min.X; x < bd.Max.X; x++ {
			if a.At(x, y) != b.At(x, y) {
				n++
			}
		}
	}
	return n
}

// memInputs are n ranks, rank r a copy of ddp4's rank r%4 with a sidecar (world
// n) and an analysis, all in memory: the analyses a 1,024-rank window's agents
// would upload.
func memInputs(t *testing.T, n int) []Input {
	t.Helper()
	var ins []Input
	for r := 0; r < n; r++ {
		data, err := os.ReadFile(filepath.Join(ddp4Dir(t), fmt.Sprintf("rank%d.5.memory_snapshot.pickle", r%4)))
		if err != nil {
			t.Fatal(err)
		}
		meta := markedMeta(t, data, r)
		meta.WorldSize = n
		mb, _ := json.Marshal(meta)
		a, err := analysis.Analyze(context.Background(), data, meta, analysis.AnalyzeOptions{Rank: r})
		if err != nil {
			t.Fatal(err)
		}
		ab := marshal(t, a)
		ins = append(ins, Input{Rank: r, Source: fmt.Sprintf("mem/rank%d.5.memory_snapshot.pickle", r),
			load:     func(context.Context) ([]byte, error) { return data, nil },
			meta:     func(context.Context) ([]byte, error) { return mb, nil },
			analysis: func(context.Context) ([]byte, error) { return ab, nil }})
	}
	return ins
}

// TestHTMLReport1024RanksPicker: at 1,024 ranks the report is a band with the
// median and the outliers, under 5 MB, and #rank=517 draws rank 517's curve and
// lists its sites, from the data embedded in the page.
func TestHTMLReport1024RanksPicker(t *testing.T) {
	res, dir := runMerge(t, Config{Inputs: memInputs(t, 1024), FromAnalyses: true, Detail: DetailDiff})
	if len(res.Decoded) != 2 || len(res.FromAnalyses) != 1024 || res.Summary.Diff == nil || res.Summary.Diff.Sites[0].Site != plantedSite {
		t.Fatalf("decoded %v, %d from analyses, diff %+v", res.Decoded, len(res.FromAnalyses), res.Summary.Diff)
	}
	page := filepath.Join(dir, "merged.html")
	st, _ := os.Stat(page)
	if st.Size() > 5<<20 {
		t.Fatalf("the report is %d bytes", st.Size())
	}
	dom, img := browse(t, page+"#rank=517")
	if !strings.Contains(dom, `class="band"`) || !strings.Contains(dom, `class="median"`) || !strings.Contains(dom, "data-ready-ms=") {
		t.Fatal("no band, median or ready mark at 1,024 ranks")
	}
	if n := len(regexp.MustCompile(`<option value="\d+">`).FindAllString(dom, -1)); n != 1024 {
		t.Fatalf("the rank picker offers %d ranks", n)
	}
	if !regexp.MustCompile(`<path d="M[^"]{20,}" stroke="#bf3989" class="curve picked" data-rank="517"`).MatchString(dom) {
		t.Fatal("#rank=517 did not draw rank 517's curve")
	}
	i := strings.Index(dom, `id="picked-sites"`)
	if i < 0 || !strings.Contains(dom[i:], "_multi_tensor_adam (torch/optim/adam.py:791)") || !strings.Contains(dom, "Rank 517: top sites") {
		t.Fatal("the picked rank's sites are not listed")
	}
	if n := countColor(img, "#bf3989", 10); n < 100 {
		t.Fatalf("the picked curve covers %d pixels", n)
	}
}

// TestHTMLCategoriesAndLeakInChromium: the report, as headless Chromium draws it,
// shows each rank's memory by category (parameters, gradients, optimizer state,
// activations, with the modules holding the most) and the leaking rank with the
// site whose blocks outlive their batch, per batch. The screenshot is kept where
// MEMSNAP_KEEP_SCREENSHOT says and its path logged.
func TestHTMLCategoriesAndLeakInChromium(t *testing.T) {
	res, out := mergeSynth(t, "categories and a leak", testjob.Job{Batches: 6, Watch: true}, testjob.Job{Batches: 6, Watch: true, Leak: 8 * mib}, testjob.Job{Batches: 6, Watch: true})
	if l := res.Summary.Ranks[1].Leak; l == nil || l.PerBatchBytes != 8*mib {
		t.Fatalf("rank 1's leak in the summary: %+v", l)
	}
	shot := os.Getenv("MEMSNAP_KEEP_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "categories.png")
		t.Setenv("MEMSNAP_KEEP_SCREENSHOT", shot)
	}
	dom, img := browse(t, filepath.Join(out, "merged.html"))
	t.Logf("screenshot of the report: %s (%dx%d)", shot, img.Bounds().Dx(), img.Bounds().Dy())
	cats := regexp.MustCompile(`(?s)<table id="categories">.*?</table>`).FindString(dom)
	if cats == "" {
		t.Fatal("the report has no table of categories")
	}
	for _, w := range []string{"<th>parameters</th>", "<th>gradients</th>", "<th>optimizer state</th>", "<th>activations</th>", "256.0 MiB", "128.0 MiB", "fc1 (parameters, 128.0 MiB)"} {
		if !strings.Contains(cats, w) {
			t.Fatalf("the categories table lacks %q:\n%s", w, cats)
		}
	}
	if n := strings.Count(cats, "<tr"); n < 4 { // a heading and a row per rank
		t.Fatalf("the categories table has %d rows:\n%s", n, cats)
	}
	leak := regexp.MustCompile(`(?s)<table class="leak" id="leak-1">.*?</table>`).FindString(dom)
	if leak == "" || !strings.Contains(leak, html.EscapeString(testjob.LeakSite)) || !strings.Contains(leak, "8.0 MiB") {
		t.Fatalf("the report does not name rank 1's leak at %s, 8 MiB a batch:\n%s", testjob.LeakSite, leak)
	}
	if strings.Contains(dom, `id="leak-0"`) || strings.Contains(dom, `id="leak-2"`) {
		t.Fatal("a steady rank is shown leaking")
	}
	// and it is drawn: the page's text covers the screenshot
	if dark := countColor(img, "#1b1f24", 40); dark < 2000 {
		t.Fatalf("little text was rendered (%d dark pixels)", dark)
	}
}
