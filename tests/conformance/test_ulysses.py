"""DeepSpeed-Ulysses' DistributedAttention (issue 53), the same script (ulysses_script.py) on real DeepSpeed and on
ours, over real processes: 2 ranks in one sequence-parallel group, 4 ranks as two groups of 2, in both layouts
(batch first, sequence first). Ours gives DeepSpeed's outputs and input gradients bit for bit (the exchanges move
the same elements to the same places; the attention between them is the script's), and both give each rank its
slice of attention over the whole sequence."""
import json

import pytest

from conftest import HERE, _run_ranks


def records(impl, world, sp):
    out = _run_ranks(world, ["ulysses_script.py", "--impl", impl, "--sp", str(sp)], timeout=300, cwd=HERE,
                     what=f"{impl}: a rank failed")[0]
    lines = [json.loads(line) for line in out.splitlines() if line.startswith('{"batch_dim"')]
    assert [r["batch_dim"] for r in lines] == [0, 1], out[-3000:]
    return lines


@pytest.mark.parametrize("world,sp", [(2, 2), (4, 2)])
def test_distributed_attention_is_deepspeeds_and_the_whole_sequences(world, sp):
    ours, theirs = records("dscpp", world, sp), records("deepspeed", world, sp)
    for a, b in zip(ours, theirs):
        assert a["out"] == b["out"], f"batch_dim {a['batch_dim']}: outputs differ from DeepSpeed's"
        assert a["grads"] == b["grads"], f"batch_dim {a['batch_dim']}: input gradients differ from DeepSpeed's"
        assert a["out"] == pytest.approx(a["whole_out"], abs=1e-6)
        for got, want in zip(a["grads"], a["whole_grads"]):
            assert got == pytest.approx(want, abs=1e-6)


def test_distributed_attention_names_what_it_does_not_support():
    import torch
    from dscpp.sequence.layer import DistributedAttention

    with pytest.raises(NotImplementedError, match="sp_stream"):
        DistributedAttention(lambda q, k, v: q, None, sp_stream=object())
    with pytest.raises(ValueError, match="scatter_idx is 1"):
        DistributedAttention(lambda q, k, v: q, None, scatter_idx=1)
    attention = DistributedAttention(lambda q, k, v: q, None)
    t = torch.zeros(2, 4, 2, 3)
    with pytest.raises(NotImplementedError, match="rotary_pos_emb"):
        attention(t, t, t, 0, rotary_pos_emb=(t, t))
    with pytest.raises(ValueError, match="batch_dim is 2"):
        attention(t, t, t, 2)
    assert attention(t + 1, t, t, 0).equal(t + 1)  # one process: the local attention alone
