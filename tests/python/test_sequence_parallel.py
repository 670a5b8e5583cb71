"""DeepSpeed-Ulysses from Python (sequence_parallel.py): "sequence_parallel_size" 2 in the config, a model whose
attention is dscpp.sequence.layer.DistributedAttention, trained through dscpp.initialize and its data loader on 2
processes (the two ranks of a sequence must read the same samples) at ZeRO 2 and 3: the per-step losses of the
whole sequences are one process's. (Sequence x data parallelism is gpt-train's test: SequenceParallel.*.)"""
import json

import pytest

from conftest import run_ranks


def losses(tmp_path, world, sp, stage):
    out = tmp_path / f"losses_{world}_{sp}_{stage}.json"
    run_ranks(world, ["sequence_parallel.py", "--sp", str(sp), "--stage", str(stage), str(out)])
    return json.loads(out.read_text())


@pytest.mark.parametrize("stage", [2, 3])
def test_split_sequences_train_as_one_process(stage, tmp_path):
    one = losses(tmp_path, 1, 1, stage)
    assert len(one) == 6
    assert losses(tmp_path, 2, 2, stage) == pytest.approx(one, abs=1e-5)
