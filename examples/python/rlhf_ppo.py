#!/usr/bin/env python3
"""RLHF with PPO, DeepSpeed-Chat's step 3 in miniature: an actor generates answers to prompts, a reward model scores
them, and PPO updates the actor and a critic — four models, each its own engine, on every rank.

    dscpp launch --num_gpus 2 examples/python/rlhf_ppo.py            # ZeRO-3 engines, the actor on the hybrid engine
    python examples/python/rlhf_ppo.py --reference                   # the same loop in plain PyTorch, one process
(From README command 1's build without installing: PYTHONPATH=build/python, and build/dscpp for dscpp.)

The four, as DeepSpeed-Chat sets them up (its ppo_trainer.py / rlhf_engine.py), here tiny and made in this file:
  actor      a causal LM being trained: ZeRO-3 on the hybrid engine (hybrid_engine.enabled), so generate() gathers
             its weights once per call instead of once per new token;
  reference  the actor's initial weights, forward only (ZeRO-3, no optimizer): the KL penalty's anchor;
  reward     a scorer of whole sequences, forward only: its value at the last token is the sequence's reward;
  critic     a value model started from the reward model's weights, trained (ZeRO-3).
One PPO iteration: generate (greedy, a fixed number of new tokens) from each rank's prompts; score; per-token rewards
= -kl_ctl · (log π − log π_ref), plus the clipped score at the last token; advantages and returns by GAE (γ 1,
λ 0.95); then one step of the clipped policy loss for the actor and one of the clipped value loss for the critic.
Each iteration prints one JSON line (rank 0): the mean over ranks of the actor's and the critic's loss and of the
reward. --reference runs the same loop on one process over every rank's prompts at once, with torch.optim.AdamW
and clip_grad_norm_; its lines equal the engines' (tests/python/test_rlhf_example.py)."""
import argparse
import copy
import json
import sys

import torch
import torch.nn.functional as F

VOCAB, DIM, LAYERS, MAX_LEN = 32, 32, 2, 32
KL_CTL, CLIP_REWARD, CLIPRANGE, CLIPRANGE_VALUE, GAMMA, LAM = 0.1, 5.0, 0.2, 0.2, 1.0, 0.95
ADAMW = {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}
CLIP = 1.0  # gradient_clipping, DeepSpeed-Chat's (and DeepSpeed's default)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.qkv, self.out = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM)
        self.up, self.down = torch.nn.Linear(DIM, 4 * DIM), torch.nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, 4, DIM // 4).permute(2, 0, 3, 1, 4)
        x = x + self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, DIM))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Backbone(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.pos = torch.nn.Embedding(VOCAB, DIM), torch.nn.Embedding(MAX_LEN, DIM)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(LAYERS)])
        self.norm = torch.nn.LayerNorm(DIM)

    def forward(self, ids):
        x = self.embed(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class Actor(torch.nn.Module):
    """A causal LM: logits for each position; generate() appends greedy tokens."""

    def __init__(self):
        super().__init__()
        self.backbone = Backbone()
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids):
        return self.head(self.backbone(ids))

    @torch.no_grad()
    def generate(self, ids, max_new_tokens):
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, self(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids


class Critic(torch.nn.Module):
    """A value per position (DeepSpeed-Chat's RewardModel: a value head on an LM's hidden states)."""

    def __init__(self):
        super().__init__()
        self.backbone = Backbone()
        self.v_head = torch.nn.Linear(DIM, 1, bias=False)

    def forward(self, ids):
        return self.v_head(self.backbone(ids)).squeeze(-1)


def log_probs_of(logits, ids):
    """log π(ids[t+1] | ids[:t+1]) for each t (DeepSpeed-Chat's gather_log_probs)."""
    return F.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def rewards_of(log_probs, ref_log_probs, score, start):
    """The KL penalty at every generated token, the clipped score added at the last (DeepSpeed-Chat's
    compute_rewards: every answer here has the same length, so its end is the sequence's)."""
    rewards = -KL_CTL * (log_probs - ref_log_probs)
    rewards[:, -1] += score.clamp(-CLIP_REWARD, CLIP_REWARD)
    return rewards[:, start:]


def advantages_and_returns(values, rewards):
    """GAE over the answer (values and rewards from the answer's first action on)."""
    advantages, last = [], 0
    length = rewards.shape[1]
    for t in reversed(range(length)):
        next_value = values[:, t + 1] if t < length - 1 else 0.0
        delta = rewards[:, t] + GAMMA * next_value - values[:, t]
        last = delta + GAMMA * LAM * last
        advantages.append(last)
    advantages = torch.stack(advantages[::-1], dim=1)
    return advantages.detach(), (advantages + values).detach()


def actor_loss_of(log_probs, old_log_probs, advantages):
    ratio = torch.exp(log_probs - old_log_probs)
    return torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - CLIPRANGE, 1 + CLIPRANGE)).mean()


def critic_loss_of(values, old_values, returns):
    clipped = values.clamp(old_values - CLIPRANGE_VALUE, old_values + CLIPRANGE_VALUE)
    return 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2).mean()


