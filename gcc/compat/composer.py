"""Composer 0.32.1: what gcc relies on beyond its documented API (gcc/compat/__init__.py).

- `LeanEngine`: Composer's event engine without visits to callbacks that do not handle an event (reads the
  engine's `_is_closed`, swaps a built Trainer's engine class).
- `meta_init_on`: Composer's meta-device initialisation on CPU (swaps `prepare_distributed.meta_init`).
- `MicroBatch`: a micro-batch Composer does not deep-copy (relies on `_train_microbatch` deep-copying only for
  train metrics).
- `forget_saved_rng`: a loaded checkpoint's RNG state dropped (`Trainer._rng_state`).
- `run_after_checkpoint_saver`: callbacks that must see each save (relies on the CheckpointSaver being appended
  last to `state.callbacks` by `Trainer.__init__`, and on the engine running callbacks in list order).
- `use_checkpoint_saver`: the Trainer's CheckpointSaver (`Trainer._checkpoint_saver`) switched to a subclass whose
  periodic saves write in the background (gcc/training/async_checkpoint.py); relies on `_save_checkpoint(state,
  logger)` being the saver's one save, on what Composer's `checkpoint._save_checkpoint` builds and writes (the
  `state`/`rng` dict, rank 0's RNG under a sharded save, DCP's FileSystemWriter and the deduplicating planner), and
  on the saver's records (`last_checkpoint_batch`, `all_saved_checkpoints_to_timestamp`, `saved_checkpoints`).
- `load_callback_state_it_has`: a sharded checkpoint written before a callback kept state still loads (wraps
  `checkpoint.dist_cp_load`, which `load_sharded_checkpoint` calls with the template `{"state": state.state_dict(),
  "rng": ...}`; DCP's default planner refuses a template key the checkpoint lacks).
- `CHECKPOINT_RE`, `LATEST_LINK`: the names Composer gives checkpoints with its default `save_filename` and
  `save_latest_filename` (rank 0's file; an FSDP sharded checkpoint is a folder of that name without the suffix);
  `COMPOSER_READS_AS_CHECKPOINT`, what its save folder's check reads as one of them.
- `LocalTensorboardLogger`: Composer's TensorboardLogger with one event file per launch (overrides its `_flush`);
  `write_summary` writes one event holding several values, through torch's private file writer (gcc's loggers
  write their scalars and the training samples with it: gcc/training/loggers.py).
- What a run loads of Composer: the parts it never uses are stand-ins while Composer and `composer.algorithms`
  load (below); `cpu_model` names the CPU in Composer's environment record (replaces `collect_env.get_cpu_model`).
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
from collections import OrderedDict
from typing import TYPE_CHECKING

import torch

from gcc.compat import require, stand_ins

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

# checked before the library is imported: a changed library is then named, not met as an ImportError
require("mosaicml", "gcc/compat/composer.py")

# What a run's processes load of Composer (`stand_ins`, gcc/compat/__init__.py; the run's entry loads Composer here
# first: gcc/training/entry.py). Composer's package loads parts that a run never uses: torchmetrics' text and audio
# metrics (the text ones import transformers' AutoModel), torchmetrics' plotting of metrics (it loads matplotlib:
# about 1 s of CPU), PEFT (for its HuggingFace model class) and the MosaicML platform's client, mcli (for its logger,
# which Composer adds only on that platform). And a Trainer loads `composer.algorithms` (to order the algorithms:
# core/passes.py), which loads every algorithm, two of which (gated linear units, ALiBi) load transformers' BERT,
# RoBERTa and GPT-2 models. About 5 s of every rank's start, for nothing gcc uses: stand-ins (PEFT absent: Composer
# then knows it as not installed) while Composer and its algorithms load. On the MosaicML platform mcli is loaded as
# usual.
_UNUSED = [
    f"torchmetrics.{kind}{part}"
    for kind in ("text", "audio", "functional.text", "functional.audio")
    for part in ("", "._deprecated")
] + ["torchmetrics.utilities.plot"]
if os.environ.get("MOSAICML_PLATFORM", "false").lower() != "true":  # Composer's MOSAICML_PLATFORM_ENV_VAR
    _UNUSED.append("mcli")

with stand_ins(_UNUSED + ["composer.algorithms.gated_linear_units", "composer.algorithms.alibi"], absent=["peft"]):
    import composer.algorithms  # noqa: F401  (loaded now: see above)
    from composer.callbacks import CheckpointSaver
    from composer.core import Callback, Engine, Event, State
    from composer.distributed import prepare_distributed
    from composer.loggers import Logger, LoggerDestination, TensorboardLogger
    from composer.utils import checkpoint, collect_env, dist


# Composer names the CPU in its environment record (`get_composer_env_dict`: a Trainer's hyperparameters, every
# checkpoint's metadata) with py-cpuinfo, which probes the CPU in a Python subprocess: ~1.2 s of CPU in every rank.
# The name is the kernel's (/proc/cpuinfo's "model name", the same brand string), read without a process.
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


collect_env.get_cpu_model = cpu_model

from gcc.compat.torch import add_summary


# ---- a sharded checkpoint of an earlier gcc --------------------------------------------------------------
# Composer loads a sharded (DCP) checkpoint into a template of the live state, and DCP's default planner refuses
# every template key the checkpoint lacks: a callback that keeps state since an upgrade of gcc (Preemption's record
# of the work a preempted step skipped) would make every FSDP run checkpointed before the upgrade unresumable. A
# callback the checkpoint holds nothing of is taken out of the template instead, as Composer does for a DDP
# checkpoint (the callback starts afresh; Composer warns that it "is not in the state_dict"). Anything else missing
# (the model's, the optimizer's) is still refused by DCP.
def load_callback_state_it_has(load):
    def dist_cp_load(state_dict, storage_reader, load_planner=None):
        saved = set(storage_reader.read_metadata().state_dict_metadata)  # flattened: state.callbacks.Name.field
        callbacks = state_dict.get("state", {}).get("callbacks", {})
        for name in list(callbacks):
            key = f"state.callbacks.{name}"
            if not any(k == key or k.startswith(key + ".") for k in saved):
                del callbacks[name]
        return load(state_dict, storage_reader, load_planner)

    return dist_cp_load


checkpoint.dist_cp_load = load_callback_state_it_has(checkpoint.dist_cp_load)

# a DDP checkpoint file or an FSDP (DCP) folder: ASCII digits, at most 18 (a step never has more), and nothing after
# (\Z: `$` would also match before a final newline)
CHECKPOINT_RE = re.compile(r"^ep([0-9]{1,18})-ba([0-9]{1,18})(-rank0\.pt)?\Z")
# what Composer's check of its save folder takes for one of its checkpoints (`ensure_folder_has_no_conflicting_files`:
# `\d` of any script, `$` before a final newline) and refuses with a FileExistsError when it seems newer than the
# step resumed: a name it reads so and CHECKPOINT_RE does not (ep٣-ba٣-rank0.pt) is refused before the Trainer starts
COMPOSER_READS_AS_CHECKPOINT = re.compile(r"^ep\d+-ba\d+(-rank0\.pt)?$")
LATEST_LINK = "latest-rank0.pt"


# ---- the event engine --------------------------------------------------------------------------------------
# Composer's event engine without the per-callback cost of events a callback does not handle.
#
# Composer 0.32.1 runs ~32 events a step at accumulation 4 (six per micro-batch). For each event its Engine checks
# the event's kind against lists of events, filters the algorithms and the callbacks twice (loggers last), and for
# every callback (about 17 here) enters a context, formats a debug line with the step's timestamp (built even when
# `ENGINE_DEBUG` is unset, the only case it is printed) and calls the callback's method, a no-op for most. That is
# ~550 callback visits a step for ~40 that do something: several milliseconds a step, over 5 % of a small step
# (`bench/trainer_overhead.py`, docs/performance.md).
#
# LeanEngine calls, for each event, only the callbacks whose class or instance overrides that event's method or
# `run_event` (Callback's own methods are all no-ops), in Composer's order: the other callbacks, then the loggers.
# The list is built once per event and rebuilt when the trainer's callback list changes. Composer's assertions that
# the trainer set a dataloader and a duration are left out (gcc's builder sets both). INIT, algorithms, the profiler
# and `ENGINE_DEBUG` take Composer's own path, unchanged.
def handles(cb: Callback, event: Event) -> bool:
    """Whether running `event` on `cb` can do anything."""
    if getattr(cb.run_event, "__func__", None) is not Callback.run_event:
        return True
    return getattr(getattr(cb, event.value), "__func__", None) is not getattr(Callback, event.value)


class LeanEngine(Engine):
    """Composer's Engine; `use_lean_engine` switches a built Trainer's engine to it."""

    def run_event(self, event: Event | str):
        event = Event(event)
        state = self.state
        if (
            event == Event.INIT
            or self._is_closed
            or state.profiler is not None
            or state.algorithms
            or os.environ.get("ENGINE_DEBUG")
        ):
            return super().run_event(event)
        for cb in self._handlers(event):
            cb.run_event(event, state, self.logger)
        return OrderedDict()  # Composer's traces: one per algorithm run, and there are none

    def _handlers(self, event: Event) -> tuple:
        callbacks = self.state.callbacks
        cache: tuple[list[Callback], dict[Event, tuple]] | None = self.__dict__.get("_lean_handlers")
        if cache is None or cache[0] != callbacks:  # list equality: same callbacks, same order
            cache = self.__dict__["_lean_handlers"] = (list(callbacks), {})
        if event not in cache[1]:
            ordered = [cb for cb in callbacks if not isinstance(cb, LoggerDestination)] + [
                cb for cb in callbacks if isinstance(cb, LoggerDestination)
            ]
            cache[1][event] = tuple(cb for cb in ordered if handles(cb, event))
        return cache[1][event]


def use_lean_engine(trainer) -> None:
    """Composer builds its Engine inside Trainer.__init__ (and runs INIT there), so the built engine's class is
    switched: LeanEngine adds no state of its own beyond a cache, and overrides only `run_event`."""
    trainer.engine.__class__ = LeanEngine


# ---- Composer's meta-device initialisation ---------------------------------------------------------------
def _meta_init(device: torch.device, module: torch.nn.Module, param_init_fn=None) -> None:
    """Composer 0.32.1's `composer.distributed.param_init.meta_init`, with the device as a parameter: after
    sharding a meta-device model, each module that still holds meta tensors is materialised (its own shard
    only) and handed to the nearest `param_init_fn`."""
    init_fn = getattr(module, "param_init_fn", param_init_fn)
    for child in module.children():
        _meta_init(device, child, init_fn)
    own = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    if not any(t.is_meta for t in own):
        return
    module.to_empty(device=device, recurse=False)
    reset = getattr(module, "reset_parameters", None)
    if callable(init_fn):
        init_fn(module)
    elif callable(reset):
        reset()
    else:
        raise ValueError(f"{type(module).__name__}: meta parameters but no param_init_fn or reset_parameters")


@contextlib.contextmanager
def meta_init_on(device: torch.device | str):
    """While Composer builds its Trainer, materialise the sharded meta-device model on `device`.

    Composer 0.32.1's `meta_init` calls `module.to_empty(device='cuda')` whatever the device, so a meta-device
    model cannot be sharded on CPU (gloo) through it; this swaps in the same procedure with the right device
    (on GPU it is the same as Composer's)."""
    device = torch.device(device)
    original = prepare_distributed.meta_init
    prepare_distributed.meta_init = lambda module, param_init_fn=None: _meta_init(device, module, param_init_fn)
    try:
        yield
    finally:
        prepare_distributed.meta_init = original


# ---- the micro-batch ---------------------------------------------------------------------------------------
class MicroBatch(dict):
    """A micro-batch that Composer's trainer does not deep-copy.

    Composer 0.32.1 `_train_microbatch` deep-copies every micro-batch only to feed train metrics, which this model
    has none of; at full geometry that is a copy of ~35 MB of latents and sem ids per sample per micro-batch.
    """

    def __deepcopy__(self, memo) -> MicroBatch:
        return self


def forget_saved_rng(trainer) -> None:
    """Drop the RNG state a checkpoint brought (`Trainer._rng_state`): Composer restores it at fit start whenever
    `batch_in_epoch` is 0, and a resume moved to the next epoch's start must not get the old epoch's middle."""
    trainer._rng_state = None


# ---- callbacks after the checkpoint saver --------------------------------------------------------------
def run_after_checkpoint_saver(trainer, callbacks: list) -> None:
    """Run `callbacks` after Composer's CheckpointSaver on every event (the rotation times each save and deletes
    what it made old; the upload commits it). Trainer.__init__ appends the saver last to `state.callbacks`, and the
    engine runs callbacks in list order (loggers after the others): appending after it suffices."""
    cbs = trainer.state.callbacks
    if not any(isinstance(cb, CheckpointSaver) for cb in cbs):
        raise RuntimeError("Composer's Trainer built no CheckpointSaver: the callbacks that follow it have none")
    cbs.extend(callbacks)


def use_checkpoint_saver(trainer, cls: type, **attrs) -> None:
    """Switch the saver Trainer.__init__ built from its `save_*` arguments (the one autoresume reads, last in
    `state.callbacks`) to its subclass `cls`, which adds no state beyond `attrs`."""
    saver = trainer._checkpoint_saver
    if not isinstance(saver, CheckpointSaver) or not issubclass(cls, type(saver)):
        raise RuntimeError(f"Composer's Trainer built no CheckpointSaver that {cls.__name__} extends")
    saver.__class__ = cls
    vars(saver).update(attrs)


# ---- TensorBoard -------------------------------------------------------------------------------------------
# Composer's TensorboardLogger, one event file per launch instead of one per flush.
#
# Composer 0.32.1 closes its SummaryWriter at every flush (every `flush_interval` steps, every epoch end and
# every validation) so that a finished file can be uploaded to object storage; locally that leaves a new event
# file each time (hundreds per run, which TensorBoard then loads one by one). It also opens an (empty) event
# file on every rank, and writes one more hparams file per validation. The run folder is local: here only
# rank 0 writes, a flush only flushes, and there are no hparams files (`config.json` holds the config).
#
# Composer writes each scalar as its own event (a protobuf, a queue put and a lock each: ~60 us, 22 scalars a
# step, over 1 ms); here one `log_metrics` call is one event holding all its scalars, which TensorBoard reads the
# same way.
class LocalTensorboardLogger(TensorboardLogger):
    writer: SummaryWriter | None  # Composer's: set by `init`, None after `close`

    def _silent(self) -> bool:
        return self.rank_zero_only and dist.get_global_rank() != 0

    def init(self, state: State, logger: Logger) -> None:
        if self._silent():
            self.run_name = state.run_name
        else:
            super().init(state, logger)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self._silent():
            return
        from tensorboard.compat.proto.summary_pb2 import Summary  # optional: only with a tensorboard logger

        self.current_metrics.update(metrics)
        values = []
        for tag, metric in metrics.items():
            if isinstance(metric, str):
                continue
            try:  # a number or a one-element tensor/array; anything else is skipped, as Composer does
                values.append(Summary.Value(tag=tag, simple_value=float(metric)))
            except (TypeError, ValueError, RuntimeError):
                continue
        if values:
            self.write_summary(Summary(value=values), step)

    def write_summary(self, summary, step: int | None, flush: bool = False) -> None:
        """Write one event holding `summary` (a tensorboard Summary) at `step`, then flush the writer if `flush`;
        nothing off rank 0 or once closed."""
        if self._silent() or self.writer is None:
            return
        add_summary(self.writer, summary, step)
        if flush:
            self.writer.flush()

    def eval_end(self, state: State, logger: Logger) -> None:
        self._flush(logger)

    def _flush(self, logger: Logger) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self, state: State, logger: Logger) -> None:
        if self.writer is not None:
            self.writer.close()
        self.writer = None
