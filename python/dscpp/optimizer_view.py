"""OptimizerView: what initialize returns as the optimizer when the config names it. The engine's optimizer runs in
C++ over each rank's flat partition; this view shows scripts what they read of a torch optimizer — param_groups with
the current lr — and turns zero_grad into the no-op it is here (the engine clears gradients after each step)."""


class OptimizerView:
    def __init__(self, engine, param_groups=None):
        """`param_groups`: the parameters of each group (initialize's model_parameters dicts), or None for one."""
        self._engine = engine
        self._groups = param_groups or [[p for p in engine.module.parameters() if p.requires_grad]]

    @property
    def param_groups(self):
        return [{"params": params, "lr": lr} for params, lr in zip(self._groups, self._engine.get_lr())]

    def zero_grad(self, set_to_none=True):
        pass

    def step(self, closure=None):
        raise RuntimeError("the optimizer dscpp.initialize returned steps inside engine.step(); call that instead")

    def state_dict(self):
        raise RuntimeError("the engine's optimizer state is saved by engine.save_checkpoint, not state_dict()")

