"""DeepSpeed's LR scheduler classes (deepspeed.runtime.lr_schedules), over any optimizer with param_groups.

A script builds one over its torch optimizer and passes it to initialize(lr_scheduler=...), or steps it itself;
initialize returns one for a config "scheduler" section. Each keeps DeepSpeed's `last_batch_iteration` and writes
the lr (and OneCycle's betas) of every param group; the values come from the engine's C++ schedule
(dscpp._C.lr_schedule, one per group), the same arithmetic a config section runs. As DeepSpeed 0.16 and later, a
scheduler built at iteration -1 sets its starting lr on the optimizer at once, and step() k moves to iteration k-1.
"""
import json
import math

import torch

from .. import _C

LR_SCHEDULE = "lr_schedule"
LR_RANGE_TEST = "LRRangeTest"
ONE_CYCLE = "OneCycle"
WARMUP_LR = "WarmupLR"
WARMUP_DECAY_LR = "WarmupDecayLR"
WARMUP_COSINE_LR = "WarmupCosineLR"
VALID_LR_SCHEDULES = [LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR]

LR_RANGE_TEST_MIN_LR = "lr_range_test_min_lr"
LR_RANGE_TEST_STEP_RATE = "lr_range_test_step_rate"
LR_RANGE_TEST_STEP_SIZE = "lr_range_test_step_size"
LR_RANGE_TEST_STAIRCASE = "lr_range_test_staircase"
EDGE_VALUE = "edge_value"  # DeepSpeed exports these two and reads neither
MID_VALUE = "mid_value"
CYCLE_FIRST_STEP_SIZE = "cycle_first_step_size"
CYCLE_FIRST_STAIR_COUNT = "cycle_first_stair_count"
CYCLE_SECOND_STEP_SIZE = "cycle_second_step_size"
CYCLE_SECOND_STAIR_COUNT = "cycle_second_stair_count"
DECAY_STEP_SIZE = "decay_step_size"
CYCLE_MIN_LR = "cycle_min_lr"
CYCLE_MAX_LR = "cycle_max_lr"
DECAY_LR_RATE = "decay_lr_rate"
CYCLE_MIN_MOM = "cycle_min_mom"
CYCLE_MAX_MOM = "cycle_max_mom"
DECAY_MOM_RATE = "decay_mom_rate"
WARMUP_MIN_LR = "warmup_min_lr"
WARMUP_MAX_LR = "warmup_max_lr"
WARMUP_NUM_STEPS = "warmup_num_steps"
WARMUP_TYPE = "warmup_type"
WARMUP_LOG_RATE = "log"
WARMUP_LINEAR_RATE = "linear"
WARMUP_MIN_RATIO = "warmup_min_ratio"
COS_MIN_RATIO = "cos_min_ratio"
TOTAL_NUM_STEPS = "total_num_steps"

_ONE_CYCLE_BETA2 = 0.99  # OneCycle writes betas (momentum, 0.99), as DeepSpeed's (the C++ schedule's kOneCycleBeta2)


def _groups(optimizer):
    """The optimizer's param groups; a scheduler drives anything that has them (a torch optimizer, ours)."""
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        raise TypeError(f"an LR scheduler needs an optimizer with param_groups (a torch.optim.Optimizer), got "
                        f"{type(optimizer).__name__}")
    return groups


def _per_group(optimizer, value, name):
    """DeepSpeed's "float or list": one value per param group, a scalar repeated."""
    count = len(_groups(optimizer))
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"{name}: expected {count} values (one per param group), got {len(value)}")
        return list(value)
    return [value] * count


def _number(value):
    return float(value.item()) if torch.is_tensor(value) else float(value)


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _write_lrs(param_groups, lrs):
    """Each group's lr; a tensor lr is filled in place, so a reference the caller holds keeps seeing it."""
    for group, lr in zip(param_groups, lrs):
        if torch.is_tensor(group["lr"]):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
    return [group["lr"] for group in param_groups]


