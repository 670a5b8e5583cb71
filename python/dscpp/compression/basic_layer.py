"""Compression-aware layers, DeepSpeed's (deepspeed.compression.basic_layer): nn.Linear, nn.Conv2d, nn.Embedding and
nn.BatchNorm2d whose forward applies the techniques switched on for them — fake-quantized weights and activations,
sparse / row / head / channel pruning masks — and whose fix_* methods (redundancy_clean's) make them permanent.

Each technique is enabled on a layer by init_compression (enable_*) and switched on at its step by the schedule
(the *_enabled flags). The arithmetic — quantizers, the top-k mask, packing — is the C++ one
(dscpp._C.compression; include/dscpp/compression/quantize.h). What a layer knows about its compression (bits,
groups, masks) lives on the layer, not on its parameters.
"""
import math

import torch
from torch import nn
from torch.nn import functional as F

from .._C import compression as _q


def _quantizer_kind(bits, quantization_type):
    return _q.weight_quantizer(bits, quantization_type == "symmetric")


class QuantAct(nn.Module):
    """Static activation quantization: the range is a running min / max (momentum 0.95) over training batches, fixed
    at inference (DeepSpeed's QuantAct)."""

    def __init__(self, act_range_momentum=0.95, quant_mode="symmetric"):
        super().__init__()
        self.act_range_momentum = act_range_momentum
        self.quant_mode = quant_mode
        self.register_buffer("x_min_max", torch.zeros(2))

    def forward(self, x, num_bits, *unused):
        if self.training:
            x_min, x_max = x.data.min(), x.data.max()
            if self.x_min_max[0] == self.x_min_max[1]:  # first batch: start from its range
                self.x_min_max[0] = x_min
                self.x_min_max[1] = x_max
            m = self.act_range_momentum
            self.x_min_max[0] = self.x_min_max[0] * m + x_min * (1 - m)
            self.x_min_max[1] = self.x_min_max[1] * m + x_max * (1 - m)
        kind = _q.SYMMETRIC if self.quant_mode == "symmetric" else _q.ASYMMETRIC
        return _q.fake_quantize(x, kind, num_bits, 1, self.x_min_max)


def _kaiming_scores(shape, like):
    scores = nn.Parameter(torch.empty(shape, dtype=like.dtype, device=like.device))
    nn.init.kaiming_uniform_(scores, a=math.sqrt(5))
    return scores


