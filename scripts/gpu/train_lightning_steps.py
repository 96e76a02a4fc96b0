"""A small model in a real PyTorch Lightning Trainer with memsnap's callback, to
check how the callback numbers batches: by trainer.global_step, so a run resumed
from a checkpoint counts on, and with gradient accumulation over k batches,
global_step * k + the batch's place in the step.
argv: max_steps accumulate checkpoint-to-save-or-"" checkpoint-to-resume-or-"" """
import sys

import torch

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl

import memsnap_hook

steps, acc = int(sys.argv[1]), int(sys.argv[2])
save, resume = sys.argv[3], sys.argv[4]


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64 * steps * acc, 512))
trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=steps, accumulate_grad_batches=acc, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     callbacks=[memsnap_hook.lightning_callback()])
trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=64), ckpt_path=resume or None)
if save:
    trainer.save_checkpoint(save)
print("global_step %d" % trainer.global_step, flush=True)
hook = memsnap_hook.get_hook()
hook.close()
if hook.errors:
    print("hook errors: %s" % (hook.errors,), flush=True)
