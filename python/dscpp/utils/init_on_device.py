"""dscpp.OnDevice, as deepspeed.OnDevice: a model built inside `with OnDevice(dtype=torch.float16, device="meta"):` has
its floating-point tensors in `dtype` and its parameters on `device` — on "meta", no memory at all, for a model whose
weights init_inference's `checkpoint` then loads (dscpp/inference/checkpoint.py).

On "meta" only the parameters go there (as Accelerate's init_empty_weights): buffers stay on the CPU, because many are
computed by the module and saved in no checkpoint (a rotary embedding's inv_freq), and a meta buffer could never be
filled. Every other device holds the whole module (torch's device context). The dtype is torch's default dtype while
inside: tensors created with an explicit dtype keep it."""
import torch


class OnDevice:
    def __init__(self, dtype, device="meta", enabled=True):
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(f"OnDevice: dtype must be a floating-point torch dtype (or None), not {dtype!r}")
        self.dtype = dtype
        self.device = torch.device(device)
        self.enabled = enabled
        self._saved_dtype = None
        self._device_context = None
        self._register_parameter = None

    def __enter__(self):
        if not self.enabled:
            return self
        if self.dtype is not None:
            self._saved_dtype = torch.get_default_dtype()
            torch.set_default_dtype(self.dtype)
        if self.device.type == "meta":
            # Each parameter moves as it is registered: before its module initializes it, so no values are drawn.
            self._register_parameter = register = torch.nn.Module.register_parameter

            def on_meta(module, name, param):
                register(module, name, param)
                if param is not None:
                    module._parameters[name] = torch.nn.Parameter(param.to(self.device),
                                                                  requires_grad=param.requires_grad)

            torch.nn.Module.register_parameter = on_meta
        else:
            self._device_context = torch.device(self.device)
            self._device_context.__enter__()
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        if not self.enabled:
            return
        if self._register_parameter is not None:
            torch.nn.Module.register_parameter = self._register_parameter
            self._register_parameter = None
        if self._device_context is not None:
            self._device_context.__exit__(exc_type, exc_value, traceback)
            self._device_context = None
        if self._saved_dtype is not None:
            torch.set_default_dtype(self._saved_dtype)
            self._saved_dtype = None
