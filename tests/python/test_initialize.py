"""dscpp.initialize and the engine's API as DeepSpeed scripts use them, and a clear Python exception for each kind
of bad input (never a crash, a hang or a C++ abort)."""
import argparse
import copy
import json
import os
import subprocess
import sys

import pytest
import torch

import dscpp
from models import TiedModel, make_model
from training import ReferenceAdam, ds_config, one_process_config as config, tokens


def test_the_seed_scripts_loop_runs_and_reports_what_deepspeed_reports():
    engine, optimizer, loader, scheduler = dscpp.initialize(model=make_model("gpt"), config=config())
    assert loader is None and scheduler is None
    assert engine.train_batch_size() == 4 and engine.train_micro_batch_size_per_gpu() == 4
    assert engine.gradient_accumulation_steps() == 1 and engine.zero_optimization_stage() == 0
    assert engine.get_global_grad_norm() is None and not engine.was_step_applied()
    for _ in range(2):
        loss = engine(tokens())
        engine.backward(loss)
        assert engine.is_gradient_accumulation_boundary()
        engine.step()
    assert engine.global_steps == 2 and engine.global_samples == 8
    assert engine.was_step_applied() and engine.get_global_grad_norm() > 0
    assert engine.get_lr() == [pytest.approx(1e-3)] and optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
    assert engine.local_rank == 0 and engine.device == torch.device("cpu")


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_backward_returns_the_loss_divided_by_the_accumulation_steps_as_deepspeeds(bf16):
    for grad_accum in (1, 4):
        c = config(train_batch_size=4 * grad_accum, gradient_accumulation_steps=grad_accum, bf16={"enabled": bf16})
        engine, _, _, _ = dscpp.initialize(model=make_model("gpt"), config=c)
        loss = engine(tokens())
        if bf16:
            loss = loss.to(torch.bfloat16)  # this model's loss is fp32 even under bf16; a bf16 model's is bf16
        returned = engine.backward(loss)
        if grad_accum == 1:
            assert returned is loss
        else:
            assert returned.dtype == loss.dtype  # DeepSpeed's `loss / gas`: a bf16 loss comes back bf16
            assert returned.item() == pytest.approx(loss.item() / grad_accum, rel=1e-2 if bf16 else 1e-6)
        engine.step()


def test_config_from_a_file_and_from_args(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config()))
    engine, *_ = dscpp.initialize(model=make_model("gpt"), config=str(path))
    assert engine.train_batch_size() == 4
    parser = dscpp.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", str(path)])
    engine, *_ = dscpp.initialize(args=args, model=make_model("gpt"))
    assert engine.train_batch_size() == 4
    with pytest.raises(ValueError, match="both in args.deepspeed_config"):
        dscpp.initialize(args=args, model=make_model("gpt"), config=config())


def test_a_client_torch_optimizer_is_the_configs_optimizer():
    model = make_model("gpt")
    c = config()
    del c["optimizer"]
    adamw = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.1)
    engine, optimizer, _, _ = dscpp.initialize(model=model, optimizer=adamw, config=c)
    assert optimizer is adamw
    assert engine.config["optimizer"]["type"] == "AdamW"
    assert engine.get_lr() == [pytest.approx(5e-4)]


def test_a_client_optimizer_beside_a_config_optimizer_section_is_the_one_used():
    # As DeepSpeed: the client optimizer is the basic optimizer; the config's section is not read (a warning says so).
    model = make_model("gpt")
    c = config()  # its optimizer section: AdamW, lr 1e-3
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with pytest.warns(UserWarning, match="section .* is not used: the optimizer passed \\(SGD\\)"):
        engine, optimizer, _, _ = dscpp.initialize(model=model, optimizer=sgd, config=c)
    assert optimizer is sgd
    assert engine.config["optimizer"]["type"] == "SGD"
    assert engine.get_lr() == [pytest.approx(0.05)]
    assert c["optimizer"]["type"] == "AdamW", "the caller's config dict is left as it was"


def test_a_config_scheduler_drives_the_lr():
    c = config(scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3,
                                                          "warmup_num_steps": 4, "warmup_type": "linear"}})
    engine, _, _, scheduler = dscpp.initialize(model=make_model("gpt"), config=c)
    lrs = []
    for _ in range(4):
        lrs.append(scheduler.get_lr()[0])
        assert engine.get_lr() == scheduler.get_lr()
        engine.backward(engine(tokens()))
        engine.step()
    # As DeepSpeed's: warmup_min_lr when built, then one iteration per step (iteration 0 is warmup_min_lr too).
    assert lrs == pytest.approx([0.0, 0.0, 2.5e-4, 5e-4], abs=1e-15)


