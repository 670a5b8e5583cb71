"""What dscpp.initialize does for a model's MoE layers, as DeepSpeed's engine does at construction: makes the expert
groups, routes each layer over its expert-parallel group, and tells the C++ engine which parameters are experts —
averaged and (ZeRO 1–2) partitioned over the expert-data-parallel group — under the names a checkpoint gives them:
the experts' global indices, so it loads under any ep_size."""
import torch.distributed as dist

from .layer import MoE


def _check_mpu(mpu, ep_size):
    """An mpu without tensor parallelism (Megatron-DeepSpeed's MoE runs pass one at tensor-parallel size 1) keeps every
    rank data parallel, so the expert groups are cut from the whole job, as without one; with tensor parallelism the
    experts would be cut from each data-parallel group, which is not supported yet."""
    if mpu is None:
        return
    tensor_group = getattr(mpu, "get_tensor_model_parallel_group", None) or getattr(mpu, "get_model_parallel_group")
    tensor_size = dist.get_world_size(tensor_group())
    if tensor_size > 1:
        raise NotImplementedError(f"dscpp.initialize: MoE layers with ep_size {ep_size} under tensor parallelism "
                                  f"(the mpu's tensor-parallel size is {tensor_size}) are not supported yet; "
                                  "MoE runs with an mpu of tensor-parallel size 1")


def expert_parallelism(model, mpu):
    """(create_engine's expert arguments, {id(param): engine name} of the experts renamed). Collective when a layer
    has ep_size > 1. Layers with ep_size 1 need nothing: their experts are data parallel like any parameter."""
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, MoE)]
    sizes = sorted({m.ep_size for _, m in layers})
    if not sizes or sizes == [1]:
        return {}, {}
    if len(sizes) > 1:
        raise NotImplementedError(f"dscpp.initialize: the model's MoE layers have ep_size {sizes}; one ep_size per "
                                  "model is supported")
    _check_mpu(mpu, sizes[0])
    for _, layer in layers:
        layer.set_deepspeed_parallelism()
    names = {}
    for prefix, layer in layers:
        local_to_global = layer.expert_parameter_names()
        for local, param in layer.named_parameters():
            if local in local_to_global and param.requires_grad:
                names[id(param)] = (prefix + "." if prefix else "") + local_to_global[local]
    from ..utils import groups
    edp = groups._named(layers[0][1].expert_group_name).edp_comm
    return dict(expert_data_parallel_group=edp, expert_params=set(names.values())), names
