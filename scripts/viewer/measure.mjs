// measure.mjs: open one merged torch memory-snapshot pickle in PyTorch's own
// MemoryViz.js, in headless Chromium, the way a user does on pytorch.org/memory_viz,
// then go through every view MemoryViz.js offers for the chosen ranks; report
// whether each rendered without error, how long it took and the memory it took.
// scripts/bench-viewer.sh drives it (it explains the choice of Chromium over
// node+jsdom); run by hand:
//
//   node scripts/viewer/measure.mjs --memoryviz MemoryViz.js --d3 D3DIR --deps DEPS \
//     --chromium /usr/bin/chromium --pickle merged.memory_snapshot.pickle [--ranks 0,17,63] \
//     [--timeout 900] [--heap-mb N] [--json out.json]
//
// D3DIR holds d3.js, d3-axis.js, d3-scale.js, d3-zoom.js, d3-brush.js (ES modules,
// bundled by bench-viewer.sh from npm); the page's import map points the CDN
// addresses MemoryViz.js imports at them, so nothing leaves 127.0.0.1. DEPS is the
// folder whose node_modules holds puppeteer-core. MemoryViz.js is read, never changed.
//
// Memory: the renderer process's peak resident set (VmHWM in /proc, polled, so a
// crashed renderer's last reading stands) and the page's JS heap (performance.memory,
// precise) after each step, against the heap limit V8 reports for the tab.
// One line of JSON goes to stdout (and --json); progress goes to stderr.

import {createRequire} from 'node:module';
import {parseArgs} from 'node:util';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';

const {values: opt} = parseArgs({
  options: {
    memoryviz: {type: 'string'},
    d3: {type: 'string'},
    deps: {type: 'string'},
    chromium: {type: 'string'},
    pickle: {type: 'string'},
    ranks: {type: 'string', default: ''},
    timeout: {type: 'string', default: '900'},
    'heap-mb': {type: 'string', default: ''},
    json: {type: 'string', default: ''},
  },
});
for (const k of ['memoryviz', 'd3', 'deps', 'chromium', 'pickle']) {
  if (!opt[k]) {
    console.error(`measure.mjs: --${k} is required`);
    process.exit(2);
  }
}
const require = createRequire(path.join(path.resolve(opt.deps), 'package.json'));
const puppeteer = require('puppeteer-core');

const timeoutMs = Number(opt.timeout) * 1000;
const started = Date.now();
const elapsed = () => (Date.now() - started) / 1000;
const log = msg => console.error(`[${elapsed().toFixed(1)}s] ${msg}`);

// The CDN modules MemoryViz.js imports, and the local bundles that stand for them.
const importMap = {
  imports: {
    'https://cdn.skypack.dev/d3@5': '/d3/d3.js',
    'https://cdn.skypack.dev/d3-axis@1': '/d3/d3-axis.js',
    'https://cdn.skypack.dev/d3-scale@1': '/d3/d3-scale.js',
    'https://cdn.skypack.dev/d3-zoom@1': '/d3/d3-zoom.js',
    'https://cdn.skypack.dev/d3-brush@1': '/d3/d3-brush.js',
  },
};
const indexHtml = `<!doctype html><html><head><meta charset="utf-8">
<script type="importmap">${JSON.stringify(importMap)}</script>
<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push('error: ' + (e.error && e.error.stack || e.message)));
window.addEventListener('unhandledrejection', e => window.__errors.push('unhandled rejection: ' + (e.reason && e.reason.stack || e.reason)));
</script>
<script type="module">
import * as mv from '/MemoryViz.js';
window.__mv = mv;
window.__ready = true;
</script>
</head><body></body></html>`;

const pickleSize = fs.statSync(opt.pickle).size;
const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://x');
  const send = (type, file) => {
    res.writeHead(200, {'content-type': type, 'cache-control': 'no-store'});
    fs.createReadStream(file).pipe(res);
  };
  if (url.pathname === '/' || url.pathname === '/index.html') {
    res.writeHead(200, {'content-type': 'text/html'});
    res.end(indexHtml);
  } else if (url.pathname === '/MemoryViz.js') {
    send('text/javascript', opt.memoryviz);
  } else if (url.pathname.startsWith('/d3/') && /^[\w.-]+$/.test(url.pathname.slice(4))) {
    send('text/javascript', path.join(opt.d3, url.pathname.slice(4)));
  } else if (url.pathname === '/snapshot.pickle') {
    res.writeHead(200, {'content-type': 'application/octet-stream', 'content-length': pickleSize});
    fs.createReadStream(opt.pickle).pipe(res);
  } else if (url.pathname === '/favicon.ico') {
    res.writeHead(204);
    res.end();
  } else {
    res.writeHead(404);
    res.end();
  }
});
await new Promise(r => server.listen(0, '127.0.0.1', r));
const base = `http://127.0.0.1:${server.address().port}`;

