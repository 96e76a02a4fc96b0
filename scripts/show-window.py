"""Print a `memsnap snapshot --wait-all --json` result and its manifest; exit 1 unless
the window was published with every rank of the world.
usage: python3 scripts/show-window.py RESULT.json WORLD_SIZE"""
import json
import sys

r = json.load(open(sys.argv[1]))
world = int(sys.argv[2])
print("window %d [%d, %d): %s, ranks %s, missing %s" % (r["window"], r["start"], r["stop"], r["state"], r["ranks"], r["missing"]))
m = json.load(open(r["manifest"]))
print("manifest %s:" % r["manifest"])
print("  window %s, reason %s, ranks merged %s, inputs:" % (m["window"], m.get("reason"), m["ranks_merged"]))
for i in m["inputs"]:
    print("    rank %d: %s" % (i["rank"], i["source"]))
sys.exit(0 if r["state"] == "published" and r["ranks"] == list(range(world)) else 1)
