"""init_inference's `checkpoint` (with `base_dir`): DeepSpeed's description of a model's weights in shard files —
{"type": "ds_model", "checkpoints": [file, ...], "version": 1.0}, a dict or a JSON file's path — loaded into the model
before its layers are sliced, as DeepSpeed's AutoTP loads it (deepspeed/module_inject/replace_module.py: each file
under base_dir, `.safetensors` or a torch.save'd state dict). The model may have been built on the meta device
(dscpp.OnDevice(dtype, device="meta")): its tensors are then the loaded ones.

Unlike DeepSpeed's loader: torch files are read with weights_only=True (a file that pickles anything but tensors and
containers is refused, never run), every shard key must name a tensor of the model, and every parameter and buffer
must come from some shard (or be tied to one that did) — a weight left at its initial value, or on the meta device,
is an error naming it rather than a wrong generation.

The shards are mapped, not read: a tensor of a safetensors file is a view of the file's pages (a private mapping, so
writing to it never reaches the file), a torch file is loaded with mmap=True. A model built on the meta device
therefore holds its whole weights only as the files' pages — the page cache, one copy per machine however many ranks
map them — and AutoTP copies out each rank's slice (init_inference casts after slicing, for the same reason): a
rank's own memory is its share of the model, not the whole of it."""
import json
import mmap
import os
import pickle

import torch

# safetensors' dtype names (its format's specification) and torch's.
_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}

# DeepSpeed's AutoTP loads these description types shard by shard (state_dict_factory.py's get_sd_loader_json returns
# them as they are); "Megatron" goes to its injected kernels' loader, which is not here.
_TYPES = ("ds_model", "bloom")


def shard_files(checkpoint, base_dir):
    """The shard files' paths that `checkpoint` (a dict or a JSON file's path) names, under `base_dir`."""
    if isinstance(checkpoint, str):
        try:
            with open(checkpoint) as f:
                checkpoint = json.load(f)
        except OSError as e:
            raise ValueError(f"init_inference: checkpoint {checkpoint!r}: cannot read it ({e.strerror})") from e
        except json.JSONDecodeError as e:
            raise ValueError(f"init_inference: checkpoint {checkpoint!r} is not JSON: {e}") from e
    if not isinstance(checkpoint, dict):
        raise ValueError("init_inference: checkpoint must be a dict or a JSON file's path, not "
                         f"{type(checkpoint).__name__}")
    for key in ("type", "checkpoints", "version"):
        if key not in checkpoint:
            raise ValueError(f"init_inference: the checkpoint description has no {key!r}; DeepSpeed's form is "
                             '{"type": "ds_model", "checkpoints": ["file", ...], "version": 1.0}')
    if str(checkpoint["type"]).lower() not in _TYPES:
        raise ValueError(f"init_inference: checkpoint type {checkpoint['type']!r} is not supported: {list(_TYPES)} "
                         "are (a Megatron checkpoint is loaded by DeepSpeed's injected kernels, which are not here)")
    files = checkpoint["checkpoints"]
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise ValueError("init_inference: the checkpoint description's 'checkpoints' must be a non-empty list of "
                         f"file names, not {files!r}")
    return [os.path.join(base_dir, f) for f in files]


def _read_safetensors(path):
    """A safetensors file's tensors as views of a private mapping of it: an 8-byte little-endian header length, a
    JSON header ({name: {"dtype", "shape", "data_offsets": [begin, end]}}, "__metadata__" aside), then the data."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        try:
            length = int.from_bytes(f.read(8), "little")
            if length <= 0 or 8 + length > size:
                raise ValueError(f"a header of {length} bytes in a file of {size}")
            header = json.loads(f.read(length))
            if not isinstance(header, dict):
                raise ValueError("its header is not a JSON object")
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"init_inference: {path} is not a safetensors file: {e}") from None
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size > 0 else None
    start, state = 8 + length, {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _SAFETENSORS_DTYPES[entry["dtype"]]
            shape = [int(d) for d in entry["shape"]]
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"init_inference: {path}: tensor {name!r} has a header entry safetensors does not "
                             f"define ({entry!r}): {e!r}") from None
        numel = 1
        for d in shape:
            numel *= d
        itemsize = torch.empty((), dtype=dtype).element_size()
        if end - begin != numel * itemsize or begin < 0 or start + end > size:
            raise ValueError(f"init_inference: {path}: tensor {name!r} ({entry['dtype']} {shape}) has bytes "
                             f"[{begin}, {end}) of {size - start}, which do not hold it")
        if numel == 0:
            state[name] = torch.empty(shape, dtype=dtype)
        elif (start + begin) % itemsize == 0:
            state[name] = torch.frombuffer(mapping, dtype=dtype, count=numel, offset=start + begin).view(shape)
        else:  # an unaligned tensor (files safetensors writes align them): a copy of its bytes
            raw = torch.frombuffer(mapping, dtype=torch.uint8, count=end - begin, offset=start + begin)
            state[name] = raw.clone().view(dtype).view(shape)
    return state


def _read_shard(path):
    if not os.path.isfile(path):
        raise ValueError(f"init_inference: checkpoint shard {path} does not exist (the description's file names "
                         "are relative to base_dir)")
    if path.endswith(".safetensors"):
        return _read_safetensors(path)
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)  # torch's legacy format maps nothing
    except pickle.UnpicklingError as e:
        raise ValueError(f"init_inference: {path} holds a pickled object that is not tensors or containers, which "
                         f"is not loaded (weights_only): {e}") from e
    except (RuntimeError, EOFError) as e:
        raise ValueError(f"init_inference: {path} is not a readable torch file: {e}") from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"init_inference: {path} is not a state dict (names to tensors)")
    return state


def load(model, checkpoint, base_dir):
    """Loads every shard `checkpoint` names into `model`, then re-ties its tied weights (Hugging Face's
    tie_weights), and checks that each of its tensors came from a shard."""
    names = set(model.state_dict())
    # A model on the meta device takes the loaded tensors themselves; a real one copies them into its own, so its
    # tied parameters stay one.
    assign = any(t.is_meta for t in model.state_dict().values())
    loaded = set()
    for path in shard_files(checkpoint, base_dir):
        state = _read_shard(path)
        unknown = sorted(set(state) - names)
        if unknown:
            raise ValueError(f"init_inference: {path} holds {len(unknown)} tensor(s) the model does not have: "
                             f"{unknown[:5]}")
        model.load_state_dict(state, strict=False, assign=assign)
        loaded |= set(state)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    own = model.state_dict()
    from_shards = {own[n].data_ptr() for n in loaded if not own[n].is_meta}
    missing = sorted(n for n, t in own.items() if n not in loaded and (t.is_meta or t.data_ptr() not in from_shards))
    if missing:
        raise ValueError(f"init_inference: no checkpoint shard holds {len(missing)} of the model's tensors "
                         f"(nor are they tied to one that does): {missing[:5]}")
    # Buffers no state dict holds (non-persistent: computed by their module) cannot come from a checkpoint.
    on_meta = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if on_meta:
        raise ValueError(f"init_inference: {on_meta[:5]} are on the meta device and in no checkpoint shard (buffers "
                         "their modules compute); build the model under dscpp.OnDevice(dtype, device='meta'), which "
                         "leaves buffers on the CPU")
