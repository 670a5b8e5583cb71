"""dscpp.runtime.hybrid_engine.DeepSpeedHybridEngine: what dscpp.initialize returns when the config's
hybrid_engine.enabled is true (DeepSpeed-Chat's actor) — the training engine, plus a generate() that does not pay
ZeRO-3's per-forward gathering for every new token.

Under ZeRO-3 a model called by itself gathers each block for every forward, and generate() runs one forward per new
token: every weight crosses the network once per token (DeepSpeed#4354: minutes per generation). With
pin_parameters (the default) generate() instead gathers the whole model once per call — inside one forward of the
engine's, each gather unit's group entered in turn, so each group comes with one all-gather of its shards, as a
training forward gathers it, and stays gathered — takes ZeRO-3's hooks off the module (as TRL's
unwrap_model_for_generation does), runs the model's own generate over the whole weights, and puts the hooks back;
the forward's end releases every group, the shards and the fp32 master untouched.
With pin_parameters false it generates through the hooks (per forward), as a plain ZeRO-3 engine does. Under ZeRO
0-2 the weights are whole already and generate() is the model's own.

LoRA layers of DeepSpeed-Chat's shape (modules with fuse_lora_weight() and unfuse_lora_weight()) are fused for the
call, so each token costs one matmul per layer, and unfused after (ZeRO-3 without pinning: left unfused, as their
weights are not whole). The weights they change are copied first and copied back after, so training resumes on
exactly the weights it had — an unfuse by subtraction would round them.

With inference_tp_size > 1 (pin_parameters on), groups of that many consecutive ranks generate their prompts
together over the layers sliced among them, each rank taking back its own rows (hybrid_tensor_parallel.py); at each
call the group's first rank gives its random state to the others, so the group samples as one.

As DeepSpeed's hybrid engine does, initialization gives every rank rank 0's random state (the GPU's under NCCL, the
CPU's otherwise), so sampling draws the same numbers on every rank. Not here: DeepSpeed's inference kernels and their
workspace (max_out_tokens, which sizes it, and release_inference_cache change nothing: nothing outlives a call)."""
import contextlib

import torch
import torch.distributed as dist

from ..engine import DeepSpeedEngine
from ..zero.gathered import GatheredParameters
from . import hybrid_tensor_parallel


def _share_random_state():
    """Rank 0's random state on every rank: the current GPU's when the default group is NCCL's (which carries only
    GPU tensors, and the GPU's generator is what sampling there draws from), the CPU's otherwise."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    on_gpu = dist.get_backend() == "nccl"
    state = torch.cuda.get_rng_state().cuda() if on_gpu else torch.get_rng_state()
    dist.broadcast(state, 0)
    (torch.cuda.set_rng_state if on_gpu else torch.set_rng_state)(state.cpu())


class DeepSpeedHybridEngine(DeepSpeedEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        settings = self._engine.hybrid_engine
        self.gather_all_layers = settings["pin_parameters"]  # DeepSpeed's attribute name
        self.Z3_enabled = self.zero_optimization_stage() == 3
        self.is_lora_fused = False
        self._lora_saved = []  # [(parameter, its data before the fuse)]
        _share_random_state()
        # inference_tp_size > 1: this rank's group (torch.distributed's, and the C++ Comm the sliced layers use).
        self._tp_group = self._tp_comm = None
        tp_size = settings["inference_tp_size"]
        if tp_size > 1:
            if not dist.is_initialized():
                raise ValueError(f"hybrid_engine.inference_tp_size {tp_size} needs torch.distributed (one process "
                                 "has no group to slice the layers over)")
            self._tp_group, self._tp_comm = hybrid_tensor_parallel.make_groups(tp_size)

    def generate(self, *inputs, **kwargs):
        """The model's generate (Hugging Face's), over weights gathered once for the call (see the module
        docstring)."""
        if not hasattr(self.module, "generate"):
            raise AttributeError(f"{type(self.module).__name__} has no generate method")
        sliced = self._tp_group is not None
        if sliced:  # the group's prompts as one batch, sampled alike on its ranks; this rank's rows come back
            generation_config = kwargs.get("generation_config") or getattr(self.module, "generation_config", None)
            if kwargs.get("return_dict_in_generate", getattr(generation_config, "return_dict_in_generate", False)):
                raise ValueError("hybrid_engine.inference_tp_size > 1 with return_dict_in_generate is not supported "
                                 "yet: this rank's rows are cut from the tokens tensor")
            inputs, kwargs = hybrid_tensor_parallel.gather_prompts(self._tp_group, inputs, kwargs)
            ids = inputs[0] if inputs else kwargs["input_ids"]
            hybrid_tensor_parallel.share_random_state(self._tp_group, ids.device)
        whole = self._whole_weights() if self.Z3_enabled and self.gather_all_layers else contextlib.nullcontext()
        with torch.no_grad(), whole:
            fuse = not self.Z3_enabled or self.gather_all_layers
            try:
                if fuse:
                    self.fuse_lora_weight()
                if not sliced:
                    return self.module.generate(*inputs, **kwargs)
                with hybrid_tensor_parallel.sliced(self.module, self._tp_comm, self._lora_modules()):
                    output = self.module.generate(*inputs, **kwargs)
                return hybrid_tensor_parallel.own_rows(self._tp_group, output)
            finally:
                if fuse:
                    self.unfuse_lora_weight()

    @contextlib.contextmanager
    def _whole_weights(self):
        """Every parameter whole for the call: one engine forward without a backward, in which every unit's group
        is gathered (and kept: no unit is left) until its end releases them all. With zero_quantized_weights a
        forward gathers int8 blocks, so the weights are then assembled exactly, parameter by parameter
        (GatheredParameters), as DeepSpeed's whole-parameter gathers are."""
        offload = self._parameter_offload
        offload._remove_module_hooks()
        if self._config.get("zero_optimization", {}).get("zero_quantized_weights", False):
            try:
                with GatheredParameters(list(self.module.parameters())):
                    yield
            finally:
                offload._register_deepspeed_module(self.module)
            return
        try:
            self._engine.begin_forward()
            try:
                for unit in range(len(offload._units)):
                    self._engine.enter_unit(unit)
                yield
            finally:
                self._engine.end_forward(False)
        finally:
            offload._register_deepspeed_module(self.module)

    def _lora_modules(self):
        return [m for m in self.module.modules()
                if callable(getattr(m, "fuse_lora_weight", None)) and callable(getattr(m, "unfuse_lora_weight", None))]

    def fuse_lora_weight(self):
        """Each LoRA layer's fuse_lora_weight(), its parameters' values kept to be restored by unfuse_lora_weight."""
        if self.is_lora_fused:
            return
        self.is_lora_fused = True  # first: a fuse that fails halfway is still undone by unfuse_lora_weight
        with torch.no_grad():
            for module in self._lora_modules():
                self._lora_saved += [(p, p.data.clone()) for p in module.parameters(recurse=False)]
                module.fuse_lora_weight()

    def unfuse_lora_weight(self):
        """Each LoRA layer's unfuse_lora_weight(), then its parameters' values before the fuse, exactly."""
        if not self.is_lora_fused:
            return
        with torch.no_grad():
            for module in self._lora_modules():
                module.unfuse_lora_weight()
            for p, data in self._lora_saved:
                p.data.copy_(data)
        self._lora_saved = []
        self.is_lora_fused = False
