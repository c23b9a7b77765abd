"""The gc25d run on Composer: `composer -n N gcc/train.py <yaml> [dotted.key=value ...]` (docs/design.md §9).

Order of a launch:
1. parse and validate the config on every rank (exit 2 naming the key: nothing has started yet);
2. join the process group; global rank 0 takes the run lock, checks the data (manifest, train/val leak),
   the run signature (run.json) and repairs the checkpoint folder; every rank gets its verdict (exit 3 on a
   refusal, the same on all ranks);
3. build data, model (base/warm-start weights only when there is no checkpoint to resume), optimizer,
   callbacks, loggers and Composer's Trainer with autoresume; fit;
4. end: loader workers, forkserver and this rank's threads stop, then the process group closes on all ranks
   together (`end_launch`); a fault leaves at once instead, on every rank (docs/training.md "How a launch ends").
Exit codes: 0 done or preempted (checkpoint written), 2 bad config, 3 refused, 4 non-finite loss, 5 stalled (a
rank missed a deadline; every thread's stack is in <run_dir>/stacks/), 6 damaged data (a shard or index that
cannot be read back as convert_data wrote it), 7 object storage unavailable (after bounded retries), 8 disk full.
On 6-8 the rank stops at once: nothing is checkpointed after the fault was seen, and nothing partial is kept.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as tdist
from composer.devices import DeviceCPU, DeviceGPU
from composer.utils import dist

from gcc import exit_codes
from gcc.compat.composer import run_after_checkpoint_saver
from gcc.compat.torch import default_store
from gcc.data.dataset import stop_loader_workers
from gcc.errors import DamagedData, LockTimeout, StorageUnavailable, disk_full
from gcc.model.dit import count_params
from gcc.redact import secret_keys
from gcc.sampling.vae import VaeError
from gcc.training import builders as B
from gcc.training.batch_change import continue_after_change
from gcc.training.callbacks import NonFiniteLoss, PreemptedBeforeFirstStep
from gcc.training.callbacks.train_stats import peak_rss_gb
from gcc.training.checkpoint_store import TakenOver, store_for
from gcc.training.config import ConfigError, check_inputs, load_config, to_dict
from gcc.training.console import ALL_RANKS, RUN_LOG_ONLY, configure_logging, open_run_log
from gcc.training.launch import agree_on_start, fetch_on_this_node
from gcc.training.peer_fault import PEER_GRACE_S, announce, peer_fault, stop_watching
from gcc.training.run_folder import Refusal, RunLock, repair_checkpoints
from gcc.training.watchdog import stop_watchdogs
from gcc.workers import start_resource_tracker, stop_forkserver

EXIT_CONFIG, EXIT_REFUSED, EXIT_NONFINITE = exit_codes.CONFIG, exit_codes.REFUSED, exit_codes.NONFINITE
EXIT_STALLED, EXIT_DATA, EXIT_STORAGE, EXIT_DISK = (
    exit_codes.STALLED,
    exit_codes.DATA,
    exit_codes.STORAGE,
    exit_codes.DISK,
)


logger = logging.getLogger(__name__)


def _rank() -> int:
    return int(os.environ.get("RANK", 0))


def fault_message(e: BaseException) -> str:
    """The error's own message, also when a DataLoader worker raised it (torch re-raises it wrapped in the
    worker's traceback text)."""
    text = str(e).strip()
    tail = text.rsplit(f"{type(e).__name__}: ", 1)
    return tail[-1].splitlines()[0] if len(tail) == 2 else text


def as_fault(e: BaseException, run_dir: str) -> tuple[int, str] | None:
    """(exit code, message) for a fault that stops the run cleanly: damaged data, storage away, disk full, a
    node-wide lock held too long, a VAE file that is not one."""
    if isinstance(e, DamagedData):
        return EXIT_DATA, f"damaged data: {fault_message(e)}"
    if isinstance(e, VaeError):  # every rank loads the same file: every rank stops here
        return EXIT_CONFIG, f"model.vae_path: {fault_message(e)}"
    if isinstance(e, LockTimeout):
        return EXIT_STALLED, fault_message(e)
    if isinstance(e, StorageUnavailable):
        return EXIT_STORAGE, (
            f"storage unavailable: {fault_message(e)}. Relaunch the same command once the store "
            f"answers: it resumes from the last complete checkpoint"
        )
    full = disk_full(e, run_dir, f"under {run_dir}")
    if full is not None:
        return EXIT_DISK, (
            f"disk full: {fault_message(full)}. Free space there and relaunch the same command: "
            f"it resumes from the last complete checkpoint"
        )
    return None


