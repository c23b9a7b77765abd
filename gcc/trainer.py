"""The gc25d run on Composer: `composer -n N gcc/train.py <yaml> [dotted.key=value ...]` (SPEC §9).

Order of a launch:
1. parse and validate the config on every rank (exit 2 naming the key: nothing has started yet);
2. join the process group; global rank 0 takes the run lock, checks the data (manifest, train/val leak),
   the run signature (run.json) and repairs the checkpoint folder; every rank gets its verdict (exit 3 on a
   refusal, the same on all ranks);
3. build data, model (base/warm-start weights only when there is no checkpoint to resume), optimizer,
   callbacks, loggers and Composer's Trainer with autoresume; fit.
Exit codes: 0 done or preempted (checkpoint written), 2 bad config, 3 refused, 4 non-finite loss, 5 stalled (a
rank missed a deadline; every thread's stack is in <run_dir>/stacks/).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

EXIT_CONFIG, EXIT_REFUSED, EXIT_NONFINITE = 2, 3, 4


def _rank() -> int:
    return int(os.environ.get("RANK", 0))


def say(msg: str, *, err: bool = False) -> None:
    """Rank 0 speaks for the run."""
    if _rank() == 0:
        print(f"gcc.train: {msg}", file=sys.stderr if err else sys.stdout, flush=True)


def check_data(manifest: dict, data: str) -> None:
    """Refuse data the run cannot train on: no train clips, or train and val sharing clips or runs."""
    from gcc.run_folder import Refusal

    tr, va = manifest["splits"]["train"], manifest["splits"]["val"]
    if not tr["clip_ids"]:
        raise Refusal(f"data {data}: the train split has no clips")
    clips = sorted(set(tr["clip_ids"]) & set(va["clip_ids"]))
    runs = sorted(set(tr["runs"]) & set(va["runs"]))
    if clips or runs:
        raise Refusal(f"data {data}: train/val leak: shared clips {clips[:5]}, shared runs {runs[:5]}")


class MicroBatch(dict):
    """A micro-batch that Composer's trainer does not deep-copy.

    Composer 0.32.1 `_train_microbatch` deep-copies every micro-batch only to feed train metrics, which this model
    has none of; at full geometry that is a copy of ~35 MB of latents and sem ids per sample per micro-batch.
    """

    def __deepcopy__(self, memo) -> "MicroBatch":
        return self


def prepare_run(cfg, lock) -> dict:
    """Rank 0's checks before any work (SPEC §9.3, §9.5). Returns what every rank needs to know."""
    from gcc.builders import read_manifest_bytes, run_signature
    from gcc.run_folder import Refusal, check_identity, checkpoint_step, repair_checkpoints, stored_record

    lock.acquire()
    try:
        manifest_bytes = read_manifest_bytes(cfg)
    except Exception as e:  # missing file (local or S3) or unreadable store
        raise Refusal(f"data {cfg.data.path}: no readable manifest.json — not a finished convert_data output "
                      f"({type(e).__name__}: {e})") from None
    manifest = json.loads(manifest_bytes)
    check_data(manifest, cfg.data.path)
    old = stored_record(Path(cfg.run_dir))
    signature = run_signature(cfg, manifest_bytes, known=(old or {}).get("signature"))
    lineage = {"init_ckpt": os.path.realpath(cfg.model.init_ckpt) if cfg.model.init_ckpt else ""}
    record = check_identity(Path(cfg.run_dir), signature, lineage)
    latest = repair_checkpoints(Path(cfg.run_dir), log=say) if cfg.autoresume else None
    resumed_step = checkpoint_step(latest) if latest else None
    return {"manifest": manifest, "lineage": record["lineage"],
            "resumed_from": str(latest.resolve()) if latest else "", "resumed_step": resumed_step}


