"""A small real Composer fit, driven event by event, for the unit tests of gcc's callbacks (gcc/training/callbacks).

`Fit` holds a real `composer.core.State` (a tiny torch model, an AdamW with two parameter groups as gcc's optimizer
has: the DiT's and the condition path's, a DataLoader) and a real `composer.loggers.Logger` whose destination is an
`InMemoryLogger`, and runs the callbacks in `state.callbacks` in their order, as Composer's Engine does. `step()`
runs one optimizer step in the order of Composer 0.32.1's train loop (trainer.py `_train_loop` / `_train_batch`):
BEFORE_DATALOADER, AFTER_DATALOADER, BATCH_START, per micro-batch (state.batch, state.outputs, state.loss set)
BEFORE_FORWARD .. AFTER_BACKWARD, AFTER_TRAIN_BATCH (gradients in place), the optimizer's update, the step's total
loss, the schedulers' step, the timestamp moved to the next batch, BATCH_END, BATCH_CHECKPOINT.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from contextlib import contextmanager

import torch
from composer.core import Event, State
from composer.devices import DeviceCPU
from composer.loggers import InMemoryLogger, Logger
from torch.utils.data import DataLoader, Dataset, TensorDataset

from gcc.model.config import TRAIN_STATS

MICRO_EVENTS = (
    Event.BEFORE_FORWARD,
    Event.AFTER_FORWARD,
    Event.BEFORE_LOSS,
    Event.AFTER_LOSS,
    Event.BEFORE_BACKWARD,
    Event.AFTER_BACKWARD,
)
LR, COND_LR = 1e-3, 1e-2


def micro(
    clips: Sequence[str],
    ids: Sequence[int],
    *,
    loss: float = 0.5,
    mse: float = 0.5,
    timestep: float = 500.0,
    sem_rms: float = 0.2,
    x_rms: float = 0.8,
    drop_text: Sequence[float] | None = None,
    drop_cond: Sequence[float] | None = None,
    mask_frac: Sequence[float] | None = None,
    epoch: int | Sequence[int] = 0,
) -> tuple[dict, dict, torch.Tensor]:
    """One micro-batch as gc's collate and GcTrainModel give it: (state.batch, state.outputs, state.loss); a
    statistic the objective declares (gcc/model/config.py TRAIN_STATS) beyond those named here is 0."""
    n = len(clips)
    assert len(ids) == n

    def per_clip(v, default):
        return torch.tensor([default] * n if v is None else list(v), dtype=torch.float32)

    batch = {
        "clip_id": list(clips),
        "sample_id": [int(i) for i in ids],
        "drop_text": per_clip(drop_text, 0.0),
        "drop_cond": per_clip(drop_cond, 0.0),
        "mask_frac": per_clip(mask_frac, 0.0),
        "epoch": [epoch] * n if isinstance(epoch, int) else [int(e) for e in epoch],
    }
    named = {"mse": mse, "timestep": timestep, "sem_rms": sem_rms, "x_rms": x_rms}
    outputs = {"stats": {s.name: torch.tensor(named.get(s.name, 0.0)) for s in TRAIN_STATS}}
    return batch, outputs, torch.tensor(loss)


class Fit:
    def __init__(self, callbacks: Sequence = (), max_steps: int = 10, dataset: Dataset | None = None):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(3, 2)
        self.optimizer = torch.optim.AdamW(
            [{"params": [self.model.weight], "lr": LR}, {"params": [self.model.bias], "lr": COND_LR}]
        )
        self.loader = DataLoader(dataset if dataset is not None else TensorDataset(torch.zeros(8, 3)), batch_size=2)
        self.state = State(
            model=self.model,
            rank_zero_seed=0,
            run_name="t",
            device=DeviceCPU(),
            max_duration=f"{max_steps}ba",
            optimizers=self.optimizer,
            train_dataloader=self.loader,
            dataloader=self.loader,
            dataloader_label="train",
            callbacks=list(callbacks),
        )
        self.memory = InMemoryLogger()
        self.logger = Logger(self.state, destinations=[self.memory])
        self.memory.init(self.state, self.logger)

    @property
    def step_count(self) -> int:
        return int(self.state.timestamp.batch)

    def event(self, event: Event) -> None:
        for cb in self.state.callbacks:
            cb.run_event(event, self.state, self.logger)

    def fit_start(self) -> None:
        self.event(Event.INIT)
        self.event(Event.FIT_START)

    def step(
        self,
        micros: Sequence[tuple[dict, dict, torch.Tensor]] | None = None,
        grads: Sequence[torch.Tensor] | None = None,
        total_loss: float | None = None,
        data_wait: float = 0.0,
    ) -> None:
        """One optimizer step. `micros`: micro() results (default: one micro-batch of two clips); `grads`: the
        gradients backward left (default: zeros); `total_loss`: Composer's loss/train/total (default: the mean of
        the micro-batch losses); `data_wait`: the seconds the loader takes to deliver the batch."""
        if micros is None:
            b = self.step_count
            micros = [micro([f"c{2 * b}", f"c{2 * b + 1}"], [2 * b, 2 * b + 1])]
        self.event(Event.BEFORE_DATALOADER)
        time.sleep(data_wait)
        self.state.batch = {k: v for k, v in micros[0][0].items()}
        self.event(Event.AFTER_DATALOADER)
        self.event(Event.BATCH_START)
        for batch, outputs, loss in micros:
            self.state.batch, self.state.outputs, self.state.loss = batch, outputs, loss
            for e in MICRO_EVENTS:
                self.event(e)
        for p, g in zip(self.model.parameters(), grads or [torch.zeros_like(p) for p in self.model.parameters()]):
            p.grad = g.clone()
        self.event(Event.AFTER_TRAIN_BATCH)  # inside the optimizer's closure: a raise here skips the update
        self.optimizer.step()
        if total_loss is None:
            losses = [loss["total"] if isinstance(loss, dict) else loss for _, _, loss in micros]
            total_loss = float(torch.stack([loss.float().mean() for loss in losses]).mean())
        self.state.total_loss_dict = {"loss/train/total": total_loss}
        for scheduler in self.state.schedulers:  # Composer steps them before BATCH_END
            scheduler.step()
        self.state.previous_timestamp = self.state.timestamp
        self.state.timestamp = self.state.timestamp.to_next_batch(samples=sum(len(b["clip_id"]) for b, _, _ in micros))
        self.event(Event.BATCH_END)
        self.event(Event.BATCH_CHECKPOINT)

    def fit_end(self) -> None:
        self.event(Event.FIT_END)

    def table(self, name: str) -> list[dict]:
        """The rows of the last table `name` logged, as dicts."""
        t = json.loads(self.memory.tables[name])
        return [dict(zip(t["columns"], row)) for row in t["data"]]


@contextmanager
def records(name: str, level: int = logging.DEBUG):
    """The log records of logger `name` while the block runs, whatever the process's logging set-up (gcc's
    `configure_logging` stops propagation at `gcc`, so pytest's caplog may not see them)."""
    got: list[logging.LogRecord] = []

    class _Keep(logging.Handler):
        def emit(self, record):
            got.append(record)

    log = logging.getLogger(name)
    handler, old = _Keep(level), log.level
    log.addHandler(handler)
    log.setLevel(level)
    try:
        yield got
    finally:
        log.removeHandler(handler)
        log.setLevel(old)
