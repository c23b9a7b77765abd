"""The one collective of each optimizer step: what every rank must agree on, in a single all-reduce.

At AFTER_TRAIN_BATCH (after every micro-batch's backward, inside Composer's optimizer closure, before the
update) one SUM all-reduce of a small float64 tensor carries
* the step's summed statistics (`TrainStats`: loss parts, drop counts, clip count),
* the number of non-finite micro-batch losses (`NonFiniteGuard` raises on it before the update),
* whether any rank received a preemption signal (`Preemption` stops after this step),
* every rank's sample ids, each rank writing its own slots (an all-gather by sum): rank 0 names the clips
  from them with the manifest (sample id i of a split is its clip_ids[i]).

Values accumulate on the device, so a GPU step synchronises with the host once, here, and not once per
logged number. Each of these was its own collective before (plus an all_gather_object of the clip ids); on
a small step that fixed cost showed (docs/performance.md, trainer overhead).
"""
from __future__ import annotations

from typing import Callable

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

SUMMED = ["mse", "timestep", "sem_rms", "x_rms", "text_drop", "cond_drop", "mask_frac", "n", "nonfinite", "preempt"]


class StepSync(Callback):
    def __init__(self, per_rank_batch: int):
        self.per_rank = per_rank_batch
        self._flags: dict[str, Callable[[], bool]] = {}
        self.totals: dict[str, float] = {}  # after the step's reduce: SUMMED over all ranks
        self.sample_ids: list[int] = []  # after the step's reduce: every rank's sample ids, in rank order
        self._local: torch.Tensor | None = None
        self._ids: list[torch.Tensor] = []

    def flag(self, name: str, source: Callable[[], bool]) -> None:
        """Read `source()` on each rank at the reduce; `totals[name]` is then the number of ranks where it held."""
        self._flags[name] = source

    def add(self, name: str, value) -> None:
        """Add a tensor (any device, summed to a scalar) or a number to this rank's share of `name`."""
        i = SUMMED.index(name)
        v = value.detach().sum().to(self._local.device, torch.float64) if torch.is_tensor(value) else value
        self._local[i] += v

    def add_many(self, names: list[str], values: torch.Tensor) -> None:
        """`add` for several names at once: `values` is a 1-d tensor in the order of `names` (one kernel)."""
        idx = torch.tensor([SUMMED.index(n) for n in names], device=self._local.device)
        self._local.index_add_(0, idx, values.detach().to(self._local.device, torch.float64))

    def batch_start(self, state: State, logger: Logger) -> None:
        self._local = state.device.tensor_to_device(torch.zeros(len(SUMMED), dtype=torch.float64))
        self._ids = []

    def after_loss(self, state: State, logger: Logger) -> None:
        self._ids.append(state.batch["sample_id"])

    def after_train_batch(self, state: State, logger: Logger) -> None:
        world, rank = dist.get_world_size(), dist.get_global_rank()
        for name, source in self._flags.items():
            self._local[SUMMED.index(name)] += 1.0 if source() else 0.0
        ids = torch.cat([t.to(self._local.device) for t in self._ids]) if self._ids else self._local.new_zeros(0)
        slots = self._local.new_zeros(world, self.per_rank)  # id + 1; 0 = no sample in that slot
        slots[rank, :len(ids)] = ids.to(torch.float64) + 1
        buf = torch.cat([self._local, slots.flatten()])
        dist.all_reduce(buf, reduce_operation="SUM")
        values = buf.tolist()  # the step's one device-to-host copy
        self.totals = dict(zip(SUMMED, values[:len(SUMMED)]))
        self.sample_ids = [int(v) - 1 for v in values[len(SUMMED):] if v > 0]
