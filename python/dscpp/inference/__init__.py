"""dscpp.inference, as deepspeed.inference: InferenceEngine (what dscpp.init_inference returns) and its config."""
from .config import InferenceConfig, merge  # noqa: F401
from .engine import InferenceEngine  # noqa: F401


def init_inference(model, config=None, **kwargs):
    """DeepSpeed's init_inference(model, config=None, **kwargs): `config` a dict or a JSON file's path, merged with
    the keyword arguments (dtype=torch.half, tensor_parallel={"tp_size": 2}, injection_policy=…, …). Returns an
    InferenceEngine around `model`, which it changes in place (dtype, sliced layers)."""
    return InferenceEngine(model, merge(config, kwargs))
