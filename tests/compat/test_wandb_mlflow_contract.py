"""Contract tests of gcc/compat/loggers.py against the installed W&B (Composer's loggers running for real:
tests/training/test_loggers.py)."""

from __future__ import annotations

import pytest
import torch
import wandb  # both are dev dependencies (pyproject.toml): a broken install fails here, it is not skipped

from gcc import compat
from gcc.compat import OVERRIDE, UnverifiedLibrary
from gcc.compat.loggers import check_installed, wandb_for_composer


def test_wandb_lost_the_method_composer_calls_and_the_alias_gives_the_url():
    assert isinstance(getattr(wandb.Run, "url", None), property)  # what the alias reads
    wandb_for_composer()
    assert callable(wandb.Run.get_url)


def test_check_installed_passes_for_the_verified_versions_and_stops_on_another(monkeypatch):
    monkeypatch.delenv(OVERRIDE, raising=False)
    check_installed({"wandb": {}, "mlflow": {}, "tensorboard": {}})  # the installed ones are the verified ones
    for dist, name in (("wandb", "wandb"), ("mlflow-skinny", "mlflow")):
        monkeypatch.setattr(compat, "installed", lambda d, dist=dist: "0.0.1" if d == dist else None)
        with pytest.raises(UnverifiedLibrary, match=f"{dist} 0.0.1 is installed; .* outside the range"):
            check_installed({name: {}})
        check_installed({"tensorboard": {}})  # a logger it does not check: nothing to stop


def test_composers_mlflow_logger_keeps_the_client_and_run_id_the_samples_are_logged_with(tmp_path, monkeypatch):
    from composer.core import State
    from composer.loggers import Logger, MLFlowLogger

    from gcc.compat.loggers import allow_mlflow_file_store, mlflow_run

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    allow_mlflow_file_store()
    dest = MLFlowLogger(
        experiment_name="contract", tracking_uri=(tmp_path / "mlruns").as_uri(), log_system_metrics=False
    )
    assert mlflow_run(dest)[1] is None  # before INIT: no run yet
    state = State(model=torch.nn.Linear(1, 1), rank_zero_seed=0, run_name="contract", device="cpu")
    dest.init(state, Logger(state, destinations=[dest]))
    try:
        client, run_id = mlflow_run(dest)
        (tmp_path / "a.txt").write_text("x")
        client.log_artifact(run_id, str(tmp_path / "a.txt"), artifact_path="samples/step-0")
        assert [a.path for a in client.list_artifacts(run_id, "samples/step-0")] == ["samples/step-0/a.txt"]
    finally:
        dest.post_close()