def run(cfg) -> int:
    try:
        return _run(cfg)
    except Exception as e:
        fault = as_fault(e, cfg.run_dir)
        if fault is not None:
            announce(_rank(), *fault)
        else:  # a collective that failed because a peer stopped on a fault: that fault's code, not ours
            fault = peer_fault(_rank(), include_own=True)
            if fault is None:
                raise
        code, message = fault
        logger.error(f"rank {_rank()}: {message}", extra=ALL_RANKS)
        if code == EXIT_DISK and _rank() == 0:  # a save cut short by the full disk goes now, not at the relaunch
            latest = repair_checkpoints(Path(cfg.run_dir))
            logger.error(f"last complete checkpoint: {latest.name if latest else 'none'}")
        return code


def _run(cfg) -> int:
    start_resource_tracker()  # before anything registers shared memory: a SIGUSR1 must not end it
    world, per_rank = B.world_size(), cfg.per_rank_batch(B.world_size())
    device = DeviceGPU() if torch.cuda.is_available() else DeviceCPU()
    if not torch.cuda.is_available():  # ranks share the CPU: don't oversubscribe its cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    dist.initialize_dist(device, timeout=cfg.dist_timeout)
    lock = RunLock(Path(cfg.run_dir))
    status, start = agree_on_start(cfg, lock)
    if status != "ok":
        logger.error(f"{'refused' if status == 'refused' else 'config error'}: {start}")
        return EXIT_REFUSED if status == "refused" else EXIT_CONFIG
    try:
        fetch_on_this_node(cfg, start)  # every rank gets the same verdict
    except Refusal as e:
        logger.error(f"refused: {e}")
        return EXIT_REFUSED
    resumed = start.resumed
    if resumed and start.resumed_step >= cfg.max_steps:
        logger.info(
            f"nothing to do: {cfg.run_dir} is at step {start.resumed_step} >= max_steps={cfg.max_steps} "
            f"(raise max_steps=... to train further)"
        )
        return 0
    text = B.node_cache(cfg)
    logger.info(
        f"{'resuming from ' + start.resumed_from if resumed else 'starting'}: world {world}, per-rank "
        f"batch {per_rank} (micro {cfg.micro_batch} × accumulation {cfg.accumulation(world)}), "
        f"global {cfg.global_batch}"
    )
    fsdp = B.parallelism_config(cfg)
    model = B.build_model(cfg, text, fsdp=fsdp is not None)
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
        continue_after_change(trainer, parts.global_batch, Path(cfg.run_dir), store_for(cfg.checkpoint_dir))
        # a run resumed at an epoch's end trains no batch of that epoch, and Composer warns about it
        warnings.filterwarnings("ignore", message="No batches were trained for global rank", category=UserWarning)
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
    t0 = time.time()
    before_first_step = None
    try:
        trainer.fit()
    except PreemptedBeforeFirstStep as e:  # every rank stops before step 1, nothing trained: nothing to save
        before_first_step = str(e)
    except (NonFiniteLoss, TakenOver) as e:  # every rank stops at the same step: closing (a barrier) is safe
        trainer.close()
        logger.error(str(e))
        return EXIT_NONFINITE if isinstance(e, NonFiniteLoss) else EXIT_REFUSED
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
    lock.release()
    return 0


# The end of a launch (docs/training.md, "How a launch ends"): how long a rank's own threads get to stop, and
# how long a rank waits for the others before it closes the process group without them. The ranks come from the
# same step and from Composer's closing barrier, so they arrive within moments of each other.
THREAD_STOP_S = 10.0
END_BARRIER_S = 60.0
END_ARRIVED, END_LEFT = "gcc/end/arrived", "gcc/end/left"


def stop_threads() -> bool:
    """Stop and join this rank's own threads: the peer-fault watch and the stall watchdog. Both are daemon threads,
    and the peer watch spends its time in store calls: one still inside such a call when the interpreter shuts
    down is ended by CPython with pthread_exit, whose unwinding through the call's C++ frames aborts the process
    ("terminate called without an active exception", exit -6). False if one did not stop in time."""
    watch, dog = stop_watching(THREAD_STOP_S), stop_watchdogs(THREAD_STOP_S)
    return watch and dog


