"""The one collective of each optimizer step: what every rank must agree on, in a single all-reduce.

At AFTER_TRAIN_BATCH (after every micro-batch's backward, inside Composer's optimizer closure, before the
update) one SUM all-reduce (none in a one-process run) of a small float64 tensor carries
* the step's summed statistics (`TrainStats`: loss parts, drop counts, clip count),
* the number of non-finite micro-batch losses (`NonFiniteGuard` raises on it before the update),
* whether any rank received a preemption signal (`Preemption` stops after this step),
* how many ranks finished their part of the checkpoint write in flight (`CheckpointWrites` commits it when all did),
* every rank's sample ids, each rank writing its own slots (an all-gather by sum): rank 0 names the clips
  from them with the manifest (sample id i of a split is its clip_ids[i]).

Each contributor registers a source that StepSync reads at the reduce; the values stay on the device, so a GPU
step synchronises with the host once, here, and not once per logged number. Contributors keep per micro-batch
work to appending references and compute their share once per step (a few kernels instead of a few per
micro-batch). Each of these was its own collective before (plus an all_gather_object of the clip ids); on a
small step that fixed cost showed (docs/performance.md, trainer overhead).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc.training.columns import STEP_STATS

# the step's own counts: its clips (TrainStats), non-finite losses (NonFiniteGuard), ranks preempted (Preemption),
# ranks whose checkpoint write in flight is done (CheckpointWrites)
RUN_TOTALS = ["n", "nonfinite", "preempt", "written"]
SUMMED = [s.name for s in STEP_STATS] + RUN_TOTALS


class StepSync(Callback):
    def __init__(self, per_rank_batch: int):
        self.per_rank = per_rank_batch
        self._sources: list[tuple[list[int], Callable[[], object]]] = []
        self.totals: dict[str, float] = {}  # after the step's reduce: SUMMED over all ranks
        self.sample_ids: list[int] = []  # after the step's reduce: every rank's sample ids, in rank order
        self._ids: list[torch.Tensor] = []

    def source(self, names: list[str], read: Callable[[], object]) -> None:
        """At each reduce, `read()` gives this rank's share of `names`, in that order: a 1-d tensor (any device) or
        a sequence of numbers. A name has one source."""
        taken = {SUMMED[i] for where, _ in self._sources for i in where}
        if taken & set(names):
            raise ValueError(f"StepSync: {sorted(taken & set(names))} already have a source")
        self._sources.append(([SUMMED.index(n) for n in names], read))

    def flag(self, name: str, source: Callable[[], bool]) -> None:
        """Read `source()` on each rank at the reduce; `totals[name]` is then the number of ranks where it held."""
        self.source([name], lambda: [1.0 if source() else 0.0])

    def batch_start(self, state: State, logger: Logger) -> None:
        self._ids = []

    def after_loss(self, state: State, logger: Logger) -> None:
        self._ids.append(state.batch["sample_id"])

    def after_train_batch(self, state: State, logger: Logger) -> None:
        world, rank = dist.get_world_size(), dist.get_global_rank()
        local = state.device.tensor_to_device(torch.zeros(len(SUMMED), dtype=torch.float64))
        dev = local.device
        idx = [i for where, _ in self._sources for i in where]
        if idx:  # each name has one source: one copy into place
            read_values = torch.cat(
                [torch.as_tensor(read(), dtype=torch.float64).to(dev).reshape(-1) for _, read in self._sources]
            )
            local.index_copy_(0, torch.tensor(idx, device=dev), read_values)
        ids = torch.cat([t.to(dev) for t in self._ids]) if self._ids else local.new_zeros(0)
        slots = local.new_zeros(world, self.per_rank)  # id + 1; 0 = no sample in that slot
        slots[rank, : len(ids)] = ids.to(torch.float64) + 1
        buf = torch.cat([local, slots.flatten()])
        if world > 1:
            dist.all_reduce(buf, reduce_operation="SUM")
        values = buf.tolist()  # the step's one device-to-host copy
        self.totals = dict(zip(SUMMED, values[: len(SUMMED)]))
        self.sample_ids = [int(v) - 1 for v in values[len(SUMMED) :] if v > 0]
