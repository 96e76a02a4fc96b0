package render

// reportHTML is the report's template: static tables (they need no script) and a
// script that draws the chart from the embedded JSON. The URL's fragment picks the
// axis and a rank: merged.html#axis=batch&rank=17.
const reportHTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>memsnap: {{.Title}}</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1b1f24;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}
.meta{color:#57606a;margin:0 0 12px}
#chart svg{width:100%;max-width:1100px;height:auto;border:1px solid #d0d7de;border-radius:6px;background:#fff}
#controls{margin:6px 0}#controls button{font:inherit;padding:2px 10px;border:1px solid #d0d7de;background:#f6f8fa;border-radius:6px;cursor:pointer}
#controls button.on{background:#0969da;color:#fff;border-color:#0969da}#controls button:disabled{opacity:.4;cursor:default}
#legend{margin:6px 0;max-width:1100px}#legend span{display:inline-block;margin:2px 12px 2px 0;cursor:pointer;user-select:none}
#legend span.off{opacity:.35}#legend i{display:inline-block;width:14px;height:4px;margin-right:5px;vertical-align:middle}
table{border-collapse:collapse;margin:4px 0}th,td{padding:4px 10px;border-bottom:1px solid #d0d7de;text-align:right}
th{background:#f6f8fa}td.l,th.l{text-align:left}tr.outlier td{background:#fff1e5;font-weight:600}
td.up{color:#cf222e}td.down{color:#1a7f37}
.axis{stroke:#8c959f;stroke-width:1}.grid{stroke:#eaeef2;stroke-width:1}.tick{fill:#57606a;font-size:11px}
.band{fill:#0969da;fill-opacity:.15;stroke:none}.median{stroke:#0969da;stroke-width:2;fill:none}
.curve{fill:none;stroke-width:1.6}.picked{stroke-width:2.4}.oom{fill:#cf222e}.batch{stroke:#d0d7de;stroke-dasharray:3 3}
details{margin:4px 0}summary{cursor:pointer}p.note{color:#57606a;margin:2px 0 8px}
</style></head><body>
<h1>Cluster memory snapshot{{if .Title}}: {{.Title}}{{end}}</h1>
<p class="meta">{{len .S.RanksMerged}} of {{.S.WorldSize}} ranks merged · times aligned by {{.S.Align}}{{if .S.Spread}} · largest peak {{printf "%.3f" .S.Spread.MaxOverMedian}}× the median ({{human .S.Spread.MedianPeakAllocatedBytes}}){{if gt (len .S.RanksMerged) 1}} · outlier: <b>{{.S.Spread.OutlierText}}</b>{{end}}{{end}}{{if .Missing}} · <b>missing ranks: {{.Missing}}</b>{{end}}{{if .S.ClockUnmeasured}} · clock offset never measured for ranks {{.S.ClockUnmeasured}} (their times are their own clocks'){{end}}{{if .S.Cut}} · cut:{{if .S.Cut.Ranks}} ranks {{.S.Cut.Ranks}}{{end}}{{if .S.Cut.Batches}} batches {{.S.Cut.Batches}}{{end}}{{end}}</p>
{{if .Why}}<details id="missing"{{if le (len .Why) 8}} open{{end}}><summary>{{len .S.MissingRanks}} rank(s) missing, and why</summary><table><tbody>
{{range .Why}}<tr><td>rank {{.Rank}}</td><td class="l">{{dash .Reason}}</td></tr>
{{end}}{{if .WhyMore}}<tr><td></td><td class="l">and {{.WhyMore}} more (merged.summary.json lists every one)</td></tr>{{end}}</tbody></table></details>{{end}}
{{if .Findings}}<h2>Findings</h2><ul id="findings">{{range .Findings}}<li>{{.}}</li>
{{end}}</ul>{{range .Leaks}}<table class="leak" id="leak-{{.Rank}}"><thead><tr><th class="l">rank {{.Rank}}: site whose blocks outlive their batch</th><th>per batch</th><th>batches</th><th>blocks</th><th>bytes</th></tr></thead><tbody>
{{range .L.Sites}}<tr><td class="l">{{.Site}}</td><td>{{human .PerBatchBytes}}</td><td>{{.Batches}}</td><td>{{.Blocks}}</td><td>{{human .Bytes}}</td></tr>
{{end}}</tbody></table>{{end}}{{end}}
<div id="controls">x axis: <button id="axis-time" type="button">wall time</button> <button id="axis-batch" type="button" title="each rank's own batches: batch + the fraction of it done">batch</button>
{{if .Band}} · rank: <select id="pick"><option value="">none</option>{{range .Rows}}<option value="{{.Rank}}">rank {{.Rank}} ({{.Peak}})</option>{{end}}</select>{{end}}</div>
{{if .AxisWhy}}<p class="note" id="axis-why">{{.AxisWhy}}</p>{{end}}
<div id="chart"><noscript>The chart is drawn by the page's own script; the tables below need none.</noscript></div>
<div id="legend"></div>
{{if .Band}}<div id="picked"></div>{{end}}
{{with .Diff}}<h2 id="diff-title">Why {{.D.Other.Label}} differs from {{.D.Base.Label}} (the median rank)</h2>
<table id="diff-peaks"><thead><tr><th class="l"></th><th>{{.D.Base.Label}}</th><th>{{.D.Other.Label}}</th><th>difference</th></tr></thead><tbody>
<tr><td class="l">peak allocated</td><td>{{human .D.Base.PeakAllocatedBytes}}</td><td>{{human .D.Other.PeakAllocatedBytes}}</td><td>{{signed .D.PeakDeltaBytes}}</td></tr>
<tr><td class="l">at batch</td><td>{{batch .D.Base.PeakBatch}}</td><td>{{batch .D.Other.PeakBatch}}</td><td></td></tr>
<tr><td class="l">in phase</td><td>{{dash .D.Base.PeakPhase}}</td><td>{{dash .D.Other.PeakPhase}}</td><td></td></tr>
{{range .D.Categories}}<tr class="cat"><td class="l">{{cat .Category}}{{if .Module}} <i>(most in {{.Module}}: {{signed .ModuleDeltaBytes}})</i>{{end}}</td><td>{{human .BaseBytes}}</td><td>{{human .OtherBytes}}</td><td class="{{if gt .DeltaBytes 0}}up{{else if lt .DeltaBytes 0}}down{{end}}" style="{{shade .DeltaBytes $.Diff.Scale}}">{{signed .DeltaBytes}}</td></tr>
{{end}}</tbody></table>
<table id="diff-sites"><thead><tr><th class="l">site alive at the peak</th><th>{{.D.Base.Label}}</th><th>{{.D.Other.Label}}</th><th>difference</th><th class="l"></th></tr></thead><tbody>
{{$d := .D}}{{range .Top}}<tr><td class="l">{{.Site}}</td><td>{{human .BaseBytes}}</td><td>{{human .OtherBytes}}</td><td class="{{if gt .DeltaBytes 0}}up{{else if lt .DeltaBytes 0}}down{{end}}" style="{{shade .DeltaBytes $.Diff.Scale}}">{{signed .DeltaBytes}}</td><td class="l">{{only $d .}}</td></tr>
{{end}}</tbody></table>
{{if .More}}<details><summary>{{len .More}} more sites</summary><table><tbody>
{{range .More}}<tr><td class="l">{{.Site}}</td><td>{{human .BaseBytes}}</td><td>{{human .OtherBytes}}</td><td>{{signed .DeltaBytes}}</td><td class="l">{{only $d .}}</td></tr>
{{end}}</tbody></table></details>{{end}}{{end}}
{{if .Cats}}<h2>What each peak held</h2>
<table id="categories"><thead><tr><th>rank</th>{{range .CatNames}}<th>{{.}}</th>{{end}}<th class="l">modules holding the most</th></tr></thead><tbody>
{{range .Cats}}<tr><td>{{.Rank}}</td>{{range .Values}}<td>{{human .}}</td>{{end}}<td class="l">{{range $i, $m := .Modules}}{{if $i}}; {{end}}{{$m.Module}} ({{$m.Category}}, {{human $m.Bytes}}){{end}}{{if and (not .Watched) (not $.NoneWatched)}} <i>(no memsnap_hook.watch: parameters, gradients and optimizer state count as unknown)</i>{{end}}</td></tr>
{{end}}</tbody></table>{{if .NoneWatched}}<p class="note" id="unwatched">No rank's trainer called <code>memsnap_hook.watch</code>: parameters, gradients and optimizer state count as unknown.</p>{{end}}{{end}}
<h2>Peaks</h2>
{{define "peakhead"}}<thead><tr><th>rank</th><th>peak allocated</th><th>at</th><th>batch</th><th>phase</th><th>vs median</th><th>peak reserved</th><th title="reserved but not allocated at the allocated peak, and the largest free block then">free at peak</th><th>allocated at end</th><th title="NVML device used less the allocator's reserved bytes, at the reserved peak">outside allocator</th><th>OOMs</th></tr></thead>{{end}}
{{define "peakrows"}}{{range .}}<tr{{if .Outlier}} class="outlier"{{end}}><td>{{.Rank}}</td><td>{{.Peak}}</td><td>{{.PeakAt}}</td><td>{{.Batch}}</td><td>{{.Phase}}</td><td>{{.VsMedian}}</td><td>{{.Reserved}}</td><td>{{.Free}}</td><td>{{.End}}</td><td>{{.Outside}}</td><td>{{.OOM}}</td></tr>
{{end}}{{end}}
{{if .Band}}<table id="peaks">{{template "peakhead"}}<tbody>
{{template "peakrows" .Notable}}</tbody></table>
<details><summary>every rank's peak ({{len .Rows}} ranks)</summary><table id="all-peaks">{{template "peakhead"}}<tbody>
{{template "peakrows" .Rows}}</tbody></table></details>
{{else}}<table id="peaks">{{template "peakhead"}}<tbody>
{{template "peakrows" .Rows}}</tbody></table>{{end}}
{{if .Batches}}<h2>Allocated at each batch's start and end</h2>
<table id="batches"><thead><tr><th>rank</th><th>batch</th><th>at start</th><th>peak</th><th>at end</th></tr></thead><tbody>
{{range .Batches}}{{$r := .Rank}}{{range .Figures}}<tr><td>{{$r}}</td><td>{{.Batch}}</td><td>{{human .StartAllocatedBytes}}</td><td>{{human .PeakAllocatedBytes}}</td><td>{{human .EndAllocatedBytes}}</td></tr>
{{end}}{{end}}</tbody></table>{{end}}
<h2>Top allocation sites at {{if .Band}}the outlier's and the median rank's peaks (pick a rank above for another){{else}}each rank's peak{{end}}</h2>
<div id="sites">{{range .Sites}}<details{{if .Open}} open{{end}}><summary>{{.Title}}</summary>
<table><thead><tr><th class="l">site (innermost frame outside torch)</th><th>bytes</th><th>blocks</th></tr></thead><tbody>
{{range .Sites}}<tr><td class="l">{{.Site}}</td><td>{{human .Bytes}}</td><td>{{.Blocks}}</td></tr>{{end}}
{{if .Early}}<tr><td class="l"><i>allocated before recording began</i></td><td>{{human .Early}}</td><td></td></tr>{{end}}
</tbody></table></details>
{{end}}</div>
<script id="data" type="application/json">{{.DataJS}}</script>
<script>
` + reportJS + `
</script>
</body></html>
`
