"""The step reads nothing back from the device but once (docs/performance.md, "Host reads"): no read of a tensor's
values by the host inside the model's forward or backward (each would make a GPU wait, ≈ 43 a forward before), and
over a whole optimizer step through the trainer the only read in gcc's code is StepSync's one, beside Composer's
own. Reads are counted by `gcc.compat.torch.HostReads` (a dispatch mode and patched `tolist`/`numpy`), which the
first test shows catches each kind."""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest
import torch
from _gc_helpers import make_batch, null_embedding, randomize_cond, tiny_dit

import gcc
from gcc.compat.torch import HostReads
from gcc.model.objective import GcTrainModel

ROOT = Path(__file__).resolve().parents[2]
GCC_DIR = os.path.dirname(gcc.__file__)


@pytest.mark.parametrize(
    "read",
    [
        lambda t: t.sum().item(),
        lambda t: bool(t.any()),
        lambda t: float(t[0]),
        lambda t: t.tolist(),
        lambda t: t.numpy(),
        lambda t: torch.nonzero(t),
        lambda t: torch.unique(t),
        lambda t: torch.bincount(t.long().clamp(min=0)),
        lambda t: t[t > 0],
        lambda t: t.repeat_interleave(t.long().clamp(min=0)),
    ],
    ids=["item", "bool", "float", "tolist", "numpy", "nonzero", "unique", "bincount", "mask", "repeat_interleave"],
)
def test_the_counter_catches_each_kind_of_read(read):
    t = torch.tensor([1.0, -2.0, 3.0])
    with HostReads() as counter:
        read(t)
        t * 2 + 1  # arithmetic reads nothing
    assert len(counter.reads) >= 1 and __file__ in counter.reads[0][1], counter.reads


@pytest.mark.parametrize("checkpointing", ["none", "selective", "block"])
def test_no_host_read_in_the_training_forward_or_backward(checkpointing):
    dit = tiny_dit(seed=2)
    randomize_cond(dit)
    dit.wrap_blocks(checkpointing)
    model = GcTrainModel(dit, seed=1, null_context=null_embedding()).train()
    batch = make_batch(B=3, T=4, seed=6, sample_ids=[5, 9, 2], epochs=[0, 1, 1])
    assert len(set(batch["prompts"])) > 1  # clips with different prompt counts: a padded context
    with HostReads() as counter:
        out = model(batch)
        loss = model.loss(out, batch)
        loss.backward()
    assert counter.reads == []
    assert torch.isfinite(loss) and all(p.grad is not None for p in dit.parameters())


class _Window:
    """Counts host reads from the step's BATCH_START to the end of its BATCH_END (the loader's fetch before, and
    validation and checkpoints after, are not the step); `per_step` holds each step's reads."""

    def __init__(self):
        self.per_step: list[list[tuple[str, str]]] = []
        self.counter: HostReads | None = None

    def start(self, state, logger):
        self.counter = HostReads().__enter__()

    def end(self, state, logger):
        assert self.counter is not None
        self.counter.__exit__(None, None, None)
        self.per_step.append(self.counter.reads)


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_a_training_step_through_the_trainer_reads_the_device_once_in_gcc(
    parallelism, e2e_shards, tmp_path, monkeypatch, in_process
):
    """One process, the trainer's own path (`gcc.training.trainer.run`: the run's callbacks, loggers and Composer's
    Trainer), three steps of two micro-batches with selective checkpointing: each step's reads in gcc's code are
    StepSync's one; the others are Composer's (its batch size and loss, read once a step each)."""
    from composer import Trainer
    from composer.core import Callback

    from gcc.training import trainer
    from gcc.training.entry import prepare

    window = _Window()
    first, last = Callback(), Callback()
    first.batch_start, last.batch_end = window.start, window.end
    real_fit = Trainer.fit

    def fit(self, *args, **kwargs):
        self.state.callbacks.insert(0, first)
        self.state.callbacks.append(last)
        return real_fit(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "fit", fit)
    monkeypatch.chdir(tmp_path)
    cfg = prepare(
        [
            str(ROOT / "yamls" / "tiny_cpu.yaml"),
            f"run_dir={tmp_path / 'run'}",
            f"data.path={e2e_shards}",
            f"parallelism={parallelism}",
            "model.activation_checkpointing=selective",
            "max_duration=3",
            "global_train_batch_size=4",
            "device_train_microbatch_size=2",
            "eval_first=false",
            "eval_interval=100",
            "save_interval=100",
            "export_every=100",
            "data.num_workers=0",
            "console_log_interval=1",
            "sample_every=0",
            "progress_bar=false",
            "callbacks={speed_monitor: {window_size: 1}, lr_monitor: {}}",
        ]
    )
    assert trainer.run(cfg) == 0
    assert len(window.per_step) == 3
    for reads in window.per_step:
        ours = collections.Counter(where.split(":")[0] for _, where in reads if where.startswith(GCC_DIR))
        assert ours == {os.path.join(GCC_DIR, "training", "callbacks", "step_sync.py"): 1}, reads
        others = {where.split(":")[0] for _, where in reads if not where.startswith(GCC_DIR)}
        assert all("/composer/" in f for f in others), others
