"""The categories trainer inside a real PyTorch Lightning Trainer: the model of
scripts/gpu/known_model.py with AdamW, memsnap's Lightning callback, and no call to
memsnap_hook.watch (the callback tells the hook the module and its optimizers).
argv: steps"""
import sys

import torch

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl

import memsnap_hook
from known_model import BATCH, SEQ, WIDTH, encoder, known

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 12


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = encoder()

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(BATCH * steps, SEQ, WIDTH))
model = Module()
known(model, 0)
trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=[memsnap_hook.lightning_callback()])
trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=BATCH))
hook = memsnap_hook.get_hook()
hook.close()
if hook.errors:
    print("hook errors: %s" % (hook.errors,), flush=True)
