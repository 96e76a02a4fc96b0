"""A trainer on a real GPU for scripts/gpu-live.sh (step 3): an OOM with enough
memory free in the allocator's segments, in pieces none large enough.

Under a 1,600 MiB cap, batch 7 carves a cached 1,500 MiB segment into fifteen
100 MiB blocks, frees every other one (700 MiB free, in 100 MiB pieces) and asks
for 300 MiB: an OOM. Right after it, the trainer prints torch's own figures as a
line "FRAG {json}": reserved, allocated and the largest free block of
torch.cuda.memory_snapshot()'s segments. Then it frees more (the pieces join)
and trains on, so a window's snapshot must be replayed back past that to tell
the largest block at the OOM.
"""
import json
import time

import torch

import memsnap_hook

MiB = 1 << 20
dev = torch.device("cuda")
torch.cuda.init()
torch.cuda.set_per_process_memory_fraction(1600 * MiB / torch.cuda.mem_get_info()[1])


def largest_free():
    best = 0
    for seg in torch.cuda.memory_snapshot():
        run = 0
        for b in seg["blocks"]:
            if b["state"] == "inactive":
                run += b["size"]
                best = max(best, run)
            else:
                run = 0
    return best


kept = []
for b in range(14):
    with memsnap_hook.step(b):
        x = torch.randn(256, 256, device=dev)
        (x @ x).sum().item()
        if b == 7:
            big = torch.empty(1500 * MiB, dtype=torch.uint8, device=dev)
            del big  # one 1,500 MiB segment, cached
            parts = [torch.empty(100 * MiB, dtype=torch.uint8, device=dev) for _ in range(15)]
            kept = parts[::2]
            del parts  # seven 100 MiB holes between the eight blocks kept
            try:
                torch.empty(300 * MiB, dtype=torch.uint8, device=dev)
                print("FAIL: 300 MiB fit", flush=True)
            except torch.cuda.OutOfMemoryError:
                print("FRAG " + json.dumps({"asked": 300 * MiB, "reserved": torch.cuda.memory_reserved(),
                                            "allocated": torch.cuda.memory_allocated(), "largest_free": largest_free()}), flush=True)
        if b == 9:
            del kept[:4]  # the first holes join: a larger free block after the OOM
    torch.cuda.synchronize()
    time.sleep(0.3)  # a step's time: the agent's window reaches the hook before it starts
print("frag trainer done", flush=True)
