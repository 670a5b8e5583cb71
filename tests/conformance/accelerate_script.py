"""A Hugging Face Accelerate script with DeepSpeed (seed 003's way in): Accelerator(deepspeed_plugin=DeepSpeedPlugin)
over a small model, its own gradient accumulation (`accumulate`), `backward`, the optimizer's step. Nothing in it
names an engine: `import deepspeed` inside Accelerate is real DeepSpeed or, with python/deepspeed-compat first on the
path, ours. Prints one JSON line per micro-batch: its loss.
    python accelerate_script.py --zero_stage 2 --grad_accum 2
"""
import argparse
import json

import ds_cpu  # noqa: F401  (DS_ACCELERATOR=cpu for real DeepSpeed; ours reads it too)
import torch
from accelerate import Accelerator, DeepSpeedPlugin

p = argparse.ArgumentParser()
p.add_argument("--zero_stage", type=int, default=2)
p.add_argument("--grad_accum", type=int, default=2)
p.add_argument("--micro_batches", type=int, default=16, help="per process")
args = p.parse_args()

torch.manual_seed(0)
accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=args.zero_stage,
                                                           gradient_accumulation_steps=args.grad_accum))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
world = accelerator.num_processes
data = torch.utils.data.TensorDataset(torch.randn(4 * args.micro_batches * world, 8),
                                      torch.randn(4 * args.micro_batches * world, 1))
loader = torch.utils.data.DataLoader(data, batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for x, y in loader:
    with accelerator.accumulate(model):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    if accelerator.is_main_process:
        print(json.dumps({"step": 0, "loss": loss.item()}), flush=True)
