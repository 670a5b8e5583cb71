"""dscpp.accelerator.get_accelerator() against DeepSpeed's CPU accelerator, in one process: the answers scripts and
libraries ask for (device names and count, backend, dtypes, streams, seeds, memory) are DeepSpeed's."""
import pytest
import torch

import ds_cpu  # noqa: F401  (before deepspeed: DS_ACCELERATOR=cpu)
from deepspeed.accelerator import get_accelerator as ds_get_accelerator

from dscpp.accelerator import CpuAccelerator, get_accelerator, set_accelerator

SAME = ["device_name()", "device_name(0)", "device_name(3)", "current_device_name()", "communication_backend_name()",
        "is_synchronized_device()", "use_host_timers()", "resolves_data_dependency()",
        "handles_memory_backpressure()", "is_available()", "is_bf16_supported()",
        "supported_dtypes()", "device()", "Stream", "Event", "current_stream()", "default_stream()",
        "lazy_call(lambda: 7)", "on_accelerator(torch.ones(1))", "on_accelerator(torch.ones(1, device='meta'))",
        "initial_seed()", "total_memory()", "_name"]


@pytest.mark.parametrize("expression", SAME)
def test_the_cpu_answers_as_deepspeeds(expression):
    ours, theirs = get_accelerator(), ds_get_accelerator()
    assert eval("ours." + expression) == eval("theirs." + expression)


def test_fp16_where_onednn_has_it():
    # DeepSpeed's answer is None (not False) where oneDNN lacks fp16 (this AVX-512-BF16 EPYC); ours is a bool.
    assert get_accelerator().is_fp16_supported() == bool(ds_get_accelerator().is_fp16_supported())


def test_device_count_and_current_device_follow_the_launchers_environment(monkeypatch):
    ours, theirs = get_accelerator(), ds_get_accelerator()
    monkeypatch.setenv("LOCAL_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert ours.device_count() == theirs.device_count() == 3
    assert ours.current_device() == int(theirs.current_device()) == 2  # DeepSpeed's is the variable's text
    monkeypatch.delenv("LOCAL_SIZE")
    assert ours.device_count() == theirs.device_count()  # the NUMA nodes with CPUs


def test_memory_is_the_processes_resident_memory_with_a_peak():
    acc = get_accelerator()
    acc.reset_peak_memory_stats()
    before = acc.memory_allocated()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    assert acc.memory_allocated() >= before + 48 * 2**20
    peak = acc.max_memory_allocated()
    del block
    assert acc.max_memory_allocated() >= peak  # the peak stays until a reset
    assert 0 < acc.available_memory() <= acc.total_memory()
    assert acc.memory_stats()["allocated_bytes.all.peak"] >= peak


def test_rng_and_streams_on_the_cpu():
    acc = get_accelerator()
    acc.manual_seed(5)
    state = acc.get_rng_state()
    a = torch.rand(3)
    acc.set_rng_state(state)
    assert torch.equal(a, torch.rand(3))
    with acc.stream(None):
        pass
    t = torch.ones(2)
    assert acc.pin_memory(t) is t


def test_choice_and_replacement(monkeypatch):
    assert isinstance(get_accelerator(), CpuAccelerator)  # DS_ACCELERATOR=cpu (ds_cpu), and no GPU here anyway
    with pytest.raises(TypeError, match="set_accelerator"):
        set_accelerator(ds_get_accelerator())
