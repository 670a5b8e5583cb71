"""DeepSpeedEngine: DeepSpeed's engine API over the C++ engine (dscpp._C.Engine).

One training step, as a script sees it and where it runs:
    engine(batch)          the module's forward, in Python, between the C++ engine's begin_forward / end_forward
                           (ZeRO-3 gathers parameters there)
    engine.backward(loss)  C++: scales the loss, runs autograd, reduces gradients into this rank's shard
    engine.step()          C++: on the accumulation boundary, clips, steps the optimizer, publishes the weights
The module's parameters are the engine's: it re-points their data (casts, flat views, shards) in place, so the
module and the engine never hold two copies.
"""
import collections
import gc
import json
import os
import re
import warnings

import torch
import torch.distributed as dist

from . import checkpointing
from .moe.layer import MoE
from .optimizer_view import OptimizerView
from .zero import gathered
from .zero.hooks import output_tensors
from .zero.parameter_offload import ParameterOffload


class _Destroyed:
    """What a DeepSpeedEngine holds in place of the C++ engine after destroy()."""

    def __getattr__(self, name):
        raise RuntimeError(f"engine.{name}: this engine was destroyed (engine.destroy()); build another with "
                           "dscpp.initialize")


_SCHEDULER_KEY = "dscpp_lr_scheduler"  # where a client scheduler's state_dict goes in a checkpoint's client state
_CLIENT_GROUPS_KEY = "dscpp_client_param_groups"  # and a client optimizer's group settings (lr, betas, eps, ...)


def _group_settings(group):
    """A param group's settings as JSON: its numbers and lists of numbers (lr, betas, eps, weight_decay, momentum,
    ...); a tensor lr as its value. The parameters, flags and anything else stay out."""
    settings = {}
    for key, value in group.items():
        if key == "params":
            continue
        if torch.is_tensor(value) and value.numel() == 1:
            value = value.item()
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) or (isinstance(value, (list, tuple)) and value and
                                               all(isinstance(v, (int, float)) for v in value)):
            settings[key] = list(value) if isinstance(value, (list, tuple)) else value
    return settings


