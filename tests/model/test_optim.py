"""Optimizer and LR schedule (gcc/model/optim.py, docs/design.md §7) on the real tiny DiT: AdamW with every
trainable DiT parameter at lr and every `gc_sem_cond` one at cond_lr, with or without the ComposerModel's `dit.`
prefix; the warmup gives optimizer step s the rate lr · min(1, s / warmup), stepped every batch."""

from __future__ import annotations

import pytest
import torch
from _gc_helpers import tiny_dit

from gcc.model.dit import COND_PREFIX
from gcc.model.optim import BETAS, build_optimizer, param_groups, trainer_schedule_kwargs, warmup_scheduler


@pytest.mark.parametrize("prefix", ["", "dit."])
def test_every_trainable_parameter_is_in_one_group_cond_at_cond_lr(prefix):
    dit = tiny_dit()
    model = torch.nn.ModuleDict({"dit": dit}) if prefix else dit
    frozen = next(p for n, p in dit.named_parameters() if not n.startswith(COND_PREFIX))
    frozen.requires_grad_(False)
    groups = param_groups(model, lr=1e-5, cond_lr=1e-4, weight_decay=0.02)
    assert [(g["name"], g["lr"], g["weight_decay"]) for g in groups] == [
        ("dit", 1e-5, 0.02),
        ("gc_sem_cond", 1e-4, 0.02),
    ]
    cond = {id(p) for n, p in dit.named_parameters() if n.startswith(COND_PREFIX)}
    trainable = {id(p) for p in dit.parameters() if p.requires_grad}
    got = [{id(p) for p in g["params"]} for g in groups]
    assert got[1] == cond and got[0] == trainable - cond and id(frozen) not in got[0]
    assert sum(len(g["params"]) for g in groups) == len(trainable)  # each once


def test_a_model_without_the_condition_is_refused():
    with pytest.raises(ValueError, match="no gc_sem_cond parameters"):
        param_groups(torch.nn.Linear(2, 2), 1e-5, 1e-4)


def test_adamw_with_the_betas():
    opt = build_optimizer(tiny_dit(), 1e-5, 1e-4)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["betas"] == BETAS
    assert [g["lr"] for g in opt.param_groups] == [1e-5, 1e-4]


@pytest.mark.parametrize("warmup", [0, 1, 4])
def test_step_s_runs_at_lr_times_min_1_s_over_warmup(warmup):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([{"params": [p], "lr": 1.0}, {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 10.0}])
    sched = warmup_scheduler(opt, warmup)
    seen = []
    for _ in range(6):
        seen.append([g["lr"] for g in opt.param_groups])  # the rate of the optimizer step about to run
        opt.step()
        sched.step()
    want = [min(1.0, s / warmup) if warmup else 1.0 for s in range(1, 7)]
    assert seen == [[pytest.approx(f), pytest.approx(10 * f)] for f in want]


def test_the_trainer_steps_the_warmup_every_batch():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    kw = trainer_schedule_kwargs(opt, 4)
    assert kw["step_schedulers_every_batch"] is True and opt.param_groups[0]["lr"] == pytest.approx(0.25)
