"""init_compression and redundancy_clean, DeepSpeed Compression's two calls (deepspeed.compression.compress).

    model = init_compression(model, "ds_config.json", teacher_model=teacher)  # layers made compression-aware
    engine, *_ = dscpp.initialize(model=model, config="ds_config.json")      # the schedule steps with the engine
    ... train ...
    model = redundancy_clean(model, "ds_config.json")                          # masks and bits made permanent

The config section is parsed and checked by the C++ config layer (dscpp._C.compression.parse_config), the same parse
the engine makes; module names are matched here with Python's re.search, as DeepSpeed matches them.
"""
import json
import os
import re

import torch

from .._C import compression as _q
from .basic_layer import BNLayer_Compress, Conv2dLayer_Compress, Embedding_Compress, LinearLayer_Compress
from . import parallel_layer
from .helper import recursive_getattr, recursive_setattr

# The techniques in the order redundancy_clean makes them permanent (quantized values first, then masks over them).
TECHNIQUES = ("weight_quantization", "sparse_pruning", "row_pruning", "head_pruning", "channel_pruning",
              "activation_quantization")


def compression_config(deepspeed_config):
    """The resolved compression_training section (every default filled) of a config dict or JSON path."""
    if isinstance(deepspeed_config, dict):
        settings = deepspeed_config
    elif isinstance(deepspeed_config, (str, os.PathLike)) and os.path.exists(deepspeed_config):
        with open(deepspeed_config) as f:
            settings = json.load(f)
    else:
        raise ValueError(f"expected a DeepSpeed config dict or the path of an existing JSON file, got "
                         f"{deepspeed_config!r}")
    text, _ = _q.parse_config(json.dumps(settings.get("compression_training") or {}))
    return json.loads(text)


def is_module_compressible(module, mpu=None):
    """A layer compression wraps: Linear, Conv2d, Embedding, BatchNorm2d, and with an mpu its tensor-parallel
    linears (mpu.ColumnParallelLinear, mpu.RowParallelLinear, as Megatron's mpu has them)."""
    kinds = (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Embedding, torch.nn.BatchNorm2d)
    if mpu is not None:
        kinds += tuple(getattr(mpu, name) for name in ("ColumnParallelLinear", "RowParallelLinear")
                       if hasattr(mpu, name))
    return isinstance(module, kinds)


def get_module_name(group_name, model, key_word, exist_module_name, verbose=True, mpu=None):
    """The compressible modules whose names `key_word` matches (re.search), not taken by an earlier group of the same
    technique; with `verbose`, one taken already is an error naming it."""
    names = []
    for name, module in model.named_modules():
        if not is_module_compressible(module, mpu) or re.search(key_word, name) is None:
            continue
        if name in exist_module_name:
            if verbose:
                raise ValueError(f"compression_training group {group_name!r}: module {name!r} is already in another "
                                 f"group of the same technique")
            continue
        exist_module_name.add(name)
        names.append(name)
    return names, exist_module_name


def _groups(model, technique, section, mpu=None):
    """Per group: (module names per `modules` entry, related module names per entry, the group's parameters merged
    with the shared ones)."""
    taken = set()
    out = []
    for group_name, group in section["different_groups"].items():
        names = [get_module_name(group_name, model, kw, taken, mpu=mpu)[0] for kw in group["modules"]]
        related = []
        for patterns in group.get("related_modules") or []:
            related.append([get_module_name(group_name, model, kw, set(), mpu=mpu)[0] for kw in patterns])
        if any(names):
            out.append((names, related, {**group["params"], **section["shared_parameters"]}))
    return out


def _enable(module, technique, p):
    if technique == "weight_quantization":
        module.enable_weight_quantization(p["start_bits"], p["target_bits"], p["quantization_period"],
                                          p["quantize_weight_in_forward"], p["quantization_type"],
                                          p["quantize_groups"])
    elif technique == "activation_quantization":
        module.enable_activation_quantization(p["bits"], p["quantization_type"], p["range_calibration"])
    elif technique == "sparse_pruning":
        module.enable_sparse_pruning(p["dense_ratio"], p["method"])
    elif technique == "row_pruning":
        module.enable_row_pruning(p["dense_ratio"], p["method"])
    elif technique == "head_pruning":
        module.enable_head_pruning(p["dense_ratio"], p["method"], p["num_heads"])
    elif technique == "channel_pruning":
        module.enable_channel_pruning(p["dense_ratio"], p["method"])


