"""TrainStats (gcc/training/callbacks/train_stats.py): one `train_log` row and the `train/*` scalars per optimizer
step. The objective's stats are means over the whole batch (each micro-batch's mean weighted by its clip count), the
dropouts the means of the per-clip values, `clips` the step's clips named from the sample ids by the manifest's train
clip_ids, lr/cond_lr the rates the optimizer applies at this step, grad_norm GradClip's; a manifest that disagrees
with the shards is DamagedData. A statistic declared in gcc/model/config.py alone reaches every one of
these outputs (docs/model.md)."""

from __future__ import annotations

import importlib
import math
import time

import pytest
import torch
from _cbfit import COND_LR, LR, Fit, micro, records
from _gc_helpers import make_batch, null_embedding, tiny_dit

from gcc.errors import DamagedData
from gcc.model import config as model_config
from gcc.model.objective import GcTrainModel
from gcc.stats import LOSS, WEIGHTED, Stat
from gcc.training import columns
from gcc.training.callbacks import (
    TRAIN_COLUMNS,
    GradClip,
    Preemption,
    StepSync,
    TrainStats,
    ValidationLog,
    console_log,
    step_sync,
    train_stats,
)

GRADS = [torch.ones(2, 3), torch.full((2,), 2.0)]  # global norm sqrt(14)


def wired(clip_ids: list[str], per_rank_batch: int = 4):
    """sync, grad clip and stats in build_callbacks' order."""
    sync = StepSync(per_rank_batch)
    grad_clip = GradClip(1.0, sync)
    stats = TrainStats(sync, clip_ids)
    fit = Fit([sync, grad_clip, stats])
    fit.fit_start()
    return fit, stats


def two_micro_batches():
    return [
        micro(
            ["a", "b"],
            [0, 1],
            mse=1.0,
            timestep=100.0,
            sem_rms=0.1,
            x_rms=0.5,
            drop_text=[1, 0],
            drop_cond=[0, 0],
            mask_frac=[0.2, 0.4],
            epoch=[1, 1],
        ),
        micro(
            ["c"],
            [2],
            mse=4.0,
            timestep=700.0,
            sem_rms=0.4,
            x_rms=1.0,
            drop_text=[1],
            drop_cond=[1],
            mask_frac=[0.9],
            epoch=[0],
        ),
    ]


def test_a_row_per_step_with_whole_batch_means_weighted_by_clip_count():
    fit, stats = wired(["a", "b", "c", "d"])
    fit.step(two_micro_batches(), grads=GRADS, total_loss=0.75)
    row = stats.last_row
    [logged] = fit.table("train_log")  # what the loggers got (the in-memory one keeps 10 digits)
    assert list(logged) == TRAIN_COLUMNS
    assert logged == {k: v if isinstance(v, str) else pytest.approx(v, rel=1e-6) for k, v in row.items()}
    assert row["step"] == 1
    assert row["loss"] == pytest.approx(0.75)  # Composer's loss/train/total
    assert row["mse"] == pytest.approx((1.0 * 2 + 4.0 * 1) / 3)  # not the plain mean of the two (2.5)
    assert row["timestep"] == pytest.approx((100.0 * 2 + 700.0) / 3)
    assert row["sem_rms"] == pytest.approx((0.1 * 2 + 0.4) / 3)
    assert row["x_rms"] == pytest.approx((0.5 * 2 + 1.0) / 3)
    assert row["text_drop"] == pytest.approx(2 / 3)
    assert row["cond_drop"] == pytest.approx(1 / 3)
    assert row["mask_frac"] == pytest.approx((0.2 + 0.4 + 0.9) / 3)
    assert row["lr"] == LR and row["cond_lr"] == COND_LR
    assert row["grad_norm"] == pytest.approx(math.sqrt(14.0))
    assert row["epoch"] == 0  # the step's oldest epoch
    assert row["clips"] == "a;b;c"
    assert row["mem_gb"] > 0
    assert abs(row["time"] - time.time()) < 60
    # the same numbers as train/* scalars, with the ratio sem_rms / x_rms; no step, time or clips
    m = fit.memory.most_recent_values
    assert m["train/mse"] == pytest.approx(2.0) and m["train/grad_norm"] == pytest.approx(math.sqrt(14.0))
    assert m["train/sem_over_x"] == pytest.approx(row["sem_rms"] / row["x_rms"])
    assert {k for k in m if k.startswith("train/")} == {
        f"train/{c}" for c in TRAIN_COLUMNS if c not in ("step", "time", "clips")
    } | {"train/sem_over_x"}
    assert fit.memory.most_recent_timestamps["train/mse"].batch == 1