def ppo_iteration(prompts, actor, reference, reward, critic, answer_tokens, actor_step, critic_step):
    """One PPO iteration over `prompts`. The four are callables (engines or plain modules); actor_step(loss) and
    critic_step(loss) backpropagate and step. Returns the actor's and critic's losses and the mean score."""
    start = prompts.shape[1] - 1  # log-prob / value index of the first answer token
    sequences = actor.generate(prompts, max_new_tokens=answer_tokens)
    with torch.no_grad():
        old_log_probs = log_probs_of(actor(sequences), sequences)
        ref_log_probs = log_probs_of(reference(sequences), sequences)
        score = reward(sequences)[:, -1]
        old_values = critic(sequences)[:, :-1]
    rewards = rewards_of(old_log_probs, ref_log_probs, score, start)
    advantages, returns = advantages_and_returns(old_values[:, start:], rewards)
    actor_loss = actor_loss_of(log_probs_of(actor(sequences), sequences)[:, start:], old_log_probs[:, start:],
                               advantages)
    actor_step(actor_loss)
    critic_loss = critic_loss_of(critic(sequences)[:, :-1][:, start:], old_values[:, start:], returns)
    critic_step(critic_loss)
    return actor_loss.item(), critic_loss.item(), score.mean().item()


def models():
    """The four, the same on every rank and in --reference (one seed): the reference is the actor's copy, the critic
    starts as the reward model."""
    torch.manual_seed(0)
    actor, reward = Actor(), Critic()
    return actor, copy.deepcopy(actor), reward, copy.deepcopy(reward)


def prompts_of(iteration, args):
    """Every rank's prompts of an iteration, ranks' rows in order (world × batch rows)."""
    g = torch.Generator().manual_seed(1000 + iteration)
    return torch.randint(0, VOCAB, (args.world * args.batch, args.prompt_tokens), generator=g)


def run_engines(args):
    import dscpp as deepspeed
    deepspeed.init_distributed(dist_backend="gloo")  # the models here live on the CPU
    rank, world = deepspeed.comm.get_rank(), deepspeed.comm.get_world_size()
    args.world = world
    actor, reference, reward, critic = models()
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    train = {"train_micro_batch_size_per_gpu": args.batch, "zero_optimization": zero, "gradient_clipping": CLIP,
             "optimizer": {"type": "AdamW", "params": ADAMW}}
    actor, _, _, _ = deepspeed.initialize(model=actor, model_parameters=actor.parameters(),
                                          config={**train, "hybrid_engine": {"enabled": True}})
    critic, _, _, _ = deepspeed.initialize(model=critic, model_parameters=critic.parameters(), config=train)
    frozen = {"train_micro_batch_size_per_gpu": args.batch, "zero_optimization": zero}
    reference, _, _, _ = deepspeed.initialize(model=reference, config=frozen)
    reward, _, _, _ = deepspeed.initialize(model=reward, config=frozen)

    def step(engine):
        def run(loss):
            engine.backward(loss)
            engine.step()
        return run

    for iteration in range(args.iterations):
        prompts = prompts_of(iteration, args)[rank * args.batch:(rank + 1) * args.batch]
        actor.eval()
        results = ppo_iteration(prompts, actor, reference, reward, critic, args.answer_tokens, step(actor),
                                step(critic))
        actor.train()
        mean = torch.tensor(results, dtype=torch.float64)
        torch.distributed.all_reduce(mean)
        report(iteration, (mean / world).tolist(), rank)


def run_reference(args):
    args.world = args.reference_world
    actor, reference, reward, critic = models()
    optimizers = [torch.optim.AdamW(m.parameters(), lr=ADAMW["lr"], betas=tuple(ADAMW["betas"]), eps=ADAMW["eps"],
                                    weight_decay=ADAMW["weight_decay"]) for m in (actor, critic)]

    def step(optimizer):
        def run(loss):
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(optimizer.param_groups[0]["params"], CLIP)
            optimizer.step()
        return run

    for iteration in range(args.iterations):
        # The engines' losses are means over each rank's rows, averaged over the ranks; every rank's answers have the
        # same length, so that is the mean over all rows: one batch of every rank's prompts.
        results = ppo_iteration(prompts_of(iteration, args), actor, reference, reward, critic, args.answer_tokens,
                                step(optimizers[0]), step(optimizers[1]))
        report(iteration, results, 0)


def report(iteration, results, rank):
    if rank == 0:
        actor_loss, critic_loss, score = results
        print(json.dumps({"iteration": iteration, "actor_loss": actor_loss, "critic_loss": critic_loss,
                          "reward": score}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iterations", type=int, default=4)
    p.add_argument("--batch", type=int, default=2, help="prompts per rank per iteration")
    p.add_argument("--prompt_tokens", type=int, default=6)
    p.add_argument("--answer_tokens", type=int, default=8)
    p.add_argument("--reference", action="store_true", help="the same loop in plain PyTorch on one process")
    p.add_argument("--reference_world", type=int, default=2, help="--reference: the ranks whose prompts it takes")
    p.add_argument("--local_rank", type=int, default=0)  # passed by the launcher, as DeepSpeed's passes it
    args = p.parse_args()
    if args.prompt_tokens + args.answer_tokens > MAX_LEN:
        sys.exit(f"rlhf_ppo.py: --prompt_tokens + --answer_tokens must be at most {MAX_LEN}")
    run_reference(args) if args.reference else run_engines(args)


if __name__ == "__main__":
    main()
