"""One DeepSpeed user script, run unchanged on real DeepSpeed and on deepspeed.cpp (tests/conformance): `--impl`
picks the module that plays `deepspeed`; everything else is the same file, the same config and the same data.

Prints one JSON line per optimizer step: the loss the script saw (rank 0's last micro-batch), engine.get_lr() after
the step (what the next step will use), the client optimizer's param-group lrs when the script brought one, the
global gradient norm where the engine reports one, and an evaluation loss (engine.eval(), no_grad) when asked. The
test compares the two runs line by line.

    python train_script.py --impl deepspeed|dscpp --config CONFIG.json --steps N
        [--client_optimizer adamw|sgd] [--model mlp|batchnorm|moe] [--eval]
        [--save_dir DIR --save_at K] [--load_dir DIR] [--freeze PARAM]
        [--moe_experts E --moe_k K --moe_ep E --moe_capacity_factor F --moe_use_rts 0|1]
"""
import argparse
import json
import os
import sys

import torch

p = argparse.ArgumentParser()
p.add_argument("--impl", choices=["deepspeed", "dscpp"], required=True)
p.add_argument("--config", required=True)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--client_optimizer", choices=["adamw", "sgd"], default=None)
p.add_argument("--model", choices=["mlp", "batchnorm", "moe", "lora"], default="mlp")
p.add_argument("--eval", action="store_true", help="an evaluation loss after each step, in eval mode")
p.add_argument("--save_dir", default=None)
p.add_argument("--save_at", type=int, default=0, help="save_checkpoint after this step (with client state)")
p.add_argument("--load_dir", default=None, help="load_checkpoint first and train --steps more")
p.add_argument("--freeze", default=None, help="a parameter left out of training (requires_grad False), as LoRA's")
p.add_argument("--moe_experts", type=int, default=4)
p.add_argument("--moe_k", type=int, default=1)
p.add_argument("--moe_ep", type=int, default=1)
p.add_argument("--moe_capacity_factor", type=float, default=1.0)
p.add_argument("--moe_use_rts", type=int, default=0)
args = p.parse_args()

if args.impl == "deepspeed":
    import ds_cpu  # noqa: F401  (real DeepSpeed on CPU with Gloo; see ds_cpu.py)
    import deepspeed
    from deepspeed.moe.layer import MoE
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
else:
    import dscpp as deepspeed
    from dscpp.moe.layer import MoE
    from dscpp.moe.utils import split_params_into_different_moe_groups_for_optimizer

RANK = int(os.environ.get("RANK", "0"))
deepspeed.init_distributed(dist_backend="gloo")  # before the model: an MoE layer forms its expert groups


class LoraLinear(torch.nn.Module):
    """PEFT's LoRA layer, in its shape: a frozen base_layer, and lora_A / lora_B beside it (modules of their own, so
    ZeRO-3 units of their own: the base is a unit with nothing to train, as under PEFT)."""

    def __init__(self, width_in, width_out, rank=4):
        super().__init__()
        self.base_layer = torch.nn.Linear(width_in, width_out)
        self.base_layer.requires_grad_(False)
        self.lora_A = torch.nn.Linear(width_in, rank, bias=False)
        self.lora_B = torch.nn.Linear(rank, width_out, bias=False)
        torch.nn.init.normal_(self.lora_B.weight, std=0.1)  # PEFT starts B at zero; nonzero makes A train at once

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * 2.0


class LoraNet(torch.nn.Module):
    """A LoRA fine-tune of a small MLP: adapted layers, a frozen one between them, a trainable head."""

    def __init__(self):
        super().__init__()
        self.fc1 = LoraLinear(16, 32)
        self.mid = torch.nn.Linear(32, 32)
        self.mid.requires_grad_(False)
        self.fc2 = LoraLinear(32, 32)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x, y):
        h = torch.tanh(self.fc1(x))
        h = torch.tanh(self.mid(h))
        h = torch.tanh(self.fc2(h))
        return torch.nn.functional.mse_loss(self.head(h), y)


