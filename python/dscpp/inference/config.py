"""The inference config, as DeepSpeed's DeepSpeedInferenceConfig reads it (deepspeed/inference/config.py): a dict, a
JSON file's path, and keyword arguments, merged (a key given both ways must agree). Each key acts, or stops the call
naming it; the ones that only steer DeepSpeed's fused CUDA kernels (kernel injection) are accepted at their defaults
and refused otherwise."""
import json

import torch

DTYPES = {"fp16": torch.float16, "float16": torch.float16, "half": torch.float16, "torch.float16": torch.float16,
          "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "torch.bfloat16": torch.bfloat16,
          "fp32": torch.float32, "float32": torch.float32, "float": torch.float32, "torch.float32": torch.float32}

# Keys that configure DeepSpeed's kernel injection, CUDA graphs, Triton or its checkpoint loading: the value each
# has by default (accepted, as it changes nothing) and why another is refused.
_AT_DEFAULT = {
    "enable_cuda_graph": (False, "CUDA graphs of the forward are not captured"),
    "use_triton": (False, "there are no Triton kernels here"),
    "triton_autotune": (False, "there are no Triton kernels here"),
    "triangular_masking": (True, "it configures the injected kernels' attention, which are not here"),
    "return_tuple": (True, "it configures the injected kernels' outputs, which are not here"),
    "training_mp_size": (1, "it reshards a Megatron checkpoint for the injected kernels"),
    "replace_method": ("auto", "it is the injected kernels' policy lookup"),
    "transposed_mode": (False, "it configures the injected kernels"),
    "set_empty_params": (False, "it empties the injected kernels' parameters before their checkpoint load"),
    "save_mp_checkpoint_path": (None, "saving a tensor-parallel checkpoint is not supported"),
    "checkpoint_config": ({}, "it configures the injected kernels' checkpoint loader"),
    "zero": ({}, "ZeRO-Inference is dscpp.initialize with zero_optimization stage 3 (and offload_param)"),
    "moe": ({}, "expert-parallel inference is not supported"),  # False (DeepSpeed's "no MoE") is taken as {}
    "quant": ({}, "weight and activation quantization at inference is not supported"),
    "min_out_tokens": (1, "it sizes the injected kernels' workspace"),
    "ep_size": (1, "expert-parallel inference is not supported"),
    "moe_experts": ([1], "expert-parallel inference is not supported"),
    "config": (None, "it is the injected kernels' model config"),
}
_ALIASES = {"kernel_inject": "replace_with_kernel_inject", "tp": "tensor_parallel", "injection_dict":
            "injection_policy", "max_tokens": "max_out_tokens", "tm": "triangular_masking", "ckpt_config":
            "checkpoint_config", "args": "config", "min_tokens": "min_out_tokens", "expert_group": "ep_group",
            "expert_mp_group": "ep_mp_group"}
_TP_KEYS = {"enabled", "tp_size", "tp_group", "mpu", "tp_grain_size"}


