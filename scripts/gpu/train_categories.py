"""A trainer with known sizes for memsnap's categories: a transformer encoder with
AdamW, told to the hook with memsnap_hook.watch. It writes the bytes its
parameters, gradients and optimizer state must hold (from the model itself) to
$MEMSNAP_KNOWN/known.<rank>.json. Rank $MEMSNAP_LEAK_RANK keeps 64 MiB more every
batch (a planted leak). Every rank shares GPU 0 and no gradients are reduced (a
process group only keeps the ranks in step), so nothing but the model, its
optimizer and the step's activations is on the device.
argv: batches [pause seconds between batches]"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import memsnap_hook

batches = int(sys.argv[1]) if len(sys.argv) > 1 else 100
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.02
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
layer = nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True)
model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
memsnap_hook.watch(model, opt)
params = sum(p.numel() * p.element_size() for p in model.parameters())
known = {"parameters": params, "gradients": params, "optimizer_state": 2 * params}
out = os.environ.get("MEMSNAP_KNOWN")
if out:
    with open(os.path.join(out, "known.%d.json" % rank), "w") as f:
        json.dump(known, f)
leak_rank = int(os.environ.get("MEMSNAP_LEAK_RANK", "-1"))
kept = []
hook = memsnap_hook.get_hook()
for b in range(batches):
    with hook.step(b):
        x = torch.randn(8, 256, 1024, device=dev)
        opt.zero_grad(set_to_none=True)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        if rank == leak_rank:
            kept.append(torch.empty(64 << 20, dtype=torch.uint8, device=dev))  # the planted leak
        torch.cuda.synchronize()
    dist.barrier()
    time.sleep(pause)
hook.close()
if hook.errors:
    print("rank %d hook errors: %s" % (rank, hook.errors), flush=True)
dist.destroy_process_group()
