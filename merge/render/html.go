package render

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"

	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/sidecar"
)

// MaxLines is the most ranks the report draws as individual lines; above it, the
// chart is a min-max band, the median and the ranks farthest from it, with a rank
// picker that draws any one rank on demand.
const MaxLines = 16

// Sizes of the report's embedded curves.
const (
	linePoints = 1500 // points of a rank drawn as a line
	gridCols   = 500  // columns of every rank's curve in band mode (2 bytes each)
	gridAbsent = 0xFFFF
	diffRows   = 15 // rows of the diff shown before "more"
)

// htmlData is the JSON the report's script draws from.
type htmlData struct {
	Band      bool       `json:"band"`
	T0        int64      `json:"t0"` // aligned µs: the chart's time span
	T1        int64      `json:"t1"`
	VMax      int64      `json:"vmax"`
	Ranks     []htmlRank `json:"ranks"`
	Grid      *htmlGrid  `json:"grid,omitempty"`
	Outliers  []int      `json:"outliers"` // ranks drawn on their own in band mode
	Median    int        `json:"median"`   // the median rank, -1 when there is none
	SiteNames []string   `json:"site_names,omitempty"`
	// Axis is the x axis the chart opens on: "batch" when the ranks' batches
	// share no moment of wall time (a rank that lags far behind the others would
	// squeeze every curve to the chart's edges), else "time"; AxisWhy says why
	// it is batch.
	Axis    string `json:"axis"`
	AxisWhy string `json:"axis_why,omitempty"`
}

// htmlRank is one rank's data for the chart.
type htmlRank struct {
	Rank    int        `json:"r"`
	Peak    int64      `json:"peak"`
	Pts     []int64    `json:"pts,omitempty"` // line mode: t-T0, v, then differences of both
	OOMs    [][2]int64 `json:"ooms,omitempty"`
	Batches [][3]int64 `json:"b,omitempty"` // [batch, aligned start_us, aligned end_us]
	Sites   [][3]int64 `json:"s,omitempty"` // band mode: [index into site_names, bytes, blocks]
}

// htmlGrid holds every rank's curve in band mode: Cols[i] is ranks[i]'s, N
// columns over [T0, T1] of two bytes (big-endian, base64), the largest allocated
// bytes in the column in units of Unit bytes, rounded up; 0xFFFF where the rank
// has no events.
type htmlGrid struct {
	N    int      `json:"n"`
	Unit int64    `json:"unit"`
	Cols []string `json:"cols"`
}

type htmlView struct {
	Title   string
	S       *analysis.Summary
	Rows    []htmlRow // every rank
	Notable []htmlRow // band mode: the outliers and the median rank, shown first
	Sites   []htmlSites
	Batches []htmlBatches
	Diff    *htmlDiff
	DataJS  template.JS
	Band    bool
	Missing string
	// Why are the missing ranks and why each is missing (at most maxWhyRows, the
	// summary has them all); WhyMore counts the rest.
	Why     []htmlWhy
	WhyMore int
	// Findings are the summary's findings; Leaks the leaking ranks' sites
	Findings []string
	Leaks    []htmlLeak
	// Cats are the shown ranks' categories at their peaks; CatNames the columns
	Cats     []htmlCats
	CatNames []string
	// NoneWatched: no shown rank's trainer called watch (said once, not per row)
	NoneWatched bool
	// AxisWhy says why the chart opens on the batch axis
	AxisWhy string
}

type htmlCats struct {
	Rank    int
	Values  []int64
	Modules []analysis.ModuleBytes
	Watched bool
}

type htmlLeak struct {
	Rank int
	L    *analysis.Leak
}

type htmlWhy struct {
	Rank   int
	Reason string
}

// maxWhyRows bounds the missing ranks the report lists with their reason.
const maxWhyRows = 64

type htmlRow struct {
	Rank                                           int
	Peak, PeakAt, Batch, Phase, Reserved, End, OOM string
	Outside                                        string
	Free                                           string // reserved, not allocated, at the peak
	VsMedian                                       string
	Outlier                                        bool
}

type htmlSites struct {
	Rank  int
	Title string
	Sites []analysis.Site
	Open  bool
	Early int64
}

type htmlBatches struct {
	Rank    int
	Figures []analysis.BatchFigure
}

type htmlDiff struct {
	D          *analysis.RankDiff
	Top, More  []analysis.SiteDiff
	Base, Othr string
	// Scale is the largest difference the tables show, which is drawn in the
	// strongest colour; smaller ones are paler (deltaStyle)
	Scale int64
}

