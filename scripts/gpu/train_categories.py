"""A trainer with known sizes for memsnap's categories (scripts/gpu/known_model.py),
told to the hook with memsnap_hook.watch. It writes the bytes its parameters,
gradients and optimizer state must hold to $MEMSNAP_KNOWN/known.<rank>.json. Rank
$MEMSNAP_LEAK_RANK keeps $MEMSNAP_LEAK_MIB MiB (default 32) more every batch (a
planted leak). Every rank shares GPU 0 and no gradients are reduced (a process group
only keeps the ranks in step), so nothing but the model, its optimizer, the step's
activations and the leak is on the device. It stops a few batches after its window.
argv: batch limit, pause seconds between batches"""
import os
import sys
import time

import torch
import torch.distributed as dist

import memsnap_hook
from known_model import Done, encoder, inputs, known

limit = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.02
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
model = encoder().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
memsnap_hook.watch(model, opt)
leak_rank = int(os.environ.get("MEMSNAP_LEAK_RANK", "-1"))
leak = int(os.environ.get("MEMSNAP_LEAK_MIB", "32")) << 20
known(model, rank, {"leak_per_batch": leak if rank == leak_rank else 0})
kept = []
hook = memsnap_hook.get_hook()
done = Done(hook, limit)
b, stop = 0, False
while not stop:
    with hook.step(b):
        x = inputs(dev)
        opt.zero_grad(set_to_none=True)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        if rank == leak_rank:
            kept.append(torch.empty(leak, dtype=torch.uint8, device=dev))  # the planted leak
        torch.cuda.synchronize()
    # every rank stops together: one that stopped alone would hang the others' barrier
    flag = torch.tensor([1 if done(b) else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    stop = bool(flag.item())
    time.sleep(pause)
    b += 1
hook.close()
if hook.errors:
    print("rank %d hook errors: %s" % (rank, hook.errors), flush=True)
print("rank %d ran %d batches" % (rank, b), flush=True)
dist.destroy_process_group()
