"""The gc25d run on Composer: `composer -n N gcc/train.py <yaml> [dotted.key=value ...]` (docs/design.md §9).

Order of a launch:
1. parse and validate the config on every rank (gcc/training/entry.py, before torch and Composer are loaded: exit
   2 naming the key, nothing has started yet);
2. join the process group; global rank 0 takes the run lock, checks the data (manifest, train/val leak),
   the run signature (run.json) and repairs the checkpoint folder; every rank gets its verdict (exit 3 on a
   refusal, the same on all ranks);
3. build data, model (base/warm-start weights only when there is no checkpoint to resume), optimizer,
   callbacks, loggers and Composer's Trainer with autoresume; fit;
4. end: loader workers, forkserver and this rank's threads stop, then all ranks wait for each other (`end_launch`);
   a fault leaves at once instead, on every rank (docs/training.md "How a launch ends").
Exit codes: 0 done or preempted (checkpoint written), 2 bad config, 3 refused, 4 non-finite loss, 5 stalled (a
rank missed a deadline; every thread's stack is in <run_dir>/stacks/), 6 damaged data (a shard or index that
cannot be read back as convert_data wrote it), 7 object storage unavailable (after bounded retries), 8 disk full.
On 6-8 the rank stops at once: nothing is checkpointed after the fault was seen, and nothing partial is kept.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch
from composer.devices import DeviceCPU, DeviceGPU
from composer.utils import dist

from gcc import exit_codes
from gcc.compat.composer import NO_BATCHES, ignore_warning, run_after_checkpoint_saver
from gcc.compat.torch import peer_gone
from gcc.errors import RELAUNCH, Refusal, exit_for, launch_verdict
from gcc.model.dit import count_params
from gcc.sampling.vae import VaeError
from gcc.training import builders as B
from gcc.training.batch_change import continue_after_change
from gcc.training.callbacks import NonFiniteLoss, PreemptedBeforeFirstStep
from gcc.training.callbacks.train_stats import peak_rss_gb
from gcc.training.checkpoint.files import repair_checkpoints
from gcc.training.checkpoint.store import TakenOver
from gcc.training.config import ConfigError, resolve_duration
from gcc.training.console import ALL_RANKS
from gcc.training.ending import PeerGone, end
from gcc.training.peer_fault import announce, peer_fault
from gcc.training.ranks import local_world_size, rank, world_size
from gcc.training.run_folder import RunLock
from gcc.training.run_start import RunStart, agree_on_start, fetch_on_this_node, steps_per_epoch, train_clips
from gcc.workers import start_resource_tracker

logger = logging.getLogger(__name__)


def as_fault(e: BaseException, run_dir: str) -> tuple[int, str] | None:
    """(exit code, message) of a fault (`exit_codes.FAULTS`: damaged data, a lock held too long, a store or server
    that did not answer, a full disk under `run_dir`) or of a VAE file that is not one, or None: the run stops on
    it cleanly (`gcc.errors.exit_for`, the same code and words as everywhere). The run's inputs were all checked
    before its start, so an error of another library is none of these unless it is a store's or a full disk."""
    verdict = exit_for(e, run_dir, RELAUNCH, foreign_input=False)
    if verdict is not None and isinstance(e, VaeError):  # every rank loads the same file: every rank stops here
        return verdict[0], f"model.vae_path: {verdict[1]}"
    return verdict if verdict is not None and verdict[0] in exit_codes.FAULTS else None


def run(cfg) -> int:
    try:
        return _run(cfg)
    except Exception as e:
        fault = as_fault(e, cfg.run_dir)
        if fault is not None:
            announce(rank(), *fault)
        else:  # a collective that failed because a peer stopped on a fault: that fault's code, not ours
            fault = peer_fault(rank(), include_own=True)
            if fault is None and peer_gone(e):  # a peer crashed or was killed: its own output says why
                raise PeerGone(
                    f"stopped: another rank's process is gone (a crash or a kill; the launcher says which), so "
                    f"this collective failed: {str(e).splitlines()[-1]}"
                ) from None
            if fault is None:
                raise
        code, message = fault
        logger.error(f"rank {rank()}: {message}", extra=ALL_RANKS)
        if code == exit_codes.DISK and rank() == 0:  # a save cut short by the full disk goes now, not at the relaunch
            latest = repair_checkpoints(Path(cfg.run_dir))
            logger.error(f"last complete checkpoint: {latest.name if latest else 'none'}")
        return code