// newHTMLDiff is the diff's tables: the first diffRows sites, the rest folded.
func newHTMLDiff(d *analysis.RankDiff) *htmlDiff {
	n := min(diffRows, len(d.Sites))
	h := &htmlDiff{D: d, Top: d.Sites[:n], More: d.Sites[n:], Scale: absBytes(d.PeakDeltaBytes)}
	for _, c := range d.Categories {
		h.Scale = max(h.Scale, absBytes(c.DeltaBytes))
	}
	for _, st := range h.Top {
		h.Scale = max(h.Scale, absBytes(st.DeltaBytes))
	}
	return h
}

func absBytes(n int64) int64 { return max(n, -n) }

// deltaStyle colours a difference by its size against scale, the largest the
// table shows: red for more, green for less, from nearly the text's grey for a
// small one to full strength (and a tinted cell) for the largest; a difference
// of 445.5 KiB beside one of 96.8 MiB is barely coloured.
func deltaStyle(delta, scale int64) template.CSS {
	if delta == 0 || scale <= 0 {
		return ""
	}
	w := math.Sqrt(min(float64(absBytes(delta))/float64(scale), 1)) // perceived strength
	full := [3]float64{0xcf, 0x22, 0x2e}
	if delta < 0 {
		full = [3]float64{0x1a, 0x7f, 0x37}
	}
	grey, white := [3]float64{0x57, 0x60, 0x6a}, [3]float64{0xff, 0xff, 0xff}
	mix := func(a, b [3]float64, t float64) string {
		return fmt.Sprintf("#%02x%02x%02x", int(math.Round(a[0]+(b[0]-a[0])*t)), int(math.Round(a[1]+(b[1]-a[1])*t)), int(math.Round(a[2]+(b[2]-a[2])*t)))
	}
	css := fmt.Sprintf("color:%s;background-color:%s", mix(grey, full, w), mix(white, full, 0.18*w))
	if w >= 0.5 {
		css += ";font-weight:600"
	}
	return template.CSS(css)
}

// Rank is what the report draws of one merged rank: its line of the
// summary, its analysis, the shift that aligns its clock, the part of its trace
// kept and its batch marks.
type Rank struct {
	Summary  analysis.RankSummary
	Analysis *analysis.RankAnalysis
	Shift    int64
	Window   analysis.Window
	Marks    []sidecar.BatchMark
}

// WriteHTML writes the report: the summary s of the merged ranks, titled title.
func WriteHTML(w io.Writer, title string, s *analysis.Summary, ranks []*Rank) error {
	d := chartData(s, ranks)
	js, err := json.Marshal(d) // escapes <, > and & so it cannot close the script
	if err != nil {
		return err
	}
	v := htmlView{Title: title, S: s, DataJS: template.JS(js), Band: d.Band, AxisWhy: d.AxisWhy}
	if len(s.MissingRanks) > 0 {
		v.Missing = fmt.Sprint(s.MissingRanks)
		for _, r := range s.MissingRanks {
			if len(v.Why) == maxWhyRows {
				v.WhyMore++
				continue
			}
			v.Why = append(v.Why, htmlWhy{Rank: r, Reason: s.MissingReasons[strconv.Itoa(r)]})
		}
	}
	if s.Diff != nil {
		v.Diff = newHTMLDiff(s.Diff)
	}
	v.Findings = s.Findings()
	for _, n := range analysis.CategoryNames {
		v.CatNames = append(v.CatNames, analysis.CategoryText(n))
	}
	for _, r := range s.Ranks {
		if r.Leak != nil && len(r.Leak.Sites) > 0 && len(v.Leaks) < 8 {
			v.Leaks = append(v.Leaks, htmlLeak{Rank: r.Rank, L: r.Leak})
		}
	}
	t0 := firstEvent(s)
	shown := func(r int) bool { return !d.Band || r == d.Median || s.Spread.IsOutlier(r) }
	for _, r := range s.Ranks {
		row := peakRow(s, r, t0)
		v.Rows = append(v.Rows, row)
		if d.Band && (shown(r.Rank) || slices.Contains(d.Outliers, r.Rank)) {
			v.Notable = append(v.Notable, row)
		}
		if !shown(r.Rank) {
			continue
		}
		if c := r.Categories; c != nil {
			hc := htmlCats{Rank: r.Rank, Modules: c.Modules[:min(8, len(c.Modules))], Watched: c.Watched > 0}
			for _, n := range analysis.CategoryNames {
				hc.Values = append(hc.Values, c.AtPeak[n])
			}
			v.Cats = append(v.Cats, hc)
		}
		v.Sites = append(v.Sites, htmlSites{Rank: r.Rank, Title: fmt.Sprintf("rank %d at its peak of %s", r.Rank, analysis.HumanBytes(r.PeakAllocatedBytes)),
			Sites: r.TopSites, Early: r.AllocatedBeforeRecording, Open: row.Outlier || len(s.Ranks) == 1})
		if len(r.BatchFigures) > 0 {
			v.Batches = append(v.Batches, htmlBatches{Rank: r.Rank, Figures: r.BatchFigures})
		}
	}
	v.NoneWatched = len(v.Cats) > 0 && !slices.ContainsFunc(v.Cats, func(c htmlCats) bool { return c.Watched })
	// the template writes a piece at a time, 57 bytes on average: unbuffered, a
	// 1,024-rank report was some 30,000 writes to its file, and a leader whose
	// goroutine gave its core up at each one (a simulated cluster busy with a
	// new term's gossip) took 15 s over it
	bw := bufio.NewWriterSize(w, HTMLBuffer)
	if err := reportTmpl.Execute(bw, v); err != nil {
		return err
	}
	return bw.Flush()
}

