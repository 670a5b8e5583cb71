#!/usr/bin/env python3
"""DeepSpeed Compression's two recipes on gpt-train's tiny GPT (examples/python/gpt.py), through
dscpp.compression's init_compression / redundancy_clean and the engine's compression schedule:

    python examples/python/compression.py --recipe zeroquant   # ZeroQuant: 8-bit weights and 8-bit activations
    python examples/python/compression.py --recipe xtc         # XTC: a 2-layer student of the 4-layer teacher, its
                                                               # weights ternary (--bits 1: binary), distilled
    python examples/python/compression.py --recipe w4          # 4-bit weights (bench/compression's other rows)
(From README command 1's build without installing: PYTHONPATH=build/python.)

First a teacher is trained (--teacher_steps on gpt-train's corpus; --teacher FILE keeps it between runs), then the
recipe's model is made compression-aware and fine-tuned --steps (XTC: cross-entropy plus the KL divergence to the
teacher's logits), and redundancy_clean makes the compression real: quantized weights stored packed at their bits.
Printed: the model's bytes (parameters and buffers) and its loss on held-out windows — the teacher's, then the
recipe's before fine-tuning, after, and after cleaning (which equals the one before it) — the teacher's and the
cleaned model's greedy continuation of a held-out prompt through dscpp.init_inference, and a JSON line.
"""
import argparse
import copy
import json
import os
import sys

import torch
import torch.nn.functional as F

import dscpp
from dscpp.compression import init_compression, redundancy_clean

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import PRESETS, Gpt, load_tokens, rows  # noqa: E402

SEQ, MICRO = 64, 8
EVAL_ROWS = 64  # held out: the windows after every training row


def linear_layers(prefix=r"h\.\d+\."):
    return [prefix + r"(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)$"]


def recipe_config(recipe, bits, teacher_layers):
    """The ds_config of a recipe (what a DeepSpeed user writes for it); "teacher": the teacher's training (lr 1e-3,
    fine-tuning 5e-4 for every recipe, fp32's too)."""
    def weights(target):
        return {"shared_parameters": {"enabled": True, "quantize_weight_in_forward": True, "schedule_offset": 0,
                                      "quantize_groups": 4, "quantization_type": "symmetric"},
                "different_groups": {"wq": {"params": {"start_bits": target, "target_bits": target},
                                            "modules": linear_layers()}}}
    compression = {}
    if recipe == "zeroquant":
        compression["weight_quantization"] = weights(8)
        compression["activation_quantization"] = {
            "shared_parameters": {"enabled": True, "quantization_type": "symmetric", "range_calibration": "dynamic",
                                  "schedule_offset": 0},
            "different_groups": {"aq": {"params": {"bits": 8}, "modules": linear_layers()}}}
    elif recipe in ("w8", "w4"):
        compression["weight_quantization"] = weights(int(recipe[1:]))
    elif recipe == "xtc":
        compression["weight_quantization"] = weights(bits)
        compression["layer_reduction"] = {"enabled": True, "keep_number_layer": len(teacher_layers),
                                          "module_name_prefix": "h", "teacher_layer": teacher_layers,
                                          "other_module_name": ["wte", "wpe", "ln_f"]}
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3 if recipe == "teacher" else 5e-4}},
            "compression_training": compression}


def model_bytes(model):
    return sum(t.nbytes for t in model.parameters()) + sum(t.nbytes for t in model.buffers())


def eval_loss(model, tokens, steps_seen):
    x, y = rows(tokens, SEQ, 0, 0, steps_seen, EVAL_ROWS)
    with torch.no_grad():
        return float(model(x, y))


