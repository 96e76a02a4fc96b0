package merge

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"sort"
)

// htmlRank is one rank's data for the report's chart.
type htmlRank struct {
	Rank    int        `json:"rank"`
	Peak    int64      `json:"peak"`
	Pts     [][2]int64 `json:"pts"`               // [aligned time_us, allocated bytes]
	OOMs    [][2]int64 `json:"ooms,omitempty"`    // [aligned time_us, allocated bytes]
	Batches [][3]int64 `json:"batches,omitempty"` // [batch, aligned start_us, aligned end_us]
}

type htmlData struct {
	Ranks    []htmlRank `json:"ranks"`
	Outliers []int      `json:"outliers"` // ranks drawn on their own in band mode
	Band     bool       `json:"band"`     // more ranks than lines stay legible: min/median/max band
}

// maxLines is the most ranks the report draws as individual lines.
const maxLines = 16

type htmlView struct {
	Title   string
	S       *Summary
	Rows    []htmlRow
	Sites   []htmlSites
	DataJS  template.JS
	Band    bool
	Missing string
}

type htmlRow struct {
	Rank                                    int
	Peak, PeakAt, Batch, Reserved, End, OOM string
	VsMedian                                string
	Outlier                                 bool
}

type htmlSites struct {
	Rank  int
	Title string
	Sites []Site
	Open  bool
	Early int64
}

func writeHTML(w io.Writer, title string, s *Summary, ranks []htmlRank) error {
	d := htmlData{Ranks: ranks, Band: len(ranks) > maxLines, Outliers: []int{}}
	if d.Band && s.Spread != nil {
		// the ranks farthest from the median peak, up to 4
		type dev struct {
			rank int
			d    float64
		}
		var ds []dev
		for _, r := range s.Ranks {
			ds = append(ds, dev{r.Rank, math.Abs(float64(r.PeakAllocatedBytes - s.Spread.MedianPeakAllocatedBytes))})
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i].d > ds[j].d })
		for i := 0; i < len(ds) && i < 4; i++ {
			d.Outliers = append(d.Outliers, ds[i].rank)
		}
	}
	js, err := json.Marshal(d) // escapes <, > and & so it cannot close the script
	if err != nil {
		return err
	}
	v := htmlView{Title: title, S: s, DataJS: template.JS(js), Band: d.Band}
	if len(s.MissingRanks) > 0 {
		v.Missing = fmt.Sprint(s.MissingRanks)
	}
	t0 := int64(math.MaxInt64)
	for _, r := range s.Ranks {
		if r.Events > 0 {
			t0 = min(t0, r.FirstEventUS)
		}
	}
	for _, r := range s.Ranks {
		row := htmlRow{Rank: r.Rank, Peak: human(r.PeakAllocatedBytes), Reserved: human(r.PeakReservedBytes), End: human(r.EndAllocatedBytes)}
		if r.Events > 0 {
			row.PeakAt = fmt.Sprintf("%.3f s", float64(r.PeakAllocatedTimeUS-t0)/1e6)
		}
		row.Batch = "–"
		if r.PeakAllocatedBatch != nil {
			row.Batch = fmt.Sprint(*r.PeakAllocatedBatch)
		}
		row.OOM = fmt.Sprint(len(r.OOMs))
		if s.Spread != nil && s.Spread.MedianPeakAllocatedBytes > 0 {
			row.VsMedian = fmt.Sprintf("%.3f×", float64(r.PeakAllocatedBytes)/float64(s.Spread.MedianPeakAllocatedBytes))
			row.Outlier = r.Rank == s.Spread.OutlierRank && len(s.Ranks) > 1
		}
		v.Rows = append(v.Rows, row)
		sites := htmlSites{Rank: r.Rank, Title: fmt.Sprintf("rank %d at its peak of %s", r.Rank, human(r.PeakAllocatedBytes)), Sites: r.TopSites, Early: r.AllocatedBeforeRecording}
		sites.Open = row.Outlier || len(s.Ranks) == 1
		v.Sites = append(v.Sites, sites)
	}
	return reportTmpl.Execute(w, v)
}

// HumanBytes formats bytes with binary units (KiB, MiB, ...).
func HumanBytes(n int64) string { return human(n) }

// human formats bytes with binary units.
func human(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	f := float64(n)
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		f /= unit
		if math.Abs(f) < unit {
			return fmt.Sprintf("%.1f %s", f, u)
		}
	}
	return fmt.Sprintf("%.1f PiB", f/unit)
}

