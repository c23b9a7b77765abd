"""`algorithms: {ema: ...}`: an exponential moving average of the trainable weights (docs/training.md, "EMA"), in fp32,
held as the parameters are (DDP: whole on every rank; FSDP2: each rank its shard, a DTensor of the parameter's
placement), updated on the local shards after each optimizer step (no collective), saved in every checkpoint and
restored exactly on resume; the Export callback writes it beside the raw weights (`step-N.ema.safetensors`).

Composer's own EMA algorithm is not used: it swaps the averaged weights into the model for every evaluation and
every checkpoint (validation and samples would then see the EMA, and the checkpoint's model holds it), it is made
for FSDP1 (it updates under `summon_full_params`), and any algorithm turns gcc's lean event engine off
(gcc/compat/composer.py). The keys and the decay are Composer's: smoothing = 2 ** (-update_interval / half_life).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from composer.core import Callback, State
from composer.loggers import Logger

from gcc.model.fsdp import local_part

if TYPE_CHECKING:
    from gcc.training.config import TrainConfig

log = logging.getLogger(__name__)  # not `logger`: Composer passes its Logger under that name

STATE_KEY = "averages"  # the callback's entry in a checkpoint: {parameter name: its average}


def smoothing(half_life: int, update_interval: int) -> float:
    """The share an average keeps at each update (Composer's EMA): an old weight's share halves every `half_life`
    steps, updated every `update_interval` steps."""
    return 2.0 ** (-update_interval / half_life)


def trainable(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The module's trainable parameters by their state_dict (export) names; under FSDP2 the sharded DTensor
    parameters the optimizer updates."""
    return {
        k: v
        for k, v in module.state_dict(keep_vars=True).items()
        if isinstance(v, torch.nn.Parameter) and v.requires_grad
    }


def checkpoint_holds_ema(path: str) -> bool:
    """Whether the checkpoint a launch resumes from holds an EMA. A sharded (DCP) checkpoint is read into what the
    run holds, so a key the checkpoint lacks would fail the load: its metadata is asked first. A DDP checkpoint
    (one file) is read whole and Composer skips a callback it holds no state of: not asked (True)."""
    if not path or not (Path(path) / ".metadata").is_file():  # a DDP file, or no resume: Composer's load decides
        return True
    from torch.distributed.checkpoint import FileSystemReader

    prefix = f"state.callbacks.{Ema.__qualname__}."
    return any(k.startswith(prefix) for k in FileSystemReader(path).read_metadata().state_dict_metadata)


class Ema(Callback):
    def __init__(self, dit: torch.nn.Module, half_life: int, update_interval: int = 1, start: int = 0):
        self.dit = dit
        self.smoothing = smoothing(half_life, update_interval)
        self.update_interval, self.start = update_interval, start
        self.params: dict[str, torch.nn.Parameter] = {}
        self.averages: dict[str, torch.Tensor] = {}
        self.restored = False  # the averages came from the checkpoint
        # False while a resume loads a sharded checkpoint without an EMA (`checkpoint_holds_ema`): the load then
        # asks for none
        self.load_expects_state = True

    @torch.no_grad()
    def _track(self) -> None:
        """The averages, first as a copy of the weights, each shaped and placed as its parameter. Made once the
        Trainer has placed (DDP) or sharded (FSDP2) the model: from BEFORE_LOAD on."""
        if not self.params:
            self.params = trainable(self.dit)
            self.averages = {k: p.detach().to(torch.float32, copy=True) for k, p in self.params.items()}

    @torch.no_grad()
    def _copy_weights(self) -> None:
        for k, p in self.params.items():
            local_part(self.averages[k]).copy_(local_part(p.detach()))

    @torch.no_grad()
    def _update(self) -> None:
        """average = smoothing × average + (1 − smoothing) × weight, on each rank's own part (Composer's formula)."""
        averages = [local_part(a) for a in self.averages.values()]
        weights = [local_part(p.detach()).float() for p in self.params.values()]  # fp32 masters: no copy
        torch._foreach_mul_(averages, self.smoothing)
        torch._foreach_add_(averages, weights, alpha=1.0 - self.smoothing)

    def before_load(self, state: State, logger: Logger) -> None:
        self._track()

    def fit_start(self, state: State, logger: Logger) -> None:
        self._track()
        self.load_expects_state = True
        if not self.restored:  # the weights the run starts from: base or warm start (loaded after the Trainer)
            self._copy_weights()
            if int(state.timestamp.batch) > 0:
                log.warning(
                    f"EMA: the checkpoint holds no average (written without algorithms.ema); it starts from the "
                    f"weights of step {int(state.timestamp.batch)}"
                )

    def batch_end(self, state: State, logger: Logger) -> None:
        step = int(state.timestamp.batch)
        if step <= self.start:
            self._copy_weights()
        elif step % self.update_interval == 0:
            self._update()

    def state_dict(self) -> dict[str, Any]:
        self._track()
        return {STATE_KEY: self.averages} if self.load_expects_state else {}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get(STATE_KEY)
        if saved is None:
            return
        self._track()
        if set(saved) != set(self.averages):
            missing, unexpected = sorted(set(self.averages) - set(saved)), sorted(set(saved) - set(self.averages))
            raise ValueError(
                f"EMA: the checkpoint's averages are not this model's: missing {missing[:4]}, unexpected "
                f"{unexpected[:4]}"
            )
        for k, average in self.averages.items():
            if saved[k] is not average:  # a sharded load reads into the averages themselves
                local_part(average).copy_(local_part(saved[k]))
        self.restored = True


def build_ema(cfg: TrainConfig, dit: torch.nn.Module, resumed_from: str) -> Ema | None:
    """The run's Ema from `algorithms.ema` (None: off); `resumed_from`: the checkpoint this launch resumes ("")."""
    ema = cfg.algorithms.ema
    if ema is None:
        return None
    callback = Ema(
        dit,
        ema.half_life,
        ema.update_interval,
        ema.ema_start,
    )
    callback.load_expects_state = checkpoint_holds_ema(resumed_from)
    return callback