class _Scheduler:
    """What the five schedulers share: the iteration, stepping, writing the groups, state_dict.

    Subclasses give `_type` and, per group, the params of DeepSpeed's config section and the base lr."""
    _type = None

    def __init__(self, optimizer, group_params, base_lrs, last_batch_iteration, betas=False):
        _groups(optimizer)
        self.optimizer = optimizer
        self._schedules = [_C.lr_schedule(self._type, json.dumps(params), _number(base))
                           for params, base in zip(group_params, base_lrs)]
        self._writes_betas = betas
        self._engine = None
        self._iteration = last_batch_iteration
        self._last_lr = None
        if last_batch_iteration == -1:
            self._last_lr = self._apply()

    # ---- DeepSpeed's interface --------------------------------------------------------------------------------------

    @property
    def last_batch_iteration(self):
        if self._engine is not None:  # a config scheduler: the engine steps it after each applied optimizer step
            return self._engine.global_steps - self._engine.skipped_steps - 1
        return self._iteration

    @last_batch_iteration.setter
    def last_batch_iteration(self, value):
        self._iteration = value

    def get_lr(self):
        if self._engine is not None:
            return self._engine.get_lr()
        return [s.lr_at(self.last_batch_iteration) for s in self._schedules]

    def get_last_lr(self):
        if self._engine is not None:
            return self._engine.get_lr()
        if self._last_lr is None:
            raise AssertionError(f"{type(self).__name__}.get_last_lr: need to call step() first")
        return self._last_lr

    def step(self, last_batch_iteration=None):
        """Moves to `last_batch_iteration` (default: the next) and writes its lrs. A scheduler initialize made from
        the config is stepped by engine.step(); calling this on it does nothing, as its iteration is the engine's."""
        if self._engine is not None:
            return
        self._iteration = self._iteration + 1 if last_batch_iteration is None else last_batch_iteration
        self._last_lr = self._apply()

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state_dict):
        if self._engine is not None:
            raise RuntimeError(f"{type(self).__name__}.load_state_dict: this scheduler is the engine's (the config's "
                               "\"scheduler\"); engine.load_checkpoint restores its iteration")
        self._iteration = state_dict["last_batch_iteration"]

    # ---- here ------------------------------------------------------------------------------------------------------

    def _apply(self):
        it = self.last_batch_iteration
        lrs = _write_lrs(self.optimizer.param_groups, [s.lr_at(it) for s in self._schedules])
        if self._writes_betas:
            for group, s in zip(self.optimizer.param_groups, self._schedules):
                group["betas"] = s.betas_at(it)
        return lrs

    def _follow(self, engine):
        """Makes this the view of the engine's own schedule (initialize's, for a config "scheduler" section)."""
        self._engine = engine
        return self


class LRRangeTest(_Scheduler):
    """lr = min_lr × (1 + step_rate × interval), interval growing by one every step_size steps (continuously, or in
    stairs): the range test that finds the largest lr a model trains at."""
    _type = LR_RANGE_TEST

    def __init__(self, optimizer, lr_range_test_min_lr=1e-3, lr_range_test_step_size=2000, lr_range_test_step_rate=1.0,
                 lr_range_test_staircase=False, last_batch_iteration=-1):
        self.min_lr = _per_group(optimizer, lr_range_test_min_lr, LR_RANGE_TEST_MIN_LR)
        self.step_size = _positive_int(lr_range_test_step_size, LR_RANGE_TEST_STEP_SIZE)
        self.step_rate = lr_range_test_step_rate
        self.staircase = lr_range_test_staircase
        params = [{LR_RANGE_TEST_MIN_LR: _number(lr), LR_RANGE_TEST_STEP_SIZE: self.step_size,
                   LR_RANGE_TEST_STEP_RATE: self.step_rate, LR_RANGE_TEST_STAIRCASE: self.staircase}
                  for lr in self.min_lr]
        super().__init__(optimizer, params, self.min_lr, last_batch_iteration)