// HTMLBuffer is how much of the report is written at a time.
const HTMLBuffer = 64 << 10

// peakRow is a rank's row of the peaks table.
func peakRow(s *analysis.Summary, r analysis.RankSummary, t0 int64) htmlRow {
	row := htmlRow{Rank: r.Rank, Peak: analysis.HumanBytes(r.PeakAllocatedBytes), Reserved: analysis.HumanBytes(r.PeakReservedBytes), End: analysis.HumanBytes(r.EndAllocatedBytes),
		Batch: analysis.BatchText(r.PeakAllocatedBatch), Phase: analysis.OrDash(r.PeakAllocatedPhase), OOM: fmt.Sprint(len(r.OOMs)), Outside: "—"}
	if o := r.OutsideAllocator; o != nil {
		row.Outside = analysis.HumanBytes(o.AtPeakBytes)
	}
	row.Free = r.FreeAtPeak.Text()
	if r.Events > 0 {
		row.PeakAt = fmt.Sprintf("%.3f s", float64(r.PeakAllocatedTimeUS-t0)/1e6)
	}
	if s.Spread != nil && s.Spread.MedianPeakAllocatedBytes > 0 {
		row.VsMedian = fmt.Sprintf("%.3f×", float64(r.PeakAllocatedBytes)/float64(s.Spread.MedianPeakAllocatedBytes))
		row.Outlier = s.Spread.IsOutlier(r.Rank) && len(s.Ranks) > 1
	}
	return row
}

func firstEvent(s *analysis.Summary) int64 {
	t0 := int64(math.MaxInt64)
	for _, r := range s.Ranks {
		if r.Events > 0 {
			t0 = min(t0, r.FirstEventUS)
		}
	}
	return t0
}

// chartData is what the report's script draws: every rank's curve as a line
// (up to MaxLines ranks), or on the grid.
func chartData(s *analysis.Summary, ranks []*Rank) *htmlData {
	d := &htmlData{Band: len(ranks) > MaxLines, Outliers: []int{}, Median: -1, T0: math.MaxInt64, T1: math.MinInt64}
	for _, e := range ranks {
		if n := len(e.Analysis.Curve); n > 0 {
			d.T0, d.T1 = min(d.T0, e.Analysis.Curve[0].T+e.Shift), max(d.T1, e.Analysis.Curve[n-1].T+e.Shift)
		}
		d.VMax = max(d.VMax, e.Analysis.PeakAllocatedBytes)
	}
	if d.T0 > d.T1 {
		d.T0, d.T1 = 0, 1
	}
	if s.Spread != nil && len(s.Ranks) > 1 {
		d.Median, _ = analysis.MedianRank(s.Ranks, s.Spread, s.Spread.OutlierRank)
	}
	if d.Band {
		d.Outliers = farthest(s, 4)
		d.Grid = &htmlGrid{N: gridCols, Unit: max(1, (d.VMax+gridAbsent-2)/(gridAbsent-1))}
	}
	names := map[string]int{}
	for _, e := range ranks {
		d.Ranks = append(d.Ranks, d.rank(e, names))
	}
	d.Axis, d.AxisWhy = chooseAxis(d.Ranks)
	return d
}

