"""DeepSpeed-Ulysses from Python (sequence_parallel.py): "sequence_parallel_size" 2 in the config, a model whose
attention is dscpp.sequence.layer.DistributedAttention, trained through dscpp.initialize and its data loader on 2
processes (the two ranks of a sequence must read the same samples) at ZeRO 2 and 3: the per-step losses of the
whole sequences are one process's, also with DeepSpeed's mesh_param and the groups' getters.
(Sequence x data parallelism is gpt-train's test: SequenceParallel.*.)"""
import json

import pytest
import torch

from conftest import run_ranks


def losses(tmp_path, world, sp, stage, *extra):
    out = tmp_path / f"losses_{world}_{sp}_{stage}{''.join(extra)}.json"
    run_ranks(world, ["sequence_parallel.py", "--sp", str(sp), "--stage", str(stage), *extra, str(out)])
    return json.loads(out.read_text())


@pytest.mark.parametrize("stage", [2, 3])
def test_split_sequences_train_as_one_process(stage, tmp_path):
    one = losses(tmp_path, 1, 1, stage)
    assert len(one) == 6
    assert losses(tmp_path, 2, 2, stage) == pytest.approx(one, abs=1e-5)


def test_mesh_param_makes_deepspeeds_sequence_groups(tmp_path):
    """initialize(mesh_param=(1, 2)) without the config key: the model takes its sequence group from
    dscpp.utils.groups (DeepSpeed's getters, checked in the script) and trains as one process."""
    one = losses(tmp_path, 1, 1, 2)
    assert losses(tmp_path, 2, 2, 2, "--mesh") == pytest.approx(one, abs=1e-5)


def test_the_tiled_loss_equals_the_untiled_one():
    """dscpp.sequence.tiled_loss: the loss and gradients of a (2, 37, 16) hidden state against a 50-row head, 8
    positions at a time, equal F.cross_entropy's over the whole logits."""
    from dscpp.sequence.tiled_loss import tiled_cross_entropy
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 37, 16, generator=g, requires_grad=True)
    head = torch.randn(50, 16, generator=g, requires_grad=True)
    labels = torch.randint(0, 50, (2, 37), generator=g)
    want = torch.nn.functional.cross_entropy((hidden @ head.t()).reshape(-1, 50), labels.reshape(-1))
    want_grads = torch.autograd.grad(want, (hidden, head))
    got = tiled_cross_entropy(hidden, head, labels, tile=8)
    got_grads = torch.autograd.grad(got, (hidden, head))
    assert abs(float(got) - float(want)) < 1e-6
    assert all((a - b).abs().max() < 1e-6 for a, b in zip(got_grads, want_grads))
