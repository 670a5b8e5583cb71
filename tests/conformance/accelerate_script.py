"""A Hugging Face Accelerate script with DeepSpeed (seed 003's way in): Accelerator(deepspeed_plugin=DeepSpeedPlugin)
over a small model (with dropout unless --dropout 0), a client AdamW and a StepLR schedule, Accelerate's own gradient
accumulation (`accumulate`), `backward`, the optimizer's and the schedule's steps; `save_state` / `load_state` and
`skip_first_batches` for a resumed run. Nothing in it names an engine: `import deepspeed` inside Accelerate is real
DeepSpeed or, with python/deepspeed-compat first on the path, ours. Writes one JSON line per micro-batch (its index,
its loss, the lr it ran at, and the rank and world torch.distributed saw) to RECORDS.<rank>, then ends with
end_training() (which destroys the process group, as a script's last act should) and a last line {"ended": true}.
    python accelerate_script.py --records out.jsonl --zero_stage 2 --grad_accum 2
    python accelerate_script.py --records out.jsonl --save_dir ckpt --save_at 6           # save after batch 6
    python accelerate_script.py --records out.jsonl --save_dir ckpt --save_at 6 --resume  # load it, go on from 6
    accelerate launch --use_deepspeed --deepspeed_config_file ds.json accelerate_script.py --from_launcher \
        --records out.jsonl
"""
import argparse
import json

import ds_cpu  # noqa: F401  (DS_ACCELERATOR=cpu for real DeepSpeed; ours reads it too)
import torch
from accelerate import Accelerator, DeepSpeedPlugin

p = argparse.ArgumentParser()
p.add_argument("--records", required=True, help="each rank writes its JSON lines to RECORDS.<rank>")
p.add_argument("--zero_stage", type=int, default=2)
p.add_argument("--grad_accum", type=int, default=2)
p.add_argument("--micro_batches", type=int, default=16, help="per epoch")
p.add_argument("--epochs", type=int, default=1,
               help="with micro_batches not a multiple of grad_accum, Accelerate ends each epoch on a boundary of "
                    "its own (engine.set_gradient_accumulation_boundary(True) off the engine's count)")
p.add_argument("--from_launcher", action="store_true",
               help="Accelerator() with no plugin: `accelerate launch --use_deepspeed ...` configures DeepSpeed")
p.add_argument("--save_dir", help="save_state here after micro-batch --save_at (or, with --resume, load_state)")
p.add_argument("--save_at", type=int, default=0)
p.add_argument("--dropout", type=float, default=0.1,
               help="0 for a run to be resumed exactly: the resumed run's new DataLoader iterator draws its base "
                    "seed from torch's generator after load_state restored it, so later dropout masks differ (under "
                    "real DeepSpeed as under ours)")
p.add_argument("--resume", action="store_true", help="load_state(--save_dir), skip the --save_at batches seen")
args = p.parse_args()

torch.manual_seed(0)
if args.from_launcher:
    accelerator = Accelerator()
else:
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=args.zero_stage,
                                                               gradient_accumulation_steps=args.grad_accum))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(args.dropout),
                            torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
# On a CPU, Accelerate's DeepSpeed path treats each process as the only one (its state has no backend there): every
# process reads the whole data set, and the engine averages the ranks' equal gradients.
data = torch.utils.data.TensorDataset(torch.randn(4 * args.micro_batches, 8), torch.randn(4 * args.micro_batches, 1))
loader = torch.utils.data.DataLoader(data, batch_size=4)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

first = 0
if args.resume:
    accelerator.load_state(args.save_dir)
    first = args.save_at
batches = accelerator.skip_first_batches(loader, first) if first else loader
rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
records = open(f"{args.records}.{rank}", "w")
for epoch in range(args.epochs):
    for index, (x, y) in enumerate(batches if epoch == 0 else loader, start=epoch * len(loader) + (first if
                                                                                                 epoch == 0 else 0)):
        lr = optimizer.param_groups[0]["lr"]
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        records.write(json.dumps({"step": index, "loss": loss.item(), "lr": lr, "world": world, "rank": rank}) +
                      "\n")
        if args.save_dir and not args.resume and index + 1 == args.save_at:
            accelerator.save_state(args.save_dir)
accelerator.end_training()
records.write(json.dumps({"ended": True}) + "\n")  # everything above ran: what follows is interpreter shutdown
records.close()