def test_a_config_scheduler_is_an_instance_of_its_class_following_the_engine():
    from dscpp.runtime import lr_schedules
    c = config(scheduler={"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3,
                                                          "cycle_first_step_size": 2, "cycle_min_mom": 0.85,
                                                          "cycle_max_mom": 0.95}})
    engine, _, _, scheduler = dscpp.initialize(model=make_model("gpt"), config=c)
    assert isinstance(scheduler, lr_schedules.OneCycle) and engine.lr_scheduler is scheduler
    assert scheduler.min_lrs == [1e-4] and scheduler.max_lrs == [1e-3]
    # The same class stepped by hand over a torch optimizer gives the sequence the engine runs.
    alone = lr_schedules.OneCycle(torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-3),
                                  **c["scheduler"]["params"])
    for step in range(5):
        assert scheduler.last_batch_iteration == step - 1 == alone.last_batch_iteration
        assert scheduler.get_lr() == [pytest.approx(alone.get_lr()[0], rel=1e-12)]
        assert scheduler.get_mom() == [pytest.approx(m) for m in alone.get_mom()]
        engine.backward(engine(tokens()))
        engine.step()
        scheduler.step()  # as DeepSpeed's engine-owned scheduler, stepping it by hand does not advance it twice
        alone.step()
    assert scheduler.state_dict() == {"last_batch_iteration": 4}
    with pytest.raises(RuntimeError, match="load_checkpoint"):
        scheduler.load_state_dict({"last_batch_iteration": 0})


def test_a_config_one_cycle_over_sgd_cycles_no_momentum_as_deepspeeds():
    c = config(optimizer={"type": "SGD", "params": {"lr": 0.1}},
               scheduler={"type": "OneCycle", "params": {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1,
                                                         "cycle_first_step_size": 2}})
    with pytest.warns(UserWarning, match="cycle_momentum is off"):
        _, _, _, scheduler = dscpp.initialize(model=make_model("gpt"), config=c)
    assert scheduler.get_mom() is None and scheduler.get_lr() == [pytest.approx(0.01)]


def test_the_engine_shows_its_module_as_deepspeeds_nn_module_engine_does():
    model = make_model("gpt")
    engine, _, _, _ = dscpp.initialize(model=model, config=config())
    assert [id(p) for p in engine.parameters()] == [id(p) for p in model.parameters()]
    assert [n for n, _ in engine.named_parameters()] == ["module." + n for n, _ in model.named_parameters()]
    assert [n for n, _ in engine.named_buffers()] == ["module." + n for n, _ in model.named_buffers()]
    model.vocab_hint = 64
    assert engine.vocab_hint == 64  # an attribute the engine lacks is the module's
    with pytest.raises(AttributeError, match="nor has its module"):
        engine.no_such_attribute


@pytest.mark.parametrize("stage", [0, 3])
def test_destroy_lets_go_of_the_engine_and_its_hooks(stage):
    import gc
    import weakref
    model = make_model("gpt")
    engine, _, _, _ = dscpp.initialize(model=model, config=ds_config(stage=stage, grad_accum=1, world=1))
    engine.backward(engine(tokens()))
    engine.step()
    held = weakref.ref(engine._engine)
    engine.destroy()
    gc.collect()
    assert held() is None  # the C++ engine, its buffers and optimizer state, is gone
    assert all(type(m._parameters) is dict for m in model.modules())  # ZeRO-3's fetching dicts are undone
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
    assert not any(hasattr(m, "ds_external_parameters") for m in model.modules())
    with pytest.raises(RuntimeError, match="destroyed"):
        engine(tokens())
    engine.destroy()  # twice is harmless, as DeepSpeed's
    # A new engine in the same process, over a new model (Accelerate's free_memory, then prepare again).
    again, _, _, _ = dscpp.initialize(model=make_model("gpt"), config=ds_config(stage=stage, grad_accum=1, world=1))
    again.backward(again(tokens()))
    again.step()
    assert again.global_steps == 1


def accelerate_protocol_run(stage, driven):
    """Four micro-batches at gradient accumulation 2, either as a DeepSpeed script steps (every micro-batch:
    forward, backward, step) or as Hugging Face Accelerate drives the engine (forward,
    set_gradient_accumulation_boundary(its own count), backward, and step() only on a boundary)."""
    torch.manual_seed(0)
    c = config(train_batch_size=8, gradient_accumulation_steps=2, zero_optimization={"stage": stage})
    engine, _, _, _ = dscpp.initialize(model=make_model("gpt"), config=c)
    losses = []
    for micro in range(4):
        loss = engine(tokens())
        losses.append(loss.item())
        boundary = micro % 2 == 1
        if driven:
            engine.set_gradient_accumulation_boundary(boundary)
        engine.backward(loss)
        if boundary or not driven:
            engine.step()
    return losses, [p.detach().clone() for p in engine.module.parameters()], engine.global_steps