_COMPRESS_AWARE = {torch.nn.Linear: LinearLayer_Compress, torch.nn.Conv2d: Conv2dLayer_Compress,
                   torch.nn.Embedding: Embedding_Compress, torch.nn.BatchNorm2d: BNLayer_Compress}


def _base_layer(module):
    """The plain layer class `module` is, or a subclass of that computes as it does (nn.MultiheadAttention's
    out_proj); None for a subclass with a forward of its own."""
    for base in _COMPRESS_AWARE:
        if isinstance(module, base):
            return base if type(module).forward is base.forward else None
    return None


def _compress_aware(module):
    """The compression-aware replacement of a Linear / Conv2d / Embedding / BatchNorm2d, sharing its tensors. Built
    as DeepSpeed builds it (a fresh layer, its initialisation drawn from torch's generator), so the random draws after
    init_compression — learned scores, dropout — are DeepSpeed's."""
    if isinstance(module, tuple(_COMPRESS_AWARE.values())):
        return module
    base = _base_layer(module)
    if base is torch.nn.Linear:
        new = LinearLayer_Compress(module.in_features, module.out_features, bias=module.bias is not None)
    elif base is torch.nn.Conv2d:
        new = Conv2dLayer_Compress(module.in_channels, module.out_channels, module.kernel_size, module.stride,
                                   module.padding, module.dilation, module.groups, module.bias is not None,
                                   module.padding_mode)
    elif base is torch.nn.Embedding:
        new = Embedding_Compress(module.num_embeddings, module.embedding_dim, module.padding_idx, module.max_norm,
                                 module.norm_type, module.scale_grad_by_freq, module.sparse)
    else:
        new = BNLayer_Compress(module.num_features, module.eps, module.momentum, module.affine,
                               module.track_running_stats)
    # The same Parameter objects and buffers, so anything already holding them (an optimizer) still does.
    for name, param in module._parameters.items():
        new._parameters[name] = param
    for name, buffer in module._buffers.items():
        new._buffers[name] = buffer
    new.train(module.training)
    return new


def init_compression(model, deepspeed_config, teacher_model=None, mpu=None):
    """Makes `model`'s layers compression-aware as the config's compression_training says (with layer reduction,
    first initialises the student's layers from `teacher_model`'s). Returns the model; its techniques switch on at
    their schedule_offset, stepped by the engine dscpp.initialize builds from the same config."""
    config = compression_config(deepspeed_config)
    c_model = model.module if hasattr(model, "module") else model
    if config["layer_reduction"]["enabled"]:
        if teacher_model is None:
            raise ValueError("init_compression: compression_training.layer_reduction is enabled, which needs "
                             "teacher_model")
        student_initialization(c_model, teacher_model, deepspeed_config)
    named = set()  # the modules some switched-on technique names
    for technique in TECHNIQUES:
        if config[technique]["shared_parameters"]["enabled"]:
            for names, _, _ in _groups(c_model, technique, config[technique], mpu):
                named.update(n for entry in names for n in entry)
    for name, module in list(c_model.named_modules()):
        tensor_parallel = parallel_layer.replacement(module, mpu)
        if tensor_parallel is not None:  # each rank compresses its partition, as DeepSpeed's
            recursive_setattr(c_model, name, tensor_parallel)
            continue
        if not is_module_compressible(module) or isinstance(module, parallel_layer.PARALLEL):
            continue
        if _base_layer(module) is None and not isinstance(module, tuple(_COMPRESS_AWARE.values())):
            if name in named:  # replacing it would drop its own forward
                raise ValueError(f"init_compression: {name} is a {type(module).__name__}, a subclass of "
                                 f"{type(module).__mro__[1].__name__} with a forward of its own; "
                                 f"only layers that compute as Linear, Conv2d, Embedding and BatchNorm2d do can be "
                                 f"compressed (convert_conv1d_to_linear turns GPT-2's Conv1D into Linear)")
            continue
        recursive_setattr(c_model, name, _compress_aware(module))
    for technique in TECHNIQUES:
        section = config[technique]
        if not section["shared_parameters"]["enabled"]:
            continue
        for names, _, params in _groups(c_model, technique, section, mpu):
            for name in (n for entry in names for n in entry):
                _enable(recursive_getattr(c_model, name), technique, params)
    c_model._dscpp_compression = config  # what initialize's schedule steps
    return model