class Net(torch.nn.Module):
    """A small regression MLP whose forward returns the loss, as DeepSpeed scripts' modules do; `batchnorm` puts a
    BatchNorm1d (running statistics: buffers the engine must keep per rank) between the layers; `moe` puts a
    DeepSpeed-MoE layer there (its l_aux joins the loss)."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.fc1 = torch.nn.Linear(16, 32)
        if kind == "batchnorm":
            self.norm = torch.nn.BatchNorm1d(32)
        if kind == "moe":
            torch.manual_seed(2)  # the experts' initial values: the same on every rank and in both engines
            self.moe = MoE(hidden_size=32, expert=torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh()),
                           num_experts=args.moe_experts, ep_size=args.moe_ep, k=args.moe_k,
                           capacity_factor=args.moe_capacity_factor, eval_capacity_factor=args.moe_capacity_factor,
                           min_capacity=0, use_rts=bool(args.moe_use_rts), drop_tokens=True)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x, y):
        h = torch.tanh(self.fc1(x))
        aux = 0.0
        if self.kind == "batchnorm":
            h = self.norm(h)
        if self.kind == "moe":
            out, l_aux, _ = self.moe(h)
            h = h + out
            aux = 0.01 * l_aux
        return torch.nn.functional.mse_loss(self.fc2(h), y) + aux


torch.manual_seed(0)
model = LoraNet() if args.model == "lora" else Net(args.model)
if args.freeze:
    model.get_parameter(args.freeze).requires_grad_(False)
with open(args.config) as f:
    config = json.load(f)

optimizer = None
params = model.parameters()
if args.model == "moe":  # DeepSpeed-MoE's way: experts in param groups of their own
    params = split_params_into_different_moe_groups_for_optimizer(
        [{"params": list(model.parameters()), "name": "all"}])
if args.client_optimizer == "adamw":
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
elif args.client_optimizer == "sgd":
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)

engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=params, optimizer=optimizer,
                                               config=config)

data = torch.Generator().manual_seed(1 + RANK)  # each rank its own rows
first = 0
if args.load_dir:
    _, client_state = engine.load_checkpoint(args.load_dir)
    first = client_state["step"]
    for _ in range(first * engine.gradient_accumulation_steps()):  # the rows the saved run used
        torch.randn(engine.train_micro_batch_size_per_gpu(), 20, generator=data)

held_out = torch.randn(8, 16, generator=torch.Generator().manual_seed(99)), \
    torch.randn(8, 4, generator=torch.Generator().manual_seed(98))
micro = engine.train_micro_batch_size_per_gpu()
# Under bf16 the engine casts the module, not its inputs: the script casts them, as a DeepSpeed user's does.
dtype = torch.bfloat16 if config.get("bf16", {}).get("enabled") else torch.float32
held_out = tuple(t.to(dtype) for t in held_out)
for step in range(first, first + args.steps):
    engine.train()
    for _ in range(engine.gradient_accumulation_steps()):
        rows = torch.randn(micro, 20, generator=data).to(dtype)
        loss = engine(rows[:, :16], rows[:, 16:])
        engine.backward(loss)
        engine.step()
    record = {"step": step + 1, "loss": float(loss), "lr": [float(v) for v in engine.get_lr()],
              "group_lr": [float(g["lr"]) for g in optimizer.param_groups] if args.client_optimizer else None,
              "grad_norm": None if engine.get_global_grad_norm() is None else float(engine.get_global_grad_norm())}
    if args.eval:
        engine.eval()
        with torch.no_grad():
            record["eval_loss"] = float(engine(*held_out))
    print(json.dumps(record), flush=True)
    if args.save_dir and step + 1 == args.save_at:
        engine.save_checkpoint(args.save_dir, client_state={"step": step + 1})

if args.impl == "deepspeed" and not os.environ.get("DS_KEEP_EXIT"):  # exit_under_load.sh measures that exit
    # Real DeepSpeed's process sometimes aborts at interpreter exit on CPU, after everything above finished:
    # "terminate called without an active exception" (SIGABRT; once in about 180 of its processes in the suites here,
    # under load; 1 in 60 by exit_under_load.sh, where ours had 0). Its records are complete by then, so the reference
    # leaves without the interpreter's teardown. Our engine's process exits normally: an abort of ours fails the test.
    sys.stdout.flush()
    os._exit(0)
