"""A small DDP job instrumented with the memsnap hook. With MEMSNAP_BACKEND=nccl each
rank drives GPU local_rank; with gloo (the default) every rank shares GPU 0. Ranks
differ on purpose: the batch grows with the rank, and the last rank holds an extra
96 MiB buffer from batch 4 on. Run under `memsnap agent` via torchrun.
argv: batches [pause seconds between batches]
MEMSNAP_FAIL_RANK=R MEMSNAP_FAIL_AFTER=N: rank R raises an uncaught exception N batches
into the first window it records (scripts/gpu-crash.sh)."""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import memsnap_hook

batches = int(sys.argv[1]) if len(sys.argv) > 1 else 12
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
backend = os.environ.get("MEMSNAP_BACKEND", "gloo")
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) if backend == "nccl" else 0)
torch.cuda.set_device(dev)
hidden = 1536
model = nn.Sequential(*[nn.Sequential(nn.Linear(hidden, hidden), nn.GELU()) for _ in range(6)], nn.Linear(hidden, 10)).to(dev)
ddp = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
hook = memsnap_hook.get_hook()
fail_rank = int(os.environ.get("MEMSNAP_FAIL_RANK", "-1"))
fail_after = int(os.environ.get("MEMSNAP_FAIL_AFTER", "10"))
keep = None
for b in range(batches):
    w = hook.recording()
    if rank == fail_rank and w is not None and b >= w["start"] + fail_after:
        raise RuntimeError("planted failure of rank %d at batch %d, %d batches into window %d" % (rank, b, b - w["start"], w["id"]))
    with hook.step(b):
        x = torch.randn(64 * (rank + 1), hidden, device=dev)
        if rank == world - 1 and b == 4:
            keep = torch.empty(96 << 20, dtype=torch.uint8, device=dev)
        y = torch.randint(0, 10, (x.shape[0],), device=dev)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
    dist.barrier()
    time.sleep(pause)  # lets the hook's thread report progress
hook.close()
if hook.errors:
    print("rank %d hook errors: %s" % (rank, hook.errors), flush=True)
dist.destroy_process_group()