def run(cfg) -> int:
    import torch
    from composer import Evaluator, Trainer
    from composer.core import DataSpec, Event
    from composer.devices import DeviceCPU, DeviceGPU
    from composer.utils import dist

    from gcc import builders as B
    from gcc.callbacks import (VAL_COLUMNS, TRAIN_COLUMNS, CheckpointRotation, Export, GradClip, NonFiniteGuard,
                               NonFiniteLoss, Preemption, RunFiles, TrainStats, ValidationLog)
    from gcc.callbacks.train_stats import peak_rss_gb
    from gcc.csv_logger import CSVLogger
    from gcc.data import fetch_text_table, release_stale_shm
    from gcc.export import gc_metadata
    from gcc.fsdp import mean_gradients_on_gloo, meta_init_on
    from gcc.model import count_params
    from gcc.optim import build_optimizer, trainer_schedule_kwargs
    from gcc.run_folder import RunLock, ckpt_dir
    from gcc.tensorboard_logger import LocalTensorboardLogger
    from gcc.text_table import TextTable
    from gcc.watchdog import StallWatchdog

    world = B.world_size()
    per_rank = cfg.per_rank_batch(world)
    device = DeviceGPU() if torch.cuda.is_available() else DeviceCPU()
    if not torch.cuda.is_available():  # ranks share the CPU: don't oversubscribe its cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    dist.initialize_dist(device, timeout=cfg.dist_timeout)
    run_dir = Path(cfg.run_dir)
    lock = RunLock(run_dir)
    verdict: list = [None]
    if dist.get_global_rank() == 0:
        from gcc.convert import BadInput
        from gcc.run_folder import Refusal

        try:
            verdict[0] = ("ok", prepare_run(cfg, lock))
        except (Refusal, BadInput) as e:
            verdict[0] = ("refused", str(e))
    dist.broadcast_object_list(verdict, src=0)
    status, info = verdict[0]
    if status == "refused":
        say(f"refused: {info}", err=True)
        return EXIT_REFUSED

    if info["resumed_step"] is not None and info["resumed_step"] >= cfg.max_steps:
        say(f"nothing to do: {cfg.run_dir} is at step {info['resumed_step']} >= max_steps={cfg.max_steps} "
            f"(raise max_steps=... to train further)")
        return 0
    cache = B.cache_dir(cfg)
    if dist.get_local_rank() == 0:
        cache.mkdir(parents=True, exist_ok=True)
        release_stale_shm([cache / "train", cache / "val"])  # from a killed launch of this run (we hold its lock)
        fetch_text_table(cfg.data.path, cache)
    dist.barrier()
    text = TextTable(fetch_text_table(cfg.data.path, cache))
    manifest = info["manifest"]
    resumed = info["resumed_step"] is not None
    say(f"{'resuming from ' + info['resumed_from'] if resumed else 'starting'}: world {world}, per-rank batch "
        f"{per_rank} (micro {cfg.micro_batch} × accumulation {cfg.accumulation(world)}), global {cfg.global_batch}")

    train_loader = B.build_train_loader(cfg, per_rank)
    val_loader = B.build_val_loader(cfg)
    fsdp = B.parallelism_config(cfg)
    model = B.build_model(cfg, text, fsdp=fsdp is not None)
    opt = build_optimizer(model, cfg.optim.lr, cfg.optim.cond_lr, cfg.optim.weight_decay)

    preemption = Preemption(StallWatchdog(run_dir, dist.get_global_rank()), cfg.preemption_grace_s)

    def metadata(step: int) -> dict:
        return gc_metadata(vocab=cfg.model.vocab, data=B.data_kind(cfg), data_root=cfg.data.path, step=step,
                           text_dropout=cfg.data.text_dropout, cond_dropout=cfg.data.cond_dropout,
                           mask_p=cfg.data.mask_p, lr=cfg.optim.lr, cond_lr=cfg.optim.cond_lr,
                           weight_decay=cfg.optim.weight_decay, warmup_steps=cfg.optim.warmup_steps,
                           first_frame_cond=cfg.model.first_frame_cond, seed=cfg.seed,
                           init_ckpt=info["lineage"]["init_ckpt"], model_dir=cfg.model.model_dir,
                           resumed_from=info["resumed_from"],
                           resumed_step="" if info["resumed_step"] is None else info["resumed_step"])

    grad_clip = GradClip(cfg.optim.grad_clip)
    stats = TrainStats(grad_clip)
    callbacks = [NonFiniteGuard(cfg.inject_nonfinite_step, cfg.inject_nonfinite_rank), grad_clip, stats, preemption,
                 ValidationLog("val"),
                 Export(run_dir, model.dit, cfg.export_every, cfg.max_steps, metadata,
                        lambda: preemption.preempted_at is not None, log=say),
                 RunFiles(run_dir, B.resolved_config(cfg, manifest, per_rank), stats)]
    loggers = [CSVLogger(run_dir, {"train_log": TRAIN_COLUMNS, "val_log": VAL_COLUMNS}, log=say)]
    if cfg.tensorboard:
        loggers.append(LocalTensorboardLogger(log_dir=str(run_dir / "tensorboard"), flush_interval=10))

    def eval_interval(state, event) -> bool:
        step = int(state.timestamp.batch)
        if event == Event.BATCH_END:
            return step % cfg.val_every == 0
        if event == Event.FIT_END:  # the end of training; not a preemption
            return preemption.preempted_at is None and step >= cfg.max_steps and step % cfg.val_every != 0
        return False

    def n_samples(batch) -> int:
        return len(batch["clip_id"])

    evaluators = [Evaluator(label="val", dataloader=DataSpec(val_loader, get_num_samples_in_batch=n_samples),
                            eval_interval=eval_interval)] if val_loader is not None else []
    rotation = CheckpointRotation(run_dir, cfg.keep_checkpoints, log=say)
    callbacks.insert(0, rotation.clock)  # before Composer's CheckpointSaver: times each save
    t_build = time.time()
    with meta_init_on("cuda" if torch.cuda.is_available() else "cpu"):  # FSDP: shards, then inits each shard
        trainer = Trainer(
            model=model, run_name=run_dir.name, device=device,
            train_dataloader=DataSpec(train_loader, get_num_samples_in_batch=n_samples,
                                      microbatch_transforms=MicroBatch),
            eval_dataloader=evaluators or None, max_duration=f"{cfg.max_steps}ba", optimizers=opt,
            **trainer_schedule_kwargs(opt, cfg.optim.warmup_steps),
            device_train_microbatch_size=cfg.micro_batch,
            precision="fp32" if cfg.precision == "fp32" else "amp_bf16", parallelism_config=fsdp,
            save_folder=str(ckpt_dir(run_dir)), save_interval=f"{cfg.checkpoint_every}ba",
            save_num_checkpoints_to_keep=-1,  # CheckpointRotation keeps N across restarts
            autoresume=cfg.autoresume, loggers=loggers, callbacks=callbacks, progress_bar=cfg.progress_bar,
            log_to_console=False, seed=cfg.seed, dist_timeout=cfg.dist_timeout,
        )
    if fsdp is not None:
        mean_gradients_on_gloo(model)
    if resumed:
        say(f"checkpoint loaded: trainer ready in {time.time() - t_build:.1f} s")
    else:
        B.load_initial_weights(model.dit, cfg, log=say)
    # every rank (the launcher shows rank 0's; --stdout keeps the others'): what loading the model cost
    print(f"gcc.train: rank {dist.get_global_rank()}: model ready, {count_params(model.dit) / 1e6:.1f} M "
          f"parameters, {'FSDP2 over ' + str(world) + ' rank(s)' if fsdp is not None else 'not sharded'}; "
          f"peak host RSS so far {peak_rss_gb():.2f} GB", flush=True)
    if resumed:  # a run resumed at an epoch's end trains no batch of that epoch, and Composer warns about it
        warnings.filterwarnings("ignore", message="No batches were trained for global rank", category=UserWarning)
    trainer.state.callbacks.append(rotation)  # after the CheckpointSaver
    t0 = time.time()
    try:
        trainer.fit()
    except NonFiniteLoss as e:
        say(str(e), err=True)
        return EXIT_NONFINITE
    finally:
        trainer.close()
    step = int(trainer.state.timestamp.batch)
    if preemption.preempted_at is not None:
        say(f"preempted: stopped after step {step} with a checkpoint; relaunch the same command to continue")
    else:
        say(f"done: step {step} in {time.time() - t0:.0f} s. Run folder {run_dir}: train_log.csv, val_log.csv, "
            f"tensorboard/, step-*.safetensors, checkpoints/")
    lock.release()
    return 0


def main(argv: list[str] | None = None) -> int:
    code = _main(argv)
    if code and _rank() != 0:
        # Composer's launcher reports the first non-zero exit in rank order and kills the rest: let rank 0
        # exit first, so the launcher's code is ours (2/3/4), not rank 0's -15 from that cleanup. The launcher
        # kills us as soon as rank 0 is gone (a loaded machine can take several seconds to tear rank 0 down).
        time.sleep(60)
    return code


def _main(argv: list[str] | None) -> int:
    from gcc.config import ConfigError, load_config

    p = argparse.ArgumentParser(prog="gcc/train.py", description="Train the gc25d teacher (SPEC §9).")
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
        say(f"config error: {e}", err=True)
        return EXIT_CONFIG
    return run(cfg)
