"""Every callback of the run's table (gcc/training/callbacks/__init__.py `CALLBACKS`), built by its own factory from
the trainer's own pieces (a tiny config on the loader tests' shards, the tiny model, the val loader, the text table,
a checkpoint prefix on the loopback S3 server), runs through every Composer event without raising, as Composer's
own callback tests run theirs; and every callback module under gcc/training/callbacks/ is in the table."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _cbfit import Fit, micro
from composer.callbacks import CheckpointSaver
from composer.core import Callback, Event

import gcc.training.callbacks as callbacks_package
from gcc.data.batch import gc_collate
from gcc.training import builders as B
from gcc.training.callbacks import CALLBACKS, CallbackContext, Entry, build_all
from gcc.training.checkpoint.files import ckpt_dir
from gcc.training.checkpoint.store import CheckpointStore
from gcc.training.config import load_config
from gcc.training.run_start import RunStart

ROOT = Path(__file__).resolve().parents[3]


def context(tmp_path, shards, s3_bucket, watchdog) -> CallbackContext:
    """The trainer's context for the table with every entry on: a start from step 0 that validates, samples, logs
    to the console and commits its checkpoints to a claimed prefix; one step, which is also the last."""
    cfg = load_config(
        ROOT / "yamls" / "tiny_cpu.yaml",
        [
            f"run_dir={tmp_path / 'run'}",
            f"data.path={shards}",
            f"save_folder={s3_bucket}/run",
            "global_train_batch_size=2",
            "max_duration=1",
            "val_n=2",
            "val_batch=1",
            "sample_n=1",
            "sample_steps=1",
            "sample_every=1",
            "console_log_interval=1",
            "callbacks={speed_monitor: {window_size: 1}, memory_monitor: {}, lr_monitor: {}}",
            "algorithms.ema.half_life=4ba",
        ],
    )
    text = B.node_cache(cfg)
    val_loader = B.build_val_loader(cfg)
    store = CheckpointStore(cfg.save_folder)
    start = RunStart(val_loader.dataset.ds.manifest, {"init_ckpt": ""}, store.claim(), None, "", None, store)
    model = B.build_model(cfg, text, fsdp=False)
    return B.callback_context(cfg, start, model, cfg.per_rank_batch(1), val_loader, text, watchdog)


def run_every_event(named: dict[str, Callback], fit: Fit) -> None:
    """Each event of Composer's `Event`, in its order, to each callback in turn, as Composer's Engine runs them (the
    step moves on before BATCH_END, as in Composer's train loop); then close and post_close. A callback that raises
    fails the test, named with the event."""
    for event in Event:
        if event == Event.BATCH_END:
            fit.state.timestamp = fit.state.timestamp.to_next_batch(samples=len(fit.state.batch["clip_id"]))
        for name, callback in named.items():
            try:
                callback.run_event(event, fit.state, fit.logger)
            except Exception as e:
                pytest.fail(f"{name} raised at {event.value}: {e!r}")
    for name, callback in named.items():
        try:
            callback.close(fit.state, fit.logger)
            callback.post_close()
        except Exception as e:
            pytest.fail(f"{name} raised at close: {e!r}")


def fit_for(ctx: CallbackContext, ordered: list, after_saver: list) -> Fit:
    """A real State holding the run's callbacks as the Trainer does (Composer's CheckpointSaver between the two
    groups), in the middle of a step: a micro-batch of the manifest's first two train clips, its loss and stats,
    with two clips' model inputs, and the run's model (SpeedMonitor counts the batch's FLOPs with it)."""
    saver = CheckpointSaver(folder=str(ckpt_dir(Path(ctx.cfg.run_dir))), save_interval="1000ba")
    fit = Fit([*ordered, saver, *after_saver], max_steps=ctx.cfg.max_steps)
    clips = ctx.start.manifest["splits"]["train"]["clip_ids"][:2]
    batch, fit.state.outputs, fit.state.loss = micro(clips, [0, 1])
    fit.state.batch = {**gc_collate([ctx.val_loader.dataset[i] for i in range(2)]), **batch}
    fit.state.model = ctx.model
    return fit


def test_every_callback_of_the_table_runs_through_every_event_and_every_module_is_in_it(
    tmp_path, shards, s3_bucket, watchdog
):
    ctx = context(tmp_path, shards, s3_bucket, watchdog)
    ordered, after_saver = build_all(ctx)
    # every entry is on: each one is run (Composer's MemoryMonitor only with a GPU: it reads CUDA's statistics)
    assert [e.name for e in CALLBACKS if ctx[e.name] is None] == (
        [] if torch.cuda.is_available() else ["memory_monitor"]
    )
    ctx["validate_at_start"].evaluate = lambda: None  # the Trainer's eval(), which trainer.py sets

    fit = fit_for(ctx, ordered, after_saver)
    run_every_event({name: cb for name, cb in ctx.built.items() if cb is not None}, fit)

    run = Path(ctx.cfg.run_dir)  # the callbacks did their work at the step (1, the last)
    assert (run / "step-1.safetensors").is_file() and (run / "done.json").is_file()
    assert (run / "step-1.ema.safetensors").is_file()
    assert (run / "samples" / "step-1").is_dir()
    # Composer's callbacks logged through the run's logger: SpeedMonitor the batch's FLOPs and times, LRMonitor the
    # two parameter groups' rates
    assert list(ctx["speed_monitor"].history_flops) == [ctx.model.flops_per_batch(fit.state.batch)]
    logged = {key for key, _ in fit.memory.data.items()}
    assert {"time/train", "lr-AdamW/group0", "lr-AdamW/group1"} <= logged
    # every module of the callbacks' package holds a callback of the table
    modules = {p.stem for p in Path(callbacks_package.__file__).parent.glob("*.py")} - {"__init__"}
    in_table = {type(cb).__module__.rsplit(".", 1)[-1] for cb in ctx.built.values()}
    assert modules - in_table == set(), "a callback module under gcc/training/callbacks/ is not in CALLBACKS"


class _RaisesAtEvalEnd(Callback):
    def eval_end(self, state, logger) -> None:
        raise RuntimeError("boom")


def test_a_callback_that_raises_at_an_event_fails_the_walk(watchdog):
    """The walk above can fail: an entry whose callback raises at one event is named with that event."""
    ctx = CallbackContext(None, None, None, 1, None, None, watchdog, lambda step: {}, {}, lambda: None)
    ordered, _ = build_all(ctx, (Entry("raises", lambda c: _RaisesAtEvalEnd()),))
    fit = Fit(ordered)
    fit.state.batch, fit.state.outputs, fit.state.loss = micro(["a"], [0])
    with pytest.raises(pytest.fail.Exception, match="raises raised at eval_end: RuntimeError"):
        run_every_event({name: cb for name, cb in ctx.built.items() if cb is not None}, fit)
