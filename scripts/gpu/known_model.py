"""The model every categories trainer uses, and the bytes it must hold.

A transformer encoder (4 layers, d_model 1024) trained with AdamW on small batches,
so that each step's activations (about 170 MiB) stay below what AdamW's foreach step
holds for a moment (its temporaries, as large as the parameters): each rank's peak
is then in the optimizer step, where parameters, gradients and optimizer state are
all alive, and their bytes there are what the model says:
parameters P, gradients P, optimizer state 2P (exp_avg and exp_avg_sq; AdamW's step
counters live on the CPU)."""
import json
import os

import torch
import torch.nn as nn

BATCH, SEQ, WIDTH = 4, 128, 1024


def encoder():
    layer = nn.TransformerEncoderLayer(d_model=WIDTH, nhead=16, dim_feedforward=4 * WIDTH, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)


def inputs(dev, n=BATCH):
    return torch.randn(n, SEQ, WIDTH, device=dev)


def known(model, rank, extra=None):
    """The bytes the categories must show at the peak, written to
    $MEMSNAP_KNOWN/known.<rank>.json when that is set."""
    params = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    k = {"parameters": params, "gradients": params, "optimizer_state": 2 * params}
    k.update(extra or {})
    out = os.environ.get("MEMSNAP_KNOWN")
    if out:
        with open(os.path.join(out, "known.%d.json" % rank), "w") as f:
            json.dump(k, f)
    return k


class Done:
    """Says when a trainer may stop: a few batches after the hook's window ended
    (or at the batch limit), so a job waiting for its window never runs on for long
    and a planted leak stays bounded."""

    def __init__(self, hook, limit, after=3):
        self.hook, self.limit, self.after = hook, limit, after
        self.seen, self.left = False, None

    def __call__(self, b):
        if b + 1 >= self.limit:
            return True
        if self.hook.recording() is not None:
            self.seen = True
        elif self.seen and self.left is None:
            self.left = self.after
        if self.left is not None:
            self.left -= 1
            return self.left < 0
        return False