class OneCycle(_Scheduler):
    """DeepSpeed's 1Cycle: lr rises from cycle_min_lr to cycle_max_lr over the first step size and falls back over
    the second, then decays; with cycle_momentum, beta1 moves the other way (betas become (momentum, 0.99))."""
    _type = ONE_CYCLE

    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate=0.0, cycle_first_step_size=2000,
                 cycle_second_step_size=None, cycle_first_stair_count=0, cycle_second_stair_count=None,
                 decay_step_size=0, cycle_momentum=True, cycle_min_mom=0.8, cycle_max_mom=0.9, decay_mom_rate=0.0,
                 last_batch_iteration=-1):
        if cycle_first_step_size is None or cycle_first_step_size <= 0:
            raise ValueError(f"{CYCLE_FIRST_STEP_SIZE} must be positive, got {cycle_first_step_size!r}")
        if cycle_second_step_size is not None and cycle_second_step_size < 0:
            raise ValueError(f"{CYCLE_SECOND_STEP_SIZE} must be >= 0 (or None: the first's), got "
                             f"{cycle_second_step_size!r}")
        self.first_step_size = float(cycle_first_step_size)
        self.second_step_size = (self.first_step_size if cycle_second_step_size is None
                                 else float(cycle_second_step_size))
        self.total_size = self.first_step_size + self.second_step_size
        self.step_ratio = self.first_step_size / self.total_size
        self.min_lrs = _per_group(optimizer, cycle_min_lr, CYCLE_MIN_LR)
        self.max_lrs = _per_group(optimizer, cycle_max_lr, CYCLE_MAX_LR)
        min_moms = _per_group(optimizer, cycle_min_mom, CYCLE_MIN_MOM)
        max_moms = self._max_moms = _per_group(optimizer, cycle_max_mom, CYCLE_MAX_MOM)
        defaults = getattr(optimizer, "defaults", None)
        if cycle_momentum and defaults is not None and "betas" not in defaults:
            # DeepSpeed's choice: an optimizer without betas (SGD) runs the lr cycle alone.
            import warnings
            warnings.warn(f"OneCycle: cycle_momentum is off: {type(optimizer).__name__} has no betas")
            cycle_momentum = False
        self.cycle_momentum = cycle_momentum
        common = {DECAY_LR_RATE: decay_lr_rate, CYCLE_FIRST_STEP_SIZE: int(cycle_first_step_size),
                  CYCLE_FIRST_STAIR_COUNT: cycle_first_stair_count, DECAY_STEP_SIZE: decay_step_size,
                  "cycle_momentum": cycle_momentum, DECAY_MOM_RATE: decay_mom_rate}
        if cycle_second_step_size is not None:
            common[CYCLE_SECOND_STEP_SIZE] = int(cycle_second_step_size)
        if cycle_second_stair_count is not None:
            common[CYCLE_SECOND_STAIR_COUNT] = cycle_second_stair_count
        params = [{**common, CYCLE_MIN_LR: _number(lo), CYCLE_MAX_LR: _number(hi), CYCLE_MIN_MOM: mlo,
                   CYCLE_MAX_MOM: mhi} for lo, hi, mlo, mhi in zip(self.min_lrs, self.max_lrs, min_moms, max_moms)]
        super().__init__(optimizer, params, self.min_lrs, last_batch_iteration, betas=cycle_momentum)

    def get_mom(self):
        """Each group's (beta1, beta2) at the current iteration; None without cycle_momentum."""
        if not self.cycle_momentum:
            return None
        if self.last_batch_iteration < 0:
            # As DeepSpeed's get_mom before the first step: the cycle's start, max momentum — although what it set on
            # the optimizer when built (and what betas_at(-1) gives) is the min.
            return [(mom, _ONE_CYCLE_BETA2) for mom in self._max_moms]
        return [s.betas_at(self.last_batch_iteration) for s in self._schedules]


