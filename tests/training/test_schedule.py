"""The learning-rate schedule (gcc/training/schedule.py, docs/design.md §7): Composer's schedulers by name, asked at
the step being taken: constant_with_warmup gives optimizer step s the rate lr · min(1, s / warmup), the schedule gcc
had before it had a `scheduler:` section, stepped every batch."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from gcc.training.schedule import composer_scheduler, step_scheduler, trainer_schedule_kwargs
from gcc.training.sections import SchedulerConfig


def _rates(name: str, warmup: int, max_steps: int, alpha_f: float = 0.0) -> list[list[float]]:
    """The rate of each group (lr 1 and 10) at optimizer steps 1..max_steps under the named schedule, read as the
    optimizer is about to step, the schedule stepped after each step (as Composer's Trainer does every batch)."""
    opt = torch.optim.AdamW([{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in (1.0, 10.0)])
    sched = step_scheduler(opt, composer_scheduler(SchedulerConfig(name, warmup, alpha_f)), max_steps)
    seen = []
    for _ in range(max_steps):
        seen.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    return seen


@pytest.mark.parametrize("warmup, steps", [(0, 6), (1, 6), (4, 12), (500, 1200)])
def test_constant_with_warmup_is_the_schedule_gcc_always_had(warmup, steps):
    """Before the `scheduler:` section gcc's own LambdaLR gave optimizer step s lr · min(1, s / warmup) (1 with no
    warmup), in both groups; Composer's ConstantWithWarmupScheduler, asked at step s, gives the same rate at every
    step."""
    before = [min(1.0, s / warmup) if warmup else 1.0 for s in range(1, steps + 1)]
    assert _rates("constant_with_warmup", warmup, steps) == [[f, 10 * f] for f in before]


def test_cosine_with_warmup_warms_up_then_decays_to_alpha_f_at_the_last_step():
    got = [g[0] for g in _rates("cosine_with_warmup", 4, 20, alpha_f=0.1)]  # decay over steps 4..20
    assert got[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])  # the warmup, 1 at its end
    assert got[11] == pytest.approx(0.1 + 0.9 * 0.5)  # step 12: half way through the decay, half way down
    assert got[7] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))  # step 8: a quarter of the way
    assert got[-1] == pytest.approx(0.1)  # the last step: alpha_f
    assert all(a > b for a, b in itertools.pairwise(got[3:]))  # falling all the way


def test_linear_decay_with_warmup_falls_in_a_line_to_alpha_f_at_the_last_step():
    got = [g[0] for g in _rates("linear_decay_with_warmup", 4, 20, alpha_f=0.2)]
    assert got[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert got[11] == pytest.approx((1 + 0.2) / 2)  # half way through the decay
    assert got[-1] == pytest.approx(0.2)
    steps = [a - b for a, b in itertools.pairwise(got[3:])]
    assert steps == pytest.approx([0.8 / 16] * 16)  # the same fall each step


def test_both_groups_follow_the_schedule_in_proportion():
    rates = _rates("cosine_with_warmup", 3, 9, alpha_f=0.0)
    assert [g[1] for g in rates] == pytest.approx([10 * g[0] for g in rates])


def test_an_unknown_scheduler_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="scheduler.name: unknown scheduler 'step'"):
        composer_scheduler(SchedulerConfig("step", 1))


def test_the_trainer_steps_the_schedule_every_batch():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    kw = trainer_schedule_kwargs(opt, composer_scheduler(SchedulerConfig(t_warmup=4)), 10)
    assert kw["step_schedulers_every_batch"] is True and opt.param_groups[0]["lr"] == pytest.approx(0.25)


def test_every_scheduler_name_the_config_accepts_is_built_and_no_other():
    """The names are stated once, as the config's choices (`SchedulerName`): the table that builds them holds
    exactly those, the decaying ones among them, and a name outside them is refused naming the key."""
    import typing

    from gcc.training.config import CHOICES
    from gcc.training.schedule import SCHEDULERS
    from gcc.training.sections import DECAYING, SchedulerName

    assert list(SCHEDULERS) == list(typing.get_args(SchedulerName)) == list(CHOICES["scheduler.name"])
    assert set(DECAYING) < set(SCHEDULERS)
    rates = {name: [r[0] for r in _rates(name, 2, 10, alpha_f=0.25)] for name in SCHEDULERS}
    assert rates["constant_with_warmup"][-1] == 1.0  # each name builds its own kind
    assert rates["linear_decay_with_warmup"][-1] == rates["cosine_with_warmup"][-1] == 0.25  # alpha_f at the end
    assert len({rates[name][3] for name in SCHEDULERS}) == 3  # and the three differ on the way
    with pytest.raises(ValueError, match="scheduler.name: unknown scheduler 'step'"):
        composer_scheduler(SchedulerConfig("step", 0))