def _run(cfg) -> int:
    start_resource_tracker()  # before anything registers shared memory: a SIGUSR1 must not end it
    world = world_size()
    per_rank = cfg.per_rank_batch(world)
    device = DeviceGPU() if torch.cuda.is_available() else DeviceCPU()
    if not torch.cuda.is_available():  # ranks share the CPU: don't oversubscribe its cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world_size()))
    dist.initialize_dist(device, timeout=cfg.dist_timeout)
    lock = RunLock(Path(cfg.run_dir))
    try:  # every rank gets the same verdict
        start = agree_on_start(cfg, lock)
        fetch_on_this_node(cfg, start, lock)
    except (Refusal, ConfigError) as e:
        code, line = launch_verdict(e)
        logger.error(line)
        return code
    if isinstance(cfg.max_duration, str):  # epochs: batches from this launch's train split and global batch
        given = cfg.max_duration
        resolve_duration(cfg, steps_per_epoch(train_clips(start.manifest, cfg.data.limit), world, per_rank))
        logger.info(f"max_duration {given}: {cfg.max_steps} batches at this launch's global batch")
    resumed = start.resumed
    if resumed and start.resumed_step >= cfg.max_steps:
        logger.info(
            f"nothing to do: {cfg.run_dir} is at step {start.resumed_step} >= max_duration={cfg.max_steps} "
            f"(raise max_duration=... to train further)"
        )
        return exit_codes.OK
    trainer, parts = _ready_trainer(cfg, start, device, world, per_rank)
    stopped = _fit(cfg, trainer, parts)
    if stopped is not None:
        return stopped
    lock.release()
    return exit_codes.OK


def _ready_trainer(cfg, start: RunStart, device, world: int, per_rank: int):
    """The model, loaders, callbacks and Composer's Trainer of this launch, resumed from its checkpoint or holding
    the initial weights: (trainer, the run's callbacks)."""
    resumed = start.resumed
    text = B.node_cache(cfg)
    logger.info(
        f"{'resuming from ' + start.resumed_from if resumed else 'starting'}: world {world}, per-rank "
        f"batch {per_rank} (micro {cfg.device_train_microbatch_size} × accumulation {cfg.accumulation(world)}), "
        f"global {cfg.global_train_batch_size}"
    )
    fsdp = B.parallelism_config(cfg)
    model = B.build_model(cfg, text, fsdp=fsdp is not None)
    logger.info(B.describe_model(cfg, start.manifest))
    val_loader = B.build_val_loader(cfg)
    parts = B.build_callbacks(cfg, start, model, per_rank, val_loader, text)
    t_build = time.time()
    trainer = B.build_trainer(
        cfg,
        device,
        model,
        B.build_train_loader(cfg, per_rank),
        B.build_evaluators(cfg, val_loader, parts.preemption),
        parts.callbacks,
        B.build_loggers(cfg),
        fsdp,
    )
    if resumed:
        logger.info(f"checkpoint loaded: trainer ready in {time.time() - t_build:.1f} s")
        continue_after_change(trainer, parts.global_batch, Path(cfg.run_dir), start.store)
        ignore_warning(NO_BATCHES)  # a run resumed at an epoch's end trains no batch of that epoch
    else:
        B.load_initial_weights(model.dit, cfg)
    logger.info(
        f"rank {dist.get_global_rank()}: model ready, {count_params(model.dit) / 1e6:.1f} M parameters, "
        f"{'FSDP2 over ' + str(world) + ' rank(s)' if fsdp is not None else 'not sharded'}; peak host RSS "
        f"so far {peak_rss_gb():.2f} GB",
        extra=ALL_RANKS,
    )
    run_after_checkpoint_saver(trainer, parts.after_saver)
    if parts.validate_at_start is not None:
        parts.validate_at_start.evaluate = trainer.eval
    return trainer, parts


def _fit(cfg, trainer, parts) -> int | None:
    """The training, closed and reported (done, preempted, or stopped before its first step); the exit code of a
    run that every rank stopped at the same step (a non-finite loss, the prefix taken over), else None."""
    t0 = time.time()
    before_first_step = None
    try:
        trainer.fit()
    except PreemptedBeforeFirstStep as e:  # every rank stops before step 1, nothing trained: nothing to save
        before_first_step = str(e)
    except (NonFiniteLoss, TakenOver) as e:  # every rank stops at the same step: closing (a barrier) is safe
        trainer.close()
        logger.error(str(e))
        return e.exit_code
    # any other error skips close(): its barrier would wait for ranks that never get there
    trainer.close()
    step = int(trainer.state.timestamp.batch)
    if before_first_step is not None:
        logger.info(before_first_step)
    elif parts.preemption.preempted_at is not None:
        logger.info(f"preempted: stopped after step {step} with a checkpoint; relaunch the same command to continue")
    else:
        logger.info(
            f"done: step {step} in {time.time() - t0:.0f} s. Run folder {cfg.run_dir}: train_log.csv, "
            f"val_log.csv, tensorboard/, step-*.safetensors, checkpoints/"
        )
    return None


def train_rank(cfg) -> int:
    """The run of a checked config (gcc/training/entry.py), to the end of the launch on this rank
    (gcc/training/ending.py `end`)."""

    def checked_run() -> int:
        if cfg.precision != "fp32" and not torch.cuda.is_available():
            logger.error(f"config error: precision: {cfg.precision} needs a GPU; on CPU set precision=fp32")
            return exit_codes.CONFIG
        return run(cfg)

    return end(checked_run)
