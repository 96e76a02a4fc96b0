"""On a machine with two GPUs or more: a trainer that puts its model on cuda:1
without torch.cuda.set_device (the current device stays 0) gets the hook's
figures of cuda:1, the device it uses, not of device 0.
  python3 scripts/gpu/device_choice.py"""
import sys

import torch

import memsnap_hook

if torch.cuda.device_count() < 2:
    print("device choice: SKIP (one device)")
    sys.exit(0)
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:1")
y = torch.randn(1024, 1024, device="cuda:1") @ torch.randn(1024, 1024, device="cuda:1")
torch.cuda.synchronize(1)
t = memsnap_hook._Torch()
m = t.memory()
want = {"allocated": torch.cuda.memory_allocated(1), "reserved": torch.cuda.memory_reserved(1),
        "device_total": torch.cuda.mem_get_info(1)[1]}
print("current device", torch.cuda.current_device(), "| hook's figures:", {k: m[k] for k in want}, "| torch's of cuda:1:", want,
      "| of cuda:0:", torch.cuda.memory_allocated(0))
ok = torch.cuda.current_device() == 0 and all(m[k] == v for k, v in want.items()) and m["allocated"] != torch.cuda.memory_allocated(0)
print("device choice: OK" if ok else "device choice: FAIL")
sys.exit(0 if ok else 1)
