"""dscpp.moe.layer.MoE: DeepSpeed's Mixture-of-Experts layer (deepspeed.moe.layer.MoE), same signature, defaults,
module names and results. The experts are Python modules and run here; the gate's routing and the tokens' way to
the experts and back (dispatch, all-to-all over the expert-parallel group, combine) are the C++ layer's
TokenDispatcher, so both front ends route with one implementation (include/dscpp/moe/gate.h has the rules).

One forward, for hidden states (…, M):
    dispatch   C++: the gate (logits in fp32 from deepspeed_moe.gate.wg) picks k experts per token, within each
               expert's capacity, and this rank receives its local experts' tokens from every expert-parallel rank:
               (ep_size, local experts, capacity, M)
    experts    Python: local expert i runs on [:, i:i+1], as DeepSpeed's Experts hands it its chunk
    combine    C++: the outputs go back, and each token's output is the weighted sum of its kept choices
and the layer returns (output, l_aux, exp_counts); a script adds coeff · l_aux to its loss.

With ep_size > 1 the layer needs its expert-parallel group, which dscpp.initialize makes (as DeepSpeed's engine
does); a checkpoint names each expert by its global index, so it loads under any ep_size.
"""
import copy

import torch
from torch import nn
from torch.nn import functional as F

from .. import _C
from ..utils import groups


class TopKGate(nn.Module):
    """The gate's weight, kept in fp32 as DeepSpeed's TopKGate keeps it (routing runs in C++; see MOELayer)."""

    def __init__(self, model_dim, num_experts):
        super().__init__()
        self.wg = nn.Linear(model_dim, num_experts, bias=False).float()


class Experts(nn.Module):
    """This rank's experts: deep copies of the given one, marked as DeepSpeed marks them (allreduce False,
    group_name), so dscpp.moe.utils.is_moe_param and the optimizer-group helpers find them."""

    def __init__(self, expert, num_local_experts=1, expert_group_name=None):
        super().__init__()
        self.deepspeed_experts = nn.ModuleList([copy.deepcopy(expert) for _ in range(num_local_experts)])
        self.num_local_experts = num_local_experts
        for module in self.deepspeed_experts:
            for param in module.parameters():
                param.allreduce = False
                param.group_name = expert_group_name

    def forward(self, inputs):
        outputs = []
        for chunk, expert in zip(inputs.chunk(self.num_local_experts, dim=1), self.deepspeed_experts):
            out = expert(chunk)
            outputs.append(out[0] if isinstance(out, tuple) else out)
        return torch.cat(outputs, dim=1)


class MOELayer(nn.Module):
    """The gate, this rank's experts and the C++ dispatcher between them; l_aux and exp_counts of the last forward
    are kept as attributes, as DeepSpeed's are."""

    def __init__(self, gate, experts, ep_group_name, ep_size, num_local_experts, options):
        super().__init__()
        self.gate = gate
        self.experts = experts
        self.ep_group_name = ep_group_name
        self.ep_size = ep_size
        self.num_local_experts = num_local_experts
        self.l_aux = None
        self.exp_counts = None
        self._options = options  # TokenDispatcher's gate options
        self._dispatcher = _C.TokenDispatcher(ep_group=None, **options) if ep_size == 1 else None

    def _set_ep_group(self, ep_comm):
        """Routes over `ep_comm` (a dscpp._C.Comm over the expert-parallel group, of ep_size ranks)."""
        self._dispatcher = _C.TokenDispatcher(ep_group=ep_comm, **self._options)

    def forward(self, hidden_states, used_token=None):
        if used_token is not None:
            raise NotImplementedError("dscpp MoE: used_token (a mask of the tokens the gate may route) is not "
                                      "supported; route every token")
        if self._dispatcher is None:
            raise RuntimeError(f"dscpp MoE: this layer spreads its experts over ep_size {self.ep_size} ranks and has "
                               "no expert-parallel group yet: dscpp.initialize makes it (or call the MoE layer's "
                               "set_deepspeed_parallelism() after dscpp.init_distributed())")
        width = hidden_states.shape[-1]
        dispatched = self._dispatcher.dispatch(hidden_states.reshape(-1, width), self.gate.wg.weight, self.training)
        output = self._dispatcher.combine(self.experts(dispatched.expert_inputs), dispatched)
        self.l_aux, self.exp_counts = dispatched.l_aux, dispatched.exp_counts
        return output.reshape(hidden_states.shape[:-1] + output.shape[-1:])


