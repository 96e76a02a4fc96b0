"""Checks a GPU end-to-end run: every rank's snapshot covers exactly the asked
batches, decodes with memsnap's codec to the same figures CPython computes, and
carries NVML samples. Usage: check.py MEMSNAP STORE_PREFIX WORLD START STOP"""
import glob
import json
import os
import subprocess
import sys

memsnap, prefix, world, start, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
here = os.path.dirname(os.path.abspath(__file__))
figures = os.path.join(here, "..", "..", "testdata", "figures.py")
ok = True
for r in range(world):
    snap = os.path.join(prefix, "rank%d.%d.memory_snapshot.pickle" % (r, stop))
    meta_path = os.path.join(prefix, "rank%d.%d.memory_snapshot.memsnap.json" % (r, stop))
    if not os.path.exists(snap):
        print("rank %d: MISSING %s" % (r, snap)); ok = False; continue
    meta = json.load(open(meta_path))
    batches = [b["batch"] for b in meta.get("batches", [])]
    ours = json.loads(subprocess.check_output([memsnap, "inspect", "--json", snap]))
    ref = json.loads(subprocess.check_output([sys.executable, figures, snap]))
    samples = meta.get("nvml_samples") or []
    gpu = meta.get("gpu") or {}
    first_ev = None
    import pickle
    s = pickle.load(open(snap, "rb"))
    evs = [e for t in s["device_traces"] for e in t]
    inside = all(meta["batches"][0]["start_us"] - 2000 <= e["time_us"] <= meta["batches"][-1]["end_us"] + 2000 for e in evs)
    good = batches == list(range(start, stop)) and ours == ref and len(samples) > 0 and inside and len(evs) > 0
    ok = ok and good
    print("rank %d: batches %s, events %d (inside the window: %s), memsnap figures == CPython figures: %s, "
          "peak allocated %d, NVML samples %d (device used %.1f..%.1f GiB), GPU %s %s -> %s" % (
              r, batches, len(evs), inside, ours == ref, ours["devices"][0]["peak_allocated_bytes"] if ours["devices"] else -1,
              len(samples), min((x["device_used_bytes"] for x in samples), default=0) / 2**30,
              max((x["device_used_bytes"] for x in samples), default=0) / 2**30, gpu.get("name"), gpu.get("uuid"),
              "OK" if good else "FAIL"))
print("ALL OK" if ok else "SOME CHECKS FAILED")
sys.exit(0 if ok else 1)
