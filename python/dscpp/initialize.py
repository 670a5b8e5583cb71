"""dscpp.initialize: DeepSpeed's entry point. Gathers what the C++ engine needs — the model's tensors, the config
(with a client optimizer folded in), torch.distributed's process group — builds it, and wraps it for Python."""
import json
import os
import warnings

import torch
import torch.distributed as dist

from . import _C
from .client_optimizer import engine_groups, optimizer_parameters, optimizer_section
from .comm import engine_comm_arguments, init_distributed
from .config import load_json, resolve_config, zero_section_without_auto
from .engine import DeepSpeedEngine
from .moe.parallelism import expert_parallelism
from .runtime import lr_schedules
from .runtime.hybrid_engine import DeepSpeedHybridEngine
from .zero import hooks as zero_hooks
from .zero import init as zero_init


def _flatten_parameters(model_parameters):
    out = []
    for item in model_parameters:
        if isinstance(item, dict):
            params = item["params"]
            out.extend([params] if isinstance(params, torch.Tensor) else params)
        else:
            out.append(item)
    return out


def _trainable_only(model_parameters):
    """model_parameters (or an optimizer's param_groups) without the frozen parameters (requires_grad=False), groups
    left empty by that dropped. DeepSpeed steps only the parameters that require a gradient among those it is given:
    a LoRA / PEFT fine-tune passes model.parameters() with the base weights frozen, and they keep their values."""
    out = []
    for item in model_parameters:
        if isinstance(item, dict):
            params = item["params"]
            params = [params] if isinstance(params, torch.Tensor) else list(params)
            kept = [p for p in params if p.requires_grad]
            if kept:
                out.append({**item, "params": kept})
        elif item.requires_grad:
            out.append(item)
    return out


def _untrained(given, trainable, what):
    """The trainable parameters outside `given` (model_parameters or a client optimizer's, frozen ones dropped), which
    the optimizer leaves alone, as DeepSpeed does: the engine keeps them as frozen ones. A parameter given that is not
    one of the model's trainable ones is an error."""
    given_ids = {id(p) for p in given}
    trainable_ids = {id(p) for p in trainable}
    if not given_ids <= trainable_ids:
        raise ValueError(f"dscpp.initialize: {what} holds {len(given_ids - trainable_ids)} parameters that are not "
                         "the model's (model.parameters() with requires_grad=True); the engine trains the model's "
                         "own parameters")
    return [p for p in trainable if id(p) not in given_ids]


def _non_persistent_buffers(model):
    """The names (as named_buffers gives them) of buffers registered with persistent=False: checkpoints leave them
    out, as the module's state_dict does."""
    names = {id(b): name for name, b in model.named_buffers()}
    out = set()
    for module in model.modules():
        for short in module._non_persistent_buffers_set:
            buffer = module._buffers.get(short)
            if buffer is not None and id(buffer) in names:
                out.add(names[id(buffer)])
    return out


