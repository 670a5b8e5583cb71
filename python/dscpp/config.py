"""Where the DeepSpeed config comes from — initialize's `config` (a path or a dict), `config_params`, or
`args.deepspeed_config` — and add_config_arguments. Parsing and validation are the C++ engine's (dscpp::Config)."""
import argparse
import json
import math
import os
import sys


def add_config_arguments(parser):
    """Adds DeepSpeed's command-line arguments (--deepspeed, --deepspeed_config) to an argparse parser; returns it."""
    if not isinstance(parser, argparse.ArgumentParser):
        raise TypeError(f"dscpp.add_config_arguments: expected an argparse.ArgumentParser, got {type(parser).__name__}")
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (helper flag for user code, no impact on DeepSpeed backend)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true",
                       help="Deprecated enable DeepSpeed (helper flag for user code, no impact on DeepSpeed backend)")
    group.add_argument("--deepscale_config", default=None, type=str,
                       help="Deprecated DeepSpeed json configuration file.")
    return parser


def resolve_config(args, config, config_params):
    """The config as a dict (possibly to be completed by initialize) or a path, from whichever source was given.
    Returns (dict_or_None, path_or_None)."""
    if config is None:
        config = config_params
    elif config_params is not None:
        raise ValueError("dscpp.initialize: both config and config_params were given; pass one")
    from_args = None
    if args is not None:
        from_args = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
    if config is not None and from_args is not None:
        raise ValueError("dscpp.initialize: a config was given both in args.deepspeed_config "
                         f"({from_args}) and to initialize(config=...); pass one")
    config = config if config is not None else from_args
    if config is None:
        raise ValueError("dscpp.initialize: no DeepSpeed config: pass config= (a path or a dict) or "
                         "args with --deepspeed_config")
    return dict_or_path(config, "dscpp.initialize", "config")


def dict_or_path(config, caller, argument):
    """A config given as a dict (deep-copied: a clear error if it is not JSON) or a path (which must exist), as
    (dict_or_None, path_or_None); `caller` and `argument` name the call in errors."""
    if isinstance(config, dict):
        return _finite(json.loads(json.dumps(config)), caller), None
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{caller}: the DeepSpeed config file {path} does not exist")
        return None, path
    raise TypeError(f"{caller}: {argument} must be a path or a dict, got {type(config).__name__}")


def _finite(config, caller, where=""):
    """A dict config's numbers as JSON can carry them. steps_per_print = float("inf") — what Hugging Face Accelerate
    sets to silence the step log — means "never print", as in DeepSpeed, so it becomes the largest interval; any
    other inf or nan is an error naming its key (JSON has no such numbers; the engine's parser would refuse them)."""
    if isinstance(config, dict):
        for key, value in list(config.items()):
            path = f"{where}.{key}" if where else str(key)
            if path == "steps_per_print" and isinstance(value, float) and value == math.inf:
                config[key] = sys.maxsize
            else:
                config[key] = _finite(value, caller, path)
    elif isinstance(config, list):
        return [_finite(v, caller, f"{where}[{i}]") for i, v in enumerate(config)]
    elif isinstance(config, float) and not math.isfinite(config):
        raise ValueError(f"{caller}: config {where} = {config}: a DeepSpeed config number must be finite")
    return config


def load_json(path):
    """The config file's JSON, for initialize to complete (a client optimizer). Errors name the file."""
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON: {e}") from None


def without_auto(value):
    """`value` (a config's JSON) without the entries whose value is the string "auto", as DeepSpeed's config models
    (its zero_optimization section among them) drop them: Hugging Face leaves some unfilled until it knows the model."""
    if isinstance(value, dict):
        return {k: without_auto(v) for k, v in value.items() if not (isinstance(v, str) and v == "auto")}
    if isinstance(value, list):
        return [without_auto(v) for v in value]
    return value


def zero_section_without_auto(config, config_dict, config_path):
    """(config, config_dict, config_path) with the "auto" entries of zero_optimization dropped, as DeepSpeed's
    initialize drops them (TRL builds its reference model's engine before the Trainer fills the model-dependent bucket
    sizes). `config` is the JSON read (config_dict, or the file's); a config without such entries comes back as it
    was (a file stays a file, whose name heads its errors)."""
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict) or without_auto(zero) == zero:
        return config, config_dict, config_path
    config = {**config, "zero_optimization": without_auto(zero)}
    return config, config, None