@pytest.mark.parametrize("stage", [0, 2])
def test_accelerates_boundaries_and_steps_train_as_the_scripts_loop(stage):
    losses, params, steps = accelerate_protocol_run(stage, driven=True)
    want_losses, want_params, want_steps = accelerate_protocol_run(stage, driven=False)
    assert losses == want_losses and steps == want_steps == 2
    assert all(torch.equal(a, b) for a, b in zip(params, want_params))


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_an_early_boundary_steps_on_the_micro_steps_so_far(stage):
    # Accelerate at the end of an epoch of 2 batches with gradient accumulation 4: the boundary set on micro-step 1
    # applies the two micro-steps' gradients, each scaled by 1/4 as always (DeepSpeed's); the same as gradient
    # accumulation 2 over losses halved.
    def run(grad_accum, driven):
        torch.manual_seed(0)
        c = config(train_batch_size=4 * grad_accum, gradient_accumulation_steps=grad_accum,
                   zero_optimization={"stage": stage})
        engine, _, _, _ = dscpp.initialize(model=make_model("gpt"), config=c)
        for micro in range(2):
            loss = engine(tokens())
            if driven:
                engine.set_gradient_accumulation_boundary(micro == 1)
                engine.backward(loss)
            else:
                engine.backward(loss * 0.5)
                engine.step()
        if driven:
            engine.step()
        with dscpp.zero.GatheredParameters(list(engine.module.parameters())):
            return [p.detach().clone() for p in engine.module.parameters()], engine.global_steps

    params, steps = run(4, driven=True)
    want_params, want_steps = run(2, driven=False)
    assert steps == want_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(params, want_params))


def test_a_boundary_that_is_not_a_bool_is_refused_naming_it():
    engine, _, _, _ = dscpp.initialize(model=make_model("gpt"), config=config(train_batch_size=8,
                                                                              gradient_accumulation_steps=2))
    with pytest.raises(TypeError, match="is_boundary must be a bool, got str"):
        engine.set_gradient_accumulation_boundary("False")


def test_training_data_gives_a_distributed_sampler_loader():
    data = torch.utils.data.TensorDataset(torch.arange(12))
    engine, _, loader, _ = dscpp.initialize(model=make_model("gpt"), config=config(), training_data=data)
    assert engine.training_dataloader is loader
    assert isinstance(loader.sampler, torch.utils.data.DistributedSampler)
    batches = list(loader)
    assert len(batches) == 3 and all(b[0].numel() == 4 for b in batches)
    assert sorted(torch.cat([b[0] for b in batches]).tolist()) == list(range(12))


# ---- bad input -------------------------------------------------------------------------------------------------------

def test_a_model_that_is_not_a_module():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got dict"):
        dscpp.initialize(model={"w": torch.zeros(2)}, config=config())


def test_a_config_path_that_does_not_exist(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError, match="nope.json does not exist"):
        dscpp.initialize(model=make_model("gpt"), config=str(missing))


def test_a_config_with_an_unknown_key_names_it_and_the_closest_one():
    c = config()
    c["zero_optimization"]["stage3_prefetch_bucket_sise"] = 10
    with pytest.raises(dscpp.ConfigError, match="stage3_prefetch_bucket_sise") as e:
        dscpp.initialize(model=make_model("gpt"), config=c)
    assert "stage3_prefetch_bucket_size" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_a_bad_config_file_is_named(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"train_batch_size": 2, "zero_optimization": {"stage": 7}}')
    with pytest.raises(dscpp.ConfigError, match="bad.json"):
        dscpp.initialize(model=make_model("gpt"), config=str(path))


def test_an_optimizer_type_the_engine_cannot_take():
    model = make_model("gpt")
    c = config()
    del c["optimizer"]
    with pytest.raises(TypeError, match="torch.optim.rmsprop.RMSprop cannot be taken"):
        dscpp.initialize(model=model, optimizer=torch.optim.RMSprop(model.parameters()), config=c)


