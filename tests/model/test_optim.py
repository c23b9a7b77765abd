"""The optimizer (gcc/model/optim.py, docs/design.md §7) on the real tiny DiT: AdamW with every trainable DiT
parameter at lr and every `gc_sem_cond` one at cond_lr, with or without the ComposerModel's `dit.` prefix."""

from __future__ import annotations

import pytest
import torch
from _gc_helpers import tiny_dit

from gcc.model.config import OptimizerConfig
from gcc.model.dit import COND_PREFIX
from gcc.model.optim import build_optimizer, param_groups


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
        param_groups(torch.nn.Linear(2, 2), 1e-5, 1e-4, 0.0)


def test_adamw_with_the_betas_and_eps():
    """The section's values; its defaults stated once (`OptimizerConfig`)."""
    opt = build_optimizer(tiny_dit(), OptimizerConfig(lr=1e-5, cond_lr=1e-4))
    defaults = OptimizerConfig()
    assert isinstance(opt, torch.optim.AdamW) and list(opt.defaults["betas"]) == defaults.betas == [0.9, 0.999]
    assert opt.defaults["eps"] == defaults.eps == 1e-8 and opt.defaults["weight_decay"] == defaults.weight_decay
    assert [g["lr"] for g in opt.param_groups] == [1e-5, 1e-4]
    opt = build_optimizer(tiny_dit(), OptimizerConfig(lr=1e-5, cond_lr=1e-4, betas=[0.8, 0.95], eps=1e-6))
    assert (opt.defaults["betas"], opt.defaults["eps"]) == ((0.8, 0.95), 1e-6)