class _Compressible:
    """What the compression-aware layers share: weight quantization, activation quantization, sparse pruning, and a
    weight that redundancy_clean may store packed at its bits (buffers weight_codes / weight_codebook)."""

    def _init_compression(self):
        self.weight_quantization_enabled = False  # switched on at its step by the schedule
        self.weight_quantization_enabled_in_forward = False
        self.weight_bits = None  # (start_bits, target_bits, quantization_period) once enabled
        self.sparse_pruning_method = None
        self.sparse_pruning_enabled = False
        self.activation_quantization_method = None
        self.activation_quantization_enabled = False

    # -- the weight, possibly packed ----------------------------------------------------------------------------------

    def __getattr__(self, name):
        if name == "weight" and "weight_codes" in self.__dict__.get("_buffers", {}):
            return self.unpacked_weight()
        return super().__getattr__(name)

    def unpacked_weight(self):
        return _q.unpack(self.weight_codes, self.weight_codebook, self.weight_storage_bits, list(self.weight_shape))

    def pack_weight(self):
        """Stores the weight at its quantized bits (redundancy_clean's last step); False, leaving it as it is, when it
        is not on a grid of at most 256 values per group or packing would not make it smaller."""
        weight = self._parameters["weight"]
        groups = self.weight_quantize_num_groups
        if weight.numel() % groups:  # rows or heads removed since: the groups no longer divide it
            groups = 1
        packed = _q.pack(weight.detach(), groups)
        if packed is None:
            return False
        codes, codebook, bits = packed
        if codes.nbytes + codebook.nbytes >= weight.nbytes:  # a codebook per small group can outweigh the values
            return False
        del self._parameters["weight"]
        self.weight_shape = tuple(weight.shape)
        self.weight_storage_bits = bits
        self.register_buffer("weight_codes", codes)
        self.register_buffer("weight_codebook", codebook)
        return True

    # -- techniques ---------------------------------------------------------------------------------------------------

    def enable_weight_quantization(self, start_bits, target_bits, quantization_period,
                                   weight_quantization_enabled_in_forward, quantization_type, num_groups):
        self.weight_bits = [start_bits, target_bits, quantization_period]
        self.weight_quantization_type = quantization_type
        self.weight_quantize_num_groups = num_groups
        self.weight_quantization_enabled_in_forward = weight_quantization_enabled_in_forward
        if weight_quantization_enabled_in_forward:
            self.weight_quantizer_kind = _quantizer_kind(target_bits, quantization_type)

    def fix_weight_quantization(self):
        self.weight.data = _q.quantize(self.weight.data, self.weight_quantizer_kind, self.weight_bits[1],
                                       self.weight_quantize_num_groups)
        self.weight_quantization_enabled_in_forward = False

    def _quantized_weight(self):
        weight = self.weight
        if self.weight_quantization_enabled_in_forward and self.weight_quantization_enabled:
            weight = _q.fake_quantize(weight, self.weight_quantizer_kind, self.weight_bits[1],
                                      self.weight_quantize_num_groups)
        return weight

    def enable_sparse_pruning(self, ratio, method):
        self.sparse_pruning_ratio = ratio
        self.sparse_pruning_method = method
        if method == "l1":  # fixed now, from the weight's magnitudes
            self.register_buffer("sparse_pruning_mask", _q.topk_mask(self.weight.data.abs(), ratio))
        else:  # learned scores
            self.sparse_mask_scores = _kaiming_scores(self.weight.shape, self.weight)

    def fix_sparse_pruning_helper(self):
        self.weight.data = self.weight.data * self.get_mask("sparse")
        if self.sparse_pruning_method == "l1":
            del self.sparse_pruning_mask
        else:
            del self.sparse_mask_scores
        self.sparse_pruning_method = None
        self.sparse_pruning_enabled = False

    def _sparse_mask(self):
        if self.sparse_pruning_method == "l1":
            return self.sparse_pruning_mask
        return _q.topk_mask(self.sparse_mask_scores, self.sparse_pruning_ratio)

    def enable_activation_quantization(self, bits, quantization_type, range_calibration):
        if bits not in (4, 8):
            raise ValueError(f"activation quantization: bits {bits}: 4 or 8 only")
        self.activation_quantization_bits = bits
        self.activation_quantization_method = f"{quantization_type}_{range_calibration}"
        self.activation_quantization_static = range_calibration == "static"
        if self.activation_quantization_static:
            self.activation_quantizer = QuantAct(quant_mode=quantization_type)
        else:
            self.activation_kind = _q.SYMMETRIC if quantization_type == "symmetric" else _q.ASYMMETRIC

    def _quantized_input(self, x, groups):
        if not self.activation_quantization_enabled:
            return x
        if self.activation_quantization_static:
            return self.activation_quantizer(x, self.activation_quantization_bits)
        return _q.fake_quantize(x, self.activation_kind, self.activation_quantization_bits, groups)

    def _replace_weight(self, data):
        """A new weight Parameter of another shape (pruned rows / columns / heads / channels removed)."""
        self.weight = nn.Parameter(data.contiguous())

    def _prune_outputs(self, keep, dim_reduction, kind):
        """Row (Linear) / channel (Conv2d) pruning made permanent: the outputs outside `keep` removed with their bias
        entries (dim_reduction), or zeroed; then the technique's mask or scores dropped. Returns the output count."""
        if dim_reduction:
            self._replace_weight(self.weight.data[keep.view(-1)])
            if self.bias is not None:
                self.bias = nn.Parameter(self.bias.data[keep.view(-1)])
        else:
            self.weight.data = self.weight.data * keep.view((-1,) + (1,) * (self.weight.dim() - 1))
            if self.bias is not None:
                self.bias.data = self.bias.data * keep.view(-1)
        method = getattr(self, f"{kind}_pruning_method")
        delattr(self, f"{kind}_pruning_mask" if method == "l1" else f"{kind}_mask_scores")
        setattr(self, f"{kind}_pruning_method", None)
        setattr(self, f"{kind}_pruning_enabled", False)
        return self.weight.size(0)