def _mpu_groups(mpu, model):
    """DeepSpeed's mpu (Megatron's parallel state): its data-parallel group, which ZeRO, the batch and the loader
    use, and the InitOptions fields for its tensor-parallel group with the parameters sliced over it (those marked
    tensor_model_parallel, Megatron's attribute, or model_parallel, DeepSpeed's). (None, {}) without one."""
    if mpu is None:
        return None, {}
    if hasattr(mpu, "get_sequence_parallel_group"):
        # DeepSpeed reads its sequence-data-parallel group from such an mpu (Ulysses' parallel_state_sp); here the
        # engine's group would be its data-parallel one, and sequence_parallel_size would split that.
        raise NotImplementedError(f"dscpp.initialize: mpu {type(mpu).__name__} has sequence-parallel groups, which "
                                  "are not supported yet; pass no mpu and set sequence_parallel_size in the config "
                                  "(the engine's group is then every rank, its sequence groups consecutive ranks)")
    tensor_group = getattr(mpu, "get_tensor_model_parallel_group", None) or getattr(mpu, "get_model_parallel_group",
                                                                                    None)
    if tensor_group is None or not hasattr(mpu, "get_data_parallel_group"):
        raise TypeError(f"dscpp.initialize: mpu {type(mpu).__name__} must have get_data_parallel_group() and "
                        "get_tensor_model_parallel_group() (or get_model_parallel_group()), as Megatron's does")
    if not dist.is_initialized():
        raise RuntimeError("dscpp.initialize: an mpu needs torch.distributed initialised (its groups are "
                           "torch.distributed groups); call dscpp.init_distributed() and build the groups first")
    for name in ("get_pipeline_model_parallel_world_size", "get_pipe_parallel_world_size"):
        if hasattr(mpu, name) and getattr(mpu, name)() > 1:
            raise NotImplementedError(f"dscpp.initialize: mpu.{name}() is {getattr(mpu, name)()}; pipeline "
                                      "parallelism is not supported yet")
    def is_slice(p):
        return getattr(p, "tensor_model_parallel", False) or getattr(p, "model_parallel", False)
    sliced = [name for name, p in model.named_parameters() if p.requires_grad and is_slice(p)]
    model_group = _C.comm_over(**engine_comm_arguments("model", tensor_group()))
    return mpu.get_data_parallel_group(), dict(model_parallel_group=model_group, model_parallel_params=set(sliced))


def _mesh_sequence_parallel(mesh_param, settings):
    """DeepSpeed's mesh_param (data_parallel_size, sequence_parallel_size): the config with that sequence-parallel
    size (the groups are made once the engine exists). ValueError naming the numbers when they do not fit."""
    if not (isinstance(mesh_param, (tuple, list)) and len(mesh_param) == 2 and
            all(isinstance(n, int) and n >= 1 for n in mesh_param)):
        raise ValueError(f"dscpp.initialize: mesh_param must be (data_parallel_size, sequence_parallel_size), two "
                         f"positive integers, got {mesh_param!r}")
    data, sequence = mesh_param
    world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    if data * sequence != world:
        raise ValueError(f"dscpp.initialize: mesh_param {tuple(mesh_param)} covers {data * sequence} ranks, the job "
                         f"has {world}")
    if settings.get("sequence_parallel_size", sequence) != sequence:
        raise ValueError(f"dscpp.initialize: mesh_param's sequence_parallel_size {sequence} and the config's "
                         f"{settings['sequence_parallel_size']} differ")
    return {**settings, "sequence_parallel_size": sequence}


