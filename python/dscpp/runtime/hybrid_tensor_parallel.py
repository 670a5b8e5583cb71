"""The hybrid engine's tensor-parallel generation layout (hybrid_engine.inference_tp_size > 1), as DeepSpeed's hybrid
engine has it: the ranks form groups of inference_tp_size consecutive ranks; in each, the ranks' prompts are
concatenated into one batch, every rank generates it over the model's layers sliced among the group (AutoTP,
dscpp.module_inject: column- and row-parallel linears, the vocabulary split), and each rank takes back its own rows.

The slices are cut from the whole weights the call holds (under ZeRO-3 the groups gathered for it) and dropped when
it ends: `sliced` puts AutoTP's layers in place of the model's own and, on the way out, the model's own modules and
head counts back, so training goes on over the very same modules and parameters. LoRA layers of DeepSpeed-Chat's
shape are fused first by the hybrid engine; while sliced, each is taken as the plain linear it then computes
(x·Wᵀ + b, its fused weight and its bias shared, not copied), so AutoTP slices it like any projection."""
import contextlib

import torch
import torch.distributed as dist

from .. import _C
from ..comm import engine_comm_arguments
from ..module_inject import auto_tp
from ..utils import groups


def make_groups(size):
    """(this rank's torch.distributed group of `size` consecutive ranks, a dscpp._C.Comm over it)."""
    mine = groups.consecutive_group(size, "hybrid_engine.inference_tp_size")
    return mine, _C.comm_over(**engine_comm_arguments("hybrid_tp", mine))


def _as_linear(module):
    """A plain nn.Linear over a fused LoRA layer's own weight and bias (the same Parameters)."""
    out_features, in_features = module.weight.shape
    linear = torch.nn.Linear(in_features, out_features, bias=module.bias is not None, device="meta")
    linear.weight = module.weight
    linear.bias = module.bias
    return linear


@contextlib.contextmanager
def sliced(model, comm, lora_modules):
    """Inside: `model` sliced over `comm` by AutoTP from its whole weights (`lora_modules`, fused, taken as plain
    linears). On exit every replaced module and every divided head count is put back."""
    by_module = {id(m): n for n, m in model.named_modules()}
    replaced = {}  # qualified name -> the model's own module there
    counts = [(m, a, getattr(m, a)) for m in model.modules() for a in auto_tp.SHARDED_ATTRIBUTES
              if isinstance(getattr(m, a, None), int) and not isinstance(getattr(m, a), bool)]
    try:
        for module in lora_modules:
            name = by_module[id(module)]
            if isinstance(getattr(module, "weight", None), torch.Tensor) and module.weight.dim() == 2:
                replaced[name] = module
                model.set_submodule(name, _as_linear(module))
        plan = auto_tp.plan(model, comm.world_size)
        modules = dict(model.named_modules())
        for name in list(plan.linears) + [plan.embedding, plan.head]:
            if name is not None and name not in replaced:
                replaced[name] = modules[name]
        auto_tp.apply(model, plan, comm)
        yield
    finally:
        for name, module in replaced.items():
            model.set_submodule(name, module)
        for module, attribute, value in counts:
            setattr(module, attribute, value)


def share_random_state(group, device):
    """The group's first rank's random state on every rank of the group — the CPU's, and the GPU's when generating
    there: the group samples one batch together, so its ranks must draw the same numbers at every call (their states
    part between calls, e.g. dropout on batches of other shapes)."""
    on_gpu = dist.get_backend(group) == "nccl"  # NCCL carries GPU tensors only
    source = dist.get_global_rank(group, 0)
    states = [(torch.get_rng_state, torch.set_rng_state)]
    if device.type == "cuda":
        states.append((lambda: torch.cuda.get_rng_state(device), lambda s: torch.cuda.set_rng_state(s, device)))
    for get, put in states:
        state = get()
        state = state.cuda() if on_gpu else state
        dist.broadcast(state, source, group=group)
        put(state.cpu())


def gather_prompts(group, inputs, kwargs):
    """The group's prompts as one batch (each rank's rows in rank order), in the (inputs, kwargs) generate takes.
    input_ids and attention_mask are concatenated; every rank of the group must pass the same shapes and dtypes (and
    a mask or none), as DeepSpeed's all_gather_into_tensor needs."""
    ids = inputs[0] if inputs else kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ValueError("hybrid_engine.inference_tp_size > 1: generate takes the prompts as a (batch, length) "
                         "input_ids tensor, which the group's ranks concatenate")
    mask = kwargs.get("attention_mask")
    size = dist.get_world_size(group)
    described = (tuple(ids.shape), str(ids.dtype),
                 None if not isinstance(mask, torch.Tensor) else (tuple(mask.shape), str(mask.dtype)))
    everyone = [None] * size
    dist.all_gather_object(everyone, described, group=group)
    if any(d != everyone[0] for d in everyone):
        raise ValueError(f"hybrid_engine.inference_tp_size {size}: the ranks of a tensor-parallel group passed "
                         f"prompts (input_ids shape and dtype, attention_mask's or none) {everyone}; each must pass "
                         "the same, as DeepSpeed's hybrid engine concatenates them")

    def concatenated(t):
        parts = [torch.empty_like(t) for _ in range(size)]
        dist.all_gather(parts, t.contiguous(), group=group)
        return torch.cat(parts)

    kwargs = dict(kwargs)
    if inputs:
        inputs = (concatenated(ids),) + tuple(inputs[1:])
    else:
        kwargs["input_ids"] = concatenated(ids)
    if isinstance(mask, torch.Tensor):
        kwargs["attention_mask"] = concatenated(mask)
    return inputs, kwargs


def own_rows(group, output):
    """This rank's rows of the group's generated batch: its share of them, in rank order (num_return_sequences
    makes several rows of each prompt, next to each other)."""
    if not isinstance(output, torch.Tensor):
        raise ValueError(f"hybrid_engine.inference_tp_size > 1: generate returned {type(output).__name__}, not the "
                         "tokens tensor this rank's rows are cut from")
    share = output.shape[0] // dist.get_world_size(group)
    return output[dist.get_rank(group) * share:(dist.get_rank(group) + 1) * share]