def redundancy_clean(model, deepspeed_config, mpu=None, pack=True):
    """Makes the compression permanent: quantized weights put on their grid, pruned weights zeroed — and pruned rows,
    heads and channels removed where the group names related_modules (whose matching input dimension goes too). The
    cleaned model computes what the compressed one did. With `pack` (the default) each quantized weight is then stored
    at its bits (buffers weight_codes / weight_codebook instead of the weight parameter); pack=False keeps DeepSpeed's
    layout — fp32 weights holding the quantized values — whose state_dict loads into the uncompressed model."""
    config = compression_config(deepspeed_config)
    c_model = model.module if hasattr(model, "module") else model
    quantized = []
    for technique in TECHNIQUES:
        section = config[technique]
        for names, related, params in _groups(c_model, technique, section, mpu):
            masks = []  # the group's masks so far, in module order: related module j follows masks[j]
            shrink = bool(related)
            for i, entry in enumerate(names):
                for name in entry:
                    module = recursive_getattr(c_model, name)
                    masks.append(_fix(module, technique, params, None, shrink))
                    if technique == "weight_quantization" and params["enabled"] and \
                            params["quantize_weight_in_forward"]:
                        quantized.append(module)
                for related_names in related[i] if shrink else []:
                    if len(related_names) > len(masks):
                        raise ValueError(f"redundancy_clean: {technique} related_modules match "
                                         f"{len(related_names)} modules ({related_names}) for {len(masks)} pruned "
                                         f"ones; each related module follows the pruned module of its position")
                    for j, name in enumerate(related_names):
                        _fix(recursive_getattr(c_model, name), technique, params, masks[j], True)
    for module in quantized if pack else []:  # last: pruning may have zeroed some quantized values
        module.pack_weight()
    return model


def _fix(module, technique, p, mask, dim_reduction):
    enabled = p["enabled"]
    if technique == "weight_quantization" and enabled and p["quantize_weight_in_forward"]:
        return module.fix_weight_quantization()
    if technique == "sparse_pruning" and enabled:
        return module.fix_sparse_pruning_helper()
    if technique == "row_pruning" and (enabled or mask is not None):
        return module.fix_row_col_pruning_helper(mask, dim_reduction=dim_reduction)
    if technique == "head_pruning" and (enabled or mask is not None):
        return module.fix_head_pruning_helper(mask, p["num_heads"], dim_reduction=dim_reduction)
    if technique == "channel_pruning" and (enabled or mask is not None):
        return module.fix_channel_pruning_helper(mask, dim_reduction=dim_reduction)
    return None


def student_initialization(student_model, teacher_model, deepspeed_config):
    """Layer reduction: student layer i takes teacher layer teacher_layer[i] (under module_name_prefix), and each of
    other_module_name is copied whole."""
    config = compression_config(deepspeed_config)["layer_reduction"]
    prefix = config["module_name_prefix"]
    pairs = [(f"{prefix}.{i}", f"{prefix}.{t}") for i, t in enumerate(config["teacher_layer"])]
    pairs += [(name, name) for name in config["other_module_name"]]
    for s_name, t_name in pairs:
        try:
            s_module, t_module = recursive_getattr(student_model, s_name), recursive_getattr(teacher_model, t_name)
        except AttributeError as e:
            raise ValueError(f"compression_training.layer_reduction: {e}") from None
        s_params, t_params = list(s_module.parameters()), list(t_module.parameters())
        if [p.shape for p in s_params] != [p.shape for p in t_params]:
            raise ValueError(f"compression_training.layer_reduction: student {s_name} and teacher {t_name} differ in "
                             f"their parameters' shapes")
        with torch.no_grad():
            for s, t in zip(s_params, t_params):
                s.copy_(t)