def _dataloader(training_data, engine, collate_fn, drop_last):
    """DeepSpeed's loader: torch's DistributedSampler (shuffled, seed 0; call set_epoch per epoch) over the
    data-parallel ranks (the sequence ranks of one sample counted once), micro-batch sized."""
    from torch.utils.data import DataLoader, DistributedSampler, IterableDataset
    if isinstance(training_data, IterableDataset):
        raise TypeError("dscpp.initialize: training_data is an IterableDataset, which cannot be sharded by a sampler; "
                        "pass a map-style Dataset, or build your own loader")
    # With sequence_parallel_size P the engine's group holds P consecutive ranks per sample: they read the same one.
    sequence = engine.sequence_parallel_size
    sampler = DistributedSampler(training_data, num_replicas=engine.world_size // sequence, rank=engine.rank // sequence)
    return DataLoader(training_data, batch_size=engine.micro_batch, sampler=sampler, collate_fn=collate_fn,
                      drop_last=drop_last)


def _client_scheduler(lr_scheduler, client_optimizer, settings):
    """A client lr_scheduler, as DeepSpeed takes it: a torch scheduler over the client optimizer, or a callable
    making one from it. The engine then steps with the optimizer's lr, which the scheduler sets after each step."""
    if lr_scheduler is None:
        return None
    if client_optimizer is None:
        raise TypeError("dscpp.initialize: a client lr_scheduler object drives a client optimizer: pass optimizer= "
                        "too, pass a callable that makes the scheduler from the engine's optimizer, or describe the "
                        "schedule in the config's \"scheduler\" section")
    if not hasattr(lr_scheduler, "step"):
        if not callable(lr_scheduler):
            raise TypeError(f"dscpp.initialize: lr_scheduler must be a scheduler or a callable making one, got "
                            f"{type(lr_scheduler).__name__}")
        lr_scheduler = lr_scheduler(client_optimizer)
    if getattr(lr_scheduler, "optimizer", None) is not client_optimizer:
        raise ValueError("dscpp.initialize: the lr_scheduler schedules another optimizer than the one passed")
    if settings.get("scheduler"):
        raise ValueError(f"dscpp.initialize: an lr_scheduler was passed ({type(lr_scheduler).__name__}) and the "
                         "config has a \"scheduler\" section; keep one")
    return lr_scheduler


# The forward-only engine's stand-in (see initialize): SGD without momentum keeps no state.
_FORWARD_ONLY_OPTIMIZER = {"type": "SGD", "params": {"lr": 0.0}}


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None, lr_scheduler=None,
               distributed_port=29500, mpu=None, dist_init_required=None, collate_fn=None, config=None,
               mesh_param=None, config_params=None):
    """DeepSpeed's initialize → (engine, optimizer, training_dataloader, lr_scheduler).

    `config` is a path or a dict (or args.deepspeed_config). A client `optimizer` (torch.optim.Adam, AdamW, SGD,
    Adagrad or DeepSpeedCPUAdam, or a callable making one from the parameters) becomes the config's "optimizer"
    section; a client `lr_scheduler` over it (or a callable making one) sets the lr of each step. With neither an
    optimizer nor an "optimizer" section the engine runs forward only (the optimizer returned is None). When
    WORLD_SIZE > 1 and torch.distributed is not initialised, init_distributed() joins the job first; the engine
    communicates over torch.distributed's default group, or with an `mpu` (Megatron's parallel state) over its
    data-parallel group, the model being tensor parallel over its tensor-parallel group."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"dscpp.initialize: model must be a torch.nn.Module, got {type(model).__name__}")
    config_dict, config_path = resolve_config(args, config, config_params)
    # `settings`: the config's JSON, read once for the decisions below; the engine still gets a file by its path (its
    # name heads the engine's errors) unless initialize had to change the config.
    settings = config_dict if config_dict is not None else load_json(config_path)
    if mesh_param is not None:
        settings = _mesh_sequence_parallel(mesh_param, settings)
        config_dict, config_path = settings, None
    settings, config_dict, config_path = zero_section_without_auto(settings, config_dict, config_path)
    if not dist.is_initialized() and dist_init_required is not False and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        init_distributed(distributed_port=distributed_port)

    trainable = [p for p in model.parameters() if p.requires_grad]
    client_optimizer = None
    untrained = []  # trainable parameters the optimizer leaves alone (outside model_parameters / its param_groups)
    groups = []  # the engine's parameter groups: [(parameters, weight_decay or None, lr or None)]
    if optimizer is not None:
        if callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
            optimizer = optimizer(model_parameters if model_parameters is not None else trainable)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"dscpp.initialize: optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        section = optimizer_section(optimizer)
        untrained = _untrained([p for p in optimizer_parameters(optimizer) if p.requires_grad], trainable,
                               "the optimizer")
        if "optimizer" in settings:
            # DeepSpeed uses the client optimizer as its basic optimizer and never reads the config's section.
            warnings.warn(f"dscpp.initialize: the config's \"optimizer\" section ({settings['optimizer']}) is "
                          f"not used: the optimizer passed ({type(optimizer).__name__}) is, as in DeepSpeed")
        config_dict, config_path = {**settings, "optimizer": section}, None
        client_optimizer = optimizer
        groups = engine_groups(_trainable_only(optimizer.param_groups))
    elif model_parameters is not None:
        model_parameters = _trainable_only(list(model_parameters))
        untrained = _untrained(_flatten_parameters(model_parameters), trainable, "model_parameters")
        if any(isinstance(g, dict) for g in model_parameters):
            groups = engine_groups(model_parameters, settings.get("optimizer", {}).get("params", {}))
    # A callable lr_scheduler with the config's optimizer (the Trainer's, for a config without "scheduler"): made,
    # as DeepSpeed makes it, from the engine's optimizer once the engine exists.
    scheduler_maker = None
    if lr_scheduler is not None and client_optimizer is None and callable(lr_scheduler) and \
            not hasattr(lr_scheduler, "step"):
        if settings.get("scheduler"):
            raise ValueError("dscpp.initialize: an lr_scheduler callable was passed and the config has a "
                             "\"scheduler\" section; keep one")
        scheduler_maker, lr_scheduler = lr_scheduler, None
    client_scheduler = _client_scheduler(lr_scheduler, client_optimizer, settings)
    forward_only, forward_only_file = False, None
    if optimizer is None:
        if "optimizer" not in settings:
            # No optimizer anywhere: DeepSpeed's engine then runs forward only (TRL's reference model, an evaluation
            # copy). The C++ engine is built forward only (InitOptions.forward_only: every parameter held frozen, no
            # gradient, master or optimizer buffers) with a stateless SGD at lr 0 that never steps; backward and step
            # are refused.
            if settings.get("scheduler"):
                raise ValueError("dscpp.initialize: the config has a \"scheduler\" section but there is no optimizer "
                                 "for it to schedule (no optimizer= and no \"optimizer\" section)")
            if scheduler_maker is not None:
                raise ValueError("dscpp.initialize: an lr_scheduler callable was passed but there is no optimizer "
                                 "for it to schedule (no optimizer= and no \"optimizer\" section)")
            forward_only_file = config_path  # the file's name still heads its errors (below)
            config_dict, config_path = {**settings, "optimizer": _FORWARD_ONLY_OPTIMIZER}, None
            forward_only = True

    # ZeRO-3's units (the other stages ignore them): each module's own parameters, or a leaf module's all.
    units = zero_hooks.gather_units(model)
    data_group, model_parallel = _mpu_groups(mpu, model)
    # MoE layers with ep_size > 1: their groups made, their experts named by global index (the engine's names).
    tensor_parallel = model_parallel["model_parallel_group"].world_size if model_parallel else 1
    experts, expert_names = expert_parallelism(model, tensor_parallel)
    names = {id(p): expert_names.get(id(p), name) for name, p in model.named_parameters()}
    options = _C.InitOptions()  # every field the engine takes from here; include/dscpp/engine/engine.h says each
    options.comm = _C.comm_over(**engine_comm_arguments(group=data_group))
    options.param_groups = [([names[id(p)] for p in params], decay, lr) for params, decay, lr in groups]
    options.untrained_params = {names[id(p)] for p in untrained}
    # Without an optimizer, every parameter is held as a frozen one and nothing for training is allocated: ZeRO-3
    # keeps a rank's shard of the weights (ZeRO-Inference), stages 0-2 the whole weights (a reference model).
    options.forward_only = forward_only
    compression, options.compression_applied = _compression_schedule(model, settings)
    # The config's sparse_attention describes the model's attention: it must hold DeepSpeed's sparse attention.
    from .ops.sparse_attention import SparseSelfAttention
    options.sparse_attention_applied = any(isinstance(m, SparseSelfAttention) for m in model.modules())
    for field, value in {**model_parallel, **experts}.items():
        setattr(options, field, value)
    tensors = _C.ModelTensors(
        params=[(names[id(p)], p) for _, p in model.named_parameters()], buffers=list(model.named_buffers()),
        non_persistent_buffers=_non_persistent_buffers(model), units=[(name, params) for name, _, params in units],
        prepartitioned=zero_init.take_units(model))
    try:
        engine = _C.create_engine(tensors, config=config_path if config_path is not None else json.dumps(config_dict),
                                  config_is_path=config_path is not None, options=options)
    except _C.ConfigError as e:
        if forward_only_file is None:
            raise
        raise _C.ConfigError(f"{forward_only_file}: {e}") from None
    resolved = json.loads(engine.config_json)
    from .utils import groups as groups_module
    groups_module.mpu = mpu  # the getters answer from it, as DeepSpeed's do
    if engine.sequence_parallel_size > 1 or (mesh_param is not None and dist.is_initialized()):
        # DeepSpeed's mesh groups, for dscpp.utils.groups' getters (a mesh of sequence size 1 has groups of one)
        groups_module._create_sequence_parallel_groups(engine.sequence_parallel_size)
    loader = None
    if training_data is not None:
        loader = _dataloader(training_data, engine, collate_fn, bool(resolved.get("dataloader_drop_last", False)))
    # DeepSpeed's initialize returns its hybrid engine (training plus generation) when the config asks for it.
    engine_class = DeepSpeedHybridEngine if engine.hybrid_engine["enabled"] else DeepSpeedEngine
    wrapper = engine_class(model, engine, loader, client_optimizer, client_scheduler,
                           param_groups=[params for params, _, _ in groups], param_names=names,
                           zero3_units=units if engine.zero_stage == 3 else None,
                           forward_only=forward_only, data_parallel_group=data_group)
    if compression is not None:
        _check_moq(compression, engine)
        wrapper.compression_scheduler = compression
    if scheduler_maker is not None:
        wrapper._make_client_scheduler(scheduler_maker)
        client_scheduler = wrapper.lr_scheduler
    scheduler = client_scheduler
    if scheduler is None and resolved.get("scheduler"):
        scheduler = lr_schedules.engine_scheduler(wrapper, resolved["scheduler"], resolved.get("optimizer") or {})
        wrapper.lr_scheduler = scheduler
    return wrapper, wrapper.optimizer, loader, scheduler


def _compression_schedule(model, settings):
    """(DeepSpeed Compression's schedule or None, whether the model went through init_compression) when the config
    switches something on; (None, False) otherwise. A config that switches something on for a model that did not go
    through init_compression is refused: DeepSpeed would train it uncompressed."""
    section = settings.get("compression_training")
    if not section:
        return None, False
    from .compression import scheduler
    from .compression.compress import compression_config
    config = compression_config({"compression_training": section})
    techniques = [t for t in scheduler.TECHNIQUES if config[t]["shared_parameters"]["enabled"]]
    switched_on = techniques + (["layer_reduction"] if config["layer_reduction"]["enabled"] else [])
    if not switched_on:
        return None, False
    if not any(hasattr(m, "_dscpp_compression") for m in model.modules()):
        # DeepSpeed's recipes build the teacher's engine from the student's config: that model is meant to run
        # uncompressed, as DeepSpeed's engine runs a model init_compression did not see. Said, not silent.
        warnings.warn(f"dscpp.initialize: compression_training switches on {', '.join(switched_on)}, but this model "
                      f"did not go through dscpp.compression.init_compression, so it runs uncompressed (as a "
                      f"distillation's teacher does); call init_compression(model, config) first to compress it")
        return None, True
    return (scheduler.compression_scheduler(model, config) if techniques else None), True


def _check_moq(compression, engine):
    """MoQ quantizes the model's weights in place after each step, which needs an fp32 master apart from them
    (fp16 / bf16) and whole weights in the module (ZeRO 0-2)."""
    if not compression._moq:
        return
    key = "compression_training.weight_quantization.shared_parameters.quantize_weight_in_forward"
    if engine.compute_dtype == "Float":
        raise _C.ConfigError(f"{key} = false (MoQ: weights quantized after each step) needs fp16 or bf16, where the "
                             f"fp32 master weights stay unquantized; set it true to quantize in the forward instead")
    if engine.zero_stage == 3:
        raise _C.ConfigError(f"{key} = false (MoQ) quantizes whole weights, which ZeRO-3 partitions; use stage 0-2 "
                             f"or set it true to quantize in the forward")