class LoraLinear(torch.nn.Module):
    """A frozen base weight plus a trainable low-rank update, as PEFT's LoRA builds it."""

    def __init__(self, width=16, rank=2):
        super().__init__()
        self.base = torch.nn.Linear(width, width)
        self.base.requires_grad_(False)
        self.lora_a = torch.nn.Parameter(torch.randn(rank, width) * 0.1)
        self.lora_b = torch.nn.Parameter(torch.randn(width, rank) * 0.1)

    def forward(self, x):
        return (self.base(x) + x @ self.lora_a.t() @ self.lora_b.t()).pow(2).mean()


def lora_run(pass_parameters, steps=3, stage=0):
    """A LoRA fine-tune: the frozen base and the adapters after `steps` steps, model_parameters as the script gives
    them (pass_parameters(model) → model_parameters / optimizer)."""
    torch.manual_seed(0)
    model = LoraLinear()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    given = pass_parameters(model)
    c = {"train_batch_size": 4, "zero_optimization": {"stage": stage}}
    if "optimizer" not in given:
        c["optimizer"] = {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}
    engine, _, _, _ = dscpp.initialize(model=model, config=c, **given)
    for _ in range(steps):
        engine.backward(engine(x))
        engine.step()
    with dscpp.zero.GatheredParameters(list(model.parameters())):  # whole again under ZeRO-3
        return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_frozen_parameters_among_model_parameters_keep_their_values_and_the_rest_train(stage):
    # DeepSpeed steps the parameters that require a gradient among those given: every LoRA script passes
    # model.parameters() with the base frozen. The same run as passing only the adapters, or nothing.
    torch.manual_seed(0)
    initial = {name: p.detach().clone() for name, p in LoraLinear().named_parameters()}
    everything = lora_run(lambda m: {"model_parameters": m.parameters()}, stage=stage)
    adapters = lora_run(lambda m: {"model_parameters": [p for p in m.parameters() if p.requires_grad]}, stage=stage)
    unset = lora_run(lambda m: {}, stage=stage)
    grouped = lora_run(lambda m: {"model_parameters": [{"params": [m.base.weight, m.base.bias]},
                                                        {"params": [m.lora_a, m.lora_b]}]}, stage=stage)
    for name in ("base.weight", "base.bias"):
        assert torch.equal(everything[name], initial[name]), name
    for name in ("lora_a", "lora_b"):
        assert everything[name].shape == initial[name].shape, name
        assert not torch.equal(everything[name], initial[name]), f"{name} did not train"
    for other in (adapters, unset, grouped):
        for name, value in everything.items():
            assert torch.equal(value, other[name]), name


def test_a_client_optimizer_over_every_parameter_steps_only_the_trainable_ones():
    adapters = lora_run(lambda m: {"model_parameters": [p for p in m.parameters() if p.requires_grad]})
    client = lora_run(lambda m: {"optimizer": torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1)})
    for name, value in adapters.items():
        assert torch.equal(value, client[name]), name


def subset_run(pass_parameters, freeze_the_rest=False, stage=0):
    """gpt trained 3 steps with the optimizer over its blocks only (pass_parameters(model) → initialize's
    arguments); or, as the reference, the rest frozen. Every parameter's values after it, whole."""
    torch.manual_seed(0)
    model = make_model("gpt")
    if freeze_the_rest:
        block_ids = {id(p) for p in model.blocks.parameters()}
        for p in model.parameters():
            p.requires_grad_(id(p) in block_ids)
    given = pass_parameters(model)
    c = config(zero_optimization={"stage": stage, "stage3_param_persistence_threshold": 0})
    if "optimizer" in given:
        del c["optimizer"]
    engine, _, _, _ = dscpp.initialize(model=model, config=c, **given)
    for _ in range(3):
        engine.backward(engine(tokens()))
        engine.step()
    with dscpp.zero.GatheredParameters(list(model.parameters())):
        return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_an_optimizer_or_model_parameters_over_part_of_the_model_trains_that_part(stage):
    # As DeepSpeed: the parameters outside the optimizer keep their values; the rest train exactly as with the
    # others frozen.
    torch.manual_seed(0)
    initial = {name: p.detach().clone() for name, p in make_model("gpt").named_parameters()}
    reference = subset_run(lambda m: {}, freeze_the_rest=True, stage=stage)
    client = subset_run(lambda m: {"optimizer": torch.optim.AdamW(m.blocks.parameters(), lr=1e-3,
                                                                  weight_decay=0.1)}, stage=stage)
    listed = subset_run(lambda m: {"model_parameters": m.blocks.parameters()}, stage=stage)
    moved = [name for name in initial if name.startswith("blocks.") and not torch.equal(reference[name], initial[name])]
    assert moved, "the blocks did not train"
    for run in (client, listed):
        for name, value in reference.items():
            assert torch.equal(value, run[name]), name
            if not name.startswith("blocks."):
                assert torch.equal(value, initial[name]), f"{name} outside the optimizer moved"


