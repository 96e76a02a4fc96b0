"""A trainer on a real GPU for scripts/gpu-live.sh.

  live_trainer.py figures METRICS_URL   40 batches, then checks the agent's metrics
                                        against torch's own figures at the batch
                                        they name, and times the hook's report
  live_trainer.py leak MIB              leaks MIB MiB a batch on rank 1 (RANK) until
                                        it runs out of memory
"""
import os
import re
import sys
import time
import urllib.request

import torch

import memsnap_hook

dev = torch.device("cuda")
rank = int(os.environ.get("RANK", "0"))
model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
memsnap_hook.watch(model, opt)


def train_step():
    x = torch.randn(128, 2048, device=dev)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def figures():
    url = sys.argv[2]
    seen = {}
    for b in range(40):
        with memsnap_hook.step(b):
            train_step()
        torch.cuda.synchronize()
        st = torch.cuda.memory_stats()
        free, total = torch.cuda.mem_get_info()
        seen[b] = {"allocated": st["allocated_bytes.all.current"], "reserved": st["reserved_bytes.all.current"],
                   "peak": st["allocated_bytes.all.peak"], "free": free, "total": total}
        time.sleep(0.1)
    time.sleep(1.5)
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    got = {}
    for m in re.finditer(r"^(memsnap_[a-z_]+)\{[^}]*\} (\S+)$", text, re.M):
        got[m.group(1)] = float(m.group(2))
    b = int(got["memsnap_batch"])
    want = seen[b]
    print("the agent's figures at batch %d:" % b, {k: int(v) for k, v in got.items() if k.endswith("bytes")})
    print("torch's at batch %d:" % b, want)
    ok = True
    for k, name in (("allocated", "memsnap_allocated_bytes"), ("reserved", "memsnap_reserved_bytes"), ("peak", "memsnap_peak_allocated_bytes")):
        if int(got[name]) != want[k]:
            print("FAIL: %s = %d, torch says %d" % (name, got[name], want[k]))
            ok = False
    if int(got["memsnap_device_total_bytes"]) != want["total"]:
        print("FAIL: device total %d, torch says %d" % (got["memsnap_device_total_bytes"], want["total"]))
        ok = False
    used = want["total"] - want["free"]
    if abs(got["memsnap_device_used_bytes"] - used) > 0.02 * want["total"]:
        print("FAIL: device used %d, cudaMemGetInfo says %d" % (got["memsnap_device_used_bytes"], used))
        ok = False
    nv = got.get("memsnap_nvml_device_used_bytes")
    if nv is None or abs(nv - used) > 0.02 * want["total"]:
        print("FAIL: NVML's device used %s, cudaMemGetInfo says %d" % (nv, used))
        ok = False
    print("device used: metric %d, NVML %s, cudaMemGetInfo %d; device total: metric %d, NVML %s, cudaMemGetInfo %d" % (
        got["memsnap_device_used_bytes"], nv, used, got["memsnap_device_total_bytes"], got.get("memsnap_nvml_device_total_bytes"), want["total"]))
    # the hook's cost on the training thread, with real torch
    h = memsnap_hook.get_hook()

    def per_step(every):
        h._mem_every = every
        n = 3000
        t = time.perf_counter()
        for i in range(n):
            h._mem_next = 0.0
            h.batch_start(100000 + i)
            h.batch_end(100000 + i)
        return (time.perf_counter() - t) / n * 1e6
    off, on = per_step(0), per_step(1e-9)
    print("hook cost per step: %.2f us without a report, %.2f us with a report read every step (it reads once a second)" % (off, on))
    print("figures: OK" if ok else "figures: FAIL")
    sys.exit(0 if ok else 1)


def leak():
    mib = int(sys.argv[2])
    keep = []
    torch.cuda.set_per_process_memory_fraction(0.05)
    for b in range(100000):
        with memsnap_hook.step(b):
            train_step()
            if rank == 1:
                keep.append(torch.empty(mib << 20, dtype=torch.uint8, device=dev))  # the leak
        time.sleep(0.2)


if __name__ == "__main__":
    {"figures": figures, "leak": leak}[sys.argv[1]]()
