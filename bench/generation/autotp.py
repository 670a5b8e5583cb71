"""bench/generation (run.sh), part 2: tokens/s of init_inference's AutoTP at tp 2 over 2 processes (one core each)
against the strongest one-process baseline, the plain model in one process with 2 threads — the same two cores.
Run once per side (`--tp 1` the baseline, `--tp 2` under dscpp launch); each prints its tokens/s per round on rank 0.

    python bench/generation/autotp.py --tp 1            (OMP_NUM_THREADS=2)
    dscpp launch --num_gpus 2 bench/generation/autotp.py --tp 2
"""
import argparse
import time

import torch

import dscpp
import llama  # bench/generation/llama.py: the shared model

p = argparse.ArgumentParser()
p.add_argument("--tp", type=int, default=1)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--new_tokens", type=int, default=32)
p.add_argument("--batch", type=int, default=4)
llama.add_arguments(p)
args = p.parse_args()

model = llama.make(args)
if args.tp > 1:
    model = dscpp.init_inference(model, dtype=torch.float32, tensor_parallel={"tp_size": args.tp})
prompt = torch.randint(1, llama.VOCAB, (args.batch, 16), generator=torch.Generator().manual_seed(1))


def tokens_per_second():
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                             do_sample=False, pad_token_id=0)
    return (out.shape[1] - prompt.shape[1]) * args.batch / (time.perf_counter() - start)


tokens_per_second()  # warm-up
rates = sorted(tokens_per_second() for _ in range(args.rounds))
if args.tp == 1 or dscpp.comm.get_rank() == 0:
    print(f"autotp tp {args.tp}: tokens/s " + " / ".join(f"{r:.2f}" for r in rates))