def test_an_optimizer_over_parameters_the_model_does_not_have():
    model = make_model("gpt")
    c = config()
    del c["optimizer"]
    stranger = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="holds 1 parameters that are not the model's"):
        dscpp.initialize(model=model, optimizer=torch.optim.AdamW([stranger, *model.parameters()]), config=c)


def test_parameter_groups_that_differ_in_more_than_weight_decay_and_lr():
    model = make_model("gpt")
    vectors = [p for p in model.parameters() if p.dim() < 2]
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    adamw = torch.optim.AdamW([{"params": matrices}, {"params": vectors, "betas": (0.8, 0.9)}], lr=1e-3)
    c = config()
    del c["optimizer"]
    with pytest.raises(ValueError, match="group 1 differs from group 0 in betas; only weight_decay and lr may differ"):
        dscpp.initialize(model=model, optimizer=adamw, config=c)
    with pytest.raises(ValueError, match=r"group 1 sets betas=\[0.8, 0.9\] and the config's optimizer.params does not"):
        dscpp.initialize(model=model, model_parameters=[{"params": matrices}, {"params": vectors, "betas": (0.8, 0.9)}],
                         config=config())
    with pytest.raises(ValueError, match="group 0 sets eps=1e-06 and the config's optimizer.params does not set"):
        dscpp.initialize(model=model, model_parameters=[{"params": matrices, "eps": 1e-6}, {"params": vectors}],
                         config=config())
    with pytest.raises(ValueError, match="group 1's weight_decay must be a number >= 0, got -1"):
        dscpp.initialize(model=model, model_parameters=[{"params": matrices}, {"params": vectors, "weight_decay": -1}],
                         config=config())
    with pytest.raises(ValueError, match="group 1's lr must be a number >= 0, got 'fast'"):
        dscpp.initialize(model=model, model_parameters=[{"params": matrices}, {"params": vectors, "lr": "fast"}],
                         config=config())
    with pytest.raises(ValueError, match="mixes parameter groups \\(dicts\\) with Parameter at 1"):
        dscpp.initialize(model=model, model_parameters=[{"params": matrices}] + vectors, config=config())


def test_backward_before_forward():
    engine, *_ = dscpp.initialize(model=make_model("gpt"), config=config())
    with pytest.raises(RuntimeError, match="no forward ran"):
        engine.backward(engine.module(tokens()))


def test_step_with_no_backward():
    engine, *_ = dscpp.initialize(model=make_model("gpt"), config=config())
    engine(tokens())
    with pytest.raises(RuntimeError, match="no backward since the last step"):
        engine.step()


def test_a_loss_that_is_not_a_scalar():
    engine, *_ = dscpp.initialize(model=make_model("gpt"), config=config())
    engine(tokens())
    with pytest.raises(ValueError, match="loss must be a scalar"):
        engine.backward(torch.ones(3, requires_grad=True))


def test_zero3_module_called_outside_the_engine_with_gradients():
    c = config()
    c["zero_optimization"]["stage"] = 3
    engine, *_ = dscpp.initialize(model=make_model("gpt"), config=c)
    with pytest.raises(RuntimeError, match="called by itself with gradients enabled"):
        engine.module(tokens())
    engine.backward(engine(tokens()))  # the engine is still usable
    engine.step()
    assert engine.global_steps == 1


def test_activation_checkpointing_outside_the_engines_forward():
    with pytest.raises(RuntimeError, match="inside the model's forward run by engine"):
        dscpp.checkpointing.checkpoint(torch.nn.Linear(2, 2), torch.zeros(1, 2))


def test_a_client_scheduler_without_a_client_optimizer_or_beside_a_config_scheduler():
    model = make_model("gpt")
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    with pytest.raises(TypeError, match="drives a client optimizer"):
        dscpp.initialize(model=model, lr_scheduler=scheduler, config=config())
    c = config(scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 2}})
    del c["optimizer"]
    with pytest.raises(ValueError, match="keep one"):
        dscpp.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=c)


