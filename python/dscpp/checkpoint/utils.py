"""deepspeed.checkpoint.utils' clone_tensors_for_torch_save."""
import torch


def clone_tensors_for_torch_save(item, device=torch.device("cpu")):
    """`item` with every tensor in it (alone, or in nested lists, tuples and dicts) replaced by a detached copy on
    `device`: what torch.save should get from a state_dict whose tensors are views into larger buffers (ours are
    views of the engine's flat buffers), which would otherwise save the whole buffer. Other values are returned
    as they are."""
    device = torch.device(device)
    if torch.is_tensor(item):
        copy = item.detach()
        return copy.clone() if copy.device == device else copy.to(device)
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v, device) for v in item]
    if isinstance(item, tuple):
        return tuple(clone_tensors_for_torch_save(v, device) for v in item)
    if isinstance(item, dict):
        return type(item)((k, clone_tensors_for_torch_save(v, device)) for k, v in item.items())
    return item