class DeepSpeedEngine:
    """Returned by dscpp.initialize; see the module docstring for one step."""

    def __init__(self, module, engine, training_dataloader=None, client_optimizer=None, client_scheduler=None,
                 param_groups=None, param_names=None, zero3_units=None, forward_only=False,
                 data_parallel_group=None):
        """`param_groups`: the parameters of each of the engine's parameter groups (initialize's), or None for one.
        `param_names`: {id(param): the engine's name} where it differs from the module's (MoE experts, named by
        global index); the module's names otherwise. `zero3_units`: under ZeRO-3, the gather units the C++ engine
        was built with (zero.hooks.gather_units), which this engine hooks into the module (ParameterOffload) until
        destroy(); None otherwise. `forward_only`: built without an optimizer (initialize's
        stand-in one is never stepped, and not shown in `config`); backward and step are refused.
        `data_parallel_group`: the torch.distributed group ZeRO partitions over (an mpu's), None for the world."""
        self.module = module
        self._engine = engine
        self.training_dataloader = training_dataloader
        self._config = json.loads(engine.config_json)
        self._grouped = bool(param_groups)
        self._forward_only = forward_only
        self._compiled = False  # compile() ran
        # A client optimizer's lrs — set by a client scheduler after each applied step, or by the script — are the
        # ones each step uses, as a torch optimizer reads them, unless the config's scheduler sets them.
        self._follows_client_lrs = client_optimizer is not None and not self._config.get("scheduler")
        if forward_only:
            self._config.pop("optimizer", None)
            self.optimizer = None
        else:
            self.optimizer = client_optimizer if client_optimizer is not None else OptimizerView(self, param_groups)
        # The client's scheduler, which this wrapper steps and checkpoints; `lr_scheduler` is what DeepSpeed's
        # engine shows: that one, or initialize's view of the config's schedule (which the C++ engine steps and saves).
        self._client_scheduler = client_scheduler
        self.lr_scheduler = client_scheduler
        # DeepSpeed Compression's schedule (dscpp.compression.scheduler), when the model went through
        # init_compression; initialize attaches it, and step() moves it on.
        self.compression_scheduler = None
        self._follow_client_lrs()
        self._show_schedule_lrs()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        first = next(iter(module.parameters()), None)
        self.device = first.device if first is not None else torch.device("cpu")
        # DeepSpeed's MoE bookkeeping, which scripts read: the model's MoE layers and each one's expert count.
        self.moe_layers = [m for m in module.modules() if isinstance(m, MoE)]
        self.has_moe_layers = bool(self.moe_layers)
        self.num_experts = [m.num_experts for m in self.moe_layers]
        self._param_names = {id(p): name for name, p in module.named_parameters()}
        self._param_names.update(param_names or {})
        self._params_by_id = {id(p): p for p in module.parameters()}
        self._param_shapes = {name: torch.Size(shape) for name, shape in engine.param_shapes.items()}
        # DeepSpeed's: the group ZeRO partitions over and the ranks average gradients in (the world without an mpu).
        if data_parallel_group is None and dist.is_initialized():
            data_parallel_group = dist.group.WORLD
        self.data_parallel_group = data_parallel_group
        gathered.register(self)
        # The order a step's calls must come in: backward needs a forward, step needs a backward.
        self._forwarded = False
        self._backwarded = False
        self._gathered_for_backward = False  # a ZeRO-3 forward's gathers wait for its backward
        self._in_forward = False  # inside forward(): the module's own calls are the engine's
        self._bare_forward = False  # the module was called by itself (below), and its forward has not ended
        # Under ZeRO-3 the module may also be called by itself, as DeepSpeed's hooked module may: the Trainer
        # evaluates self.model, generate() calls it per token. Such a forward is the engine's, without gradients:
        # it gathers unit by unit and releases everything when it ends (_bare_forward_begins/_ends, hooked by
        # ParameterOffload around the units' own hooks). DeepSpeed's optimizer shows that object as
        # parameter_offload (TRL takes the hooks off through it to generate on a gathered model); ours shows it on
        # whichever optimizer the engine returns — the one attribute put on a client's optimizer.
        self._parameter_offload = None
        if zero3_units is not None:
            self._parameter_offload = ParameterOffload(module, engine, zero3_units, self._bare_forward_begins,
                                                       self._bare_forward_ends)
            if self.optimizer is not None:
                self.optimizer.parameter_offload = self._parameter_offload

    # ---- one step -------------------------------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        """The module's forward; its outputs are returned as they are."""
        if self.compression_scheduler is not None and self.global_steps == 0:
            self.compression_scheduler.on_forward()  # techniques at schedule_offset 0 act from the first forward
        self._engine.begin_forward()
        checkpointing._active.append(self)  # checkpointing.checkpoint inside the forward uses this engine
        self._in_forward = True
        try:
            outputs = self.module(*args, **kwargs)
        except BaseException:
            self._engine.end_forward(False)  # nothing will come back for what the forward gathered
            raise
        finally:
            self._in_forward = False
            checkpointing._active.pop()
        will_backward = (not self._forward_only and torch.is_grad_enabled() and
                         any(t.requires_grad for t in output_tensors(outputs)))
        self._engine.end_forward(will_backward)
        self._forwarded = True
        self._gathered_for_backward = will_backward and self.zero_optimization_stage() == 3
        return outputs

    __call__ = forward

    def _refuse_if_forward_only(self, call):
        if self._forward_only:
            raise RuntimeError(f"engine.{call}: this engine was initialized without an optimizer (no optimizer= and "
                               "no \"optimizer\" section), so it runs forward only; pass one to train")

    def _bare_forward_begins(self, module, inputs):
        if self._in_forward:
            return
        if torch.is_grad_enabled():
            raise RuntimeError(
                "ZeRO-3: the model was called by itself with gradients enabled; outside the engine it runs only "
                "without them (torch.no_grad(): evaluation, generation). To train, call the engine: engine(inputs)")
        self._engine.begin_forward()
        self._bare_forward = True

    def _bare_forward_ends(self, module, inputs, outputs):
        if self._bare_forward:
            self._bare_forward = False
            self._engine.end_forward(False)  # no backward will come: every gathered unit is released

    def backward(self, loss, retain_graph=False, scale_wrt_gas=True):
        """Scales `loss` (the micro-batch's mean) by the loss scale / gradient_accumulation_steps and backpropagates;
        the gradients go into this rank's shard. Returns what DeepSpeed's returns: `loss` divided by
        gradient_accumulation_steps (in the loss's dtype) when that is above 1, else `loss`.

        scale_wrt_gas=False: the caller divided the loss already (the Hugging Face Trainer passes loss / accumulation
        steps), so it is backpropagated as it is and returned unchanged. The C++ engine always divides (and counts the
        loss it reports as the micro-batch's), so it is handed loss × gradient_accumulation_steps: the same gradients,
        exactly when the count is a power of two, else within an fp32 rounding."""
        self._refuse_if_forward_only("backward")
        if retain_graph:
            raise NotImplementedError("engine.backward(retain_graph=True) is not supported by deepspeed.cpp")
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"engine.backward: loss must be a tensor, got {type(loss).__name__}")
        if not self._forwarded:
            raise RuntimeError("engine.backward: no forward ran since the last backward; compute the loss from "
                               "engine(batch) (the engine's forward), then call backward once")
        self._forwarded = False
        steps = self.gradient_accumulation_steps()
        self._engine.backward(loss if scale_wrt_gas or steps == 1 else loss * steps)
        self._gathered_for_backward = False
        self._backwarded = True
        return loss.detach() / steps if scale_wrt_gas and steps > 1 else loss

    def step(self, lr_kwargs=None):
        """Ends the micro-step; on an accumulation boundary the optimizer steps (unless the loss scale overflowed)."""
        self._refuse_if_forward_only("step")
        if lr_kwargs is not None:
            raise NotImplementedError("engine.step(lr_kwargs=...) is not supported by deepspeed.cpp")
        if not self._backwarded:
            raise RuntimeError("engine.step: no backward since the last step; call engine.backward(loss) first")
        self._backwarded = False
        boundary = self._engine.is_gradient_accumulation_boundary()
        if boundary:
            self._follow_client_lrs()
        applied = self._engine.step()  # false off the boundary, and for a step skipped on overflow
        if boundary:
            self._show_schedule_lrs()
        if self.compression_scheduler is not None and boundary and applied:
            self.compression_scheduler.on_step(self.global_steps - self.skipped_steps)
        if self._client_scheduler is not None and boundary and applied:
            with warnings.catch_warnings():
                # torch warns when optimizer.step() did not run first; it did, in the C++ engine, out of its sight.
                warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()` before"))
                self._client_scheduler.step()

    def _make_client_scheduler(self, make):
        """A client scheduler over the config's optimizer, from initialize's callable: from now on it sets the view's
        group lrs (as it is built, then after each applied step), and each step uses them. The view shows its own
        groups before `make` runs, so what the scheduler writes while it is built (its first lr) stays."""
        self._follows_client_lrs = True
        scheduler = make(self.optimizer)
        if getattr(scheduler, "optimizer", None) is not self.optimizer:
            raise ValueError("dscpp.initialize: the lr_scheduler callable made a scheduler of another optimizer than "
                             "the one it was given (the engine's)")
        self._client_scheduler = self.lr_scheduler = scheduler
        self._follow_client_lrs()

    def _follow_client_lrs(self):
        """The client optimizer's lr of each group, for the engine's next optimizer step (called before each)."""
        if not self._follows_client_lrs:
            return
        groups = self.optimizer.param_groups
        self._engine.set_lr(float(groups[0]["lr"]))
        if self._grouped:
            for i, group in enumerate(groups):
                self._engine.set_group_lr(i, float(group["lr"]))

    def _show_schedule_lrs(self):
        """Under a config "scheduler" with a client optimizer, the schedule's lrs in the client's param_groups, where
        DeepSpeed's scheduler writes them (scripts read optimizer.param_groups[0]["lr"]); the engine steps with them."""
        if self.optimizer is None or isinstance(self.optimizer, OptimizerView) or not self._config.get("scheduler"):
            return
        lrs = self.get_lr()
        for i, group in enumerate(self.optimizer.param_groups):
            group["lr"] = lrs[i] if i < len(lrs) else lrs[0]

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    # ---- where training stands ------------------------------------------------------------------------------------

    @property
    def global_steps(self):
        return self._engine.global_steps

    @property
    def global_samples(self):
        return self._engine.global_samples

    @property
    def micro_steps(self):
        return self._engine.micro_steps

    @property
    def skipped_steps(self):
        return self._engine.skipped_steps

    def get_lr(self):
        """The learning rate of each parameter group for the next step."""
        if self._follows_client_lrs:
            return [group["lr"] for group in self.optimizer.param_groups]
        return list(self._engine.group_lrs) if self._grouped else [self._engine.lr]

    def empty_partition_cache(self):
        """DeepSpeed's: give back the memory ZeRO-3 holds in gathered parameters outside a step. This engine already
        releases every gathered block when its micro-step ends (and after a forward without backward), so between
        steps only the persistent parameters stay whole and there is nothing more to release; what is left is what
        DeepSpeed does after it, a garbage collection and, on a GPU, emptying torch's cache."""
        if self._gathered_for_backward:
            raise RuntimeError("engine.empty_partition_cache: called between a forward and its backward, whose "
                               "gathered parameters the backward needs; call it between steps")
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def get_global_grad_norm(self):
        """The last step's global gradient norm before clipping; None before the first step."""
        return self._engine.last_step()["grad_norm"] if self.global_steps > 0 else None

    def was_step_applied(self):
        """False when the last boundary was skipped for overflow."""
        return self.global_steps > 0 and not self._engine.last_step()["skipped"]

    def last_step(self):
        """deepspeed.cpp's: what the last optimizer boundary did — step, loss (the mean over the global batch: every
        rank and micro-step), lr, loss_scale, grad_norm, skipped."""
        return self._engine.last_step()

    def get_loss_scale(self):
        return self._engine.loss_scale

    def is_gradient_accumulation_boundary(self):
        return self._engine.is_gradient_accumulation_boundary()

    def set_gradient_accumulation_boundary(self, is_boundary):
        """DeepSpeed's override of the engine's micro-step count, kept until set again: Hugging Face Accelerate sets
        it before each backward from its own count, and to True at the end of an epoch whose batches are not a
        multiple of gradient_accumulation_steps — that step then applies the micro-steps accumulated so far (each
        scaled by 1/gradient_accumulation_steps, as DeepSpeed's). Accelerate calls step() on boundaries only: a
        micro-step whose backward had no step() is closed here, as the engine's step() off a boundary does (it only
        counts the micro-step)."""
        if not isinstance(is_boundary, bool):
            raise TypeError(f"engine.set_gradient_accumulation_boundary: is_boundary must be a bool, got "
                            f"{type(is_boundary).__name__}")
        if self._backwarded:
            self.step()
        self._engine.set_gradient_accumulation_boundary(is_boundary)

    def gradient_accumulation_steps(self):
        return self._engine.grad_accum

    def train_batch_size(self):
        return self._engine.train_batch_size

    def train_micro_batch_size_per_gpu(self):
        return self._engine.micro_batch

    def zero_optimization_stage(self):
        return self._engine.zero_stage

    def memory(self):
        """This rank's model-state bytes: params, grads, master, optimizer_state, buffers, model_states, and ZeRO-3's
        persistent and gathered_peak (gpt-train's metrics' `memory`)."""
        return json.loads(self._engine.memory_json)

    @property
    def config(self):
        """The resolved config (every default filled), as a dict."""
        return self._config

    def compile(self, backend="inductor", compile_kwargs=None, schedule=None, compiled_autograd_enabled=False):
        """DeepSpeed's (Accelerate calls it when dynamo is configured): the module's forward compiled with
        torch.compile(backend=backend, **compile_kwargs), in place (nn.Module.compile); the engine's step is C++ and
        is not compiled. At ZeRO 0-2 only: under ZeRO-3 the module's forward runs the engine's gather hooks, which
        torch.compile would have to trace. DeepSpeed's deepcompile (`schedule`, compiled autograd) is not built."""
        if schedule is not None or compiled_autograd_enabled:
            raise NotImplementedError("engine.compile: schedule and compiled_autograd_enabled (DeepSpeed's "
                                      "deepcompile) are not supported by deepspeed.cpp")
        if self.zero_optimization_stage() == 3:
            raise NotImplementedError("engine.compile: torch.compile under ZeRO-3 is not supported by deepspeed.cpp "
                                      "(the forward runs the engine's gather hooks); run without it, or at ZeRO 0-2")
        if self.is_compiled:
            return
        self.module.compile(backend=backend, **(compile_kwargs or {}))
        self._compiled = True

    @property
    def is_compiled(self):
        return self._compiled

    def destroy(self):
        """DeepSpeed's: lets go of what the engine holds — ZeRO-3's hooks on the module and the C++ engine (its flat
        buffers, gradients, optimizer state, communicators) — so that a script (Accelerate's free_memory) can build
        another in the same process. The module keeps the values its parameters show (under ZeRO-3, 0-element between
        steps, as DeepSpeed leaves them); any other engine call afterwards is an error saying so."""
        if isinstance(self._engine, _Destroyed):
            return
        if self._parameter_offload is not None:
            self._parameter_offload.destroy()
            self._parameter_offload = None
        self._engine = _Destroyed()
        gc.collect()

    # ---- whole parameters: what zero.GatheredParameters asks of the engine ------------------------------------------

    def holds(self, param):
        """Whether `param` (the object itself) is one of this engine's parameters."""
        return self._params_by_id.get(id(param)) is param

    def parameter_shape(self, param):
        """`param`'s whole shape (a tensor-parallel rank's slice's), as the engine holds it whatever the tensor shows
        (under ZeRO-3, 0 elements between forwards, frozen ones too); None for a parameter this engine does not
        hold."""
        if not self.holds(param):
            return None
        return self._param_shapes.get(self._param_names[id(param)])

    def whole_parameter(self, param):
        """`param`'s whole current value, in the compute dtype: under ZeRO-3 assembled from the data-parallel ranks'
        shards — collective: every rank asks for the same parameters in the same order, outside a forward; otherwise
        the parameter itself (its tensor, not a copy)."""
        return self._engine.whole_parameter(param)

    def write_parameters(self, params):
        """The current value of each of `params` (its .data, whole, on this rank) becomes the engine's: its master copy
        and, under ZeRO-3, this rank's shard of it. Every data-parallel rank writes the same values (GatheredParameters
        broadcasts them first)."""
        self._engine.set_parameters({self._param_names[id(p)]: p.data for p in params})

    # ---- as the module --------------------------------------------------------------------------------------------
    # DeepSpeed's engine is an nn.Module holding the model as `module`: its parameters are the model's (named with a
    # "module." prefix), and an attribute it lacks is the model's.

    def parameters(self, recurse=True):
        return self.module.parameters(recurse)

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        return self.module.named_parameters(prefix + ("." if prefix else "") + "module", recurse, remove_duplicate)

    def buffers(self, recurse=True):
        return self.module.buffers(recurse)

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        return self.module.named_buffers(prefix + ("." if prefix else "") + "module", recurse, remove_duplicate)

    def __getattr__(self, name):
        # Only for names this class does not have; `module` itself may not be set yet while __init__ runs.
        module = self.__dict__.get("module")
        if module is None or name.startswith("__"):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        try:
            return getattr(module, name)
        except AttributeError:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}' (nor has its module, "
                                 f"{type(module).__name__})") from None

    # ---- checkpoints ----------------------------------------------------------------------------------------------

    def save_checkpoint(self, save_dir, tag=None, client_state={}, save_latest=True, exclude_frozen_parameters=False):
        """Collective. Writes save_dir/<tag>/ (default tag global_step<N>) and then, with save_latest,
        save_dir/latest. Besides the trained state it holds the module's buffers (BatchNorm's running statistics) and
        frozen parameters, rank 0's, unless exclude_frozen_parameters. `client_state` must be JSON (no pickles:
        nothing in a checkpoint runs code on load). Returns True."""
        if self._client_scheduler is not None:  # the client scheduler's state travels in the client state
            if not isinstance(client_state, dict):
                raise TypeError("save_checkpoint: with a client lr_scheduler, client_state must be a dict")
            client_state = dict(client_state, **{_SCHEDULER_KEY: self._client_scheduler.state_dict()})
        if not isinstance(self.optimizer, OptimizerView):
            # As DeepSpeed's checkpoint holds the client optimizer's state_dict, its param groups' settings with it:
            # a resumed run's client optimizer shows (and, for the lr, steps with) the values it had when saved.
            if client_state is None:
                client_state = {}
            if not isinstance(client_state, dict):
                raise TypeError("save_checkpoint: with a client optimizer, client_state must be a dict")
            client_state = dict(client_state, **{_CLIENT_GROUPS_KEY: [_group_settings(g)
                                                                      for g in self.optimizer.param_groups]})
        try:
            state = json.dumps(client_state if client_state is not None else None)
        except TypeError as e:
            raise TypeError(f"save_checkpoint: client_state must be JSON-serialisable ({e}); checkpoints hold no "
                            "pickles") from None
        self._engine.save_checkpoint(os.fspath(save_dir), "" if tag is None else str(tag), state, bool(save_latest),
                                     bool(exclude_frozen_parameters))
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False, custom_load_fn=None):
        """Collective. Loads load_dir/<tag> (default: the tag `latest` names), written by any world size, ZeRO stage,
        or by gpt-train. Returns (path, client_state); (None, None) when load_dir has no `latest` and no tag was
        given, as DeepSpeed does.

        An engine built without an optimizer (forward only) loads the checkpoint's weights — trained ones too — and
        counters; there is no optimizer state to load.

        load_optimizer_states=False keeps this engine's optimizer state; load_lr_scheduler_states=False keeps its
        schedule position (a new engine's schedule starts over) and its client scheduler; load_module_only=True loads
        the weights alone (counters, optimizer, schedule, loss scaler stay); load_module_strict=False lets the model
        and the checkpoint differ in which parameters they have (shared ones must agree in shape)."""
        if custom_load_fn is not None:
            raise NotImplementedError("load_checkpoint: custom_load_fn is not supported (the weights load into the "
                                      "engine's partitions directly, with no module state_dict to hand it); use "
                                      "load_module_strict=False, or set values with dscpp.zero.GatheredParameters")
        load_dir = os.fspath(load_dir)
        if tag is None and not os.path.isfile(os.path.join(load_dir, "latest")):
            warnings.warn(f"dscpp: unable to find latest file at {os.path.join(load_dir, 'latest')}, if trying to "
                          "load latest checkpoint please pass an explicit tag")
            return None, None
        path, _, client_state = self._engine.load_checkpoint(
            load_dir, "" if tag is None else str(tag), bool(load_optimizer_states), bool(load_lr_scheduler_states),
            bool(load_module_only), bool(load_module_strict))
        self._forwarded = self._backwarded = False
        client_state = json.loads(client_state)
        if isinstance(client_state, dict) and _CLIENT_GROUPS_KEY in client_state:
            saved_groups = client_state.pop(_CLIENT_GROUPS_KEY)
            if (self.optimizer is not None and not isinstance(self.optimizer, OptimizerView) and
                    load_optimizer_states and not load_module_only and
                    len(saved_groups) == len(self.optimizer.param_groups)):
                for group, settings in zip(self.optimizer.param_groups, saved_groups):
                    for key, value in settings.items():
                        if torch.is_tensor(group.get(key)):
                            group[key].fill_(value)
                        else:
                            group[key] = tuple(value) if isinstance(value, list) else value
        if isinstance(client_state, dict) and _SCHEDULER_KEY in client_state:
            scheduler_state = client_state.pop(_SCHEDULER_KEY)
            if self._client_scheduler is not None and load_lr_scheduler_states and not load_module_only:
                self._client_scheduler.load_state_dict(scheduler_state)
                for group, lr in zip(self.optimizer.param_groups, self._client_scheduler.get_last_lr()):
                    group["lr"] = lr  # the engine takes them at the next optimizer step
        if self.compression_scheduler is not None:  # the techniques on that the loaded run had on
            self.compression_scheduler.resume(self.global_steps - self.skipped_steps)
        return path, client_state

    def zero_gather_16bit_weights_on_model_save(self):
        """zero_optimization.stage3_gather_16bit_weights_on_model_save: whether a ZeRO-3 model save gathers the
        whole weights (Accelerate's get_state_dict and the Trainer's save_model ask before they do)."""
        return bool(self._config.get("zero_optimization", {}).get("stage3_gather_16bit_weights_on_model_save", False))

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters=False):
        """DeepSpeed's: the module's state_dict with whole weights (in the compute dtype) on rank 0, None on the
        others; collective. Gathered one module at a time, so at most one module's parameters are whole at once
        (each copied out before its shards are released); a parameter two modules share appears under both names as
        one tensor, as nn.Module.state_dict gives it; persistent buffers as they are. Accelerate's get_state_dict
        and the Trainer's save_model under ZeRO-3 call it."""
        if self.zero_optimization_stage() != 3:
            raise ValueError("_zero3_consolidated_16bit_state_dict: this function requires ZeRO-3 mode (the "
                             "module's state_dict() is whole at stages 0-2)")
        rank0 = not dist.is_initialized() or dist.get_rank() == 0
        state = collections.OrderedDict() if rank0 else None
        first_name = {}  # id(parameter) -> the key it was first written under

        def visit(module, prefix):
            params = list(module.parameters(recurse=False))
            with gathered.GatheredParameters(params):
                if rank0:
                    for name, p in module.named_parameters(recurse=False):
                        if exclude_frozen_parameters and not p.requires_grad:
                            continue
                        if id(p) in first_name:
                            state[prefix + name] = state[first_name[id(p)]]
                        else:
                            state[prefix + name] = p.detach().clone()  # the whole value exists only in here
                            first_name[id(p)] = prefix + name
                    for name, buffer in module.named_buffers(recurse=False):
                        if buffer is not None and name not in module._non_persistent_buffers_set:
                            state[prefix + name] = buffer.detach().clone()
            for name, child in module.named_children():
                visit(child, prefix + name + ".")

        visit(self.module, "")
        return state

    def save_16bit_model(self, save_dir, save_filename="model.safetensors"):
        """Collective. The whole weights in the compute dtype, as one safetensors file written by rank 0 (under ZeRO-3
        it needs stage3_gather_16bit_weights_on_model_save). Returns whether it saved."""
        os.makedirs(save_dir, exist_ok=True)
        return self._engine.save_16bit_model(os.path.join(os.fspath(save_dir), save_filename))
