"""What dscpp.initialize does for a model's MoE layers, as DeepSpeed's engine does at construction: makes the expert
groups, routes each layer over its expert-parallel group, and tells the C++ engine which parameters are experts —
averaged and (ZeRO 1–2) partitioned over the expert-data-parallel group — under the names a checkpoint gives them:
the experts' global indices, so it loads under any ep_size."""
from ..utils import groups
from .layer import MoE


def expert_parallelism(model, tensor_parallel_size):
    """(the InitOptions fields for the experts, {id(param): engine name} of the experts renamed). Collective when a
    layer has ep_size > 1. Layers with ep_size 1 need nothing: their experts are data parallel like any parameter.

    `tensor_parallel_size`: the mpu's (1 without one). At 1 — Megatron-DeepSpeed's MoE runs pass an mpu of
    tensor-parallel size 1 — every rank is data parallel and the expert groups are cut from the whole job; under
    tensor parallelism they would be cut from each data-parallel group, which is not supported yet."""
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, MoE)]
    sizes = sorted({m.ep_size for _, m in layers})
    if not sizes or sizes == [1]:
        return {}, {}
    if len(sizes) > 1:
        raise NotImplementedError(f"dscpp.initialize: the model's MoE layers have ep_size {sizes}; one ep_size per "
                                  "model is supported")
    if tensor_parallel_size > 1:
        raise NotImplementedError(f"dscpp.initialize: MoE layers with ep_size {sizes[0]} under tensor parallelism "
                                  f"(the mpu's tensor-parallel size is {tensor_parallel_size}) are not supported "
                                  "yet; MoE runs with an mpu of tensor-parallel size 1")
    for _, layer in layers:
        layer.set_deepspeed_parallelism()
    names = {}
    for prefix, layer in layers:
        local_to_global = layer.expert_parameter_names()
        for local, param in layer.named_parameters():
            if local in local_to_global and param.requires_grad:
                names[id(param)] = (prefix + "." if prefix else "") + local_to_global[local]
    edp = groups._named(layers[0][1].expert_group_name).edp_comm
    return dict(expert_data_parallel_group=edp, expert_params=set(names.values())), names