def leave_now(code: int) -> None:
    """Exit at once with `code`, past interpreter shutdown (the fault paths, docs/training.md "How a launch
    ends"): the log and the streams flushed, nothing else run."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _end_barrier(store, rank: int, world: int, timeout_s: float) -> bool:
    """Wait until every rank has arrived here (at most `timeout_s`, then say so and go on: False). Rank 0, whose process
    keeps the store, leaves last: it waits for the others to have seen the count, so no rank queries a store that
    is gone. A fault that a peer records meanwhile ends this rank with that fault's code, as during the run."""
    deadline = time.monotonic() + timeout_s
    arrived = store.add(END_ARRIVED, 1)
    while True:
        left = store.add(END_LEFT, 0) if rank == 0 else 0
        if arrived >= world and (rank != 0 or left >= world - 1):
            if rank != 0:
                store.add(END_LEFT, 1)
            return True
        fault = peer_fault(rank)
        if fault is not None:
            logger.error(f"rank {rank}: {fault[1]}", extra=ALL_RANKS)
            leave_now(fault[0])
        if time.monotonic() > deadline:
            logger.warning(
                f"rank {rank}: {min(arrived, world)} of {world} ranks reached the end of the launch within "
                f"{timeout_s:g} s; closing the process group without the others",
                extra=ALL_RANKS,
            )
            return False
        time.sleep(0.05)
        arrived = store.add(END_ARRIVED, 0)


def _drain_gloo_workers(tdist):
    """Let gloo's worker threads finish with the collectives that came before, so that closing the process group
    cannot deadlock. A collective whose Python tensors were freed while a worker still held them (the temporaries
    of `broadcast_object_list`, for one) leaves that worker needing the GIL to drop them, which it does after the
    caller's wait() has returned, holding the queue's lock. `destroy_process_group` joins the workers while
    holding the GIL: a worker still at that point never finishes (seen as a launch that hangs at its end). A
    collective call waits for the queue's lock with the GIL released, so each of two collectives on a tensor held
    here lets every such worker finish first. The caller keeps the returned tensor until the group is closed: a
    worker still holding it when it is freed would need the GIL in turn."""
    held = torch.zeros(1)
    for _ in range(2):
        tdist.all_reduce(held)
    return held


def close_process_group(timeout_s: float = END_BARRIER_S) -> None:
    """All ranks together (`_end_barrier`), then `destroy_process_group`: its threads (gloo's, the store's server
    on rank 0) stop here rather than somewhere in interpreter shutdown."""
    if "torch.distributed" not in sys.modules:
        return
    if not (tdist.is_available() and tdist.is_initialized()):
        return
    rank, world = tdist.get_rank(), tdist.get_world_size()
    together = True
    try:
        if world > 1:
            together = _end_barrier(default_store(), rank, world, timeout_s)
    except Exception as e:  # the store's host, rank 0, is gone: it left on its own (its deadline passed)
        together = False
        logger.warning(
            f"rank {rank}: the other ranks are gone ({type(e).__name__}: {e}); closing the process group without them",
            extra=ALL_RANKS,
        )
    try:
        held = _drain_gloo_workers(tdist) if together else None
        tdist.destroy_process_group()
        del held
    except Exception as e:
        logger.warning(f"rank {rank}: closing the process group failed ({type(e).__name__}: {e})", extra=ALL_RANKS)


