"""Checks a merged summary's memory findings against what the trainers say they
hold (scripts/gpu/known_model.py's known.<rank>.json files).
argv: merged.summary.json, the folder of known.<rank>.json, the ranks expected,
      [--leak RANK] [--truncated RANK] [--no-outside]
Prints a line per rank and ALL OK or SOME CHECKS FAILED (exit 1)."""
import argparse
import json
import os
import sys

ap = argparse.ArgumentParser()
ap.add_argument("summary")
ap.add_argument("known")
ap.add_argument("ranks", type=int)
ap.add_argument("--leak", type=int, default=-1)
ap.add_argument("--truncated", type=int, default=-1)
ap.add_argument("--tolerance", type=float, default=0.02)
a = ap.parse_args()
summary = json.load(open(a.summary))
mib = lambda n: "%.1f MiB" % (n / 2**20)
close = lambda got, want: want > 0 and abs(got - want) <= a.tolerance * want
ok = sorted(r["rank"] for r in summary["ranks"]) == list(range(a.ranks))
if not ok:
    print("ranks in the summary: %s, want 0..%d: FAIL" % ([r["rank"] for r in summary["ranks"]], a.ranks - 1))
for r in summary["ranks"]:
    known = json.load(open(os.path.join(a.known, "known.%d.json" % r["rank"])))
    c = r.get("categories") or {}
    cats = c.get("at_peak", {})
    line = []
    for k in ("parameters", "gradients", "optimizer_state"):
        got, want = cats.get(k, 0), known[k]
        good = close(got, want)
        ok = ok and good
        line.append("%s %s (model: %s, %+.2f%%) %s" % (k, mib(got), mib(want), 100.0 * (got - want) / want, "OK" if good else "FAIL"))
    print("rank %d: peak %s in %s, %d watched tensors" % (r["rank"], mib(r["peak_allocated_bytes"]), r.get("peak_allocated_phase"), c.get("watched_tensors", 0)))
    print("  " + "\n  ".join(line))
    print("  activations %s, temporaries %s, unknown %s; top modules: %s" % (
        mib(cats.get("activations", 0)), mib(cats.get("temporaries", 0)), mib(cats.get("unknown", 0)),
        ", ".join("%s %s %s" % (m["module"], m["category"], mib(m["bytes"])) for m in (c.get("modules") or [])[:3])))
    o = r.get("outside_allocator")
    good = o is not None and o.get("at_peak_bytes", 0) > 0
    ok = ok and good
    print("  outside the allocator: %s -> %s" % (json.dumps(o), "OK" if good else "FAIL"))
    leak, trunc = r.get("leak"), r.get("truncated")
    if r["rank"] == a.leak:
        want = known.get("leak_per_batch", 0)
        site = (leak or {}).get("sites", [{}])[0] if (leak or {}).get("sites") else {}
        good = leak is not None and close(leak["per_batch_bytes"], want) and "train_categories.py" in site.get("site", "")
        print("  leak: %s per batch (planted: %s), top site %s (%s per batch) -> %s" % (
            mib(leak["per_batch_bytes"]) if leak else None, mib(want), site.get("site"), mib(site.get("per_batch_bytes", 0)), "OK" if good else "FAIL"))
        ok = ok and good
    elif leak is not None:
        print("  a steady rank flagged as leaking: %s -> FAIL" % json.dumps(leak)[:300])
        ok = False
    if r["rank"] == a.truncated:
        good = trunc is not None and trunc.get("suggest_max_entries", 0) > trunc.get("max_entries", 0)
        print("  truncated: %s -> %s" % (json.dumps(trunc), "OK" if good else "FAIL"))
        ok = ok and good
    elif trunc is not None:
        print("  truncated although its history held the window: %s -> FAIL" % json.dumps(trunc))
        ok = False
d = summary.get("diff")
if d:
    print("diff: %s against %s: categories %s" % (d.get("other", {}).get("label"), d.get("base", {}).get("label"), json.dumps((d.get("categories") or [])[:3])))
print("ALL OK" if ok else "SOME CHECKS FAILED")
sys.exit(0 if ok else 1)
