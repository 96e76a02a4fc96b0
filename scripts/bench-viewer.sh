#!/usr/bin/env bash
# bench-viewer.sh: how large a merged pickle PyTorch's memory viewer handles.
#
# Builds merged torch memory-snapshot pickles of several sizes (64 ranks of varied
# event counts, synthesised by `benchtool gen`, merged by `memsnap merge`), opens
# each in PyTorch's own MemoryViz.js (what pytorch.org/memory_viz runs) and goes
# through every view it offers (Active Memory Timeline, Allocator State History,
# Active Cached Segment Timeline) for the first rank, the rank with the most
# events and the last rank; prints, for each size, whether every view rendered
# without error, the time, and the peak memory. It is what `--pickle-max-bytes`'s
# default (merge.DefaultPickleMaxBytes) is chosen from.
#
#   MEMORYVIZ=path/to/MemoryViz.js scripts/bench-viewer.sh
#
# MemoryViz.js is PyTorch's code: it is not in the torch wheel and is never
# committed here. It is torch/utils/viz/MemoryViz.js in the pytorch/pytorch
# repository; on a machine online:
#   curl -fLo .cache/viewer/MemoryViz.js \
#     https://raw.githubusercontent.com/pytorch/pytorch/main/torch/utils/viz/MemoryViz.js
# (or take it from a pytorch checkout) and copy it to the machine that measures.
#
# Why headless Chromium and not node+jsdom: Chromium is what users open the viewer
# in, and what runs out of memory there is the tab: its V8 heap limit (about 4 GiB,
# printed as "heap limit") and the renderer's resident memory, DOM and layout
# included. MemoryViz.js's Allocator State History puts one <pre> per trace event
# into the page and its timelines one SVG polygon per drawn allocation, which a
# browser lays out and paints; jsdom neither lays out nor paints, stores its DOM in
# the JS heap (so a heap bound means something else there), and lacks APIs the
# viewer calls (scrollIntoViewIfNeeded). The page is driven through the viewer's own
# selects, so its code runs unchanged; each view it has drawn stays in the page,
# hidden, as it does for a user.
#
# Offline: everything is served from 127.0.0.1 and MemoryViz.js's CDN imports of d3
# are mapped (an import map) to local ES-module bundles of the same versions (d3@5,
# d3-axis@1, d3-scale@1, d3-zoom@1, d3-brush@1) built with esbuild. The npm packages
# (those, puppeteer-core and esbuild) are installed once into $VIEWER_DEPS (default
# .cache/viewer, git-ignored) and reused: the first run needs the npm registry, or
# copy that folder from a machine that has it. Chromium: `apt-get install chromium`
# (or CHROMIUM=path); it runs --headless --no-sandbox --disable-gpu with a fresh
# profile, no network but 127.0.0.1.
#
# Environment:
#   MEMORYVIZ     path to MemoryViz.js (required)
#   SIZES         merged pickle sizes to build, MB (default "25 50 100 200 400")
#   RANKS         ranks per pickle (default 64)
#   VIEW_RANKS    ranks whose views are gone through: a list (0,3,63), "all", or
#                 empty for the first, the most-events and the last rank
#   HEAP_MB       give the tab this V8 heap (--js-flags=--max-old-space-size); empty:
#                 Chromium's default
#   TIMEOUT       seconds one pickle may take in the viewer (default 900)
#   PICKLES       space-separated existing merged pickles to measure instead of building
#   KEEP=1        keep the work folder (printed)
#   CHROMIUM, VIEWER_DEPS, BIN (a memsnap binary to use instead of building one)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

if [[ -z "${MEMORYVIZ:-}" || ! -f "${MEMORYVIZ:-}" ]]; then
  cat >&2 <<'EOF'