def end_launch(code: int) -> int:
    """The orderly end of a launch, for a code that every rank reaches together (0 finished, preempted or nothing
    to do; 2 bad config; 3 refused; 4 non-finite loss): the loader workers, then the forkserver, then this rank's
    threads stop; then the process group closes on all ranks together. Loggers (TensorBoard's writer thread) and
    the checkpoint uploads were closed by the trainer's close()."""
    took: dict[str, float] = {}
    t0 = time.monotonic()
    stop_loader_workers()  # none, in a launch that built no loader
    stop_forkserver()
    took["workers and forkserver"] = time.monotonic() - t0
    t0 = time.monotonic()
    if not stop_threads():
        # still inside a store call after THREAD_STOP_S (a store that does not answer): interpreter shutdown could
        # abort the process, so leave as a fault does
        logger.warning(f"rank {_rank()}: a watch thread did not stop within {THREAD_STOP_S:g} s; exiting at once")
        leave_now(code)
    took["threads"] = time.monotonic() - t0
    t0 = time.monotonic()
    close_process_group()
    took["process group"] = time.monotonic() - t0
    logger.debug(
        f"rank {_rank()}: end of the launch (exit {code}): " + ", ".join(f"{k} {v:.2f} s" for k, v in took.items())
    )
    return code


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(argv)
        if code in exit_codes.FAULTS:
            leave_on_fault(code)
        code = end_launch(code)
    except BaseException as e:
        # an error, or the SystemExit of Composer's SIGTERM handler: the rank ends through interpreter shutdown, so
        # its threads stop first (stop_threads); the other ranks may never get to an end barrier: none is waited for
        if isinstance(e, Exception):  # the console gets Python's own traceback; train.log gets it here
            logger.error(
                f"rank {_rank()}: stopped on an unexpected error", exc_info=True, extra={**ALL_RANKS, **RUN_LOG_ONLY}
            )
        stop_threads()
        raise
    # Everything that needs closing is closed: the interpreter's last collection would only walk every object of
    # torch, Composer and the model (seconds on a loaded machine), so they are left out of it.
    gc.freeze()
    if code in exit_codes.TOGETHER and _rank() != 0:
        # Composer's launcher reports the first non-zero exit in rank order and kills the rest: let rank 0
        # exit first, so the launcher's code is ours (2/3/4), not rank 0's -15 from that cleanup. The launcher
        # kills us as soon as rank 0 is gone (a loaded machine can take several seconds to tear rank 0 down).
        # A fault (6-8) is seen by one rank while the others wait in a collective: that rank exits at once.
        time.sleep(60)
    return code


def leave_on_fault(code: int) -> None:
    """The end of a launch on a fault (5-8), the same on every rank (docs/training.md "How a launch ends")."""
    # The fault is in the store (rank 0 keeps it): stay a moment so that the other ranks read it and stop with
    # this code rather than on their collective's bare error. Then exit now, not through interpreter shutdown:
    # shutdown restores SIGTERM's default action, and the launcher's SIGTERM (sent to every rank once one has
    # failed) would turn this code into -15. Every rank ends a fault this way, the ones that learn of it from
    # their watch thread too (StallWatchdog.stop_for_peer), and so does a missed deadline: a peer may be stuck in
    # a collective, so there is no end barrier to wait for. The loader workers and the forkserver stop by
    # themselves when their rank is gone (gcc/workers.py).
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        for s in (signal.SIGTERM, signal.SIGUSR1):  # the launcher's SIGTERM then: nothing left to save
            signal.signal(s, signal.SIG_IGN)
        time.sleep(PEER_GRACE_S)
    leave_now(code)


def _main(argv: list[str] | None) -> int:
    configure_logging("INFO", _rank())
    p = argparse.ArgumentParser(prog="gcc/train.py", description="Train the gc25d teacher (docs/design.md §9).")
    p.add_argument("yaml", help="run config, e.g. yamls/sft_v10.yaml")
    p.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. optim.lr=2e-5")
    args = p.parse_args(argv)
    try:  # every rank checks the config and what it names before any work: the same verdict everywhere
        cfg = load_config(args.yaml, args.overrides)
        cfg.per_rank_batch(int(os.environ.get("WORLD_SIZE", 1)))
        check_inputs(cfg)
        if cfg.precision != "fp32" and not torch.cuda.is_available():
            raise ConfigError(f"precision: {cfg.precision} needs a GPU; on CPU set precision=fp32")
    except ConfigError as e:
        logger.error(f"config error: {e}")
        return EXIT_CONFIG
    except StorageUnavailable as e:
        logger.error(f"storage unavailable: {e}. Relaunch the same command once the store answers")
        return EXIT_STORAGE
    configure_logging(cfg.log_level, _rank())
    try:  # every rank: rank 0's lines and each rank's own warnings, from here on (docs/training.md)
        open_run_log(cfg.run_dir, _rank(), int(os.environ.get("WORLD_SIZE", 1)))
    except ConfigError as e:
        logger.error(f"config error: {e}")
        return EXIT_CONFIG
    except Refusal as e:
        logger.error(f"refused: {e}")
        return EXIT_REFUSED
    for key in secret_keys(to_dict(cfg)):
        logger.warning(
            f"{key}: holds a credential; gcc masks it in its own files and logs, but the yaml or the "
            f"command line, and the library it is passed to, may keep it: set it through the "
            f'environment instead (docs/training.md, "Trust and safety")'
        )
    return run(cfg)
