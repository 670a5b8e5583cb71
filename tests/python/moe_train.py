"""A rank of a DeepSpeed-MoE training script run with `import dscpp as deepspeed`: a small token model with an MoE
layer (dscpp.moe.layer.MoE, ep_size EP) trained through deepspeed.initialize with DeepSpeed's MoE parameter groups,
gradient clipping and the aux loss. Rank 0 also trains the same model in a plain PyTorch loop on one process, whose
MoE is DeepSpeed's dense formulas (moe_reference.py) over every expert: same initial values, tokens (each data-parallel
rank's micro-batch is a chunk; the loop accumulates the chunks), AdamW and clipping. Rank 0 writes both per-step
losses to OUT.

    python3 moe_train.py [--mpu TP] [--bf16] [--zero_init] [--checkpointing]
                         EP STAGE K RESIDUAL DROP STEPS OUT [SAVE_DIR [LOAD_DIR DATA_RANKS]]
                                                                             (torchrun's environment)

--mpu TP passes a Megatron-style mpu (tensor_parallel.py's) of tensor-parallel size TP — Megatron-DeepSpeed's MoE runs
pass one at 1;
--bf16 trains the engine in bf16 (the tokens cross the all-to-all in bf16), the reference staying in fp32;
--zero_init builds the engine's model inside dscpp.zero.Init (ZeRO-3), which the experts' deep copies must survive;
--checkpointing runs the engine's MoE layer inside dscpp.checkpointing.checkpoint (recomputed in backward, its
all-to-alls with it).

With SAVE_DIR the engine saves a checkpoint after STEPS // 2 steps; with LOAD_DIR it first loads that one (saved
at another ep_size) and runs the rest of the steps, writing only its own losses.
"""
import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import dscpp as deepspeed
from dscpp.moe.layer import MoE
from dscpp.moe.utils import split_params_into_different_moe_groups_for_optimizer

import moe_reference
from tensor_parallel import Mpu

VOCAB, DIM, HIDDEN, EXPERTS, MICRO, SEQ = 32, 8, 16, 4, 2, 6
LR, WD, CLIP, AUX = 1e-2, 0.01, 0.1, 0.01


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(DIM, HIDDEN)
        self.out = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return self.out(F.gelu(self.fc(x)))


class Model(nn.Module):
    """tokens → mean next-token loss + AUX · l_aux."""

    def __init__(self, ep_size, k, residual, drop):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.moe = MoE(hidden_size=DIM, expert=Expert(), num_experts=EXPERTS, ep_size=ep_size, k=k,
                       capacity_factor=1.0, min_capacity=2, use_residual=residual, drop_tokens=drop, use_rts=False,
                       top2_2nd_expert_sampling=False)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)
        self.k, self.drop, self.dense_reference, self.checkpointed = k, drop, False, False

    def experts_in_global_order(self):
        return list(self.moe.deepspeed_moe.experts.deepspeed_experts)

    def forward(self, tokens):
        x = self.embed(tokens[:, :-1])
        if self.dense_reference:
            m = self.moe
            residual = (m.mlp, m.coefficient) if m.use_residual else None
            out, l_aux, _ = moe_reference.moe_forward(x, m.deepspeed_moe.gate.wg.weight, self.experts_in_global_order(),
                                                      self.k, 1.0, 2, self.drop, residual)
        elif self.checkpointed:
            out, l_aux = deepspeed.checkpointing.checkpoint(lambda h: self.moe(h)[:2], x)
        else:
            out, l_aux, _ = self.moe(x)
        logits = self.head(self.norm(x + out))
        return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)) + AUX * l_aux


def make_model(ep_size, k, residual, drop, first_expert, zero_init=None):
    """Seeded, so every rank and the reference start alike; each expert gets values of its own from its global index
    (deep copies would start equal, which would hide an expert in the wrong place). `zero_init`: the config to build
    it partitioned with."""
    import contextlib
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=zero_init) if zero_init else contextlib.nullcontext():
        model = Model(ep_size, k, residual, drop)
    for i, expert in enumerate(model.experts_in_global_order()):
        torch.manual_seed(100 + first_expert + i)
        for p in expert.parameters():
            p.data.uniform_(-0.5, 0.5)
    return model