const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'memsnap-viewer-'));
const args = [
  '--no-sandbox',
  '--disable-gpu',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
  '--disable-dev-shm-usage',
  '--enable-precise-memory-info',
  `--user-data-dir=${userDataDir}`,
  '--window-size=1600,1000',
];
if (opt['heap-mb']) {
  args.push(`--js-flags=--max-old-space-size=${opt['heap-mb']}`);
}

const result = {
  pickle: opt.pickle,
  pickle_bytes: pickleSize,
  chromium: null,
  heap_limit_bytes: null,
  ranks: [],
  steps: [],
  ok: false,
  error: null,
  seconds: null,
  peak_renderer_rss_bytes: 0,
  peak_browser_rss_bytes: 0,
  peak_js_heap_bytes: 0,
};

// Peak memory, polled from /proc: the renderer's own high-water mark and the
// whole browser's summed resident set.
function descendants(pid) {
  const out = [];
  const kids = {};
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      (kids[ppid] ||= []).push(Number(d));
    } catch {}
  }
  const todo = [pid];
  while (todo.length) {
    const p = todo.pop();
    out.push(p);
    todo.push(...(kids[p] || []));
  }
  return out;
}
function statusKB(pid, field) {
  try {
    const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm'));
    return m ? Number(m[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}
let browserPid = null;
function sampleMemory() {
  if (!browserPid) return;
  let total = 0;
  for (const p of descendants(browserPid)) {
    total += statusKB(p, 'VmRSS');
    let cmd = '';
    try {
      cmd = fs.readFileSync(`/proc/${p}/cmdline`, 'utf8');
    } catch {}
    if (cmd.includes('--type=renderer') && !cmd.includes('--extension-process')) {
      result.peak_renderer_rss_bytes = Math.max(result.peak_renderer_rss_bytes, statusKB(p, 'VmHWM'));
    }
  }
  result.peak_browser_rss_bytes = Math.max(result.peak_browser_rss_bytes, total);
}
const sampler = setInterval(sampleMemory, 200);

let browser;
let crashed = null;
const pageErrors = [];
const deadline = started + timeoutMs;
const left = () => Math.max(1000, deadline - Date.now());

async function finish(code) {
  clearInterval(sampler);
  sampleMemory();
  result.seconds = Number(elapsed().toFixed(1));
  const line = JSON.stringify(result);
  if (opt.json) fs.writeFileSync(opt.json, line + '\n');
  console.log(line);
  try {
    if (browser) await Promise.race([browser.close(), new Promise(r => setTimeout(r, 10000))]);
  } catch {}
  try {
    if (browser && browser.process()) browser.process().kill('SIGKILL');
  } catch {}
  server.close();
  fs.rmSync(userDataDir, {recursive: true, force: true});
  process.exit(code);
}
const watchdog = setTimeout(() => {
  result.error = result.error || `timed out after ${opt.timeout}s`;
  finish(1);
}, timeoutMs + 5000);
watchdog.unref();

try {
  browser = await puppeteer.launch({
    executablePath: opt.chromium,
    headless: true,
    args,
    protocolTimeout: timeoutMs + 60000,
    defaultViewport: {width: 1600, height: 1000},
  });
  browserPid = browser.process().pid;
  result.chromium = await browser.version();
  const page = await browser.newPage();
  page.on('error', e => {
    crashed = String(e && e.message || e);
  });
  page.on('pageerror', e => pageErrors.push(String(e && e.stack || e)));
  page.on('console', m => {
    if (m.type() === 'error') pageErrors.push('console.error: ' + m.text());
  });
  page.on('requestfailed', r => pageErrors.push(`request failed: ${r.url()} ${r.failure() && r.failure().errorText}`));

  await page.goto(base + '/', {waitUntil: 'load', timeout: left()});
  await page.waitForFunction('window.__ready === true || window.__errors.length > 0', {timeout: Math.min(left(), 60000)});
  const early = await page.evaluate('window.__errors');
  if (early.length) throw new Error('MemoryViz.js did not load: ' + early.join('; '));
  result.heap_limit_bytes = await page.evaluate('performance.memory.jsHeapSizeLimit');

  // Two animation frames: the browser has laid out and painted what the step
  // added, and the Allocator State History's own requestAnimationFrame (it
  // draws the selected event's memory) has run.
  const settle = () =>
    page.evaluate('new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(r, 0))))');
  const state = async () => {
    const [heap, errors] = await page.evaluate('[performance.memory.usedJSHeapSize, window.__errors.slice()]');
    result.peak_js_heap_bytes = Math.max(result.peak_js_heap_bytes, heap);
    sampleMemory();
    return {heap, errors: errors.concat(pageErrors.splice(0))};
  };
  // What the visible view holds: MemoryViz.js shows the selected view's div
  // with style "display: float" and hides the others.
  const rendered = () =>
    page.evaluate(`(() => {
      const divs = [...document.body.children].filter(d => d.tagName === 'DIV' && (d.getAttribute('style') || '').includes('display: float'));
      if (divs.length !== 1) return {ok: false, why: divs.length + ' views shown'};
      const d = divs[0];
      const shapes = d.querySelectorAll('polygon, rect').length;
      const pres = d.querySelectorAll('pre').length;
      return {ok: shapes > 0, shapes, pres, why: shapes > 0 ? '' : 'nothing drawn'};
    })()`);

  const step = async (name, fn) => {
    const t = Date.now();
    const s = {step: name, ok: false, seconds: null, js_heap_bytes: null, renderer_rss_bytes: null, error: null};
    result.steps.push(s);
    try {
      await fn();
      await settle();
      const st = await state();
      s.js_heap_bytes = st.heap;
      const r = await rendered();
      s.shapes = r.shapes;
      s.pres = r.pres;
      if (st.errors.length) s.error = st.errors.join('; ').slice(0, 2000);
      else if (!r.ok) s.error = r.why;
      else s.ok = true;
    } catch (e) {
      s.error = crashed ? `renderer crashed (${crashed}): out of memory` : String(e && e.message || e).slice(0, 2000);
    }
    s.seconds = Number(((Date.now() - t) / 1000).toFixed(1));
    sampleMemory();
    s.renderer_rss_bytes = result.peak_renderer_rss_bytes;
    log(`${name}: ${s.ok ? 'ok' : 'FAILED: ' + s.error} in ${s.seconds}s, JS heap ${(s.js_heap_bytes / 2 ** 20 || 0).toFixed(0)} MiB, renderer peak RSS ${(result.peak_renderer_rss_bytes / 2 ** 20).toFixed(0)} MiB`);
    return s.ok;
  };

  // Load: fetch, unpickle, annotate, and draw the first view (Active Memory
  // Timeline of the first device), as a dropped file is.
  const loaded = await step('load + first view', async () => {
    await page.evaluate(`window.__mv.add_remote_files([{name: ${JSON.stringify(path.basename(opt.pickle))}, url: '/snapshot.pickle'}])`);
    await page.waitForFunction('document.querySelectorAll("select")[2].options.length > 0 || window.__errors.length > 0', {
      timeout: left(),
      polling: 500,
    });
  });
  if (!loaded) throw new Error('the pickle did not load');

  const [views, devices] = await page.evaluate(`(() => {
    const s = document.querySelectorAll('select');
    return [[...s[1].options].map(o => o.value), [...s[2].options].map(o => o.value)];
  })()`);
  result.views = views;
  result.devices = devices.length;
  let ranks = opt.ranks ? opt.ranks.split(',').filter(Boolean) : [devices[0], devices.at(-1)];
  if (opt.ranks === 'all') ranks = devices;
  ranks = [...new Set(ranks.map(r => (r === 'last' ? devices.at(-1) : r)))].filter(r => devices.includes(r));
  result.ranks = ranks;

  // Every view of every chosen rank, switched to as the selects do. MemoryViz.js
  // keeps each view it has drawn (hidden), so memory adds up as a user's does.
  let ok = true;
  outer: for (const rank of ranks) {
    for (const v of views) {
      ok = await step(`rank ${rank}: ${v}`, async () => {
        await page.evaluate(
          (v, rank) => {
            const s = document.querySelectorAll('select');
            s[1].value = v;
            s[2].value = rank;
            s[2].dispatchEvent(new Event('change'));
          },
          v,
          rank,
        );
      });
      if (!ok) break outer;
    }
  }
  result.ok = ok;
  if (!ok) result.error = result.steps.at(-1).error;
} catch (e) {
  result.error = crashed ? `renderer crashed (${crashed}): out of memory` : String(e && e.message || e).slice(0, 2000);
  if (result.steps.length && !result.steps.at(-1).error) result.steps.at(-1).error = result.error;
}
await finish(result.ok ? 0 : 1);
