"""One `train_log.csv` row and TensorBoard `train/*` scalars per optimizer step (docs/design.md §9.10).

Per micro-batch (AFTER_LOSS) it adds the objective's statistics and the batch's dropouts (gcc/stats.py: each is
declared once, with its reduction) to the step's one reduction (`StepSync`, on the device), so every number
describes the whole global batch. `clips` lists every rank's clip ids in rank order, named on rank 0 from the sample ids with the manifest's train clip_ids.
`step_time` is wall time from asking the loader for the batch to the end of the step (data wait included,
validation and checkpointing excluded); `data_time` is the loader-wait part; `time`
is the Unix time at the end of the step (differences of consecutive rows: the true period, everything included).
"""

from __future__ import annotations

import resource
import time
from functools import lru_cache
from typing import Any

import psutil
import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc.data.sample_rng import BATCH_STATS
from gcc.errors import DamagedData
from gcc.model.config import RATIOS, TRAIN_STATS
from gcc.stats import SUM, WEIGHTED
from gcc.training.callbacks.step_sync import StepSync
from gcc.training.columns import STEP_STATS, TRAIN_COLUMNS

# the step's sums in the order _sums gives them: the micro-batch means to weight, then the values to add up
_WEIGHTED = [s.name for s in STEP_STATS if s.reduce == WEIGHTED]
_ADDED = [s.name for s in STEP_STATS if s.reduce != WEIGHTED]


def peak_rss_gb() -> float:
    """This process's peak resident memory (host), GB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


@lru_cache(maxsize=1)
def _this_process() -> psutil.Process:
    return psutil.Process()


def memory_gb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 1e9
    return _this_process().memory_info().rss / 1e9


class TrainStats(Callback):
    def __init__(self, sync: StepSync, clip_ids: list[str]):
        self.sync, self.clip_ids = sync, clip_ids
        self.step_times: list[float] = []
        self.data_times: list[float] = []
        self.last_row: dict | None = None  # rank 0: the step's train_log row
        sync.source(_WEIGHTED + _ADDED + ["n"], self._sums)
        self._reset()

    def _reset(self) -> None:
        # per micro-batch of the step: (its statistics by name, its clips' epochs); small
        # tensors only, not the batch, which would keep every micro-batch's inputs alive until the step's end
        self._micro: list[tuple[dict, list[int]]] = []
        self._own_clips: list[str] = []
        self._lrs = (float("nan"), float("nan"))

    def _sums(self) -> torch.Tensor:
        """This rank's sums for the step's reduce, in the order of _WEIGHTED + _ADDED + n: the per-micro-batch means
        weighted by the micro-batch's clip count, the other values (per clip or per micro-batch) summed. A few
        kernels per step, on the objective's device, with no copy from the host (the counts are scalars)."""
        if not self._micro:
            return torch.zeros(len(_WEIGHTED) + len(_ADDED) + 1)
        counts = [float(len(epoch)) for _, epoch in self._micro]
        dev = self._micro[0][0][TRAIN_STATS[0].name].device  # the objective's device
        parts = []
        if _WEIGHTED:
            weighted = [
                torch.stack([v[k].to(dev).float().reshape(()) for k in _WEIGHTED]).double() * count
                for (v, _), count in zip(self._micro, counts)
            ]  # each micro-batch's means times its clips
            parts.append(torch.stack(weighted).sum(0))
        if _ADDED:
            added = [torch.cat([v[k].reshape(-1) for v, _ in self._micro]).to(dev).double().sum() for k in _ADDED]
            parts.append(torch.stack(added))
        parts.append(torch.full((1,), sum(counts), device=dev, dtype=torch.float64))
        return torch.cat(parts)

    def before_dataloader(self, state: State, logger: Logger) -> None:
        self._t0 = time.perf_counter()

    def after_dataloader(self, state: State, logger: Logger) -> None:
        self._t_data = time.perf_counter() - self._t0

    def after_loss(self, state: State, logger: Logger) -> None:
        b, stats = state.batch, state.outputs["stats"]
        values = {s.name: stats[s.name] for s in TRAIN_STATS} | {s.name: b[s.key or s.name] for s in BATCH_STATS}
        self._micro.append((values, b["epoch"]))
        self._own_clips += b["clip_id"]

    def after_train_batch(self, state: State, logger: Logger) -> None:
        # the lr the optimizer is about to apply for this step (the scheduler steps after BATCH_END's prelude)
        groups = state.optimizers[0].param_groups
        self._lrs = (groups[0]["lr"], groups[1]["lr"] if len(groups) > 1 else float("nan"))

    def batch_end(self, state: State, logger: Logger) -> None:
        step_time = time.perf_counter() - self._t0
        self.step_times.append(step_time)
        self.data_times.append(self._t_data)
        if dist.get_global_rank() != 0:  # the loggers write on rank 0 only
            self._reset()
            return
        tot = self.sync.totals
        n = max(tot["n"], 1.0)
        values = {s.name: tot[s.name] if s.reduce == SUM else tot[s.name] / n for s in STEP_STATS}
        clips = [self.clip_ids[i] for i in self.sync.sample_ids]
        if clips[: len(self._own_clips)] != self._own_clips:  # rank 0's own slots come first
            raise DamagedData(
                f"train split: sample ids name {clips[: len(self._own_clips)]} by the manifest's "
                f"train clip_ids, but the shards hold {self._own_clips}: manifest.json and the shards "
                f"disagree"
            )
        epochs = [e for _, epoch in self._micro for e in epoch]
        row: dict[str, Any] = {
            "step": int(state.timestamp.batch),
            "loss": float(state.total_loss_dict.get("loss/train/total", float("nan"))),
            **values,
            "lr": self._lrs[0],
            "cond_lr": self._lrs[1],
            "grad_norm": tot["grad_norm"],
            "step_time": step_time,
            "data_time": self._t_data,
            "mem_gb": memory_gb(),
            "epoch": min(epochs) if epochs else int(state.timestamp.epoch),
            "time": time.time(),
            "clips": ";".join(clips),
        }
        self.last_row = row
        logger.log_table(TRAIN_COLUMNS, [[row[c] for c in TRAIN_COLUMNS]], name="train_log")
        scalars = {f"train/{k}": row[k] for k in TRAIN_COLUMNS if k not in ("step", "time", "clips")}
        for name, (num, den) in RATIOS.items():
            scalars[f"train/{name}"] = row[num] / row[den] if row[den] else float("nan")
        logger.log_metrics(scalars)
        self._reset()