def test_compile_compiles_the_modules_forward_at_zero_0_to_2():
    # Accelerate calls engine.compile(backend=..., compile_kwargs=...) when dynamo is on. The "eager" backend runs
    # the captured graph as is: the same losses as without compile, and the module's forward is the compiled one.
    def run(compiled, stage=0):
        torch.manual_seed(0)
        engine, *_ = dscpp.initialize(model=make_model("gpt"), config=config(zero_optimization={"stage": stage}))
        if compiled:
            engine.compile(backend="eager", compile_kwargs={"dynamic": False})
            assert engine.is_compiled and engine.module._compiled_call_impl is not None
        losses = []
        for s in range(2):
            loss = engine(torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(s)))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        return losses

    assert run(compiled=True) == run(compiled=False)
    c = config(zero_optimization={"stage": 3})
    engine, *_ = dscpp.initialize(model=make_model("gpt"), config=c)
    with pytest.raises(NotImplementedError, match="torch.compile under ZeRO-3 is not supported"):
        engine.compile()
    with pytest.raises(NotImplementedError, match="deepcompile"):
        engine.compile(compiled_autograd_enabled=True)


def test_memory_reports_the_model_state_bytes():
    engine, *_ = dscpp.initialize(model=make_model("gpt"), config=config())
    memory = engine.memory()
    whole = sum(p.numel() * 4 for p in engine.module.parameters())
    assert memory["params"] == whole and memory["optimizer_state"] == 2 * whole, memory


