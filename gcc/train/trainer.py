"""The gc25d run on Composer: `composer -n N gcc/train.py <yaml> [dotted.key=value ...]` (docs/design.md §9).

Order of a launch:
1. parse and validate the config on every rank (exit 2 naming the key: nothing has started yet);
2. join the process group; global rank 0 takes the run lock, checks the data (manifest, train/val leak),
   the run signature (run.json) and repairs the checkpoint folder; every rank gets its verdict (exit 3 on a
   refusal, the same on all ranks);
3. build data, model (base/warm-start weights only when there is no checkpoint to resume), optimizer,
   callbacks, loggers and Composer's Trainer with autoresume; fit.
Exit codes: 0 done or preempted (checkpoint written), 2 bad config, 3 refused, 4 non-finite loss, 5 stalled (a
rank missed a deadline; every thread's stack is in <run_dir>/stacks/), 6 damaged data (a shard or index that
cannot be read back as convert_data wrote it), 7 object storage unavailable (after bounded retries), 8 disk full.
On 6-8 the rank stops at once: nothing is checkpointed after the fault was seen, and nothing partial is kept.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import warnings
from pathlib import Path

from gcc.train.run_folder import Refusal, check_identity
from gcc.train.watchdog import EXIT_STALLED  # 5

EXIT_CONFIG, EXIT_REFUSED, EXIT_NONFINITE, EXIT_DATA, EXIT_STORAGE, EXIT_DISK = 2, 3, 4, 6, 7, 8


logger = logging.getLogger(__name__)


def _rank() -> int:
    return int(os.environ.get("RANK", 0))


def check_data(manifest: dict, data: str) -> None:
    """Refuse data the run cannot train on: no train clips, or train and val sharing clips or runs."""
    tr, va = manifest["splits"]["train"], manifest["splits"]["val"]
    if not tr["clip_ids"]:
        raise Refusal(f"data {data}: the train split has no clips")
    clips = sorted(set(tr["clip_ids"]) & set(va["clip_ids"]))
    runs = sorted(set(tr["runs"]) & set(va["runs"]))
    if clips or runs:
        raise Refusal(f"data {data}: train/val leak: shared clips {clips[:5]}, shared runs {runs[:5]}")


def prepare_run(cfg, lock) -> dict:
    """Rank 0's checks before any work (docs/design.md §9.3, §9.5). Returns what every rank needs to know."""
    from gcc.data.errors import StorageUnavailable
    from gcc.train.builders import read_manifest_bytes, run_signature
    from gcc.train.checkpoint_store import store_for
    from gcc.train.run_folder import checkpoint_step, repair_checkpoints, stored_record

    lock.acquire()
    try:
        manifest_bytes = read_manifest_bytes(cfg)
    except StorageUnavailable:
        raise
    except Exception as e:  # missing file (local or S3)
        raise Refusal(f"data {cfg.data.path}: no readable manifest.json — not a finished convert_data output "
                      f"({type(e).__name__}: {e})") from None
    manifest = json.loads(manifest_bytes)
    check_data(manifest, cfg.data.path)
    run_dir = Path(cfg.run_dir)
    store, launch = store_for(cfg.checkpoint_dir), ""
    remote_record = None
    if store is not None:
        launch = store.claim()
        remote_record = adopt_remote_record(store, run_dir)
    old = stored_record(run_dir)
    signature = run_signature(cfg, manifest_bytes, known=(old or {}).get("signature"))
    lineage = {"init_ckpt": os.path.realpath(cfg.model.init_ckpt) if cfg.model.init_ckpt else ""}
    record = check_identity(run_dir, signature, lineage)
    latest = repair_checkpoints(run_dir) if cfg.autoresume else None
    if store is not None:
        if remote_record is None:
            store.write_record(record)
        remote = store.repair() if cfg.autoresume else None
        if remote is not None and (latest is None or checkpoint_step(remote) >= checkpoint_step(latest)) \
                and not store.whole_here(remote, run_dir):
            latest = store.fetch(remote, run_dir)
    resumed_step = checkpoint_step(latest) if latest else None
    return {"manifest": manifest, "lineage": record["lineage"], "launch": launch,
            "resumed_from": str(latest.resolve()) if latest else "", "resumed_step": resumed_step}


def adopt_remote_record(store, run_dir: Path) -> dict | None:
    """The prefix's run record is the run's: copied into a run folder that has none (a fresh machine), and a run
    folder that holds another run is refused. A prefix with checkpoints but no record is refused, as a run folder
    is (its run signature is unknown)."""
    from gcc.data.storage import atomic_write
    from gcc.train.run_folder import diff_signatures, stored_record

    remote, local = store.read_record(), stored_record(run_dir)
    if remote is None:
        if store.checkpoints():
            raise Refusal(f"{store.url}: holds checkpoints but no run.json, so its run signature is unknown; use "
                          f"another checkpoint_dir")
        return None
    if local is None:
        atomic_write(run_dir / "run.json", json.dumps(remote, indent=1, sort_keys=True))
    elif diffs := diff_signatures(remote["signature"], local["signature"]):
        raise Refusal(f"{run_dir} and checkpoint_dir {store.url} hold different runs; their run.json signatures "
                      f"differ (prefix -> run folder):\n  " + "\n  ".join(diffs) +
                      "\nPoint run_dir and checkpoint_dir at the same run")
    return remote