class WarmupLR(_Scheduler):
    """lr rises from warmup_min_lr to warmup_max_lr (default: the optimizer's lr) over warmup_num_steps, on a log or
    linear curve, then stays there."""
    _type = WARMUP_LR

    def __init__(self, optimizer, warmup_min_lr=0.0, warmup_max_lr=None, warmup_num_steps=1000,
                 warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        self._warmup_init(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type)
        super().__init__(optimizer, self._params(), self.max_lrs, last_batch_iteration)

    def _warmup_init(self, optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type):
        _positive_int(warmup_num_steps, WARMUP_NUM_STEPS)
        if warmup_max_lr is None:
            warmup_max_lr = [group["lr"] for group in _groups(optimizer)]
        self.min_lrs = _per_group(optimizer, warmup_min_lr, WARMUP_MIN_LR)
        self.max_lrs = _per_group(optimizer, warmup_max_lr, WARMUP_MAX_LR)
        self.delta_lrs = [hi - lo for hi, lo in zip(self.max_lrs, self.min_lrs)]
        self.warmup_num_steps = max(2, warmup_num_steps)  # as DeepSpeed: log(warmup_num_steps) > 0
        self.warmup_type = warmup_type

    def _params(self, **extra):
        return [{WARMUP_MIN_LR: _number(lo), WARMUP_MAX_LR: _number(hi), WARMUP_NUM_STEPS: self.warmup_num_steps,
                 WARMUP_TYPE: self.warmup_type, **extra} for lo, hi in zip(self.min_lrs, self.max_lrs)]


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then a linear decay to 0 at total_num_steps."""
    _type = WARMUP_DECAY_LR

    def __init__(self, optimizer, total_num_steps, warmup_min_lr=0.0, warmup_max_lr=0.001, warmup_num_steps=1000,
                 warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        self.total_num_steps = total_num_steps
        self._warmup_init(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type)
        _Scheduler.__init__(self, optimizer, self._params(**{TOTAL_NUM_STEPS: total_num_steps}), self.max_lrs,
                            last_batch_iteration)


class WarmupCosineLR(_Scheduler):
    """Scales each group's own lr: a warmup ratio from warmup_min_ratio to 1 over warmup_num_steps, then a cosine
    down to cos_min_ratio at total_num_steps."""
    _type = WARMUP_COSINE_LR

    def __init__(self, optimizer, total_num_steps, warmup_min_ratio=0.0, warmup_num_steps=1000, cos_min_ratio=0.0001,
                 warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        _positive_int(warmup_num_steps, WARMUP_NUM_STEPS)
        self.total_num_steps = total_num_steps
        self.warmup_min_ratio = warmup_min_ratio
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.cos_min_ratio = cos_min_ratio
        self.warmup_type = warmup_type
        self.org_lrs = [_number(group["lr"]) for group in _groups(optimizer)]
        params = {TOTAL_NUM_STEPS: total_num_steps, WARMUP_MIN_RATIO: warmup_min_ratio,
                  WARMUP_NUM_STEPS: self.warmup_num_steps, COS_MIN_RATIO: cos_min_ratio, WARMUP_TYPE: warmup_type}
        self._ratio = _C.lr_schedule(self._type, json.dumps(params), 1.0)  # the factor itself: an lr of 1 scaled
        super().__init__(optimizer, [params] * len(self.org_lrs), self.org_lrs, last_batch_iteration)

    def get_lr_ratio(self):
        """The factor on each group's own lr at the current iteration."""
        return self._ratio.lr_at(self.last_batch_iteration)


class _ConfiguredGroups:
    """The optimizer's param groups as the config set them up, for a config scheduler's attributes (max_lrs, org_lrs,
    ...): the engine's own groups show the current lr, not the one the schedule starts from. `defaults` says whether
    the optimizer has betas, which OneCycle's momentum cycle needs (SGD and Adagrad have none)."""

    def __init__(self, lrs, has_betas):
        self.param_groups = [{"lr": lr} for lr in lrs]
        self.defaults = {"betas": None} if has_betas else {}


# The lr of a config optimizer section without "lr" (DeepSpeed's Adam, AdamW and Lamb default). Only the attributes of
# the scheduler initialize returns read it; the engine's own schedule has the optimizer's.
_DEFAULT_LR = 1e-3
_WITHOUT_BETAS = ("sgd", "adagrad")


_CLASSES = {cls._type: cls for cls in (LRRangeTest, OneCycle, WarmupLR, WarmupDecayLR, WarmupCosineLR)}


def engine_scheduler(engine, section, optimizer_section):
    """initialize's lr_scheduler for a config "scheduler" section: an instance of the class it names, built from the
    section's params over the optimizer section's lr and then following the engine's schedule — its iteration and lrs
    are the engine's; its attributes and get_mom() as DeepSpeed's."""
    cls = _CLASSES[section["type"]]
    params = {k: v for k, v in (section.get("params") or {}).items() if k != "last_batch_iteration"}
    lr = (optimizer_section.get("params") or {}).get("lr", _DEFAULT_LR)
    has_betas = str(optimizer_section.get("type", "")).lower() not in _WITHOUT_BETAS
    scheduler = cls(_ConfiguredGroups([lr] * len(engine.get_lr()), has_betas), **params)
    scheduler.optimizer = engine.optimizer
    return scheduler._follow(engine)
