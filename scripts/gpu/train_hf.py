"""The categories trainer inside a real Hugging Face transformers Trainer: the
model of scripts/gpu/known_model.py with torch's AdamW, memsnap's Hugging Face
callback, and no call to memsnap_hook.watch (the callback tells the hook the model
and the optimizer the Trainer made).
argv: steps"""
import sys
import tempfile

import torch
import torch.nn as nn
import transformers

import memsnap_hook
from known_model import BATCH, SEQ, WIDTH, encoder, known

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 12


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = encoder()

    def forward(self, x):
        return {"loss": self.net(x).float().pow(2).mean()}


class Data(torch.utils.data.Dataset):
    def __init__(self, n):
        self.x = torch.randn(n, SEQ, WIDTH)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i]}


torch.manual_seed(0)
model = Model()
known(model, 0)
args = transformers.TrainingArguments(
    output_dir=tempfile.mkdtemp(), per_device_train_batch_size=BATCH, max_steps=steps, learning_rate=1e-4,
    optim="adamw_torch", report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
    dataloader_num_workers=0, remove_unused_columns=False)
trainer = transformers.Trainer(model=model, args=args, train_dataset=Data(BATCH * steps), callbacks=[memsnap_hook.hf_callback()])
trainer.train()
hook = memsnap_hook.get_hook()
hook.close()
if hook.errors:
    print("hook errors: %s" % (hook.errors,), flush=True)