def train(engine, tokens, steps, teacher=None, temperature=2.0):
    for step in range(steps):
        x, y = rows(tokens, SEQ, step, MICRO, 0, MICRO)
        if teacher is None:
            loss = engine(x, y)
        else:  # XTC's distillation: cross-entropy plus the KL divergence to the teacher's softened logits
            logits = engine(x)
            with torch.no_grad():
                target = teacher(x)
            ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
            kd = F.kl_div(F.log_softmax(logits / temperature, -1), F.softmax(target / temperature, -1),
                          reduction="batchmean") * temperature ** 2 / x.size(1)
            loss = ce + kd
        engine.backward(loss)
        engine.step()


def generate(model, prompt, new_tokens=48):
    """Greedy bytes from `model` through dscpp.init_inference (one process: the model as it is, in fp32)."""
    engine = dscpp.init_inference(model, dtype=torch.float32)
    ids = prompt.view(1, -1)
    with torch.no_grad():
        for _ in range(new_tokens):
            ids = torch.cat([ids, engine(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return bytes(ids[0, prompt.numel():].tolist()).decode("latin-1")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", default="zeroquant", choices=["fp32", "zeroquant", "w8", "w4", "xtc"])
    p.add_argument("--bits", type=int, default=2, choices=[1, 2], help="XTC's weight bits: 2 ternary, 1 binary")
    p.add_argument("--teacher_steps", type=int, default=150)
    p.add_argument("--steps", type=int, default=60, help="fine-tuning steps of the compressed model")
    p.add_argument("--teacher", help="a file for the trained teacher's weights: loaded if it exists, else saved")
    args = p.parse_args()
    torch.manual_seed(1234)
    n_layer, n_head, n_embd, block = PRESETS["tiny"]
    tokens = load_tokens(None, SEQ)
    held_out = (args.teacher_steps + args.steps) * MICRO  # evaluation windows no training step reads

    teacher = Gpt(256, n_layer, n_head, n_embd, block)
    if args.teacher and os.path.exists(args.teacher):
        teacher.load_state_dict(torch.load(args.teacher))
    else:
        engine, *_ = dscpp.initialize(model=teacher, config=recipe_config("teacher", 0, []))
        train(engine, tokens, args.teacher_steps)
        engine.destroy()
        if args.teacher:
            torch.save(teacher.state_dict(), args.teacher)
    teacher.eval()
    result = {"recipe": args.recipe, "teacher_bytes": model_bytes(teacher),
              "teacher_loss": eval_loss(teacher, tokens, held_out)}
    print(f"teacher (fp32, {n_layer} layers): {result['teacher_bytes']} bytes, eval loss {result['teacher_loss']:.4f}")

    config = recipe_config(args.recipe, args.bits, [1, 3])
    if args.recipe == "xtc":
        student = Gpt(256, 2, n_head, n_embd, block)
        init_compression(student, config, teacher_model=teacher)
    else:
        student = init_compression(copy.deepcopy(teacher), config)
    engine, *_ = dscpp.initialize(model=student, config=config)
    engine.eval()
    x, y = rows(tokens, SEQ, 0, 0, held_out, EVAL_ROWS)
    with torch.no_grad():
        result["before"] = float(engine(x, y))  # the engine's first forward switches the techniques on
    engine.train()
    train(engine, tokens, args.steps, teacher if args.recipe == "xtc" else None)
    student.eval()
    result["after"] = eval_loss(student, tokens, held_out)
    redundancy_clean(student, config)
    result["cleaned"] = eval_loss(student, tokens, held_out)
    result["bytes"] = model_bytes(student)
    print(f"{args.recipe}: {result['bytes']} bytes ({result['bytes'] / result['teacher_bytes']:.3f} of the teacher's)"
          f"; eval loss before fine-tuning {result['before']:.4f}, after {result['after']:.4f}, after "
          f"redundancy_clean {result['cleaned']:.4f}")
    prompt = tokens[held_out * SEQ:held_out * SEQ + 16]
    print(f"prompt {bytes(prompt.tolist()).decode('latin-1')!r}\n  teacher:  {generate(teacher, prompt)!r}\n"
          f"  {args.recipe}: {generate(student, prompt)!r}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