var reportTmpl = template.Must(template.New("report").Funcs(template.FuncMap{"human": human}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>memsnap: {{.Title}}</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1b1f24;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}
.meta{color:#57606a;margin:0 0 12px}
#chart svg{width:100%;max-width:1100px;height:auto;border:1px solid #d0d7de;border-radius:6px;background:#fff}
#legend{margin:6px 0;max-width:1100px}#legend span{display:inline-block;margin:2px 12px 2px 0;cursor:pointer;user-select:none}
#legend span.off{opacity:.35}#legend i{display:inline-block;width:14px;height:4px;margin-right:5px;vertical-align:middle}
table{border-collapse:collapse;margin:4px 0}th,td{padding:4px 10px;border-bottom:1px solid #d0d7de;text-align:right}
th{background:#f6f8fa}td.l,th.l{text-align:left}tr.outlier td{background:#fff1e5;font-weight:600}
.axis{stroke:#8c959f;stroke-width:1}.grid{stroke:#eaeef2;stroke-width:1}.tick{fill:#57606a;font-size:11px}
.band{fill:#0969da;fill-opacity:.15;stroke:none}.median{stroke:#0969da;stroke-width:2;fill:none}
.curve{fill:none;stroke-width:1.6}.oom{fill:#cf222e}.batch{stroke:#d0d7de;stroke-dasharray:3 3}
details{margin:4px 0}summary{cursor:pointer}
</style></head><body>
<h1>Cluster memory snapshot{{if .Title}}: {{.Title}}{{end}}</h1>
<p class="meta">{{len .S.RanksMerged}} of {{.S.WorldSize}} ranks merged · times aligned by {{.S.Align}}{{if .S.Spread}} · largest peak {{printf "%.3f" .S.Spread.MaxOverMedian}}× the median ({{human .S.Spread.MedianPeakAllocatedBytes}}){{if gt (len .S.RanksMerged) 1}} · outlier: <b>rank {{.S.Spread.OutlierRank}}</b>{{end}}{{end}}{{if .Missing}} · <b>missing ranks: {{.Missing}}</b>{{end}}</p>
<div id="chart"><noscript>The chart is drawn by the page's own script; the tables below need none.</noscript></div>
<div id="legend"></div>
<h2>Peaks</h2>
<table id="peaks"><thead><tr><th>rank</th><th>peak allocated</th><th>at</th><th>batch</th><th>vs median</th><th>peak reserved</th><th>allocated at end</th><th>OOMs</th></tr></thead><tbody>
{{range .Rows}}<tr{{if .Outlier}} class="outlier"{{end}}><td>{{.Rank}}</td><td>{{.Peak}}</td><td>{{.PeakAt}}</td><td>{{.Batch}}</td><td>{{.VsMedian}}</td><td>{{.Reserved}}</td><td>{{.End}}</td><td>{{.OOM}}</td></tr>
{{end}}</tbody></table>
<h2>Top allocation sites at each rank's peak</h2>
<div id="sites">{{range .Sites}}<details{{if .Open}} open{{end}}><summary>{{.Title}}</summary>
<table><thead><tr><th class="l">site (innermost frame outside torch)</th><th>bytes</th><th>blocks</th></tr></thead><tbody>
{{range .Sites}}<tr><td class="l">{{.Site}}</td><td>{{human .Bytes}}</td><td>{{.Blocks}}</td></tr>{{end}}
{{if .Early}}<tr><td class="l"><i>allocated before recording began</i></td><td>{{human .Early}}</td><td></td></tr>{{end}}
</tbody></table></details>
{{end}}</div>
<script id="data" type="application/json">{{.DataJS}}</script>
<script>
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var PAL = ["#0969da","#cf222e","#1a7f37","#8250df","#bf8700","#0598bc","#e16f24","#6e7781","#d6336c","#2da44e","#953800","#4e5dca","#a40e26","#116329","#7d4e00","#3d444d"];
  var W = 1100, H = 440, L = 86, R = 20, T = 16, B = 42;
  var t0 = Infinity, t1 = -Infinity, vmax = 0;
  D.ranks.forEach(function (r) { r.pts.forEach(function (p) { t0 = Math.min(t0, p[0]); t1 = Math.max(t1, p[0]); vmax = Math.max(vmax, p[1]); }); });
  if (!isFinite(t0)) { t0 = 0; t1 = 1; }
  if (t1 <= t0) t1 = t0 + 1;
  vmax = vmax > 0 ? vmax * 1.05 : 1;
  function x(t) { return L + (t - t0) / (t1 - t0) * (W - L - R); }
  function y(v) { return H - B - v / vmax * (H - T - B); }
  function el(name, attrs, parent) { var e = document.createElementNS(NS, name); for (var k in attrs) e.setAttribute(k, attrs[k]); if (parent) parent.appendChild(e); return e; }
  function bytes(v) { var u = ["B","KiB","MiB","GiB","TiB"], i = 0; while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; } return (i ? v.toFixed(1) : v) + " " + u[i]; }
  function secs(us) { var s = us / 1e6; return (t1 - t0 < 2e6 ? (s * 1000).toFixed(0) + " ms" : s.toFixed(s < 10 ? 2 : 1) + " s"); }
  function step(pts) { var d = ""; pts.forEach(function (p, i) { d += i ? "H" + x(p[0]).toFixed(1) + "V" + y(p[1]).toFixed(1) : "M" + x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1); }); return d; }
  var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "allocated bytes of every rank over time" });
  for (var i = 0; i <= 5; i++) {
    var v = vmax / 1.05 * i / 5, yy = y(v);
    el("line", { x1: L, x2: W - R, y1: yy, y2: yy, "class": "grid" }, svg);
    el("text", { x: L - 6, y: yy + 4, "text-anchor": "end", "class": "tick" }, svg).textContent = bytes(v);
  }
  for (i = 0; i <= 6; i++) {
    var t = t0 + (t1 - t0) * i / 6, xx = x(t);
    el("line", { x1: xx, x2: xx, y1: H - B, y2: H - B + 5, "class": "axis" }, svg);
    el("text", { x: xx, y: H - B + 18, "text-anchor": "middle", "class": "tick" }, svg).textContent = secs(t - t0);
  }
  el("text", { x: W - R, y: H - 6, "text-anchor": "end", "class": "tick" }, svg).textContent = "time since the first event";
  el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, "class": "axis" }, svg);
  el("line", { x1: L, x2: L, y1: T, y2: H - B, "class": "axis" }, svg);
  var first = D.ranks.find(function (r) { return r.batches && r.batches.length; });
  if (first) first.batches.forEach(function (b) {
    el("line", { x1: x(b[1]), x2: x(b[1]), y1: T, y2: H - B, "class": "batch" }, svg);
    el("text", { x: x(b[1]) + 3, y: T + 10, "class": "tick" }, svg).textContent = "batch " + b[0];
  });
  var legend = document.getElementById("legend");
  function addLegend(label, color, nodes) {
    var s = document.createElement("span"), sw = document.createElement("i");
    sw.style.background = color; s.appendChild(sw); s.appendChild(document.createTextNode(label));
    s.onclick = function () { s.classList.toggle("off"); nodes.forEach(function (n) { n.style.display = s.classList.contains("off") ? "none" : ""; }); };
    legend.appendChild(s);
  }
  function curve(r, color) {
    var g = el("g", { "data-rank": r.rank }, svg);
    var p = el("path", { d: step(r.pts), stroke: color, "class": "curve", "data-rank": r.rank }, g);
    el("title", {}, p).textContent = "rank " + r.rank + ": peak " + bytes(r.peak);
    (r.ooms || []).forEach(function (o) { el("path", { d: "M" + x(o[0]) + " " + (y(o[1]) - 9) + "l-5 -8h10z", "class": "oom" }, g); });
    return g;
  }
  if (!D.band) {
    D.ranks.forEach(function (r, i) { var c = PAL[i % PAL.length]; addLegend("rank " + r.rank, c, [curve(r, c)]); });
  } else {
    var N = 400, lo = [], md = [], hi = [];
    var cols = D.ranks.map(function (r) {
      var out = new Array(N).fill(NaN), j = 0, last = NaN;
      for (var k = 0; k < N; k++) {
        var end = t0 + (t1 - t0) * (k + 1) / N, m = NaN;
        while (j < r.pts.length && r.pts[j][0] <= end) { last = r.pts[j][1]; m = isNaN(m) ? last : Math.max(m, last); j++; }
        var started = r.pts.length && r.pts[0][0] <= end, done = !r.pts.length || end > r.pts[r.pts.length - 1][0] + (t1 - t0) / N;
        out[k] = started && !done ? (isNaN(m) ? last : m) : NaN;
      }
      return out;
    });
    for (var k = 0; k < N; k++) {
      var vs = cols.map(function (c) { return c[k]; }).filter(function (v) { return !isNaN(v); }).sort(function (a, b) { return a - b; });
      var tk = t0 + (t1 - t0) * (k + 0.5) / N;
      if (!vs.length) continue;
      lo.push([tk, vs[0]]); hi.push([tk, vs[vs.length - 1]]);
      md.push([tk, vs.length % 2 ? vs[(vs.length - 1) / 2] : (vs[vs.length / 2 - 1] + vs[vs.length / 2]) / 2]);
    }
    var band = el("path", { d: "M" + hi.map(function (p) { return x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1); }).join("L") + "L" + lo.reverse().map(function (p) { return x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1); }).join("L") + "Z", "class": "band" }, svg);
    addLegend("min–max of " + D.ranks.length + " ranks", "rgba(9,105,218,.3)", [band]);
    var med = el("path", { d: "M" + md.map(function (p) { return x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1); }).join("L"), "class": "median" }, svg);
    addLegend("median", "#0969da", [med]);
    D.outliers.forEach(function (rank, i) {
      var r = D.ranks.find(function (q) { return q.rank === rank; }); if (!r) return;
      var c = PAL[(i + 1) % PAL.length]; addLegend("rank " + rank + " (far from the median)", c, [curve(r, c)]);
    });
  }
  document.getElementById("chart").appendChild(svg);
})();
</script>
</body></html>
`))