def test_import_refuses_another_torch_naming_both_versions(tmp_path):
    """dscpp's extension runs only on the torch it was compiled against: under another, `import dscpp` raises an
    ImportError naming both versions before it loads the extension (which would otherwise fail on missing symbols or
    crash). The other torch is a stand-in package on the path ahead of the real one."""
    from dscpp._torch_version import BUILT_AGAINST
    assert BUILT_AGAINST == torch.__version__
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text('__version__ = "2.10.0+cpu"\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", "import dscpp"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result
    last = result.stderr.strip().splitlines()[-1]
    assert last == (f"ImportError: dscpp was built against torch {BUILT_AGAINST}, but this environment has torch "
                    f"2.10.0+cpu; install torch=={BUILT_AGAINST.split('+')[0]} (the wheel built for the same CUDA) or "
                    f"rebuild dscpp in this environment (scripts/setup.sh)"), result.stderr


@pytest.mark.parametrize("stage", [0, 3])
def test_empty_partition_cache_between_steps_and_not_inside_one(stage):
    """DeepSpeed's empty_partition_cache: between steps it gives back what it can (ZeRO-3 here holds no gathered
    block then) and training goes on the same; between a ZeRO-3 forward and its backward it is refused, saying why."""
    def run(empty):
        engine, *_ = dscpp.initialize(model=make_model("gpt"), config=config(
            zero_optimization={"stage": stage, "stage3_param_persistence_threshold": 0}))
        losses = []
        for _ in range(3):
            loss = engine(tokens())
            if empty and stage == 3:
                with pytest.raises(RuntimeError, match="between a forward and its backward"):
                    engine.empty_partition_cache()
            engine.backward(loss)
            engine.step()
            if empty:
                engine.empty_partition_cache()
            losses.append(engine.last_step()["loss"])
        with torch.no_grad():
            engine.eval()
            engine(tokens())  # a forward without backward gathers and releases: nothing waits
            engine.train()
        engine.empty_partition_cache()
        return losses
    assert run(True) == run(False)


def test_steps_per_print_infinity_means_never_and_other_non_finite_numbers_are_refused():
    """Hugging Face Accelerate's DeepSpeedPlugin sets steps_per_print = float("inf"); DeepSpeed takes it as "never"."""
    engine, *_ = dscpp.initialize(model=make_model("gpt"), config=config(steps_per_print=float("inf")))
    engine.backward(engine(tokens()))
    engine.step()
    assert engine.global_steps == 1
    with pytest.raises(ValueError, match=r"config optimizer.params.lr = nan: a DeepSpeed config number must be finite"):
        dscpp.initialize(model=make_model("gpt"), config=config(optimizer={"type": "AdamW",
                                                                            "params": {"lr": float("nan")}}))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("kind", ["AdamW", "Adam"])
def test_adam_steps_as_torch_optim_with_a_correctly_rounded_sqrt(kind, stage):
    """The engine's Adam/AdamW on CPU master weights (the fused SIMD kernel, src/optim/cpu_adam*.cpp) computes what
    torch.optim's single-tensor step computes, operation for operation, with the square root correctly rounded:
    after several steps every parameter equals training.ReferenceAdam's bit for bit, at every stage, and torch.optim's
    own (whose CPU sqrt is MKL's, within an ulp) within a few ulps. "Adam" with adam_w_mode false is the L2 decay."""
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(13, 37), torch.nn.Tanh(), torch.nn.Linear(37, 3))
    reference, plain = copy.deepcopy(model), copy.deepcopy(model)
    params = {"lr": 1e-2, "betas": [0.8, 0.95], "eps": 1e-7, "weight_decay": 0.1}
    if kind == "Adam":
        params["adam_w_mode"] = False
    engine, _, _, _ = dscpp.initialize(model=model, config={
        "train_batch_size": 8, "optimizer": {"type": kind, "params": params}, "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage}})
    optimizers = [
        ReferenceAdam(reference.parameters(), lr=1e-2, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.1,
                      decoupled=kind == "AdamW"),
        (torch.optim.AdamW if kind == "AdamW" else torch.optim.Adam)(
            plain.parameters(), lr=1e-2, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.1, foreach=False)]
    data = torch.Generator().manual_seed(6)
    for step in range(4):
        x, y = torch.randn(8, 13, generator=data), torch.randn(8, 3, generator=data)
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
        for net, optimizer in zip((reference, plain), optimizers):
            torch.nn.functional.mse_loss(net(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    with dscpp.zero.GatheredParameters(list(model.parameters())):
        for (name, ours), exact, torchs in zip(model.named_parameters(), reference.parameters(), plain.parameters()):
            assert torch.equal(ours.detach(), exact.detach()), (name, (ours - exact).abs().max().item())
            assert torch.allclose(ours.detach(), torchs.detach(), rtol=0, atol=1e-6), name


def test_backward_with_scale_wrt_gas_false_takes_the_loss_as_divided_by_the_caller():
    """The Hugging Face Trainer divides the loss by the accumulation steps itself and passes scale_wrt_gas=False:
    the same gradients (and weights) as DeepSpeed's own division, and the loss handed back as it came."""
    weights = []
    for scale_wrt_gas in (True, False):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        engine, _, _, _ = dscpp.initialize(model=model, config={
            "train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})
        data = torch.Generator().manual_seed(2)
        for _ in range(4):
            loss = torch.nn.functional.mse_loss(engine(torch.randn(4, 6, generator=data)),
                                                torch.randn(4, 1, generator=data))
            if scale_wrt_gas:
                engine.backward(loss)
            else:
                divided = loss / 2
                assert engine.backward(divided, scale_wrt_gas=False) is divided
            engine.step()
        assert engine.global_steps == 2
        weights.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*weights))


def test_zero3_consolidated_state_dict_is_the_modules_whole_state_dict():
    """_zero3_consolidated_16bit_state_dict (Accelerate's get_state_dict and the Trainer's save_model under ZeRO-3):
    the keys and whole values of the module's state_dict as a ZeRO-0 run of the same steps has them, the tied weight
    one tensor under both names, persistent buffers only; and each parameter's ds_status, ds_shape and ds_numel as
    DeepSpeed reports them."""
    from dscpp.runtime.zero.partition_parameters import ZeroParamStatus
    states = {}
    for stage in (0, 3):
        torch.manual_seed(4)
        model = TiedModel()
        engine, _, _, _ = dscpp.initialize(model=model, config={
            "train_batch_size": 6, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
            "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True,
                                  "stage3_param_persistence_threshold": 0}})
        for step in range(2):
            engine.backward(engine(torch.randint(0, 32, (6,), generator=torch.Generator().manual_seed(step))))
            engine.step()
        if stage == 0:
            states[stage] = model.state_dict()
            with pytest.raises(ValueError, match="requires ZeRO-3"):
                engine._zero3_consolidated_16bit_state_dict()
            continue
        assert engine.zero_gather_16bit_weights_on_model_save()
        weight = model.embed.weight
        assert weight.ds_status == ZeroParamStatus.NOT_AVAILABLE  # released between steps
        # the whole shape while it holds nothing (the Trainer counts trainable parameters with ds_numel)
        assert weight.numel() == 0 and weight.ds_shape == (32, 8) and weight.ds_numel == 32 * 8
        assert sum(p.ds_numel for p in model.parameters()) == sum(p.numel() for p in TiedModel().parameters())
        with dscpp.zero.GatheredParameters([weight]):
            assert weight.ds_status == ZeroParamStatus.AVAILABLE
        states[stage] = engine._zero3_consolidated_16bit_state_dict()
        assert states[stage]["head.weight"] is states[stage]["embed.weight"]
        engine.destroy()
        assert type(weight) is torch.nn.Parameter  # destroy gives the parameters their class back
    assert list(states[3]) == list(states[0])  # the same keys in the same order; "scratch" in neither
    for key, value in states[0].items():
        assert torch.allclose(states[3][key], value, rtol=0, atol=1e-6), key


def test_a_zero3_model_called_by_itself_evaluates_as_through_the_engine():
    """Under ZeRO-3 the module may be called outside the engine, as DeepSpeed's hooked module may (the Trainer's
    evaluation, generate()): without gradients it gathers unit by unit and releases all at the end, giving what the
    engine's own forward gives; with gradients enabled it is refused, naming the way to train."""
    torch.manual_seed(4)
    model = TiedModel()
    engine, _, _, _ = dscpp.initialize(model=model, config={
        "train_batch_size": 6, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})
    ids = torch.randint(0, 32, (6,), generator=torch.Generator().manual_seed(0))
    engine.backward(engine(ids))
    engine.step()
    engine.eval()
    with torch.no_grad():
        through_engine = engine(ids)
        by_itself = model(ids)
        again = model(ids)
    assert torch.equal(by_itself, through_engine) and torch.equal(again, through_engine)
    assert model.embed.weight.numel() == 0  # released when the forward ended
    with pytest.raises(RuntimeError, match="called by itself with gradients enabled"):
        model(ids)
    engine.train()
    engine.backward(engine(ids))  # the engine trains on afterwards
    engine.step()
    assert engine.global_steps == 2


def test_a_scheduler_callable_over_the_config_optimizer_sets_each_steps_lr():
    """initialize(lr_scheduler=callable) with the config's optimizer (the Trainer's way for a config without a
    "scheduler" section): the callable gets the engine's optimizer, a torch.optim.Optimizer, and the schedule it makes
    sets each step's lr, read back through get_lr() and the optimizer's param_groups, as torch's own loop would."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    plain = copy.deepcopy(model)
    made = []

    def make(optimizer):
        made.append(optimizer)
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step + 1) / 4)  # a warmup from its step 0

    engine, optimizer, _, scheduler = dscpp.initialize(model=model, lr_scheduler=make, config={
        "train_batch_size": 4, "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}})
    assert made == [optimizer] and isinstance(optimizer, torch.optim.Optimizer)
    assert scheduler is engine.lr_scheduler and scheduler.optimizer is optimizer
    reference = ReferenceAdam(plain.parameters(), lr=1e-2, weight_decay=0.1)
    reference_schedule = torch.optim.lr_scheduler.LambdaLR(reference, lambda step: (step + 1) / 4)
    data = torch.Generator().manual_seed(2)
    lrs = []
    for _ in range(3):
        x, y = torch.randn(4, 6, generator=data), torch.randn(4, 1, generator=data)
        lrs.append(engine.get_lr()[0])
        assert optimizer.param_groups[0]["lr"] == lrs[-1]
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
        torch.nn.functional.mse_loss(plain(x), y).backward()
        reference.step()
        reference.zero_grad()
        reference_schedule.step()
    assert lrs == pytest.approx([2.5e-3, 5e-3, 7.5e-3], rel=1e-12)  # the schedule's first value first
    for ours, theirs in zip(model.parameters(), plain.parameters()):
        assert torch.equal(ours.detach(), theirs.detach())
    with pytest.raises(ValueError, match="keep one"):
        dscpp.initialize(model=torch.nn.Linear(2, 2), lr_scheduler=make, config={
            "train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2}}})


def test_auto_left_in_zero_optimization_is_dropped_as_deepspeed_drops_it():
    """DeepSpeed's zero_optimization model drops entries still "auto" (TRL builds its reference model's engine before
    the Trainer fills the bucket sizes): the defaults stand in. "auto" elsewhere is still an error naming the key."""
    engine, _, _, _ = dscpp.initialize(model=torch.nn.Linear(2, 2), config={
        "train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "allgather_bucket_size": 5e8}})
    zero = engine.config["zero_optimization"]
    assert zero["reduce_bucket_size"] == 5e8 and zero["stage"] == 2  # DeepSpeed's default
    with pytest.raises(dscpp.ConfigError, match="train_batch_size"):
        dscpp.initialize(model=torch.nn.Linear(2, 2), config={
            "train_batch_size": "auto", "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})


@pytest.mark.parametrize("key", ["bf16", "bfloat16"])
def test_zero_init_takes_the_compute_dtype_from_a_config_with_auto_left(key):
    """zero.Init reads only zero_optimization and the dtype sections of the config it is given (Transformers hands it
    the Trainer's, "auto" still in it): the dtype, under either of DeepSpeed's names, is the one partitioning uses —
    asking for another is refused naming both."""
    config = {"train_batch_size": "auto", key: {"enabled": True},
              "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}
    with pytest.raises(ValueError, match="computes in torch.bfloat16"):
        with dscpp.zero.Init(config_dict_or_path=config, dtype=torch.float32):
            pass