// chooseAxis opens the chart on the batch axis when the ranks' batches (their
// marks, on the aligned clock) share no moment: then it names the rank farthest
// from the others' median start, and how far.
func chooseAxis(ranks []htmlRank) (axis, why string) {
	type span struct {
		rank       int
		start, end int64
	}
	var spans []span
	for _, r := range ranks {
		if n := len(r.Batches); n > 0 {
			spans = append(spans, span{r.Rank, r.Batches[0][1], r.Batches[n-1][2]})
		}
	}
	if len(spans) < 2 {
		return "time", ""
	}
	latestStart, earliestEnd := spans[0].start, spans[0].end
	starts := make([]int64, len(spans))
	for i, sp := range spans {
		latestStart, earliestEnd = max(latestStart, sp.start), min(earliestEnd, sp.end)
		starts[i] = sp.start
	}
	if latestStart <= earliestEnd {
		return "time", ""
	}
	med := analysis.MedianInt(starts)
	far := spans[0]
	for _, sp := range spans[1:] {
		if abs64(sp.start-med) > abs64(far.start-med) {
			far = sp
		}
	}
	d := far.start - med
	how := "after"
	if d < 0 {
		how = "before"
	}
	return "batch", fmt.Sprintf("The ranks' batches share no moment of wall time (rank %d ran its %.1f s %s the others' median), so the chart opens on the batch axis.",
		far.rank, math.Abs(float64(d))/1e6, how)
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// rank is one rank's chart data.
func (d *htmlData) rank(e *Rank, names map[string]int) htmlRank {
	h := htmlRank{Rank: e.Summary.Rank, Peak: e.Analysis.PeakAllocatedBytes}
	for _, o := range e.Summary.OOMs {
		h.OOMs = append(h.OOMs, [2]int64{o.TimeUS, o.AllocatedThen})
	}
	for _, m := range e.Marks {
		if !e.Window.Before(m.EndUS) && !e.Window.After(m.StartUS) {
			h.Batches = append(h.Batches, [3]int64{m.Batch, m.StartUS + e.Shift, m.EndUS + e.Shift})
		}
	}
	if !d.Band {
		var pt, pv int64 = d.T0, 0
		for _, p := range analysis.DownsampleCurve(append(analysis.Curve(nil), e.Analysis.Curve...), linePoints) {
			t := p.T + e.Shift
			h.Pts = append(h.Pts, t-pt, p.A-pv)
			pt, pv = t, p.A
		}
		return h
	}
	d.Grid.Cols = append(d.Grid.Cols, gridColumn(e.Analysis.Curve, e.Shift, d.T0, d.T1, d.Grid.N, d.Grid.Unit))
	for _, st := range e.Summary.TopSites {
		i, ok := names[st.Site]
		if !ok {
			i = len(d.SiteNames)
			names[st.Site] = i
			d.SiteNames = append(d.SiteNames, st.Site)
		}
		h.Sites = append(h.Sites, [3]int64{int64(i), st.Bytes, int64(st.Blocks)})
	}
	return h
}

// farthest returns the n ranks whose peaks are farthest from the median.
func farthest(s *analysis.Summary, n int) []int {
	if s.Spread == nil {
		return []int{}
	}
	type dev struct {
		rank int
		d    float64
	}
	var ds []dev
	for _, r := range s.Ranks {
		ds = append(ds, dev{r.Rank, math.Abs(float64(r.PeakAllocatedBytes - s.Spread.MedianPeakAllocatedBytes))})
	}
	sort.SliceStable(ds, func(i, j int) bool { return ds[i].d > ds[j].d })
	out := []int{}
	for i := 0; i < len(ds) && i < n; i++ {
		out = append(out, ds[i].rank)
	}
	return out
}

// gridColumn puts a curve on n columns over [t0, t1]: each column holds the
// largest allocated bytes of the curve's steps that overlap it.
func gridColumn(c analysis.Curve, shift, t0, t1 int64, n int, unit int64) string {
	vals := make([]uint16, n)
	for i := range vals {
		vals[i] = gridAbsent
	}
	span := uint64(t1-t0) + 1
	col := func(t int64) int {
		return int(min(analysis.ScaleDiv(uint64(t+shift-t0), uint64(n), span), uint64(n-1)))
	}
	for j, p := range c {
		end := col(p.T)
		if j+1 < len(c) {
			end = max(col(c[j+1].T), col(p.T))
		}
		code := uint16(min(max(0, (p.A+unit-1)/unit), gridAbsent-1))
		for k := col(p.T); k <= end; k++ {
			if vals[k] == gridAbsent || vals[k] < code {
				vals[k] = code
			}
		}
	}
	b := make([]byte, 2*n)
	for i, v := range vals {
		binary.BigEndian.PutUint16(b[2*i:], v)
	}
	return base64.StdEncoding.EncodeToString(b)
}

var reportTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"human": analysis.HumanBytes, "signed": analysis.Signed, "batch": analysis.BatchText, "dash": analysis.OrDash,
	"only": func(d *analysis.RankDiff, s analysis.SiteDiff) string { return analysis.OnlyText(d, s) },
	"cat":  analysis.CategoryText, "shade": deltaStyle,
}).Parse(reportHTML))
