"""One `train_log.csv` row and TensorBoard `train/*` scalars per optimizer step (docs/design.md §9.10).

Per micro-batch (AFTER_LOSS) it accumulates the objective's stats and the batch's dropouts; at BATCH_END it
reduces them over all ranks, so every number describes the whole global batch. `clips` lists every rank's
clip ids in rank order. `step_time` is wall time from asking the loader for the batch to the end of the
step (data wait included, validation and checkpointing excluded); `data_time` is the loader-wait part; `time`
is the Unix time at the end of the step (differences of consecutive rows: the true period, everything included).
"""
from __future__ import annotations

import time

import psutil
import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc.train.callbacks.grad_clip import GradClip

TRAIN_COLUMNS = ["step", "loss", "mse", "timestep", "lr", "cond_lr", "grad_norm", "sem_rms", "x_rms", "text_drop",
                 "cond_drop", "mask_frac", "step_time", "data_time", "mem_gb", "epoch", "time", "clips"]
_SUMMED = ["mse", "timestep", "sem_rms", "x_rms", "text_drop", "cond_drop", "mask_frac", "n"]


def peak_rss_gb() -> float:
    """This process's peak resident memory (host), GB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def memory_gb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 1e9
    return psutil.Process().memory_info().rss / 1e9


class TrainStats(Callback):
    def __init__(self, grad_clip: GradClip):
        self.grad_clip = grad_clip
        self.step_times: list[float] = []
        self.data_times: list[float] = []
        self._reset()

    def _reset(self) -> None:
        self._sums = dict.fromkeys(_SUMMED, 0.0)
        self._clips: list[str] = []
        self._epochs: set[int] = set()
        self._lrs = (float("nan"), float("nan"))

    def before_dataloader(self, state: State, logger: Logger) -> None:
        self._t0 = time.perf_counter()

    def after_dataloader(self, state: State, logger: Logger) -> None:
        self._t_data = time.perf_counter() - self._t0

    def after_loss(self, state: State, logger: Logger) -> None:
        b = state.batch
        n = len(b["clip_id"])
        stats = state.outputs["stats"]
        for k in ("mse", "timestep", "sem_rms", "x_rms"):
            self._sums[k] += float(stats[k]) * n
        self._sums["text_drop"] += float(b["drop_text"].float().sum())
        self._sums["cond_drop"] += float(b["drop_cond"].float().sum())
        self._sums["mask_frac"] += float(b["mask_frac"].float().sum())
        self._sums["n"] += n
        self._clips += list(b["clip_id"])
        self._epochs.update(int(e) for e in b["epoch"])

    def after_train_batch(self, state: State, logger: Logger) -> None:
        # the lr the optimizer is about to apply for this step (the scheduler steps after BATCH_END's prelude)
        groups = state.optimizers[0].param_groups
        self._lrs = (groups[0]["lr"], groups[1]["lr"] if len(groups) > 1 else float("nan"))

    def batch_end(self, state: State, logger: Logger) -> None:
        step_time = time.perf_counter() - self._t0
        sums = state.device.tensor_to_device(torch.tensor([self._sums[k] for k in _SUMMED], dtype=torch.float64))
        dist.all_reduce(sums, reduce_operation="SUM")
        tot = dict(zip(_SUMMED, sums.tolist()))
        n = max(tot.pop("n"), 1.0)
        mean = {k: v / n for k, v in tot.items()}
        clips = [c for rank_clips in dist.all_gather_object(self._clips) for c in rank_clips]
        self.step_times.append(step_time)
        self.data_times.append(self._t_data)
        row = {
            "step": int(state.timestamp.batch),
            "loss": float(state.total_loss_dict.get("loss/train/total", float("nan"))),
            **mean,
            "lr": self._lrs[0], "cond_lr": self._lrs[1], "grad_norm": self.grad_clip.last_norm,
            "step_time": step_time, "data_time": self._t_data, "mem_gb": memory_gb(),
            "epoch": min(self._epochs) if self._epochs else int(state.timestamp.epoch), "time": time.time(),
            "clips": ";".join(clips),
        }
        logger.log_table(TRAIN_COLUMNS, [[row[c] for c in TRAIN_COLUMNS]], name="train_log")
        scalars = {f"train/{k}": row[k] for k in TRAIN_COLUMNS if k not in ("step", "time", "clips")}
        scalars["train/sem_over_x"] = row["sem_rms"] / row["x_rms"] if row["x_rms"] else float("nan")
        logger.log_metrics(scalars)
        self._reset()
