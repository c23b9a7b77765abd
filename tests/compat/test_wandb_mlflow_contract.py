"""Contract tests of gcc/compat/loggers.py against the installed W&B (Composer's loggers running for real:
tests/training/test_loggers.py)."""

from __future__ import annotations

import pytest

from gcc.compat.loggers import check_installed, wandb_for_composer


def test_wandb_lost_the_method_composer_calls_and_the_alias_gives_the_url():
    wandb = pytest.importorskip("wandb")
    assert isinstance(getattr(wandb.Run, "url", None), property)  # what the alias reads
    wandb_for_composer()
    assert callable(wandb.Run.get_url)


def test_check_installed_passes_for_the_verified_versions_and_ignores_other_names():
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    check_installed({"wandb": {}, "mlflow": {}, "tensorboard": {}})