bench-viewer.sh: set MEMORYVIZ=path/to/MemoryViz.js.
  MemoryViz.js is PyTorch's memory viewer, torch/utils/viz/MemoryViz.js in the
  pytorch/pytorch repository (it is not in the torch wheel, and is not committed here):
    curl -fLo .cache/viewer/MemoryViz.js \
      https://raw.githubusercontent.com/pytorch/pytorch/main/torch/utils/viz/MemoryViz.js
    MEMORYVIZ=.cache/viewer/MemoryViz.js scripts/bench-viewer.sh
EOF
  exit 2
fi
memoryviz=$(realpath "$MEMORYVIZ")
sizes=${SIZES:-25 50 100 200 400}
ranks=${RANKS:-64}
timeout_s=${TIMEOUT:-900}
deps=${VIEWER_DEPS:-$repo/.cache/viewer}
chromium=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}
[[ -n "$chromium" ]] || { echo "bench-viewer.sh: no Chromium: apt-get install -y chromium, or set CHROMIUM" >&2; exit 2; }
command -v node >/dev/null || { echo "bench-viewer.sh: node (v18+) is needed" >&2; exit 2; }

# The d3 versions MemoryViz.js imports, read from its own import lines.
mapfile -t d3pkgs < <(grep -o 'cdn.skypack.dev/d3[a-z-]*@[0-9][0-9.]*' "$memoryviz" | sed 's|cdn.skypack.dev/||' | sort -u)
[[ ${#d3pkgs[@]} -gt 0 ]] || { echo "bench-viewer.sh: $memoryviz imports no d3 from cdn.skypack.dev: the import map needs updating" >&2; exit 2; }
mkdir -p "$deps"
need=()
for p in "${d3pkgs[@]}" puppeteer-core esbuild; do
  name=${p%@*}
  [[ -d "$deps/node_modules/$name" ]] || need+=("$p")
done
if [[ ${#need[@]} -gt 0 ]]; then
  echo "installing ${need[*]} into $deps (npm)" >&2
  [[ -f "$deps/package.json" ]] || echo '{"private": true}' >"$deps/package.json"
  (cd "$deps" && PUPPETEER_SKIP_DOWNLOAD=1 npm install --no-audit --no-fund --loglevel=error "${need[@]}" >&2)
fi
# One bundle per CDN module, code-split so that d3, d3-zoom and d3-brush share one
# d3-selection (and so one d3.event), as the CDN's modules do.
d3dir=$deps/d3
rm -rf "$deps/d3src" "$d3dir"
mkdir -p "$deps/d3src"
for p in "${d3pkgs[@]}"; do
  echo "export * from '${p%@*}';" >"$deps/d3src/${p%@*}.js"
done
"$deps/node_modules/.bin/esbuild" "$deps"/d3src/*.js --bundle --splitting --format=esm --outdir="$d3dir" --log-level=warning

work=$(mktemp -d /tmp/bench-viewer.XXXXXX)
if [[ "${KEEP:-0}" == 1 ]]; then echo "work folder: $work" >&2; else trap 'rm -rf "$work"' EXIT; fi

# Inputs: per size, 8 event-count levels from 0.5x to 1.5x the mean, spread over
# the ranks (rank r at level 5r mod 8), so ranks differ as a real job's do.
declare -A most
pickles=()
if [[ -n "${PICKLES:-}" ]]; then
  read -r -a pickles <<<"$PICKLES"
else
  if [[ -n "${BIN:-}" ]]; then memsnap=$BIN; else
    CGO_CFLAGS=-Wno-deprecated-declarations go build -o "$work/memsnap" ./cmd/memsnap
    memsnap=$work/memsnap
  fi
  go build -o "$work/benchtool" ./scripts/benchtool
  base=$repo/testdata/snapshots/single/transformer.memory_snapshot.pickle
  per_level=$(( (ranks + 7) / 8 ))
  for mb in $sizes; do
    # about 67 merged-pickle bytes per requested trace event (measured: gen rounds up)
    mean=$(( mb * 1048576 * 10 / 670 / ranks ))
    d=$work/${mb}mb
    mkdir -p "$d/in"
    for l in 0 1 2 3 4 5 6 7; do
      ev=$(( mean * (7 + 2 * l) / 14 ))
      mkdir -p "$d/l$l"
      "$work/benchtool" gen -events "$ev" -ranks "$per_level" -balance -out "$d/l$l" "$base" >/dev/null
    done
    for ((r = 0; r < ranks; r++)); do
      l=$(( 5 * r % 8 ))
      ln "$d/l$l/rank$(( r / 8 )).1.memory_snapshot.pickle" "$d/in/rank$r.1.memory_snapshot.pickle"
      if [[ $l == 7 && -z "${most[$d/out/merged.memory_snapshot.pickle]:-}" ]]; then most[$d/out/merged.memory_snapshot.pickle]=$r; fi
    done
    "$memsnap" merge -q --out "$d/out" --pickle-max-bytes $((1 << 40)) "$d/in" >/dev/null
    rm -rf "$d"/l? "$d/in"
    pickles+=("$d/out/merged.memory_snapshot.pickle")
    echo "built $(du -m "$d/out/merged.memory_snapshot.pickle" | cut -f1) MB pickle of $ranks ranks ($mean events a rank on average)" >&2
  done
fi

results=()
for p in "${pickles[@]}"; do
  view_ranks=${VIEW_RANKS:-}
  if [[ -z "$view_ranks" ]]; then view_ranks="0,${most[$p]:-0},last"; fi
  echo "== $p (views of ranks $view_ranks)" >&2
  out=$work/$(basename "$(dirname "$(dirname "$p")")")-$(basename "$p").json
  timeout -k 10 $((timeout_s + 60)) node scripts/viewer/measure.mjs --memoryviz "$memoryviz" --d3 "$d3dir" --deps "$deps" \
    --chromium "$chromium" --pickle "$p" --ranks "$view_ranks" --timeout "$timeout_s" ${HEAP_MB:+--heap-mb "$HEAP_MB"} --json "$out" >/dev/null || true
  [[ -s "$out" ]] || echo "{\"pickle\": \"$p\", \"pickle_bytes\": $(stat -c %s "$p"), \"ok\": false, \"error\": \"measure.mjs gave no result\", \"steps\": []}" >"$out"
  results+=("$out")
done

echo
node -e '
const fs = require("fs");
const mib = b => b ? (b / 2 ** 20).toFixed(0) : "-";
const rows = process.argv.slice(1).map(f => JSON.parse(fs.readFileSync(f, "utf8")));
const heap = rows.map(r => r.heap_limit_bytes).find(Boolean);
console.log(`MemoryViz.js in ${rows.map(r => r.chromium).find(Boolean) || "Chromium"}, tab heap limit ${mib(heap)} MiB`);
console.log("| pickle MiB | ranks | views OK | load + first view s | all views s | total s | peak renderer RSS MiB | peak JS heap MiB | result |");
console.log("|---|---|---|---|---|---|---|---|---|");
for (const r of rows) {
  const views = r.steps.filter(s => s.step !== "load + first view");
  const okv = views.filter(s => s.ok).length;
  const first = r.steps[0] || {};
  const vs = views.reduce((a, s) => a + (s.seconds || 0), 0);
  const res = r.ok ? "ok" : "FAILED at " + (r.steps.find(s => !s.ok) || {step: "start"}).step + ": " + String(r.error || "").slice(0, 120);
  console.log(`| ${(r.pickle_bytes / 2 ** 20).toFixed(0)} | ${r.devices ?? "-"} (views of ${(r.ranks || []).join(",") || "-"}) | ${okv}/${(r.ranks || []).length * (r.views || []).length || "-"} | ${first.ok ? first.seconds : "failed"} | ${vs.toFixed(1)} | ${r.seconds ?? "-"} | ${mib(r.peak_renderer_rss_bytes)} | ${mib(r.peak_js_heap_bytes)} | ${res} |`);
}
' "${results[@]}"
