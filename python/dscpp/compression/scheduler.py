"""The compression schedule the engine steps: each technique switches on, on its layers, once the applied training
steps reach its schedule_offset (and stays on); with quantize_weight_in_forward false, weight quantization is MoQ —
after each applied step the quantized layers' weights are put on their grid, the bits dropping from start_bits to
target_bits one at a time, the period doubling after each drop (DeepSpeed's runtime/quantize.py).

dscpp.initialize attaches one to the engine when the model went through init_compression; the engine calls
on_forward while no step has been applied (DeepSpeed's "step zero" check, before every such forward) and on_step after
each applied optimizer step. Its step count is the engine's (global_steps - skipped_steps), so a resumed run is where
it was on the schedule; MoQ's bit state is not saved in checkpoints (DeepSpeed's neither): a resumed MoQ run starts
its bits again.
"""
import json
import logging

from .._C import compression as _q
from .compress import TECHNIQUES, _groups
from .helper import recursive_getattr

logger = logging.getLogger("dscpp")

_FLAGS = {
    "weight_quantization": "weight_quantization_enabled",
    "activation_quantization": "activation_quantization_enabled",
    "sparse_pruning": "sparse_pruning_enabled",
    "row_pruning": "row_pruning_enabled",
    "head_pruning": "head_pruning_enabled",
    "channel_pruning": "channel_pruning_enabled",
}


class compression_scheduler:  # noqa: N801 (DeepSpeed's name)
    def __init__(self, model, compression_config):
        """`compression_config`: the resolved compression_training section (compress.compression_config)."""
        self.model = model
        self.compression_config = compression_config
        self._schedule = _q.Schedule(json.dumps(compression_config))  # when each technique acts: the C++ one
        self.training_steps = 0
        self.weight_quantization_enabled = False
        self._switched_on = set()
        # Per technique: the modules of its groups, for the enabled ones.
        self._techniques = {}
        for technique in TECHNIQUES:
            section = compression_config[technique]
            if section["shared_parameters"]["enabled"]:
                names = [n for per_entry, _, _ in _groups(model, technique, section)
                         for entry in per_entry for n in entry]
                self._techniques[technique] = [recursive_getattr(model, n) for n in names]
        shared = compression_config["weight_quantization"]["shared_parameters"]
        self._moq = shared["enabled"] and not shared["quantize_weight_in_forward"]
        self._moq_settings = shared
        mixed = shared.get("fp16_mixed_quantize") or {}
        self._mixed = bool(mixed.get("enabled", False))
        self._change_ratio = mixed.get("quantize_change_ratio", 0.001)
        self._qsteps = 0
        self._real_ratio = 1.0  # fp16_mixed_quantize: the share of the real weight still blended in
        self.check_all_modules()

    def check_all_modules(self):
        for technique, modules in self._techniques.items():
            if not self._schedule.on(technique, self.training_steps):
                continue
            for module in modules:
                setattr(module, _FLAGS[technique], True)
            if technique not in self._switched_on:
                self._switched_on.add(technique)
                logger.info(f"{technique} is switched on at step {self.training_steps}")
                if technique == "weight_quantization":
                    self.weight_quantization_enabled = True

    def step(self, step_zero_check=False):
        """DeepSpeed's: one applied step more (or, with step_zero_check, only the check)."""
        if not step_zero_check:
            self.training_steps += 1
        self.check_all_modules()

    # -- driven by the engine -----------------------------------------------------------------------------------------

    def on_forward(self):
        """Before a forward while no step has been applied: techniques at offset 0 act from the first forward."""
        self.check_all_modules()
        if self._moq and self.weight_quantization_enabled:
            self.quantize_weights()

    def resume(self, applied_steps):
        """After a checkpoint's load: the schedule where the loaded run was (DeepSpeed's restarts at 0)."""
        self.training_steps = applied_steps
        self.check_all_modules()

    def on_step(self, applied_steps):
        """After an applied optimizer step (the engine's count of them): MoQ quantizes the new weights, then the
        schedule moves on, as DeepSpeed's engine orders the two."""
        if self._moq and self.weight_quantization_enabled:
            self.quantize_weights()
        self.training_steps = applied_steps
        self.check_all_modules()

    def quantize_weights(self):
        """MoQ: every 2-D-or-more weight of the quantized layers put on its current bits' grid, in place."""
        s = self._moq_settings
        self._qsteps += 1
        if self._mixed:  # DeepSpeed's update: down by the ratio while above 0 (so once below it), then 0
            self._real_ratio = self._real_ratio - self._change_ratio if self._real_ratio > 0 else 0.0
        modules = self._techniques["weight_quantization"]
        seen = set()  # a weight shared by two layers (a tied head) is quantized once, as DeepSpeed's per parameter
        for module in modules:
            weight = module.weight
            if weight.dim() < 2 or weight.numel() == 0 or id(weight) in seen:
                continue
            seen.add(id(weight))
            bits, target, period = module.weight_bits
            bits, period, dropped = _q.moq_advance(bits, target, period, self._qsteps)
            module.weight_bits = [bits, target, period]
            if dropped:
                self._real_ratio = 1.0
                if s["quantize_verbose"]:
                    logger.info(f"MoQ: {bits} bits from quantization {self._qsteps}, the next drop at {period}")
            quantized = _q.moq_quantize(weight.data, bits, s["quantize_groups"],
                                        s["quantization_type"] == "symmetric", s["rounding"] == "stochastic")
            if self._mixed:
                quantized = self._real_ratio * weight.data + (1 - self._real_ratio) * quantized
            weight.data.copy_(quantized)
