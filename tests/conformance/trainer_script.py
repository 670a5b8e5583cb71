"""The Hugging Face Trainer with DeepSpeed (seed 001's way in): `TrainingArguments(deepspeed=CONFIG)` with the
Trainer's own "auto" configs, on a tiny LLaMA-style or GPT-2-style causal LM built from a config (no download), over
random token rows the script makes; or, with --trainer sft, TRL's SFTTrainer (`SFTConfig(deepspeed=CONFIG)`) over the
same rows as a pre-tokenized dataset, or with --trainer dpo, TRL's DPOTrainer over prompt/chosen/rejected texts of
random words and a reference model (a copy of the model, which TRL prepares as a second, optimizer-less engine), with
a word-level tokenizer made here. Nothing in it names an engine: `import deepspeed` inside Transformers and
Accelerate is real DeepSpeed or, with python/deepspeed-compat first on the path, ours. Prints one JSON line per
optimizer step (its loss as the Trainer logs it, the lr, the gradient norm), one per evaluation with --eval, and, at
the end, a digest of the weights `save_model` wrote.
    python trainer_script.py --model llama --zero_stage 2 --out OUT
    python trainer_script.py --model llama --zero_stage 2 --out OUT --resume   # from OUT's last checkpoint
    python trainer_script.py --trainer sft --model llama --zero_stage 3 --out OUT
    python trainer_script.py --trainer dpo --model llama --zero_stage 2 --out OUT
"""
import argparse
import json
import os

import ds_cpu  # noqa: F401  (DS_ACCELERATOR=cpu for real DeepSpeed; ours reads it too)
import torch
import transformers

p = argparse.ArgumentParser()
p.add_argument("--trainer", choices=["hf", "sft", "dpo", "grpo"], default="hf",
               help="transformers.Trainer, or TRL's SFTTrainer, DPOTrainer or GRPOTrainer")
p.add_argument("--model", choices=["llama", "gpt2"], default="llama")
p.add_argument("--zero_stage", type=int, choices=[2, 3], default=2)
p.add_argument("--out", required=True)
p.add_argument("--max_steps", type=int, default=6)
p.add_argument("--save_steps", type=int, default=3)
p.add_argument("--resume", action="store_true", help="resume_from_checkpoint=True: OUT's latest checkpoint-N")
p.add_argument("--pretrained", action="store_true",
               help="save the model first (save_pretrained, no DeepSpeed yet), then load it with from_pretrained under "
                    "the Trainer's config (ZeRO-3: into zero.Init, the weights through GatheredParameters) and grow "
                    "its vocabulary with resize_token_embeddings")
p.add_argument("--no_config_scheduler", action="store_true",
               help="no \"scheduler\" section: the Trainer makes its own (linear) schedule, from the engine's optimizer")
p.add_argument("--eval", action="store_true", help="evaluate on 16 other rows every 3 steps (the Trainer calls the "
                                                   "model itself, outside the engine)")
p.add_argument("--no_gather", action="store_true",
               help="grpo: ds3_gather_for_generation=False (generate() runs the ZeRO-3 model unit by unit)")
args = p.parse_args()

# The Trainer's ZeRO configs as its documentation gives them: every size and rate "auto", filled from the arguments.
CONFIG = {
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                      "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": args.zero_stage, "overlap_comm": True, "contiguous_gradients": True,
                          "reduce_bucket_size": "auto"},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 1000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}
if args.no_config_scheduler:
    del CONFIG["scheduler"]
if args.zero_stage == 3:
    CONFIG["zero_optimization"].update({"stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold":
                                        "auto", "stage3_gather_16bit_weights_on_model_save": True})

if args.model == "llama":
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model_class = transformers.LlamaForCausalLM
else:
    config = transformers.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    model_class = transformers.GPT2LMHeadModel
torch.manual_seed(0)
pretrained = os.path.join(args.out, "pretrained")
if args.pretrained and not os.path.isdir(pretrained):
    model_class._from_config(config).save_pretrained(pretrained)  # before TrainingArguments: no DeepSpeed yet

settings = dict(
    output_dir=args.out, per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=args.max_steps,
    learning_rate=5e-3, warmup_steps=2, weight_decay=0.01, logging_steps=1, save_steps=args.save_steps,
    save_strategy="steps", report_to=[], seed=7, data_seed=7, deepspeed=CONFIG, disable_tqdm=True,
    dataloader_num_workers=0)