class InferenceConfig:
    """The settled config: dtype (a torch dtype), tp_size, tp_group (a torch.distributed group or None), mpu,
    injection_policy ({block class: names} or None), max_out_tokens, keep_module_on_host, checkpoint (None, a dict
    or a JSON file's path: dscpp/inference/checkpoint.py) and base_dir."""

    def __init__(self, merged):
        d = {_ALIASES.get(k, k): v for k, v in merged.items()}
        if d.get("moe") is False:
            d["moe"] = {}
        known = set(_AT_DEFAULT) | {"dtype", "tensor_parallel", "mp_size", "mpu", "replace_with_kernel_inject",
                                    "injection_policy", "injection_policy_tuple", "max_out_tokens",
                                    "keep_module_on_host", "ep_group", "ep_mp_group", "moe_type", "checkpoint",
                                    "base_dir"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"init_inference: unknown config key(s) {unknown}; the keys are DeepSpeed's inference "
                             f"config's: {sorted(known)}")
        for key, (default, why) in _AT_DEFAULT.items():
            if key in d and d[key] != default:
                raise ValueError(f"init_inference: {key}={d[key]!r} is not supported: {why} (only {default!r})")
        for key in ("ep_group", "ep_mp_group", "moe_type"):
            if d.get(key) not in (None, "standard"):
                raise ValueError(f"init_inference: {key} is not supported: expert-parallel inference is not here")
        if d.get("replace_with_kernel_inject", False):
            raise ValueError("init_inference: replace_with_kernel_inject=True is not supported: it swaps the model's "
                             "blocks for DeepSpeed's fused CUDA inference kernels, which this engine does not have; "
                             "leave it False — tensor_parallel.tp_size then slices the model's own layers (AutoTP)")
        self.dtype = _dtype(d.get("dtype", torch.float16))
        self.keep_module_on_host = bool(d.get("keep_module_on_host", False))
        self.checkpoint = d.get("checkpoint")
        self.base_dir = d.get("base_dir", "") or ""
        if not isinstance(self.base_dir, str):
            raise ValueError(f"init_inference: base_dir must be a directory's path, not {self.base_dir!r}")
        self.max_out_tokens = _positive_int("max_out_tokens", d.get("max_out_tokens", 1024))
        self.injection_policy = d.get("injection_policy") or d.get("injection_policy_tuple")
        if self.injection_policy is not None and not isinstance(self.injection_policy, dict):
            raise ValueError("init_inference: injection_policy must be a dict {block class: (names of its "
                             "row-parallel linears, e.g. 'self_attn.o_proj')}, not "
                             f"{type(self.injection_policy).__name__}")
        tp = d.get("tensor_parallel", {}) or {}
        if not isinstance(tp, dict):  # DeepSpeedTPConfig object
            tp = {k: getattr(tp, k) for k in _TP_KEYS if hasattr(tp, k)}
        extra = sorted(set(tp) - _TP_KEYS)
        if extra:
            raise ValueError(f"init_inference: unknown tensor_parallel key(s) {extra}; allowed: {sorted(_TP_KEYS)}")
        if tp.get("tp_grain_size", 64) != 64:
            raise ValueError("init_inference: tensor_parallel.tp_grain_size is only 64 here: it sets DeepSpeed's "
                             "uneven splits, and every split here is even (sizes that do not divide are errors)")
        self.tp_size = _positive_int("tensor_parallel.tp_size", tp.get("tp_size", d.get("mp_size", 1)))
        if "mp_size" in d and "tp_size" in tp and d["mp_size"] != tp["tp_size"]:
            raise ValueError(f"init_inference: mp_size {d['mp_size']} (deprecated) and tensor_parallel.tp_size "
                             f"{tp['tp_size']} differ")
        if not tp.get("enabled", True):
            self.tp_size = 1
        self.tp_group = tp.get("tp_group")
        self.mpu = tp.get("mpu", d.get("mpu"))


def _positive_int(key, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"init_inference: {key} must be a positive integer, not {value!r}")
    return value


def _dtype(value):
    if isinstance(value, torch.dtype):
        if value in (torch.float16, torch.bfloat16, torch.float32):
            return value
    elif isinstance(value, str) and value.lower() in DTYPES:
        return DTYPES[value.lower()]
    raise ValueError(f"init_inference: dtype {value!r} is not supported; torch.float16, torch.bfloat16 or "
                     "torch.float32 (or 'fp16', 'bf16', 'fp32'); int8 needs the quantized kernels, which are not here")


def merge(config, kwargs):
    """DeepSpeed's init_inference merge: `config` (None, a dict or a JSON file's path) and keyword arguments; a key
    in both must have one value."""
    if config is None:
        config = {}
    elif isinstance(config, str):
        try:
            with open(config) as f:
                config = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"init_inference: cannot read the config file {config}: {e}") from e
    elif not isinstance(config, dict):
        raise ValueError(f"init_inference: config must be a dict or a JSON file's path, not {type(config)}")
    both = {k for k in set(config) & set(kwargs) if config[k] != kwargs[k]}
    if both:
        raise ValueError(f"init_inference: {sorted(both)} given in config and as keyword arguments with different "
                         "values")
    return InferenceConfig({**config, **kwargs})