def fetch_on_this_node(cfg, info: dict) -> None:
    """With remote checkpoints every node needs the checkpoint in its own run folder (which may be node-local):
    local rank 0 of each node other than rank 0's downloads what rank 0 resumes from, if its folder lacks it."""
    from composer.utils import dist

    from gcc.train.checkpoint_store import store_for
    from gcc.train.run_folder import repair_checkpoints

    if not (cfg.checkpoint_dir and info["resumed_from"]):
        return
    name = Path(info["resumed_from"]).name
    if dist.get_local_rank() == 0 and dist.get_global_rank() != 0:
        store = store_for(cfg.checkpoint_dir)
        if not store.whole_here(name, Path(cfg.run_dir)):
            store.fetch(name, Path(cfg.run_dir))
            repair_checkpoints(Path(cfg.run_dir))  # what this node wrote after `name` was never committed
    dist.barrier()


def agree_on_start(cfg, lock) -> tuple[str, object]:
    """Global rank 0 runs `prepare_run`; every rank gets its verdict: ("ok", info) or ("refused", message). A fault
    (storage away, disk full) leaves rank 0 at once with its exit code; the launcher then stops the others."""
    from composer.utils import dist

    from gcc.data.errors import BadInput
    verdict: list = [None]
    if dist.get_global_rank() == 0:
        try:
            verdict[0] = ("ok", prepare_run(cfg, lock))
        except (Refusal, BadInput) as e:
            verdict[0] = ("refused", str(e))
    dist.broadcast_object_list(verdict, src=0)
    return verdict[0]


def fault_message(e: BaseException) -> str:
    """The error's own message, also when a DataLoader worker raised it (torch re-raises it wrapped in the
    worker's traceback text)."""
    text = str(e).strip()
    tail = text.rsplit(f"{type(e).__name__}: ", 1)
    return tail[-1].splitlines()[0] if len(tail) == 2 else text


def as_fault(e: BaseException, run_dir: str) -> tuple[int, str] | None:
    """(exit code, message) for a fault that stops the run cleanly: damaged data, storage away, disk full."""
    from gcc.data.errors import DamagedData, StorageUnavailable, disk_full

    if isinstance(e, DamagedData):
        return EXIT_DATA, f"damaged data: {fault_message(e)}"
    if isinstance(e, StorageUnavailable):
        return EXIT_STORAGE, (f"storage unavailable: {fault_message(e)}. Relaunch the same command once the store "
                              f"answers: it resumes from the last complete checkpoint")
    full = disk_full(e, run_dir, f"under {run_dir}")
    if full is not None:
        return EXIT_DISK, (f"disk full: {fault_message(full)}. Free space there and relaunch the same command: "
                           f"it resumes from the last complete checkpoint")
    return None


def run(cfg) -> int:
    from gcc.train.peer_fault import announce, peer_fault

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
        from gcc.train.console import ALL_RANKS
        from gcc.train.run_folder import repair_checkpoints

        code, message = fault
        logger.error(f"rank {_rank()}: {message}", extra=ALL_RANKS)
        if code == EXIT_DISK and _rank() == 0:  # a save cut short by the full disk goes now, not at the relaunch
            latest = repair_checkpoints(Path(cfg.run_dir))
            logger.error(f"last complete checkpoint: {latest.name if latest else 'none'}")
        return code


