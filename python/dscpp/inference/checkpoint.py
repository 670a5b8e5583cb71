"""init_inference's `checkpoint` (with `base_dir`): DeepSpeed's description of a model's weights in shard files —
{"type": "ds_model", "checkpoints": [file, ...], "version": 1.0}, a dict or a JSON file's path — loaded into the model
before its layers are sliced, as DeepSpeed's AutoTP loads it (deepspeed/module_inject/replace_module.py: each file
under base_dir, `.safetensors` or a torch.save'd state dict). The model may have been built on the meta device
(dscpp.OnDevice(dtype, device="meta")): its tensors are then the loaded ones.

Unlike DeepSpeed's loader: torch files are read with weights_only=True (a file that pickles anything but tensors and
containers is refused, never run), every shard key must name a tensor of the model, and every parameter and buffer
must come from some shard (or be tied to one that did) — a weight left at its initial value, or on the meta device,
is an error naming it rather than a wrong generation."""
import json
import os
import pickle

import torch

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


def _read_shard(path):
    if not os.path.isfile(path):
        raise ValueError(f"init_inference: checkpoint shard {path} does not exist (the description's file names "
                         "are relative to base_dir)")
    if path.endswith(".safetensors"):
        try:
            from safetensors.torch import load_file
        except ImportError as e:
            raise ValueError(f"init_inference: {path} is a safetensors file; pip install safetensors to read it") \
                from e
        return load_file(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
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
