"""Module-tree helpers of DeepSpeed Compression (deepspeed.compression.helper), which DeepSpeed-Chat imports too."""
import torch


def recursive_getattr(model, module_name):
    """model.a.b.c for "a.b.c"."""
    output = model
    for name in module_name.split("."):
        output = getattr(output, name)
    return output


def recursive_setattr(model, module_name, module):
    """Sets model.a.b.c = module for "a.b.c"."""
    parent_name, _, leaf = module_name.rpartition(".")
    parent = recursive_getattr(model, parent_name) if parent_name else model
    setattr(parent, leaf, module)


def convert_conv1d_to_linear(model, convert_type):
    """Replaces every `convert_type` module (GPT-2's Conv1D, whose weight is [in, out]) by the equivalent
    nn.Linear, so that compression can wrap it."""
    c_model = model.module if hasattr(model, "module") else model
    for name, module in list(c_model.named_modules()):
        if not isinstance(module, convert_type):
            continue
        n_in, n_out = module.weight.shape
        linear = torch.nn.Linear(n_in, n_out, bias=module.bias is not None, device=module.weight.device,
                                 dtype=module.weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(module.weight.t())
            if module.bias is not None:
                linear.bias.copy_(module.bias.view(-1))
        recursive_setattr(c_model, name, linear)
    return model
