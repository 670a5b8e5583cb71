"""DeepSpeed's optimizer classes and names from Python: DeepSpeedCPUAdam / Adagrad / Lion, OnebitAdam, ZeroOneAdam,
OnebitLamb and FusedLamb, each taken by initialize as the engine's own optimizer and stepping as it does."""
import pytest
import torch

import dscpp
from models import make_model
from training import one_process_config as config, tokens


def test_deepspeed_cpu_adam_steps_as_torch_adamw_and_is_taken_by_initialize():
    from dscpp.ops.adam import DeepSpeedCPUAdam
    torch.manual_seed(0)
    ours_p = torch.nn.Parameter(torch.randn(1000))
    ref_p = torch.nn.Parameter(ours_p.detach().clone())
    ours = DeepSpeedCPUAdam([ours_p], lr=1e-2, weight_decay=0.1)
    ref = torch.optim.AdamW([ref_p], lr=1e-2, weight_decay=0.1)
    for step in range(5):
        grad = torch.randn(1000, generator=torch.Generator().manual_seed(step))
        ours_p.grad, ref_p.grad = grad.clone(), grad.clone()
        ours.step()
        ref.step()
    # The SIMD path this CPU has (AVX-512 or AVX2, or scalar), against torch's arithmetic.
    assert torch.allclose(ours_p, ref_p, rtol=1e-6, atol=1e-7), (ours.simd_path, (ours_p - ref_p).abs().max())
    model = make_model("gpt")
    c = config()
    del c["optimizer"]
    engine, optimizer, _, _ = dscpp.initialize(model=model, optimizer=DeepSpeedCPUAdam(model.parameters(), lr=2e-3),
                                               config=c)
    assert engine.config["optimizer"]["type"] == "Adam" and engine.config["optimizer"]["params"]["adam_w_mode"]
    assert engine.get_lr() == [pytest.approx(2e-3)]
    with pytest.raises(RuntimeError, match="does not support amsgrad"):
        DeepSpeedCPUAdam(model.parameters(), amsgrad=True)


@pytest.mark.parametrize("kind", ["adagrad", "lion"])
def test_deepspeed_cpu_adagrad_and_lion_step_as_the_engines_own(kind):
    # Hugging Face Accelerate swaps an offloaded torch Adagrad (or bitsandbytes Lion) for these and passes it to
    # initialize: the engine runs its own Adagrad / Lion with the same settings, and trains as the class itself does
    # in a plain loop (two implementations of each: the class in Python, the engine's flat one in C++).
    from dscpp.ops.adagrad import DeepSpeedCPUAdagrad
    from dscpp.ops.lion import DeepSpeedCPULion

    def make(params):
        if kind == "adagrad":
            return DeepSpeedCPUAdagrad(params, lr=1e-2, eps=1e-8, weight_decay=0.01)
        return DeepSpeedCPULion(params, lr=1e-3, betas=(0.8, 0.95), weight_decay=0.1)

    batches = [torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(s)) for s in range(3)]
    torch.manual_seed(0)
    plain = make_model("gpt")
    torch.manual_seed(0)
    model = make_model("gpt")
    optimizer = make(plain.parameters())
    for batch in batches:
        plain(batch).backward()
        for p in plain.parameters():  # the engine steps every parameter, one the loss does not reach at gradient 0
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad()
    c = config(gradient_clipping=0)
    del c["optimizer"]
    engine, _, _, _ = dscpp.initialize(model=model, optimizer=make(model.parameters()), config=c)
    assert engine.config["optimizer"]["type"] == {"adagrad": "Adagrad", "lion": "Lion"}[kind]
    for batch in batches:
        engine.backward(engine(batch))
        engine.step()
    for (name, a), b in zip(model.named_parameters(), plain.parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-6), (name, (a - b).abs().max())
    torch.manual_seed(0)
    initial = make_model("gpt")
    assert not any(torch.equal(a, b) for a, b in zip(plain.parameters(), initial.parameters()))  # all of it trained


def expect_set_up_step_then_training(engine, model):
    """A 1-bit optimizer's first step is DeepSpeed's set-up step (nothing moves); the next one moves every weight."""
    before = [p.detach().clone() for p in model.parameters()]
    engine.backward(engine(tokens()))
    engine.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
    engine.backward(engine(tokens()))
    engine.step()
    assert not any(torch.equal(a, b) for a, b in zip(model.parameters(), before))