def _run(cfg) -> int:
    import torch
    from composer.devices import DeviceCPU, DeviceGPU
    from composer.utils import dist

    from gcc.model.dit import count_params
    from gcc.train import builders as B
    from gcc.train.callbacks import NonFiniteLoss
    from gcc.train.callbacks.train_stats import peak_rss_gb
    from gcc.train.checkpoint_store import TakenOver
    from gcc.train.console import ALL_RANKS
    from gcc.train.run_folder import RunLock

    world, per_rank = B.world_size(), cfg.per_rank_batch(B.world_size())
    device = DeviceGPU() if torch.cuda.is_available() else DeviceCPU()
    if not torch.cuda.is_available():  # ranks share the CPU: don't oversubscribe its cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    dist.initialize_dist(device, timeout=cfg.dist_timeout)
    lock = RunLock(Path(cfg.run_dir))
    status, info = agree_on_start(cfg, lock)
    if status == "refused":
        logger.error(f"refused: {info}")
        return EXIT_REFUSED
    fetch_on_this_node(cfg, info)
    resumed = info["resumed_step"] is not None
    if resumed and info["resumed_step"] >= cfg.max_steps:
        logger.info(f"nothing to do: {cfg.run_dir} is at step {info['resumed_step']} >= max_steps={cfg.max_steps} "
                    f"(raise max_steps=... to train further)")
        return 0
    text = B.node_cache(cfg)
    logger.info(f"{'resuming from ' + info['resumed_from'] if resumed else 'starting'}: world {world}, per-rank "
                f"batch {per_rank} (micro {cfg.micro_batch} × accumulation {cfg.accumulation(world)}), "
                f"global {cfg.global_batch}")
    fsdp = B.parallelism_config(cfg)
    model = B.build_model(cfg, text, fsdp=fsdp is not None)
    parts = B.build_callbacks(cfg, info, model, per_rank)
    t_build = time.time()
    trainer = B.build_trainer(cfg, device, model, B.build_train_loader(cfg, per_rank),
                              B.build_evaluators(cfg, B.build_val_loader(cfg), parts["preemption"]),
                              parts["callbacks"], B.build_loggers(cfg), fsdp)
    if resumed:
        logger.info(f"checkpoint loaded: trainer ready in {time.time() - t_build:.1f} s")
        # a run resumed at an epoch's end trains no batch of that epoch, and Composer warns about it
        warnings.filterwarnings("ignore", message="No batches were trained for global rank", category=UserWarning)
    else:
        B.load_initial_weights(model.dit, cfg)
    logger.info(f"rank {dist.get_global_rank()}: model ready, {count_params(model.dit) / 1e6:.1f} M parameters, "
                f"{'FSDP2 over ' + str(world) + ' rank(s)' if fsdp is not None else 'not sharded'}; peak host RSS "
                f"so far {peak_rss_gb():.2f} GB", extra=ALL_RANKS)
    trainer.state.callbacks.extend(parts["after_saver"])  # after Composer's CheckpointSaver
    t0 = time.time()
    try:
        trainer.fit()
    except (NonFiniteLoss, TakenOver) as e:  # every rank stops at the same step: closing (a barrier) is safe
        trainer.close()
        logger.error(str(e))
        return EXIT_NONFINITE if isinstance(e, NonFiniteLoss) else EXIT_REFUSED
    # any other error skips close(): its barrier would wait for ranks that never get there
    trainer.close()
    step = int(trainer.state.timestamp.batch)
    if parts["preemption"].preempted_at is not None:
        logger.info(f"preempted: stopped after step {step} with a checkpoint; relaunch the same command to continue")
    else:
        logger.info(f"done: step {step} in {time.time() - t0:.0f} s. Run folder {cfg.run_dir}: train_log.csv, "
                    f"val_log.csv, tensorboard/, step-*.safetensors, checkpoints/")
    lock.release()
    return 0


def main(argv: list[str] | None = None) -> int:
    code = _main(argv)
    if code in (EXIT_STALLED, EXIT_DATA, EXIT_STORAGE, EXIT_DISK):
        from gcc.train.peer_fault import PEER_GRACE_S

        # The fault is in the store (rank 0 keeps it): stay a moment so that the other ranks read it and stop
        # with this code rather than on their collective's bare error. Then exit now, not through interpreter
        # shutdown: shutdown restores SIGTERM's default action, and the launcher's SIGTERM (sent to every rank
        # once one has failed) would turn this code into -15. The loader workers stop by themselves when their
        # rank is gone (gcc/data/workers.py).
        if int(os.environ.get("WORLD_SIZE", 1)) > 1:
            for s in (signal.SIGTERM, signal.SIGUSR1):  # the launcher's SIGTERM then: nothing left to save
                signal.signal(s, signal.SIG_IGN)
            time.sleep(PEER_GRACE_S)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code in (EXIT_CONFIG, EXIT_REFUSED, EXIT_NONFINITE) and _rank() != 0:
        # Composer's launcher reports the first non-zero exit in rank order and kills the rest: let rank 0
        # exit first, so the launcher's code is ours (2/3/4), not rank 0's -15 from that cleanup. The launcher
        # kills us as soon as rank 0 is gone (a loaded machine can take several seconds to tear rank 0 down).
        # A fault (6-8) is seen by one rank while the others wait in a collective: that rank exits at once.
        time.sleep(60)
    return code


def _main(argv: list[str] | None) -> int:
    from gcc.train.config import ConfigError, load_config
    from gcc.train.console import configure_logging

    configure_logging("INFO", _rank())
    p = argparse.ArgumentParser(prog="gcc/train.py", description="Train the gc25d teacher (docs/design.md §9).")
    p.add_argument("yaml", help="run config, e.g. yamls/sft_v10.yaml")
    p.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. optim.lr=2e-5")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.yaml, args.overrides)
        cfg.per_rank_batch(int(os.environ.get("WORLD_SIZE", 1)))
        import torch

        if cfg.precision != "fp32" and not torch.cuda.is_available():
            raise ConfigError(f"precision: {cfg.precision} needs a GPU; on CPU set precision=fp32")
    except ConfigError as e:
        logger.error(f"config error: {e}")
        return EXIT_CONFIG
    configure_logging(cfg.log_level, _rank())
    return run(cfg)
