"""dscpp.inference.engine.InferenceEngine: what dscpp.init_inference returns, as DeepSpeed's InferenceEngine — the
model in the config's dtype, its layers sliced over the tensor-parallel group (AutoTP, dscpp.module_inject), its
forward and generate.

The model's forward and its generate (Hugging Face's, with its key/value cache, sampling and stopping rules) run
unchanged on every rank of the group: the sliced layers all-reduce or all-gather through the C++ engine's Comm, so
every rank sees the same logits and — greedy, or sampling with the same seed on every rank — picks the same tokens.
"""
import os

import torch

from .. import _C
from ..comm import engine_comm_arguments, init_distributed
from ..module_inject import auto_tp
from ..utils import groups
from . import checkpoint


class InferenceEngine(torch.nn.Module):
    def __init__(self, model, config):
        super().__init__()
        self.module = model
        self._config = config
        self.mp_world_size = config.tp_size
        if config.checkpoint is not None:  # the files mapped, then sliced as a model that came with its weights
            checkpoint.load(model, config.checkpoint, config.base_dir)
        self.mp_group = None
        if config.tp_size > 1 or config.mpu is not None or config.tp_group is not None:
            self.mp_group = self._tensor_parallel_group(config)
            comm = _C.comm_over(**engine_comm_arguments("inference", self.mp_group))
            if comm.world_size > 1:
                auto_tp.apply(model, auto_tp.plan(model, comm.world_size, config.injection_policy), comm)
            self.mp_world_size = comm.world_size
        # Cast after slicing (the same values: slicing copies): a rank converts only its share, and the whole weights
        # of a model filled from mapped checkpoint files are never copied into its own memory.
        if config.dtype is not None:
            model.to(config.dtype)
        # Sliced first: a GPU receives only its rank's share of the weights.
        if not config.keep_module_on_host and torch.cuda.is_available():
            model.to(torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))))

    @staticmethod
    def _tensor_parallel_group(config):
        """The group the model is sliced over: the mpu's model-parallel group, tensor_parallel.tp_group, or groups of
        tp_size consecutive ranks (DeepSpeed makes the first only: the same group when the world is tp_size)."""
        init_distributed()
        if config.mpu is not None:
            return config.mpu.get_model_parallel_group()
        if config.tp_group is not None:
            return config.tp_group
        return groups.consecutive_group(config.tp_size, "init_inference: tensor_parallel.tp_size")

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def generate(self, *inputs, **kwargs):
        """The model's own generate (Hugging Face's), after DeepSpeed's check that no prompt is longer than
        max_out_tokens."""
        if not hasattr(self.module, "generate"):
            raise AttributeError(f"{type(self.module).__name__} has no generate method; call the engine's forward")
        ids = kwargs.get("input_ids", inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None)
        if ids is not None and ids.dim() == 2 and ids.shape[-1] > self._config.max_out_tokens:
            raise RuntimeError(f"init_inference: a prompt of {ids.shape[-1]} tokens exceeds max_out_tokens "
                               f"{self._config.max_out_tokens} (the config's max_out_tokens / max_tokens)")
        with torch.no_grad():
            return self.module.generate(*inputs, **kwargs)