class MoE(nn.Module):
    """DeepSpeed's MoE layer. `expert` is deep-copied for each of this rank's num_experts / ep_size experts (and is
    itself the dense MLP with use_residual). forward(hidden_states) → (output, l_aux, exp_counts).

    ValueError naming the value for hidden_size < 1, num_experts not divisible by ep_size, k not 1 or 2, a capacity
    factor <= 0, min_capacity < 0 and a noisy_gate_policy other than None, 'None', 'Jitter', 'RSample'."""

    def __init__(self, hidden_size, expert, num_experts=1, ep_size=1, k=1, capacity_factor=1.0,
                 eval_capacity_factor=1.0, min_capacity=4, use_residual=False, noisy_gate_policy=None,
                 drop_tokens=True, use_rts=True, use_tutel=False, enable_expert_tensor_parallelism=False,
                 top2_2nd_expert_sampling=True):
        super().__init__()
        if use_tutel:
            raise NotImplementedError("dscpp MoE: use_tutel is not supported (Tutel's kernels are CUDA-only and not "
                                      "part of deepspeed.cpp); leave it False")
        if enable_expert_tensor_parallelism:
            raise NotImplementedError("dscpp MoE: enable_expert_tensor_parallelism is not supported yet")
        if not isinstance(hidden_size, int) or hidden_size < 1:
            raise ValueError(f"MoE hidden_size is {hidden_size!r}; it must be an int >= 1")
        if not isinstance(expert, nn.Module):
            raise TypeError(f"dscpp MoE: expert must be a torch.nn.Module, got {type(expert).__name__}")
        _C.check_moe_options(num_experts=num_experts, ep_size=ep_size, k=k, capacity_factor=capacity_factor,
                             eval_capacity_factor=eval_capacity_factor, min_capacity=min_capacity,
                             noisy_gate_policy=noisy_gate_policy)
        self.use_residual = use_residual
        self.enable_expert_tensor_parallelism = False
        self.ep_size = ep_size
        self.expert_group_name = f"ep_size_{ep_size}"
        self.num_experts = num_experts
        self.num_local_experts = num_experts // ep_size
        options = dict(num_experts=num_experts, k=k, capacity_factor=capacity_factor,
                       eval_capacity_factor=eval_capacity_factor, min_capacity=min_capacity,
                       noisy_gate_policy=noisy_gate_policy, drop_tokens=drop_tokens, use_rts=use_rts,
                       top2_2nd_expert_sampling=top2_2nd_expert_sampling)
        experts = Experts(expert, self.num_local_experts, self.expert_group_name)
        self.deepspeed_moe = MOELayer(TopKGate(hidden_size, num_experts), experts, self.expert_group_name, ep_size,
                                      self.num_local_experts, options)
        if use_residual:
            self.mlp = expert
            self.coefficient = nn.Linear(hidden_size, 2)

    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_=False):
        """Makes (once per ep_size) the expert groups over the job and routes over this layer's expert-parallel
        group. Collective; dscpp.initialize calls it for every MoE layer of the model."""
        made = groups._create_expert_and_data_parallel(self.ep_size, use_data_before_expert_parallel_)
        self.deepspeed_moe._set_ep_group(made.ep_comm)

    def first_local_expert(self):
        """The global index of this rank's expert 0 (its expert-parallel rank × the local experts)."""
        if self.ep_size == 1:
            return 0
        return groups._get_expert_parallel_rank(self.expert_group_name) * self.num_local_experts

    def expert_parameter_names(self):
        """{local name: global name} of this layer's expert parameters, names relative to the layer: the module
        names expert i of this rank deepspeed_experts.<i> (DeepSpeed's), a checkpoint by its global index."""
        first = self.first_local_expert()
        out = {}
        for i, module in enumerate(self.deepspeed_moe.experts.deepspeed_experts):
            for name, _ in module.named_parameters():
                local = f"deepspeed_moe.experts.deepspeed_experts.{i}.{name}"
                out[local] = f"deepspeed_moe.experts.deepspeed_experts.{first + i}.{name}"
        return out

    def forward(self, hidden_states, used_token=None):
        output = self.deepspeed_moe(hidden_states, used_token)
        if self.use_residual:
            dense = self.mlp(hidden_states)
            if isinstance(dense, tuple):
                dense = dense[0]
            coef = F.softmax(self.coefficient(hidden_states), dim=-1)
            output = output * coef[..., 0:1] + dense * coef[..., 1:]
        return output, self.deepspeed_moe.l_aux, self.deepspeed_moe.exp_counts