class LinearLayer_Compress(_Compressible, nn.Linear):
    """nn.Linear with weight / activation quantization and sparse, row and head pruning."""

    def __init__(self, *args, bias=True, **kwargs):
        super().__init__(*args, bias=bias, **kwargs)
        self._init_compression()
        self.row_pruning_method = None
        self.row_pruning_enabled = False
        self.head_pruning_method = None
        self.head_pruning_enabled = False

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"sparse pruning={self.sparse_pruning_method is not None}, "
                f"row pruning={self.row_pruning_method is not None}, "
                f"head pruning={self.head_pruning_method is not None}, "
                f"activation quantization={self.activation_quantization_method is not None}, "
                f"weight_quantization={self.weight_bits[1] if self.weight_bits else None}")

    def enable_row_pruning(self, ratio, method):
        self.row_pruning_ratio = ratio
        self.row_pruning_method = method
        if method == "l1":  # each output row's L1 norm
            norms = torch.linalg.norm(self.weight.data, ord=1, dim=1)
            self.register_buffer("row_pruning_mask", _q.topk_mask(norms, ratio).view(-1, 1))
        else:
            self.row_mask_scores = _kaiming_scores((self.weight.size(0), 1), self.weight)

    def enable_head_pruning(self, ratio, method, num_heads):
        if method != "topk":
            raise NotImplementedError(f"head pruning method {method!r}: topk only")
        if self.in_features % num_heads:
            raise ValueError(f"head pruning: num_heads {num_heads} does not divide in_features {self.in_features}")
        self.num_heads = num_heads
        self.head_pruning_ratio = ratio
        self.head_pruning_method = method
        self.head_pruning_scores = _kaiming_scores((1, num_heads), self.weight)

    def get_mask(self, pruning_type="row"):
        if pruning_type == "sparse":
            return self._sparse_mask()
        if pruning_type == "row":
            if self.row_pruning_method == "l1":
                return self.row_pruning_mask
            return _q.topk_mask(self.row_mask_scores, self.row_pruning_ratio)
        if pruning_type == "head":
            return _q.topk_mask(self.head_pruning_scores, self.head_pruning_ratio)
        raise NotImplementedError(pruning_type)

    def _head_masked(self, weight, mask):
        """The input columns of each pruned head zeroed (the attention's output projection)."""
        rows, cols = weight.shape
        return (weight.t().reshape(self.num_heads, -1) * mask.view(-1, 1)).reshape(cols, rows).t()

    def fix_row_col_pruning_helper(self, mask=None, dim_reduction=False):
        """Without `mask`: this layer's pruned output rows zeroed, or removed with dim_reduction (then the mask is
        returned for the related layers). With `mask` (a related layer's): those input columns removed."""
        if mask is not None:
            self._replace_weight(self.weight.data[:, mask.view(-1)])
            self.in_features = self.weight.size(1)
            self.row_pruning_enabled = False
            return None
        mask = self.get_mask("row").bool()
        self.out_features = self._prune_outputs(mask, dim_reduction, "row")
        return mask

    def fix_head_pruning_helper(self, mask=None, num_heads=None, dim_reduction=False):
        """Without `mask`: this layer's (the output projection's) pruned heads' input columns zeroed, or removed with
        dim_reduction. With `mask` (from the output projection): a Q / K / V layer's rows of those heads removed."""
        num_heads = num_heads or self.num_heads
        if mask is not None:
            cols = self.weight.size(1)
            self._replace_weight(self.weight.data.reshape(num_heads, -1)[mask.view(-1), :].reshape(-1, cols))
            if self.bias is not None:
                self.bias = nn.Parameter(self.bias.data.reshape(num_heads, -1)[mask.view(-1), :].reshape(-1))
            self.out_features = self.weight.size(0)
            self.head_pruning_enabled = False
            return mask
        mask = self.get_mask("head").bool()
        if dim_reduction:
            rows = self.weight.size(0)
            self._replace_weight(self.weight.data.t().reshape(num_heads, -1)[mask.view(-1), :].reshape(-1, rows).t())
            self.in_features = self.weight.size(1)
        else:
            self.weight.data = self._head_masked(self.weight.data, mask)
        del self.head_pruning_scores
        self.head_pruning_method = None
        self.head_pruning_enabled = False
        return mask

    def forward(self, input, skip_bias_add=False):
        input, weight, bias = self.compressed(input)
        if skip_bias_add:
            return F.linear(input, weight, None), bias
        return F.linear(input, weight, bias)

    def compressed(self, input):
        """(input, weight, bias) as the techniques switched on make them: what the forward multiplies."""
        weight, bias = self._quantized_weight(), self.bias
        if self.sparse_pruning_enabled and self.sparse_pruning_method:
            weight = weight * self.get_mask("sparse").view(weight.shape)
        if self.row_pruning_enabled and self.row_pruning_method:
            mask = self.get_mask("row")
            weight = weight * mask.view(-1, 1)
            if bias is not None:
                bias = bias * mask.view(-1)
        if self.head_pruning_enabled and self.head_pruning_method:
            weight = self._head_masked(weight, self.get_mask("head"))
        input = self._quantized_input(input, input.numel() // input.size(-1))  # dynamic: one group per token
        return input, weight, bias


class Conv2dLayer_Compress(_Compressible, nn.Conv2d):
    """nn.Conv2d with weight / activation quantization and sparse and channel pruning."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_compression()
        self.channel_pruning_method = None
        self.channel_pruning_enabled = False

    def enable_weight_quantization(self, start_bits, target_bits, quantization_period,
                                   weight_quantization_enabled_in_forward, quantization_type, num_groups):
        if weight_quantization_enabled_in_forward and target_bits < 4:
            raise ValueError(f"Conv2d weight quantization in forward: target_bits {target_bits}; 4 or more only")
        super().enable_weight_quantization(start_bits, target_bits, quantization_period,
                                           weight_quantization_enabled_in_forward, quantization_type, num_groups)

    def enable_channel_pruning(self, ratio, method):
        self.channel_pruning_ratio = ratio
        self.channel_pruning_method = method
        if method == "l1":  # each output channel's kernel L1 norm
            norms = self.weight.data.abs().sum(dim=(1, 2, 3))
            self.register_buffer("channel_pruning_mask", _q.topk_mask(norms, ratio).view(-1, 1, 1, 1))
        else:
            self.channel_mask_scores = _kaiming_scores((self.weight.size(0), 1, 1, 1), self.weight)

    def get_mask(self, pruning_type="sparse"):
        if pruning_type == "sparse":
            return self._sparse_mask()
        if pruning_type == "channel":
            if self.channel_pruning_method == "l1":
                return self.channel_pruning_mask
            return _q.topk_mask(self.channel_mask_scores, self.channel_pruning_ratio)
        raise NotImplementedError(pruning_type)

    def fix_channel_pruning_helper(self, mask=None, dim_reduction=False):
        if mask is not None:  # a related layer: its input channels follow the pruned outputs
            self._replace_weight(self.weight.data[:, mask.view(-1), ...])
            self.in_channels = self.weight.size(1)
            self.channel_pruning_enabled = False
            return None
        mask = self.get_mask("channel").bool()
        self.out_channels = self._prune_outputs(mask, dim_reduction, "channel")
        return mask

    def forward(self, input):
        weight, bias = self._quantized_weight(), self.bias
        if self.sparse_pruning_enabled and self.sparse_pruning_method:
            weight = weight * self.get_mask("sparse").view(weight.shape)
        if self.channel_pruning_enabled and self.channel_pruning_method:
            mask = self.get_mask("channel")
            weight = weight * mask.view(-1, 1, 1, 1)
            if bias is not None:
                bias = bias * mask.view(-1)
        input = self._quantized_input(input, input.size(0))  # dynamic: one group per sample
        return self._conv_forward(input, weight, bias)


class Embedding_Compress(_Compressible, nn.Embedding):
    """nn.Embedding with weight quantization, always one group per token (row)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_compression()

    def enable_weight_quantization(self, start_bits, target_bits, quantization_period,
                                   weight_quantization_enabled_in_forward, quantization_type, num_groups):
        super().enable_weight_quantization(start_bits, target_bits, quantization_period,
                                           weight_quantization_enabled_in_forward, quantization_type,
                                           self.weight.size(0))

    def enable_sparse_pruning(self, ratio, method):
        raise ValueError("compression_training.sparse_pruning names an Embedding; DeepSpeed prunes Linear and Conv2d "
                         "layers only")

    def enable_activation_quantization(self, bits, quantization_type, range_calibration):
        raise ValueError("compression_training.activation_quantization names an Embedding, whose input is token ids; "
                         "DeepSpeed quantizes the inputs of Linear and Conv2d layers only")

    def forward(self, input):
        return F.embedding(input, self._quantized_weight(), self.padding_idx, self.max_norm, self.norm_type,
                           self.scale_grad_by_freq, self.sparse)


class BNLayer_Compress(nn.BatchNorm2d):
    """nn.BatchNorm2d that follows the channels a preceding convolution's channel pruning removed."""

    def fix_channel_pruning_helper(self, mask, dim_reduction=True):
        keep = mask.view(-1)
        self.weight = nn.Parameter(self.weight.data[keep])
        self.bias = nn.Parameter(self.bias.data[keep])
        self.running_mean = self.running_mean[keep]
        self.running_var = self.running_var[keep]
        self.num_features = int(keep.sum())
