"""DeepSpeed's MoE forward as sharded_moe.py writes it — dense (S, E, C) masks and einsums — in plain PyTorch, for the
tests to hold dscpp.moe.layer.MoE (sparse, routed in C++) against. Fixed rules only: no random token selection, no
noise, no second-expert sampling. Top-1 keeps, of an expert's overflow, the tokens torch.topk picks over the 0/1 mask
(DeepSpeed's op); top-2 keeps the first ones in token order."""
import math

import torch
import torch.nn.functional as F


def _capacity(tokens, experts, factor, min_capacity):
    return max(math.ceil(tokens / experts * factor), min_capacity)


def gate(logits, k, capacity_factor, min_capacity, drop_tokens):
    """(l_aux, combine_weights (S, E, C), exp_counts) of fp32 `logits` (S, E)."""
    S, E = logits.shape
    gates = F.softmax(logits, dim=1)
    mask1 = F.one_hot(torch.argmax(gates, dim=1), E)
    if k == 1:
        capacity = _capacity(S, E, capacity_factor, min_capacity)
        exp_counts = mask1.sum(0)
        l_aux = torch.sum(gates.mean(0) * mask1.float().mean(0)) * E
        if drop_tokens:
            top_idx = torch.topk(mask1, k=min(capacity, S), dim=0)[1]
            mask1 = mask1 * torch.zeros_like(mask1).scatter_(0, top_idx, 1)
        else:
            capacity = int(exp_counts.max())
        locations1 = torch.cumsum(mask1, 0) - 1
        locations1_s = torch.sum(locations1 * mask1, 1)
        gates1 = gates * mask1.float()
        combine = torch.einsum("se,sc->sec", gates1, F.one_hot(locations1_s, capacity).float())
        return l_aux, combine, exp_counts
    capacity = _capacity(S, E, 2 * capacity_factor, min_capacity)
    mask2 = F.one_hot(torch.argmax(logits.masked_fill(mask1.bool(), float("-inf")), dim=1), E)
    locations1 = torch.cumsum(mask1, 0) - 1
    locations2 = torch.cumsum(mask2, 0) - 1 + mask1.sum(0, keepdim=True)
    exp_counts = (mask1 + mask2).sum(0)
    l_aux = torch.mean(gates.mean(0) * mask1.float().mean(0)) * E * E
    if drop_tokens:
        mask1 = mask1 * (locations1 < capacity)
        mask2 = mask2 * (locations2 < capacity)
    else:
        capacity = int(exp_counts.max())
    locations1_s = torch.sum(locations1 * mask1, 1)
    locations2_s = torch.sum(locations2 * mask2, 1)
    gates1_s = torch.einsum("se,se->s", gates, mask1.float())
    gates2_s = torch.einsum("se,se->s", gates, mask2.float())
    denom = torch.clamp(gates1_s + gates2_s, min=torch.finfo(gates.dtype).eps)
    gates1 = torch.einsum("s,se->se", gates1_s / denom, mask1.float())
    gates2 = torch.einsum("s,se->se", gates2_s / denom, mask2.float())
    combine = (torch.einsum("se,sc->sec", gates1, F.one_hot(locations1_s, capacity).float()) +
               torch.einsum("se,sc->sec", gates2, F.one_hot(locations2_s, capacity).float()))
    return l_aux, combine, exp_counts


def moe_forward(x, wg, experts, k, capacity_factor=1.0, min_capacity=4, drop_tokens=True, residual=None):
    """(output, l_aux, exp_counts) of DeepSpeed's MoE over hidden states `x` (…, M): gate weight `wg` (E, M), the
    E experts as callables in global order; `residual` = (mlp, coefficient) for Residual-MoE."""
    M = x.shape[-1]
    tokens = x.reshape(-1, M)
    l_aux, combine, exp_counts = gate(F.linear(tokens.float(), wg.float()), k, capacity_factor, min_capacity,
                                      drop_tokens)
    dispatched = torch.einsum("sec,sm->ecm", combine.bool().type_as(tokens), tokens)
    expert_output = torch.stack([expert(dispatched[e]) for e, expert in enumerate(experts)])
    output = torch.einsum("sec,ecm->sm", combine.type_as(tokens), expert_output).reshape(x.shape)
    if residual is not None:
        mlp, coefficient = residual
        coef = F.softmax(coefficient(x), dim=-1)
        output = output * coef[..., 0:1] + mlp(x) * coef[..., 1:]
    return output, l_aux, exp_counts
