"""One training run both ways — through dscpp's engine and as a plain PyTorch loop — over the same model, data and
settings, so tests can compare per-step losses. Micro-batch k of rank r in a step is chunk k·world + r of the
global batch; the plain loop runs the same chunks, rank by rank (BatchNorm sees the same micro-batches)."""
import json

import torch

from models import chunk, global_batches, make_model

LR, WD, CLIP, MICRO = 1e-3, 0.1, 1.0, 4


# The vectors' group decay in the grouped runs. The usual value is 0 (no decay for biases and norms), but over a few
# steps that moves the losses by less than the tests' tolerance; this one moves them by ~1e-4, so a run that
# ignored the groups would fail.
VECTOR_DECAY = 10.0
VECTOR_LR = 3 * LR  # and an lr of their own


def decay_groups(model):
    """Two parameter groups as scripts make them: the matrices at the config's weight decay, the vectors (biases,
    norms) at a weight decay and an lr of their own."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WD},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": VECTOR_DECAY, "lr": VECTOR_LR}]


class ReferenceAdam(torch.optim.Optimizer):
    """torch.optim.AdamW's single-tensor step (Adam's L2 decay with decoupled=False), operation for operation, but
    for one: the square root of the second moment is correctly rounded, as the engine's CPU Adam (and DeepSpeed's)
    takes it. torch's CPU sqrt goes through MKL's vector math, within an ulp, not correctly rounded; a ResNet's
    BatchNorm amplifies that ulp past 1e-5 within three steps, so the plain loop takes the correctly rounded one."""

    def __init__(self, params, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8, decoupled=True):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, betas=betas, eps=eps))
        self.decoupled = decoupled

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, wd, (beta1, beta2), eps = group["lr"], group["weight_decay"], group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                step, m, v, grad = state["step"], state["exp_avg"], state["exp_avg_sq"], p.grad
                if wd != 0 and self.decoupled:
                    p.mul_(1 - lr * wd)
                elif wd != 0:
                    grad = grad.add(p, alpha=wd)
                m.lerp_(grad, 1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                root = v.double().sqrt().float()  # correctly rounded: fp32's sqrt is the rounded exact root
                denom = (root / (1 - beta2 ** step) ** 0.5).add_(eps)
                p.addcdiv_(m, denom, value=-lr / (1 - beta1 ** step))


def ds_config(stage, grad_accum, world, dtype="fp32"):
    config = {
        "train_batch_size": MICRO * grad_accum * world,
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": CLIP,
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 5000, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}},
    }
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    return config


def one_process_config(**overrides):
    """ds_config for one process at ZeRO-0 without accumulation, with `overrides` on top."""
    c = ds_config(stage=0, grad_accum=1, world=1)
    c.update(overrides)
    return c


def tokens(n=4):
    """A fixed batch of n sequences of 16 tokens for make_model("gpt")."""
    return torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(3))


def engine_losses(kind, stage, grad_accum, world, rank, steps, dtype="fp32", prepare=None, configure=None,
                  zero_init=False, grouped=False):
    """The engine's per-step losses. `zero_init`: the model is built inside dscpp.zero.Init (partitioned);
    `grouped`: model_parameters are decay_groups (the vectors at a weight decay and lr of their own)."""
    import contextlib
    import dscpp
    config = ds_config(stage, grad_accum, world, dtype)
    if configure is not None:
        configure(config)
    with dscpp.zero.Init(config_dict_or_path=config) if zero_init else contextlib.nullcontext():
        model = make_model(kind)
    if prepare is not None:
        prepare(model)
    engine, _, _, _ = dscpp.initialize(model=model, config=config,
                                       model_parameters=decay_groups(model) if grouped else None)
    losses = []
    for batch in global_batches(kind, steps, MICRO * grad_accum * world):
        for k in range(grad_accum):
            inputs = chunk(batch, k * world + rank, MICRO)
            if dtype == "bf16" and kind == "resnet":
                inputs = (inputs[0].bfloat16(),) + inputs[1:]
            loss = engine(*inputs)
            engine.backward(loss)
            engine.step()
        losses.append(engine.last_step()["loss"])
    return losses


def clip_as_the_engine(params, max_norm):
    """torch.nn.utils.clip_grad_norm_ with the norm summed in fp64, as the engine sums it: torch's fp32 norm can be an
    ulp off, and through a ResNet's BatchNorm that one ulp of the clip factor grew to 2.6e-5 in the loss by step 3
    (two ranks, accumulation 2, on an AVX2-only CPU); the same sum in fp64 agrees with the engine to 6e-8."""
    grads = [p.grad for p in params if p.grad is not None]
    total = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)


def reference_losses(kind, grad_accum, world, steps, grouped=False, reduce_each_micro_step=False):
    """The plain loop over the same chunks, AdamW as torch.optim's with a correctly rounded sqrt (ReferenceAdam).
    Gradients are summed in the order data parallelism sums them: each rank's micro-batches (k·world + r) in turn,
    then the ranks' sums in rank order, as the all-reduce adds them — or, with reduce_each_micro_step (ZeRO-2 and -3,
    which reduce every micro-step into their partitions), each micro-step's gradients over the ranks first, then the
    micro-steps in turn. Adding the chunks in another order rounds differently, and a ResNet's BatchNorm amplifies
    that past 1e-5 within three steps on some CPUs."""
    model = make_model(kind)
    optimizer = ReferenceAdam(decay_groups(model) if grouped else model.parameters(), lr=LR, weight_decay=WD)
    params = [p for p in model.parameters() if p.requires_grad]
    chunks = grad_accum * world
    losses = []
    for batch in global_batches(kind, steps, MICRO * chunks):
        total = 0.0
        grads = {}  # (rank, k) -> that chunk's gradients (the rank's sum over k, at k = -1, when not per micro-step)
        for rank in range(world):
            for k in range(grad_accum):
                loss = model(*chunk(batch, k * world + rank, MICRO))
                (loss / chunks).backward()
                total += loss.item()
                if reduce_each_micro_step:
                    grads[rank, k] = [None if p.grad is None else p.grad.clone() for p in params]
                    optimizer.zero_grad()
            if not reduce_each_micro_step:
                grads[rank, -1] = [None if p.grad is None else p.grad.clone() for p in params]
                optimizer.zero_grad()
        # A parameter this step did not reach has a zero gradient, not none: the engine's flat buffers (DeepSpeed's
        # too) hold zeros for it, and AdamW steps it (its moments decay, weight decay applies). torch's
        # zero_grad() leaves None, which AdamW would skip.
        steps_reduced = range(grad_accum) if reduce_each_micro_step else [-1]
        for i, p in enumerate(params):
            p.grad = torch.zeros_like(p)
            for k in steps_reduced:
                reduced = [grads[rank, k][i] for rank in range(world) if grads[rank, k][i] is not None]
                if reduced:
                    p.grad = p.grad + sum(reduced[1:], reduced[0])
        clip_as_the_engine(params, CLIP)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total / chunks)
    return losses


if __name__ == "__main__":
    # A rank of a multi-process run: python3 training.py KIND STAGE GRAD_ACCUM STEPS DTYPE OUT [grouped | ZERO_JSON]
    # (env: torchrun's). ZERO_JSON: more zero_optimization keys, a JSON object.
    import os
    import sys
    kind, stage, gas, steps, dtype, out = sys.argv[1:7]
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    extra = json.loads(sys.argv[7]) if sys.argv[7:] and sys.argv[7].startswith("{") else {}
    losses = engine_losses(kind, int(stage), int(gas), world, rank, int(steps), dtype,
                           grouped=sys.argv[7:] == ["grouped"],
                           configure=lambda config: config["zero_optimization"].update(extra))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(losses, f)
