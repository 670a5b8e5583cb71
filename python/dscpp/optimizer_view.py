"""OptimizerView: what initialize returns as the optimizer when the config names it. The engine's optimizer runs in
C++ over each rank's flat partition; this view shows scripts what they read of a torch optimizer — param_groups with
the current lr — and turns zero_grad into the no-op it is here (the engine clears gradients after each step).

It is a torch.optim.Optimizer, as DeepSpeed's basic optimizer is, so that a torch scheduler can be built over it:
the Hugging Face Trainer, given a config with an "optimizer" but no "scheduler" section, passes initialize a callable
that makes its schedule from the engine's optimizer. The groups are then the scheduler's to set (the engine takes
their lr before each step: DeepSpeedEngine._follow_client_lrs); otherwise each read shows the engine's own lr."""
import torch


class OptimizerView(torch.optim.Optimizer):
    def __init__(self, engine, param_groups=None):
        """`param_groups`: the parameters of each group (initialize's model_parameters dicts), or None for one."""
        self._engine = engine
        groups = param_groups or [[p for p in engine.module.parameters() if p.requires_grad]]
        lrs = engine.get_lr()
        super().__init__([{"params": params, "lr": lr} for params, lr in zip(groups, lrs)], {"lr": lrs[0]})

    @property
    def param_groups(self):
        if not self._engine._follows_client_lrs:  # the engine's schedule sets the lr: show it
            for group, lr in zip(self._groups, self._engine.get_lr()):
                group["lr"] = lr
        return self._groups

    @param_groups.setter
    def param_groups(self, groups):  # torch.optim.Optimizer.__init__ assigns it, then appends each group
        self._groups = groups

    def zero_grad(self, set_to_none=True):
        pass

    def step(self, closure=None):
        raise RuntimeError("the optimizer dscpp.initialize returned steps inside engine.step(); call that instead")

    def state_dict(self):
        raise RuntimeError("the engine's optimizer state is saved by engine.save_checkpoint, not state_dict()")
