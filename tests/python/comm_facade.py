"""Run on 2 ranks by test_comm.py: dscpp.comm's script-side calls, as a DeepSpeed script makes them through
deepspeed.comm; prints one JSON line of what each returned."""
import json

import torch

import dscpp

assert not dscpp.comm.is_initialized()
assert (dscpp.comm.get_rank(), dscpp.comm.get_world_size()) == (0, 1)  # nothing initialised: one process alone
dscpp.init_distributed(dist_backend="gloo")
rank, world = dscpp.comm.get_rank(), dscpp.comm.get_world_size()
summed = torch.tensor([float(rank + 1)])
dscpp.comm.all_reduce(summed)
top = torch.tensor([float(rank)])
dscpp.comm.all_reduce(top, op=dscpp.comm.ReduceOp.MAX)
sent = torch.tensor([float(rank * 10)])
dscpp.comm.broadcast(sent, src=1)
gathered = torch.empty(world)
dscpp.comm.all_gather_into_tensor(gathered, torch.tensor([float(rank)]))
part = torch.empty(1)
dscpp.comm.reduce_scatter_tensor(part, torch.arange(world, dtype=torch.float32) + rank)
dscpp.comm.barrier()
print(json.dumps({"rank": rank, "world": world, "local_rank": dscpp.comm.get_local_rank(),
                  "initialized": dscpp.comm.is_initialized(), "sum": summed.item(), "max": top.item(),
                  "broadcast": sent.item(), "gathered": gathered.tolist(), "scattered": part.item()}), flush=True)
dscpp.comm.destroy_process_group()
