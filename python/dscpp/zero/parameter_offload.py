"""ParameterOffload: ZeRO-3's hooks on one engine's module, as the object DeepSpeed shows at
engine.optimizer.parameter_offload (its DeepSpeedZeRoOffload). TRL's unwrap_model_for_generation reads it: inside
GatheredParameters(engine.parameters()) it takes the module's hooks off (forward_hooks, backward_hooks: each
handle's remove()), runs generate() on the model as a plain module over its whole parameters, and puts the hooks back
with _register_deepspeed_module(module).

What is on the module under ZeRO-3: each module's _parameters reads through the engine (hooks.py: a read from
outside the owning module's forward is fetched on access), which stays for the engine's life; and the forward hooks
held here, which come off and go back on:
- first, the engine's bare-forward hook (the module called by itself, outside engine(...): the engine's forward
  without gradients, which releases everything it gathered when it ends);
- then each unit's pre-hook and hook (the stage gathers the unit as its forward starts, releases it as it ends);
- last, the bare forward's end (always called, also when the forward raises).
There are no module backward hooks: the stage hooks each forward's output tensors for the unit's backward, so
backward_hooks is always empty. With the hooks off, the engine's reads return early (no forward of the engine's is
running), so the module runs on whatever its parameters hold — their whole values inside GatheredParameters."""
from . import hooks


class ParameterOffload:
    def __init__(self, module, engine, units, bare_forward_begins, bare_forward_ends):
        """`engine`: the dscpp._C.Engine; `units`: hooks.gather_units' list, in the order the engine was built with;
        the two callables: DeepSpeedEngine's hooks for the module called by itself."""
        self.module = module
        self._engine = engine
        self._units = units
        self._bare_forward = (bare_forward_begins, bare_forward_ends)
        self.forward_hooks = []
        self.backward_hooks = []
        hooks.install_parameter_reads(module, engine)
        self._register_deepspeed_module(module)

    def _register_deepspeed_module(self, module):
        """Puts the forward hooks on (again: any still on come off first, so they are never on twice)."""
        if module is not self.module:
            raise ValueError("parameter_offload._register_deepspeed_module: only the engine's own module "
                             "(engine.module) can be hooked; its units were fixed at initialize")
        if self._engine is None:
            raise RuntimeError("parameter_offload._register_deepspeed_module: the engine was destroyed")
        self._remove_module_hooks()
        begins, ends = self._bare_forward
        self.forward_hooks = ([module.register_forward_pre_hook(begins, prepend=True)] +
                              hooks.unit_hooks(self._engine, self._units) +
                              [module.register_forward_hook(ends, always_call=True)])

    def _remove_module_hooks(self):
        for handle in self.forward_hooks + self.backward_hooks:
            handle.remove()
        self.forward_hooks = []
        self.backward_hooks = []

    def destroy(self):
        """engine.destroy(): the hooks off, every module's parameters plain again, and nothing of the engine held
        (the optimizer may keep showing this object)."""
        self._remove_module_hooks()
        hooks.uninstall_parameter_reads(self.module)
        self._engine, self._units, self._bare_forward = None, [], None
