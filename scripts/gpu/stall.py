"""What a window costs the training thread: time torch.cuda.memory._snapshot() and
turning history off take after ENTRIES allocator events were recorded, with Python
stacks and with C++ stacks too, and what recording costs a training step.
Usage: stall.py [ENTRIES]"""
import sys
import time

import torch
import torch.nn as nn

entries = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
dev = torch.device("cuda", 0)
mem = torch.cuda.memory
model = nn.Sequential(*[nn.Sequential(nn.Linear(1024, 1024), nn.GELU()) for _ in range(8)]).to(dev)
opt = torch.optim.AdamW(model.parameters())


def step():
    x = torch.randn(256, 1024, device=dev)
    model(x).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def timed_steps(n):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n


for _ in range(20):
    step()
base = timed_steps(200)
for stacks in ("python", "all"):
    mem._record_memory_history(enabled="all", context="all", stacks=stacks, max_entries=entries)
    rec = timed_steps(200)
    while sum(len(t) for t in mem._snapshot()["device_traces"]) < entries:
        for _ in range(200):
            step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    s = mem._snapshot()
    snap = time.perf_counter() - t
    t = time.perf_counter()
    mem._record_memory_history(enabled=None)
    off = time.perf_counter() - t
    n = sum(len(tr) for tr in s["device_traces"])
    print("stacks=%s: %d events: _snapshot() %.0f ms, history off %.1f ms; step %.3f ms recording vs %.3f ms not (%+.1f%%)" % (
        stacks, n, snap * 1e3, off * 1e3, rec * 1e3, base * 1e3, (rec / base - 1) * 100), flush=True)
