"""Megatron-style tensor-parallel layers made compression-aware (DeepSpeed's ColumnParallelLinear_Compress /
RowParallelLinear_Compress): init_compression(model, config, mpu=mpu) replaces a model's mpu.ColumnParallelLinear and
mpu.RowParallelLinear with these. Each rank compresses its own partition, as DeepSpeed's do — its rows' (column-
parallel) or columns' (row-parallel) own quantization scales and masks — so a tensor-parallel run is not the
one-process run's compression unless the groups line up (docs/compression.md). The matrix products and collectives
are the C++ engine's tensor-parallel forwards over the mpu's model-parallel group (python/src/parallel.cpp)."""

from .. import _C
from ..comm import engine_comm_arguments
from .basic_layer import LinearLayer_Compress


def model_parallel_group(mpu):
    get = getattr(mpu, "get_tensor_model_parallel_group", None) or getattr(mpu, "get_model_parallel_group", None)
    if get is None:
        raise TypeError(f"init_compression: mpu {type(mpu).__name__} has no get_model_parallel_group() (or "
                        f"get_tensor_model_parallel_group()), which Megatron's has")
    return get()


_comms = {}


def _comm(mpu):
    """The engine's Comm over the mpu's model-parallel group, one per group."""
    group = model_parallel_group(mpu)
    if id(group) not in _comms:
        _comms[id(group)] = _C.comm_over(**engine_comm_arguments("compression", group))
    return _comms[id(group)]


def _partition(mpu, size, layer, what):
    """The Comm over the mpu's model-parallel group and this rank's share of `size` (which must divide)."""
    comm = _comm(mpu)
    if size % comm.world_size:
        raise ValueError(f"{layer}: {what} {size} does not divide over the model-parallel size {comm.world_size}")
    return comm, size // comm.world_size


class ColumnParallelLinear_Compress(LinearLayer_Compress):
    """This rank's output rows [r·out/p, (r+1)·out/p) of an (out, in) linear. Returns (output, bias) as Megatron's:
    bias None unless skip_bias_add."""

    def __init__(self, mpu, input_size, output_size, bias=True, gather_output=True, skip_bias_add=False):
        comm, rows = _partition(mpu, output_size, "ColumnParallelLinear_Compress", "output_size")
        super().__init__(input_size, rows, bias=bias)
        self.comm = comm
        self.input_size, self.output_size = input_size, output_size
        self.gather_output, self.skip_bias_add = gather_output, skip_bias_add

    def forward(self, input_):
        x, weight, bias = self.compressed(input_)
        out = _C.column_parallel_linear(x, weight, None if self.skip_bias_add else bias, self.comm)
        if self.gather_output:
            out = _C.gather_from_model_parallel(out, self.comm)
        return out, (bias if self.skip_bias_add else None)


class RowParallelLinear_Compress(LinearLayer_Compress):
    """This rank's input columns [r·in/p, (r+1)·in/p) of an (out, in) linear; the partial products all-reduced, the
    whole bias added once (or returned with skip_bias_add). Returns (output, bias) as Megatron's."""

    def __init__(self, mpu, input_size, output_size, bias=True, input_is_parallel=False, skip_bias_add=False):
        comm, columns = _partition(mpu, input_size, "RowParallelLinear_Compress", "input_size")
        super().__init__(columns, output_size, bias=bias)
        self.comm = comm
        self.input_size, self.output_size = input_size, output_size
        self.input_is_parallel, self.skip_bias_add = input_is_parallel, skip_bias_add

    def forward(self, input_):
        x = input_ if self.input_is_parallel else _C.scatter_to_model_parallel(input_, self.comm)
        x, weight, bias = self.compressed(x)
        out = _C.row_parallel_linear(x, weight, None if self.skip_bias_add else bias, self.comm)
        return out, (bias if self.skip_bias_add else None)


PARALLEL = (ColumnParallelLinear_Compress, RowParallelLinear_Compress)


def replacement(module, mpu):
    """The compression-aware form of an mpu.ColumnParallelLinear / RowParallelLinear, sharing its tensors; None for
    any other module."""
    if mpu is None or isinstance(module, (ColumnParallelLinear_Compress, RowParallelLinear_Compress)):
        return None
    bias = getattr(module, "bias", None) is not None
    if isinstance(module, getattr(mpu, "ColumnParallelLinear", ())):
        new = ColumnParallelLinear_Compress(mpu, module.input_size, module.output_size, bias=bias,
                                            gather_output=module.gather_output, skip_bias_add=module.skip_bias_add)
    elif isinstance(module, getattr(mpu, "RowParallelLinear", ())):
        new = RowParallelLinear_Compress(mpu, module.input_size, module.output_size, bias=bias,
                                         input_is_parallel=module.input_is_parallel,
                                         skip_bias_add=module.skip_bias_add)
    else:
        return None
    for name, param in module._parameters.items():
        new._parameters[name] = param
    new.train(module.training)
    return new