def test_each_step_describes_its_own_micro_batches_only():
    fit, _ = wired(["a", "b", "c", "d"])
    fit.step(two_micro_batches())
    fit.step([micro(["d", "a"], [3, 0], mse=3.0, drop_text=[0, 0], epoch=2)])
    [row] = fit.table("train_log")  # the logger holds the latest table: step 2's row
    assert row["step"] == 2
    assert row["mse"] == pytest.approx(3.0)
    assert row["text_drop"] == 0.0
    assert row["epoch"] == 2
    assert row["clips"] == "d;a"


def test_lr_is_the_rate_of_this_step_not_the_one_the_scheduler_moves_to_after_it():
    fit, _ = wired(["a", "b", "c", "d"])
    fit.state.schedulers = [torch.optim.lr_scheduler.LambdaLR(fit.optimizer, lambda step: 0.5**step)]
    fit.step(two_micro_batches())
    row = fit.table("train_log")[0]
    assert (row["lr"], row["cond_lr"]) == (LR, COND_LR)
    fit.step(two_micro_batches())
    row = fit.table("train_log")[0]
    assert row["lr"] == pytest.approx(LR / 2) and row["cond_lr"] == pytest.approx(COND_LR / 2)


def test_step_time_counts_the_data_wait_and_data_time_is_that_wait():
    fit, stats = wired(["a", "b", "c", "d"])
    fit.step(two_micro_batches(), data_wait=0.2)
    fit.step(two_micro_batches(), data_wait=0.0)
    assert len(stats.step_times) == len(stats.data_times) == 2
    assert stats.data_times[0] >= 0.2 and stats.step_times[0] >= stats.data_times[0]
    assert stats.data_times[1] < 0.2
    row = stats.last_row
    assert row["data_time"] == stats.data_times[1] and row["step_time"] == stats.step_times[1]
    assert fit.table("train_log")[0]["data_time"] == pytest.approx(stats.data_times[1], rel=1e-6)


def test_a_manifest_that_names_other_clips_than_the_shards_is_damaged_data():
    fit, _ = wired(["a", "b", "x", "d"])  # sample id 2 is "x" by the manifest, but the shard's clip is "c"
    with pytest.raises(DamagedData, match=r"sample ids name \['a', 'b', 'x'\].*shards hold \['a', 'b', 'c'\]"):
        fit.step(two_micro_batches())
    assert "train_log" not in fit.memory.tables


@pytest.fixture
def declared_kl(monkeypatch):
    """The objective declares one more statistic, `kl`, in gcc/model/config.py and in nothing else: the
    modules that derive their lists from the declarations are loaded again over it, and again after the test."""
    kl = Stat("kl", WEIGHTED, LOSS, console=".3f")
    monkeypatch.setattr(model_config, "TRAIN_STATS", (*model_config.TRAIN_STATS, kl))
    derived = (columns, step_sync, train_stats, console_log)  # in their import order
    for module in derived:
        importlib.reload(module)
    yield kl
    monkeypatch.undo()
    for module in derived:
        importlib.reload(module)


class WithKL(GcTrainModel):
    """The objective with a new loss term's statistic: what a maintainer adds to GcTrainModel.loss."""

    def loss(self, outputs, batch):
        loss = super().loss(outputs, batch)
        outputs["stats"]["kl"] = outputs["pred"].detach().float().pow(2).mean()
        return loss


def test_a_statistic_the_objective_declares_reaches_the_totals_the_row_the_scalars_and_the_console(
    declared_kl, watchdog
):
    model = WithKL(tiny_dit(), seed=0, null_context=null_embedding())
    batch = make_batch(B=2, sample_ids=[0, 1], clip_ids=["a", "b"])
    outputs = model(batch)
    loss = model.loss(outputs, batch)
    kl = float(outputs["stats"]["kl"])
    sync = step_sync.StepSync(per_rank_batch=2)
    grad_clip = GradClip(1.0, sync)
    stats = train_stats.TrainStats(sync, ["a", "b"])
    preemption = Preemption(watchdog, 60.0, sync)
    console = console_log.ConsoleLog(1, 1, stats, ValidationLog("val"), preemption)
    fit = Fit([sync, grad_clip, stats, preemption, console])
    fit.fit_start()
    try:
        with records("gcc.train") as got:
            fit.step([(batch, outputs, loss)])
    finally:
        fit.fit_end()
    assert sync.totals["kl"] == pytest.approx(kl * 2)  # summed over the step, weighted by the clip count
    [logged] = fit.table("train_log")
    loss_terms = [s.name for s in model_config.TRAIN_STATS if s.column == LOSS]
    assert list(logged)[: len(loss_terms) + 2] == ["step", "loss", *loss_terms]  # kl last of the loss's terms
    assert loss_terms[-1] == "kl"
    assert logged["kl"] == pytest.approx(kl, rel=1e-6) and stats.last_row["kl"] == pytest.approx(kl)
    assert fit.memory.most_recent_values["train/kl"] == pytest.approx(kl)
    assert f"sem_rms 0.0000  kl {kl:.3f}  elapsed " in got[0].getMessage()  # with its declared format