if args.eval:
    settings.update(eval_strategy="steps", eval_steps=3, per_device_eval_batch_size=4)
if args.trainer == "grpo":
    # Four completions of at most 6 tokens per prompt, sampled by generate() on the unwrapped model (under ZeRO-3
    # inside TRL's unwrap_model_for_generation: gathered whole, the engine's hooks taken off and put back).
    settings.update(num_generations=4, max_completion_length=6, ds3_gather_for_generation=not args.no_gather)
if args.trainer in ("sft", "dpo", "grpo"):
    import trl
    # TRL's default is bf16; these runs compare in fp32
    config_class = {"sft": trl.SFTConfig, "dpo": trl.DPOConfig, "grpo": trl.GRPOConfig}[args.trainer]
    training_args = config_class(**settings, bf16=False)
else:
    training_args = transformers.TrainingArguments(**settings)

# Under ZeRO-3, TrainingArguments' DeepSpeed config makes _from_config / from_pretrained build the model inside
# zero.Init (each parameter partitioned as it is created; initial or loaded weights written through
# GatheredParameters(modifier_rank=0)).
if args.pretrained:
    model = model_class.from_pretrained(pretrained)
    model.resize_token_embeddings(104)  # under ZeRO-3: gathered, copied into new partitioned embeddings
else:
    model = model_class._from_config(config)


class Rows(torch.utils.data.Dataset):
    def __init__(self, n, length=16, seed=1):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 96, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Report(transformers.TrainerCallback):
    def on_log(self, args_, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "loss" in logs:
            print(json.dumps({"step": state.global_step, "loss": logs["loss"], "lr": logs.get("learning_rate"),
                              "grad_norm": logs.get("grad_norm"), "reward": logs.get("reward")}), flush=True)
        if state.is_world_process_zero and logs and "eval_loss" in logs:
            print(json.dumps({"eval_step": state.global_step, "eval_loss": logs["eval_loss"]}), flush=True)


if args.trainer in ("sft", "dpo", "grpo"):
    import copy

    import datasets
    import tokenizers
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"t{i}": i for i in range(96)}, unk_token="t0"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=words, pad_token="t0", eos_token="t1")
    g = torch.Generator().manual_seed(3)

    def text(n):
        return " ".join(f"t{int(i)}" for i in torch.randint(2, 96, (n,), generator=g))

    if args.trainer == "sft":
        train = datasets.Dataset.from_dict({"input_ids": Rows(64).ids.tolist()})
        trainer = trl.SFTTrainer(model=model, args=training_args, train_dataset=train, processing_class=tokenizer,
                                 callbacks=[Report()])
    elif args.trainer == "grpo":
        def even_tokens(completions, **kwargs):
            """The reward: the share of a completion's words that are even tokens."""
            return [sum(int(w[1:]) % 2 == 0 for w in c.split()) / max(1, len(c.split())) for c in completions]

        train = datasets.Dataset.from_dict({"prompt": [text(6) for _ in range(32)]})
        trainer = trl.GRPOTrainer(model=model, reward_funcs=even_tokens, args=training_args, train_dataset=train,
                                  processing_class=tokenizer, callbacks=[Report()])
    else:
        train = datasets.Dataset.from_dict({"prompt": [text(6) for _ in range(32)],
                                            "chosen": [text(4) for _ in range(32)],
                                            "rejected": [text(4) for _ in range(32)]})
        trainer = trl.DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=training_args, train_dataset=train,
                                 processing_class=tokenizer, callbacks=[Report()])
else:
    trainer = transformers.Trainer(model=model, args=training_args, train_dataset=Rows(64),
                                   eval_dataset=Rows(16, seed=2) if args.eval else None, callbacks=[Report()])
trainer.train(resume_from_checkpoint=True if args.resume else None)
final = os.path.join(args.out, "final")
trainer.save_model(final)
if trainer.is_world_process_zero():
    from safetensors.torch import load_file
    weights = load_file(os.path.join(final, "model.safetensors"))
    print(json.dumps({"saved": {k: float(v.double().sum()) for k, v in sorted(weights.items())}}), flush=True)