def test_onebit_adam_by_its_deepspeed_name_is_the_engines_one_bit_adam():
    # deepspeed.runtime.fp16.onebit.adam.OnebitAdam, passed as the client optimizer: the engine runs its 1-bit Adam
    # with the same settings. Its first step is DeepSpeed's set-up step (nothing moves); the next one trains.
    from dscpp.runtime.fp16.onebit import OnebitAdam

    model = make_model("gpt")
    c = config(gradient_clipping=0)
    del c["optimizer"]
    optimizer = OnebitAdam(model.parameters(), lr=2e-3, freeze_step=5, weight_decay=0.01, bias_correction=False)
    engine, _, _, _ = dscpp.initialize(model=model, optimizer=optimizer, config=c)
    section = engine.config["optimizer"]
    assert section["type"] == "OneBitAdam"
    assert section["params"]["freeze_step"] == 5 and section["params"]["lr"] == pytest.approx(2e-3)
    expect_set_up_step_then_training(engine, model)
    with pytest.raises(RuntimeError, match="runs inside the engine"):
        optimizer.step()
    with pytest.raises(ValueError, match="comm_backend_name 'mpi'"):
        OnebitAdam(model.parameters(), comm_backend_name="mpi")
    with pytest.raises(RuntimeError, match="AMSGrad"):
        OnebitAdam(model.parameters(), amsgrad=True)


def test_zero_one_adam_by_its_deepspeed_name_is_the_engines_zero_one_adam():
    from dscpp.runtime.fp16.onebit import ZeroOneAdam

    model = make_model("gpt")
    c = config(gradient_clipping=0)
    del c["optimizer"]
    optimizer = ZeroOneAdam(model.parameters(), lr=2e-3, var_freeze_step=5, local_step_scaler=10, weight_decay=0.01)
    engine, _, _, _ = dscpp.initialize(model=model, optimizer=optimizer, config=c)
    section = engine.config["optimizer"]
    assert section["type"] == "ZeroOneAdam"
    assert section["params"]["var_freeze_step"] == 5 and section["params"]["local_step_scaler"] == 10
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):  # the set-up step, then one that trains
        engine.backward(engine(tokens()))
        engine.step()
    assert not any(torch.equal(a, b) for a, b in zip(model.parameters(), before))
    with pytest.raises(ValueError, match="deepspeed= is the engine's"):
        ZeroOneAdam(model.parameters(), deepspeed=engine)


def test_lamb_by_its_deepspeed_names_is_the_engines_lamb():
    # deepspeed.ops.lamb.FusedLamb as the client optimizer trains as the config's "Lamb" with the same settings, bit
    # for bit; OnebitLamb becomes "OneBitLamb", whose first step is DeepSpeed's set-up step.
    from dscpp.ops.lamb import FusedLamb
    from dscpp.runtime.fp16.onebit import OnebitLamb

    def run(client):
        torch.manual_seed(0)
        model = make_model("gpt")
        c = config(gradient_clipping=0)
        if client:
            del c["optimizer"]
            optimizer = FusedLamb(model.parameters(), lr=1e-2, weight_decay=0.01, max_coeff=5.0)
        else:
            c["optimizer"] = {"type": "Lamb", "params": {"lr": 1e-2, "weight_decay": 0.01, "max_coeff": 5.0}}
            optimizer = None
        engine, _, _, _ = dscpp.initialize(model=model, optimizer=optimizer, config=c)
        assert engine.config["optimizer"]["type"] == "Lamb"
        for s in range(3):
            engine.backward(engine(tokens()))
            engine.step()
        return [p.detach().clone() for p in model.parameters()], optimizer

    ours, optimizer = run(True)
    theirs, _ = run(False)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    torch.manual_seed(0)
    assert not any(torch.equal(a, b) for a, b in zip(ours, make_model("gpt").parameters()))
    with pytest.raises(RuntimeError, match="runs inside the engine"):
        optimizer.step()
    with pytest.raises(ValueError, match="max_grad_norm"):
        FusedLamb(make_model("gpt").parameters(), max_grad_norm=1.0)

    model = make_model("gpt")
    c = config(gradient_clipping=0)
    del c["optimizer"]
    onebit = OnebitLamb(model.parameters(), lr=1e-2, freeze_step=5, weight_decay=0.01, coeff_beta=0.8,
                        factor_max=3.0)
    engine, _, _, _ = dscpp.initialize(model=model, optimizer=onebit, config=c)
    params = engine.config["optimizer"]["params"]
    assert engine.config["optimizer"]["type"] == "OneBitLamb"
    assert params["freeze_step"] == 5 and params["coeff_beta"] == 0.8 and params["factor_max"] == 3.0
    expect_set_up_step_then_training(engine, model)
    with pytest.raises(ValueError, match="eps_inside_sqrt"):
        OnebitLamb(model.parameters(), eps_inside_sqrt=True)