def global_batches(steps, size):
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (size, SEQ), generator=generator) for _ in range(steps)]


def config(stage, grad_accum, world, bf16=False):
    return {"bf16": {"enabled": bf16}, "train_batch_size": MICRO * grad_accum * world,
            "train_micro_batch_size_per_gpu": MICRO,
            "gradient_accumulation_steps": grad_accum, "gradient_clipping": CLIP,
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 64},
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}}}


def engine_losses(ep, stage, k, residual, drop, steps, save_dir, load_dir, mpu, bf16, zero_init, checkpointing=False):
    """DeepSpeed-MoE's script shape: MoE parameter groups, initialize, engine(batch) / backward / step. Run at world
    size 1 with load_dir, it accumulates over `data` micro-batches, as many as the saving run's ranks. Returns the
    per-step losses ("engine") and how many times the MoE layer ran ("moe_forwards")."""
    world, rank = dist.get_world_size(), dist.get_rank()
    data = int(load_dir[1]) if load_dir else world
    ds_config = config(stage, data // world, world, bf16)
    model = make_model(ep, k, residual, drop, (rank % ep) * (EXPERTS // ep), ds_config if zero_init else None)
    model.checkpointed = checkpointing
    forwards = []  # the MoE layer's forwards: one per micro-step, two when checkpointed (the recompute)
    model.moe.register_forward_hook(lambda *_: forwards.append(1))
    parameters = {"params": [p for p in model.parameters()], "name": "parameters"}
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=split_params_into_different_moe_groups_for_optimizer(parameters),
        config=ds_config, mpu=mpu)
    first = 0
    if load_dir:
        engine.load_checkpoint(load_dir[0])
        first = engine.global_steps
    losses = []
    for step, batch in enumerate(global_batches(steps, MICRO * data)):
        if step < first:
            continue
        for micro in range(data // world):
            loss = engine(batch[(micro * world + rank) * MICRO:(micro * world + rank + 1) * MICRO])
            engine.backward(loss)
            engine.step()
        losses.append(engine.last_step()["loss"])
        if save_dir and step + 1 == steps // 2:
            engine.save_checkpoint(save_dir)
    return {"engine": losses, "moe_forwards": len(forwards)}


def reference_losses(k, residual, drop, steps, world):
    from training import clip_as_the_engine
    model = make_model(1, k, residual, drop, 0)
    model.dense_reference = True
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    losses = []
    for batch in global_batches(steps, MICRO * world):
        total = 0.0
        for r in range(world):
            loss = model(batch[r * MICRO:(r + 1) * MICRO])
            (loss / world).backward()
            total += loss.item()
        clip_as_the_engine(list(model.parameters()), CLIP)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total / world)
    return losses


if __name__ == "__main__":
    tensor_parallel = None
    if "--mpu" in sys.argv:
        at = sys.argv.index("--mpu")
        tensor_parallel = int(sys.argv[at + 1])
        del sys.argv[at:at + 2]
    flags = {flag: flag in sys.argv for flag in ("--bf16", "--zero_init", "--checkpointing")}
    sys.argv = [a for a in sys.argv if a not in flags]
    ep, stage, k, residual, drop, steps = (int(a) for a in sys.argv[1:7])
    out = sys.argv[7]
    save_dir = sys.argv[8] if len(sys.argv) > 8 and sys.argv[8] != "-" else None
    load_dir = sys.argv[9:11] if len(sys.argv) > 9 else None  # LOAD_DIR DATA_RANKS
    deepspeed.init_distributed()
    mpu = None if tensor_parallel is None else Mpu(tensor_parallel)
    result = engine_losses(ep, stage, k, bool(residual), bool(drop), steps, save_dir, load_dir, mpu, flags["--bf16"],
                           flags["--zero_init"], flags["--checkpointing"])
    if dist.get_rank() == 0:
        if not load_dir:
            result["reference"] = reference_losses(k, bool(residual), bool(drop), steps, dist.get_world_size())
        with open(out, "w") as f:
            json.dump(result, f)
