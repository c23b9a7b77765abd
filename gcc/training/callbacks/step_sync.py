"""The one collective of each optimizer step: what every rank must agree on, in a single all-reduce.

At AFTER_TRAIN_BATCH (after every micro-batch's backward, inside Composer's optimizer closure, before the
update) one SUM all-reduce (none in a one-process run) of a small float64 tensor carries
* the step's summed statistics (`TrainStats`: loss parts, drop counts, clip count),
* the gradient norm before clipping (`GradClip`, which clips first: a `prepare` step of the reduce; rank 0's),
* the number of non-finite micro-batch losses (`NonFiniteGuard` raises on it before the update),
* whether any rank received a preemption signal (`Preemption` stops after this step),
* how many ranks finished their part of the checkpoint write in flight (`CheckpointWrites` commits it when all did),
* every rank's sample ids, each rank writing its own slots (an all-gather by sum): rank 0 names the clips
  from them with the manifest (sample id i of a split is its clip_ids[i]).

Each contributor registers a source that StepSync reads at the reduce; the values stay on the device, so a GPU
step synchronises with the host once, here, and not once per logged number (docs/performance.md, "Host reads"):
the host's numbers (flags, sample ids) go to the device in one asynchronous copy from pinned memory, the device's
are copied into place there, and the one read is the reduced buffer's. Contributors keep per micro-batch
work to appending references and compute their share once per step (a few kernels instead of a few per
micro-batch). Each of these was its own collective before (plus an all_gather_object of the clip ids); on a
small step that fixed cost showed (docs/performance.md, trainer overhead).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from gcc.training.columns import STEP_STATS

# the step's own counts: its clips (TrainStats), non-finite losses (NonFiniteGuard), ranks preempted (Preemption),
# ranks whose checkpoint write in flight is done (CheckpointWrites), the gradient norm (GradClip, rank 0's)
RUN_TOTALS = ["n", "nonfinite", "preempt", "written", "grad_norm"]
SUMMED = [s.name for s in STEP_STATS] + RUN_TOTALS


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`: on a GPU from pinned memory, asynchronously (a copy from pageable memory waits
    for everything queued on the device)."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class StepSync(Callback):
    def __init__(self, per_rank_batch: int):
        self.per_rank = per_rank_batch
        self._sources: list[tuple[list[int], Callable[[], torch.Tensor | Sequence[float]]]] = []
        self._prepare: list[Callable[[State], None]] = []
        self._where: dict[tuple[torch.device, tuple[int, ...]], torch.Tensor] = {}  # a source's slots, on a device
        self.totals: dict[str, float] = {}  # after the step's reduce: SUMMED over all ranks
        self.sample_ids: list[int] = []  # after the step's reduce: every rank's sample ids, in rank order
        self._ids: list[int] = []

    def source(self, names: list[str], read: Callable[[], torch.Tensor | Sequence[float]]) -> None:
        """At each reduce, `read()` gives this rank's share of `names`, in that order: a 1-d tensor (any device) or
        a sequence of numbers (host values). A name has one source."""
        taken = {SUMMED[i] for where, _ in self._sources for i in where}
        if taken & set(names):
            raise ValueError(f"StepSync: {sorted(taken & set(names))} already have a source")
        self._sources.append(([SUMMED.index(n) for n in names], read))

    def flag(self, name: str, source: Callable[[], bool]) -> None:
        """Read `source()` on each rank at the reduce; `totals[name]` is then the number of ranks where it held."""
        self.source([name], lambda: [1.0 if source() else 0.0])

    def prepare(self, work: Callable[[State], None]) -> None:
        """Run `work(state)` at each reduce, before the sources are read: what a source reports is made there
        (GradClip clips and keeps the norm)."""
        self._prepare.append(work)

    def batch_start(self, state: State, logger: Logger) -> None:
        self._ids = []

    def after_loss(self, state: State, logger: Logger) -> None:
        self._ids += state.batch["sample_id"]  # a host list (gcc.data.dataset.gc_collate)

    def after_train_batch(self, state: State, logger: Logger) -> None:
        for work in self._prepare:
            work(state)
        world, rank = dist.get_world_size(), dist.get_global_rank()
        dev = state.device.tensor_to_device(torch.zeros(0)).device
        host = torch.zeros(len(SUMMED) + world * self.per_rank, dtype=torch.float64)
        on_device = []
        for where, read in self._sources:
            value = read()
            if isinstance(value, torch.Tensor):
                on_device.append((where, value))
            else:
                host[where] = torch.tensor([float(v) for v in value], dtype=torch.float64)
        # every rank's sample ids, each in its own slots (id + 1; 0 = no sample in that slot): an all-gather by sum
        first = len(SUMMED) + rank * self.per_rank
        host[first : first + len(self._ids)] = torch.tensor(self._ids, dtype=torch.float64) + 1
        buf = to_device(host, dev)
        for where, value in on_device:
            buf.index_copy_(0, self._slots(where, dev), value.to(dev, torch.float64).reshape(-1))
        if world > 1:
            dist.all_reduce(buf, reduce_operation="SUM")
        values = buf.tolist()  # the step's one device-to-host copy
        self.totals = dict(zip(SUMMED, values[: len(SUMMED)]))
        self.sample_ids = [int(v) - 1 for v in values[len(SUMMED) :] if v > 0]

    def _slots(self, where: list[int], device: torch.device) -> torch.Tensor:
        """A source's positions in the buffer as an index on `device`, made once (not a copy per step)."""
        key = (device, tuple(where))
        if key not in self._where:
            self._where[key] = torch.tensor(where, device=device)
        return self._where[key]
