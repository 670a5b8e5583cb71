"""What DeepSpeed shows on each ZeRO-3 parameter that callers read: `ds_status` (ZeroParamStatus), `ds_shape`,
`ds_numel` and `ds_active_sub_modules`. TRL's losses read ds_status on the head's weight to decide whether to
gather it themselves (trl/trainer/utils.py maybe_gather_lm_head_ctx); its unwrap_model_for_generation clears
ds_active_sub_modules; the Trainer counts parameters with ds_numel.

Nothing is stored on the tensors: under ZeRO-3 the engine's parameters become ZeroParameter, an nn.Parameter whose
ds_status is read off the tensor itself — a released parameter holds no elements (its shard lives in the engine's
flat buffers), a gathered one its whole value. A parameter is gathered while its module's forward runs, and a read
from outside it (the head's weight in a fused loss) fetches it on access (hooks.py) and keeps it until its gradients
are in, so by the time a caller holds it, it is AVAILABLE. destroy() gives the parameters their class back."""
import enum

import torch


class ZeroParamStatus(enum.Enum):
    """DeepSpeed's states of a ZeRO-3 parameter (ours has no INFLIGHT a caller can see: a gather completes before
    the parameter is handed out)."""
    AVAILABLE = 1
    NOT_AVAILABLE = 2
    INFLIGHT = 3


class ZeroParameter(torch.nn.Parameter):
    """An engine's parameter under ZeRO-3 (see the module docstring); otherwise the nn.Parameter it was."""

    @property
    def ds_status(self):
        return ZeroParamStatus.AVAILABLE if self.numel() > 0 else ZeroParamStatus.NOT_AVAILABLE

    @property
    def ds_shape(self):
        """DeepSpeed's: the whole parameter's shape, also while it holds no elements (the engine's record of it)."""
        from .gathered import owner  # the engines import this module
        engine = owner(self)
        shape = engine.parameter_shape(self) if engine is not None else None
        return shape if shape is not None else self.shape

    @property
    def ds_numel(self):
        """DeepSpeed's: the whole parameter's element count (the Trainer counts trainable parameters with it)."""
        return self.ds_shape.numel()

    @property
    def ds_active_sub_modules(self):
        """DeepSpeed's set of the modules whose forward holds this parameter now (TRL clears it before taking the
        hooks off). Ours counts running units in the stage, not per parameter, so a caller sees a fresh empty set:
        clearing it changes nothing, as nothing of the engine's runs between its forwards."""
        return set()


def adopt(params):
    """Makes the engine's parameters ZeroParameter (the same objects: the module, the optimizer and the engine keep
    them)."""
    for p in params:
        if type(p) is torch.nn.Parameter:
            p.__class__ = ZeroParameter


def release(params):
    for p in params:
        if type(p) is ZeroParameter:
            p.__class__ = torch.nn.Parameter
