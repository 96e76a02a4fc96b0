package render

// reportJS draws the report's chart: lines (or, past MaxLines ranks, a min-max
// band, the median and the outliers, plus a picked rank) on a wall-time or a batch
// axis (it opens on the one htmlData.Axis says; #axis= in the address chooses). On the batch axis a rank's time t inside batch k (its own marks) is at
// k + (t - start) / (end - start); time between two batches collapses onto the
// boundary.
const reportJS = `(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var PAL = ["#0969da","#cf222e","#1a7f37","#8250df","#bf8700","#0598bc","#e16f24","#6e7781","#d6336c","#2da44e","#953800","#4e5dca","#a40e26","#116329","#7d4e00","#3d444d"];
  var W = 1100, H = 440, L = 86, R = 20, T = 16, B = 42, NB = 400, LABEL = 64;
  var vmax = D.vmax > 0 ? D.vmax * 1.05 : 1;
  var hasMarks = D.ranks.some(function (r) { return r.b && r.b.length; });
  var state = { axis: D.axis === "batch" && hasMarks ? "batch" : "time", pick: null };
  var cache = {};
  function el(name, attrs, parent) { var e = document.createElementNS(NS, name); for (var k in attrs) e.setAttribute(k, attrs[k]); if (parent) parent.appendChild(e); return e; }
  function bytes(v) { var u = ["B","KiB","MiB","GiB","TiB"], i = 0; while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; } return (i ? v.toFixed(1) : v) + " " + u[i]; }
  // series returns a rank's curve as [time, bytes] steps.
  function series(i) {
    if (cache[i]) return cache[i];
    var r = D.ranks[i], out = [];
    if (!D.band) {
      var t = D.t0, v = 0;
      for (var k = 0; k < r.pts.length; k += 2) { t += r.pts[k]; v += r.pts[k + 1]; out.push([t, v]); }
    } else {
      var s = atob(D.grid.cols[i]), n = D.grid.n, w = (D.t1 - D.t0 + 1) / n;
      for (var c = 0; c < n; c++) {
        var code = (s.charCodeAt(2 * c) << 8) | s.charCodeAt(2 * c + 1);
        if (code !== 65535) out.push([D.t0 + (c + 0.5) * w, code * D.grid.unit]);
      }
    }
    return (cache[i] = out);
  }
  function batchPos(b, t) {
    if (!b || !b.length) return NaN;
    for (var k = 0; k < b.length; k++) {
      if (t < b[k][1]) return k === 0 ? b[0][0] : b[k - 1][0] + 1;
      if (t <= b[k][2]) return b[k][0] + (t - b[k][1]) / Math.max(1, b[k][2] - b[k][1]);
    }
    return b[b.length - 1][0] + 1;
  }
  function pos(i, t) { return state.axis === "time" ? t : batchPos(D.ranks[i].b, t); }
  function domain() {
    if (state.axis === "time") return [D.t0, Math.max(D.t1, D.t0 + 1)];
    var lo = Infinity, hi = -Infinity;
    D.ranks.forEach(function (r) { if (r.b && r.b.length) { lo = Math.min(lo, r.b[0][0]); hi = Math.max(hi, r.b[r.b.length - 1][0] + 1); } });
    return isFinite(lo) ? [lo, Math.max(hi, lo + 1)] : [0, 1];
  }
  function draw() {
    var dom = domain(), x0 = dom[0], x1 = dom[1];
    function x(v) { return L + (v - x0) / (x1 - x0) * (W - L - R); }
    function y(v) { return H - B - v / vmax * (H - T - B); }
    function path(pts) { var d = ""; pts.forEach(function (p, k) { if (isNaN(p[0])) return; d += (d ? "H" + x(p[0]).toFixed(1) + "V" : "M" + x(p[0]).toFixed(1) + " ") + y(p[1]).toFixed(1); }); return d; }
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "allocated bytes of every rank", "data-axis": state.axis });
    axes(svg, x, y, x0, x1);
    var legend = document.getElementById("legend"); legend.textContent = "";
    function addLegend(label, color, nodes) {
      var s = document.createElement("span"), sw = document.createElement("i");
      sw.style.background = color; s.appendChild(sw); s.appendChild(document.createTextNode(label));
      s.onclick = function () { s.classList.toggle("off"); nodes.forEach(function (n) { n.style.display = s.classList.contains("off") ? "none" : ""; }); };
      legend.appendChild(s);
    }
    function curve(i, color, extra) {
      var r = D.ranks[i], g = el("g", { "data-rank": r.r }, svg);
      var pts = series(i).map(function (p) { return [pos(i, p[0]), p[1]]; });
      var p = el("path", { d: path(pts), stroke: color, "class": "curve" + (extra || ""), "data-rank": r.r }, g);
      el("title", {}, p).textContent = "rank " + r.r + ": peak " + bytes(r.peak);
      (r.ooms || []).forEach(function (o) { el("path", { d: "M" + x(pos(i, o[0])) + " " + (y(o[1]) - 9) + "l-5 -8h10z", "class": "oom" }, g); });
      return g;
    }
    if (!D.band) {
      D.ranks.forEach(function (r, i) { var c = PAL[i % PAL.length]; addLegend("rank " + r.r, c, [curve(i, c)]); });
    } else {
      var bm = band(x0, x1);
      var lo = bm.lo.slice().reverse();
      var bp = el("path", { d: "M" + bm.hi.map(function (p) { return x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1); }).join("L") + "L" + lo.map(function (p) { return x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1); }).join("L") + "Z", "class": "band" }, svg);
      addLegend("min–max of " + D.ranks.length + " ranks", "rgba(9,105,218,.3)", [bp]);
      var med = el("path", { d: "M" + bm.md.map(function (p) { return x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1); }).join("L"), "class": "median" }, svg);
      addLegend("median", "#0969da", [med]);
      D.outliers.forEach(function (rank, k) {
        var i = index(rank); if (i < 0) return;
        var c = PAL[(k + 1) % PAL.length]; addLegend("rank " + rank + " (far from the median)", c, [curve(i, c)]);
      });
      if (state.pick !== null && index(state.pick) >= 0) addLegend("rank " + state.pick + " (picked)", "#bf3989", [curve(index(state.pick), "#bf3989", " picked")]);
    }
    var chart = document.getElementById("chart"); chart.textContent = ""; chart.appendChild(svg);
    document.getElementById("axis-time").className = state.axis === "time" ? "on" : "";
    document.getElementById("axis-batch").className = state.axis === "batch" ? "on" : "";
  }
  function axes(svg, x, y, x0, x1) {
    for (var i = 0; i <= 5; i++) {
      var v = vmax / 1.05 * i / 5, yy = y(v);
      el("line", { x1: L, x2: W - R, y1: yy, y2: yy, "class": "grid" }, svg);
      el("text", { x: L - 6, y: yy + 4, "text-anchor": "end", "class": "tick" }, svg).textContent = bytes(v);
    }
    var ticks = [];
    if (state.axis === "time") { for (i = 0; i <= 6; i++) ticks.push(x0 + (x1 - x0) * i / 6); }
    else { var step = Math.max(1, Math.ceil((x1 - x0) / 12)); for (var b = Math.ceil(x0); b <= x1; b += step) ticks.push(b); }
    ticks.forEach(function (t) {
      var xx = x(t);
      el("line", { x1: xx, x2: xx, y1: H - B, y2: H - B + 5, "class": "axis" }, svg);
      var s = (x1 - x0) / 1e6;
      el("text", { x: xx, y: H - B + 18, "text-anchor": "middle", "class": "tick" }, svg).textContent = state.axis === "time" ?
        (s < 2 ? ((t - x0) / 1000).toFixed(0) + " ms" : ((t - x0) / 1e6).toFixed(s < 10 ? 2 : 1) + " s") : "batch " + t;
      if (state.axis === "batch") el("line", { x1: xx, x2: xx, y1: T, y2: H - B, "class": "batch" }, svg);
    });
    el("text", { x: W - R, y: H - 6, "text-anchor": "end", "class": "tick", id: "axis-label" }, svg).textContent =
      state.axis === "time" ? "time since the first event" : "batch + fraction of the batch (each rank's own marks)";
    el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, "class": "axis" }, svg);
    el("line", { x1: L, x2: L, y1: T, y2: H - B, "class": "axis" }, svg);
    // on the time axis, the first rank's batch starts: a line each, and a label
    // where it fits (labels at least LABEL px apart)
    var first = D.ranks.find(function (r) { return r.b && r.b.length; }), lastLabel = -Infinity;
    if (state.axis === "time" && first) first.b.forEach(function (b) {
      var xb = x(b[1]);
      el("line", { x1: xb, x2: xb, y1: T, y2: H - B, "class": "batch" }, svg);
      if (xb - lastLabel < LABEL || xb > W - R - 30) return;
      lastLabel = xb;
      el("text", { x: xb + 3, y: T + 10, "class": "tick batch-label" }, svg).textContent = "batch " + b[0];
    });
  }
  // band puts every rank on NB columns of the axis (the largest value in each,
  // the last one carried through empty columns) and takes each column's min,
  // median and max over the ranks present.
  function band(x0, x1) {
    var cols = [];
    for (var k = 0; k < NB; k++) cols.push([]);
    D.ranks.forEach(function (r, i) {
      var col = new Array(NB).fill(NaN), first = NB, last = -1;
      series(i).forEach(function (p) {
        var xv = pos(i, p[0]); if (isNaN(xv)) return;
        var c = Math.min(NB - 1, Math.max(0, Math.floor((xv - x0) / (x1 - x0) * NB)));
        col[c] = isNaN(col[c]) ? p[1] : Math.max(col[c], p[1]); first = Math.min(first, c); last = Math.max(last, c);
      });
      var carry = NaN;
      for (var c = first; c <= last; c++) { if (isNaN(col[c])) col[c] = carry; carry = col[c]; cols[c].push(col[c]); }
    });
    var out = { lo: [], md: [], hi: [] };
    cols.forEach(function (vs, c) {
      if (!vs.length) return;
      vs.sort(function (a, b) { return a - b; });
      var xc = x0 + (x1 - x0) * (c + 0.5) / NB, n = vs.length;
      out.lo.push([xc, vs[0]]); out.hi.push([xc, vs[n - 1]]);
      out.md.push([xc, n % 2 ? vs[(n - 1) / 2] : (vs[n / 2 - 1] + vs[n / 2]) / 2]);
    });
    return out;
  }
  function index(rank) { for (var i = 0; i < D.ranks.length; i++) if (D.ranks[i].r === rank) return i; return -1; }
  function showPicked() {
    var box = document.getElementById("picked"); if (!box) return;
    box.textContent = "";
    var i = state.pick === null ? -1 : index(state.pick); if (i < 0) return;
    var r = D.ranks[i], h = document.createElement("h2");
    h.textContent = "Rank " + r.r + ": top sites at its peak of " + bytes(r.peak); box.appendChild(h);
    var t = document.createElement("table"); t.id = "picked-sites";
    t.innerHTML = "<thead><tr><th class=l>site</th><th>bytes</th><th>blocks</th></tr></thead>";
    var tb = document.createElement("tbody");
    (r.s || []).forEach(function (s) {
      var tr = document.createElement("tr");
      [D.site_names[s[0]], bytes(s[1]), String(s[2])].forEach(function (v, k) { var td = document.createElement("td"); if (!k) td.className = "l"; td.textContent = v; tr.appendChild(td); });
      tb.appendChild(tr);
    });
    t.appendChild(tb); box.appendChild(t);
  }
  function fromHash() {
    location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      var p = kv.split("=");
      if (p[0] === "axis" && (p[1] === "time" || (p[1] === "batch" && hasMarks))) state.axis = p[1];
      if (p[0] === "rank" && /^[0-9]+$/.test(p[1])) state.pick = parseInt(p[1], 10);
    });
    var sel = document.getElementById("pick"); if (sel && state.pick !== null) sel.value = String(state.pick);
  }
  document.getElementById("axis-batch").disabled = !hasMarks;
  document.getElementById("axis-time").onclick = function () { state.axis = "time"; draw(); };
  document.getElementById("axis-batch").onclick = function () { state.axis = "batch"; draw(); };
  var sel = document.getElementById("pick");
  if (sel) sel.onchange = function () { state.pick = sel.value === "" ? null : parseInt(sel.value, 10); draw(); showPicked(); };
  fromHash();
  draw();
  showPicked();
  document.documentElement.setAttribute("data-ready-ms", String(Math.round(performance.now())));
})();`
