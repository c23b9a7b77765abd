"""Builders: config -> the parts of a Composer run (data, model, optimizer, callbacks, loggers, Trainer)."""

from __future__ import annotations

import faulthandler
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from composer import Evaluator, Trainer
from composer.core import DataSpec, Event
from composer.utils import dist
from composer.utils.parallelism import FSDP2Config
from torch.utils.data import DataLoader, Dataset

from gcc.compat.composer import MicroBatch, meta_init_on, use_checkpoint_saver, use_lean_engine
from gcc.compat.streaming import release_stale_shm
from gcc.compat.torch import gloo_gradients_as_means
from gcc.data.batch import gc_collate, pin_batches, split_batch
from gcc.data.dataset import (
    FaultAt,
    GcStreamingDataset,
    build_dataloader,
    fetch_text_table,
    round_robin_by_run,
)
from gcc.data.text_table import TextTable
from gcc.model.attention import backends_at, current_kernel, select_attention
from gcc.model.config import WAN_SHIFT
from gcc.model.dit import build_gc_dit, load_wan_base, model_config
from gcc.model.export import gc_metadata, load_gc_weights, load_legacy_zero
from gcc.model.objective import GcTrainModel
from gcc.model.optim import build_optimizer
from gcc.provenance import Provenance
from gcc.redact import redact
from gcc.sampling.decoders import pick_decoder
from gcc.sampling.media import FPS
from gcc.training import loggers as run_loggers  # (build_trainer has a `loggers` argument)
from gcc.training.callbacks import TRAIN_COLUMNS, VAL_COLUMNS, CallbackContext, CheckpointWrites, build_all
from gcc.training.callbacks.samples import SampleSettings, TrainingSamples
from gcc.training.checkpoint.background import AsyncCheckpointSaver
from gcc.training.checkpoint.files import ckpt_dir
from gcc.training.checkpoint.rotation import SaveClock
from gcc.training.config import TrainConfig, exported_values, samples_during_training
from gcc.training.console import progress_bar_draws, progress_bar_stream
from gcc.training.peer_fault import PEER_GRACE_S, announce, watch_peers
from gcc.training.ranks import rank, world_size
from gcc.training.run_start import RunStart, cache_dir, data_name, steps_per_epoch, train_clips, validates
from gcc.training.schedule import composer_scheduler, trainer_schedule_kwargs
from gcc.training.watchdog import StallWatchdog

logger = logging.getLogger(__name__)


# ---- where things live ---------------------------------------------------------------------------------
# ---- data ----------------------------------------------------------------------------------------------
def node_cache(cfg: TrainConfig) -> TextTable:
    """The node's shard cache, made ready by its local rank 0 (stale shared memory of a killed launch of this run
    released: the cache is this run's alone, under the run lock or its own lock (`launch.hold_cache`); the text
    table fetched once), then the text table on every rank."""

    cache = cache_dir(cfg)
    if dist.get_local_rank() == 0:
        cache.mkdir(parents=True, exist_ok=True)
        release_stale_shm([cache / "train", cache / "val"])
        fetch_text_table(cfg.data.path, cache)
    dist.barrier()
    return TextTable(fetch_text_table(cfg.data.path, cache))


def build_train_loader(cfg: TrainConfig, per_rank_batch: int) -> DataLoader:
    ds = GcStreamingDataset(
        cfg.data, "train", cache_dir(cfg), batch_size=per_rank_batch, seed=cfg.seed, vocab=cfg.model.vocab
    )
    collate = gc_collate
    if cfg.faults.stall_step and rank() == cfg.faults.stall_rank:
        collate = FaultAt(gc_collate, cfg.faults.stall_step)
    if cfg.faults.native_crash_step and rank() == cfg.faults.native_crash_rank:
        crash = faulthandler._sigsegv  # type: ignore[attr-defined]  # CPython's own hook for its tests
        collate = FaultAt(collate, cfg.faults.native_crash_step, crash)
    # every optimizer step sees the whole global batch: an epoch's partial tail is dropped (which samples that
    # are varies with the epoch's shuffle; docs/training.md, "Epochs")
    return build_dataloader(
        ds,
        batch_size=per_rank_batch,
        num_workers=cfg.data.num_workers,
        collate_fn=collate,
        preemption_grace_s=cfg.preemption_grace_s,
        drop_last=True,
    )


def select_val_ids(manifest: dict, n: int) -> list[int]:
    """The fixed validation clips: sample ids taken round-robin over the val runs."""
    runs = manifest["splits"]["val"]["clip_runs"]  # sample id i is the split's clip i
    return sorted(round_robin_by_run([(run, i) for i, run in enumerate(runs)], n))


class ValClips(Dataset):
    """A fixed set of val samples, map-style, so any world size evaluates exactly these clips (Composer drops
    the DistributedSampler's padding in evaluation)."""

    def __init__(self, ds: GcStreamingDataset, ids: list[int]):
        self.ds, self.ids = ds, ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.ds[self.ids[i]]


def build_val_loader(cfg: TrainConfig) -> DataLoader | None:
    if not validates(cfg):
        return None

    ds = GcStreamingDataset(
        cfg.data, "val", cache_dir(cfg), batch_size=cfg.val_batch, seed=cfg.seed, vocab=cfg.model.vocab, shuffle=False
    )
    clips = ValClips(ds, select_val_ids(ds.manifest, cfg.val_n))
    return DataLoader(
        clips,
        batch_size=cfg.val_batch,
        sampler=dist.get_sampler(clips, shuffle=False),
        collate_fn=gc_collate,
        num_workers=0,
        pin_memory=pin_batches(),
    )


# ---- model ----------------------------------------------------------------------------------------------
def build_model(cfg: TrainConfig, text: TextTable, fsdp: bool):
    """GcTrainModel around a GcDiT whose initial values are a pure function of the seed. Under FSDP the DiT stays
    on the meta device: Composer shards it and each rank initialises only its shard. Base / warm-start weights
    come after the Trainer is built (`load_initial_weights`), into the sharded model. The blocks get their
    activation checkpointing and compilation here, before Composer shards them (gcc/model/block_wrap.py), and
    the process its attention kernel (gcc/model/attention.py)."""

    select_attention(cfg.model.attention, "cuda" if torch.cuda.is_available() else "cpu")
    dit = build_gc_dit(
        cfg.model.preset,
        device="meta" if fsdp else "cpu",
        vocab=cfg.model.vocab,
        init_seed=cfg.seed,
        **cfg.model.overrides,
    )
    dit.wrap_blocks(cfg.model.activation_checkpointing, cfg.model.compile)
    return GcTrainModel(
        dit,
        seed=cfg.seed,
        null_context=text.row(text.null_id),
        val_timesteps=tuple(cfg.val_timesteps),
        config=cfg.model,
    )


def describe_model(cfg: TrainConfig, manifest: dict) -> str:
    """The launch's line about how the blocks run: checkpointing, compilation, resharding, and the attention
    kernel with the SDPA backend that runs at this data's shapes (self- and cross-attention)."""
    mc = model_config(cfg.model.preset, vocab=cfg.model.vocab, **cfg.model.overrides)
    _, T, h, w = manifest["geometry"]["latents"]
    L = manifest["geometry"]["text"][0]
    heads, hd = mc.num_heads, mc.dim // mc.num_heads
    n = (h // mc.patch_size[1]) * (w // mc.patch_size[2])
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if cfg.precision == "fp32" else torch.bfloat16
    kernel = current_kernel()
    at_shapes = (
        f"self-attention {backends_at((1, heads, T * n, hd), (1, heads, T * n, hd), dtype, dev)}, "
        f"cross-attention {backends_at((T, heads, n, hd), (T, heads, L, hd), dtype, dev)}"
    )
    reshard = cfg.fsdp.reshard_after_forward if cfg.parallelism == "fsdp" else None
    return (
        f"blocks: activation checkpointing {cfg.model.activation_checkpointing}, "
        f"{'compiled' if cfg.model.compile else 'eager'}"
        + ("" if reshard is None else f", weights {'resharded' if reshard else 'kept gathered'} after forward")
        + f"; attention {kernel.describe()} (model.attention: {cfg.model.attention}); at this data's shapes "
        + at_shapes
    )


def load_initial_weights(dit, cfg: TrainConfig) -> None:
    """Base Wan weights, then a warm start, into the model as it is (each rank reads only the rows it holds
    when sharded). Not called on resume: the checkpoint brings the weights."""

    if cfg.model.model_dir:
        load_wan_base(dit, cfg.model.model_dir)
        logger.info(f"model: base Wan weights from {cfg.model.model_dir}")
    if cfg.model.legacy_zero_ckpt:
        load_legacy_zero(dit, cfg.model.legacy_zero_ckpt)
        logger.info(f"model: warm start from DeepSpeed ZeRO checkpoint {cfg.model.legacy_zero_ckpt}")
    if cfg.model.init_ckpt:
        load_gc_weights(dit, cfg.model.init_ckpt)
        logger.info(f"model: warm start from {cfg.model.init_ckpt}")


def parallelism_config(cfg: TrainConfig) -> dict | None:
    """`parallelism: fsdp` is Composer's FSDP2 on GPU and CPU alike, at any world size (a sharded checkpoint
    needs it to be read, also on one rank): each DiT block (with its wrappers: `build_model`) a unit, bf16 compute
    with fp32 master weights and fp32 reduction under amp_bf16, sharded (DCP) checkpoints. `ddp`: None (Composer
    uses DDP when there is more than one rank)."""
    if cfg.parallelism != "fsdp":
        return None

    return {
        "fsdp": FSDP2Config(
            reshard_after_forward=cfg.fsdp.reshard_after_forward,
            activation_checkpointing=False,  # gcc wraps the blocks itself (build_model)
            mixed_precision="DEFAULT",
            state_dict_type="sharded",
        )
    }


def resolved_config(cfg: TrainConfig, manifest: dict, per_rank_batch: int, provenance: Provenance) -> dict:
    """What config.json holds (docs/training.md, "The run folder"): the config, the launch's code (`provenance`)
    and what follows from the config, the world and the data."""
    steps = steps_per_epoch(train_clips(manifest, cfg.data.limit), world_size(), per_rank_batch)
    return {
        "config": redact(asdict(cfg)),
        "provenance": provenance.as_dict(),
        "world_size": world_size(),
        "per_rank_batch": per_rank_batch,
        "grad_accum": cfg.accumulation(world_size()),
        "data_geometry": manifest["geometry"],
        "data_counts": manifest["counts"],
        "steps_per_epoch": steps,
        "samples_per_epoch": steps * cfg.global_train_batch_size,
    }


# ---- the run's wiring -----------------------------------------------------------------------------------
def export_metadata(cfg: TrainConfig, start: RunStart, step: int) -> dict[str, str]:
    """The metadata of the export at `step`: the fields the config declares exported (`exported_values`), the
    data's name from its manifest, the step, the launch's lineage and resume, and its code (provenance, read once
    by the launch: `RunStart.provenance`)."""
    code = start.provenance
    return gc_metadata(
        **exported_values(cfg),
        data=data_name(cfg, start.manifest),
        step=step,
        init_ckpt=start.lineage["init_ckpt"],
        resumed_from=start.resumed_from,
        resumed_step="" if start.resumed_step is None else start.resumed_step,
        trainer=f"gcc {code.version}",
        git_revision=code.revision,
        git_dirty=code.dirty,
        preset="" if cfg.model.overrides else cfg.model.preset,  # with overrides, no preset is the layout
    )


@dataclass
class RunCallbacks:
    """The run's callbacks, and the ones the trainer acts on itself."""

    callbacks: list  # in Composer's order (gcc/training/callbacks/__init__.py `CALLBACKS`)
    after_saver: list  # appended once the Trainer exists: they must run after Composer's CheckpointSaver
    preemption: Any  # Preemption: whether the run stopped early
    global_batch: Any  # GlobalBatchRecord: a resume reads the global batch the checkpoint was written with
    validate_at_start: Any  # ValidateAtStart, or None (no step-0 validation: off, or a resume)


def callback_context(
    cfg: TrainConfig,
    start: RunStart,
    model,
    per_rank_batch: int,
    val_loader: DataLoader | None,
    text: TextTable | None,
    watchdog: StallWatchdog,
) -> CallbackContext:
    """What the callbacks' factories build from: the run's pieces, and what this module derives for them."""
    return CallbackContext(
        cfg,
        start,
        model,
        per_rank_batch,
        val_loader,
        text,
        watchdog,
        export_metadata=lambda step: export_metadata(cfg, start, step),
        resolved_config=resolved_config(cfg, start.manifest, per_rank_batch, start.provenance),
        build_samples=lambda: build_samples(cfg, start, model, val_loader, text),
    )


def build_callbacks(
    cfg: TrainConfig,
    start: RunStart,
    model,
    per_rank_batch: int,
    val_loader: DataLoader | None = None,
    text: TextTable | None = None,
) -> RunCallbacks:
    """The run's callbacks: the rank's watchdog, then every entry of the callbacks' table (`CALLBACKS`) in its
    order; `after_saver` are appended after the Trainer exists (they must follow Composer's CheckpointSaver)."""

    rank = dist.get_global_rank()
    watchdog = StallWatchdog(
        Path(cfg.run_dir),
        rank,
        announce=lambda code, why: announce(rank, code, why),
        grace_s=PEER_GRACE_S if dist.get_world_size() > 1 else 0.0,
    )
    watch_peers(rank, watchdog.stop_for_peer)
    context = callback_context(cfg, start, model, per_rank_batch, val_loader, text, watchdog)
    ordered, after_saver = build_all(context)
    return RunCallbacks(
        ordered, after_saver, context["preemption"], context["global_batch"], context["validate_at_start"]
    )


def build_samples(
    cfg: TrainConfig, start: RunStart, model, val_loader: DataLoader | None, text
) -> TrainingSamples | None:
    """The TrainingSamples, or None when the run logs no samples (docs/sample.md). The clips: the first `sample_n` of
    the fixed validation clips' rule (round-robin over the val runs); the decoder: the synthetic world's for
    gcc-synth data, the Wan VAE with `model.vae_path`, else the latent preview."""
    if val_loader is None or text is None or not samples_during_training(cfg):
        return None
    manifest = start.manifest
    # each rank decodes its own clips: with a VAE, one on every GPU
    decoder = pick_decoder(manifest.get("synthetic", False), cfg.model.vae_path, text.keys, cfg.model.vocab)
    settings = SampleSettings(
        every_steps=cfg.eval_interval * cfg.sample_every,
        max_steps=cfg.max_steps,
        steps=cfg.sample_steps,
        shift=WAN_SHIFT,
        sem_cfg=float(cfg.sample_cfg),
        seed=cfg.seed,
        fps=FPS,
        keep=cfg.keep_samples,
    )
    assert isinstance(val_loader.dataset, ValClips)  # build_val_loader's
    val_clips = val_loader.dataset.ds
    return TrainingSamples(
        cfg.run_dir,
        model,
        val_clips.get_item,
        select_val_ids(manifest, cfg.sample_n),
        decoder,
        settings,
        cfg.model.vocab,
    )


def build_loggers(cfg: TrainConfig) -> list:
    """CSV tables always, then the yaml's `loggers:` (gcc/training/loggers.py)."""

    return run_loggers.build_loggers(cfg.run_dir, cfg.loggers, {"train_log": TRAIN_COLUMNS, "val_log": VAL_COLUMNS})


def samples_in(batch) -> int:
    return len(batch["clip_id"])


def build_evaluators(cfg: TrainConfig, val_loader: DataLoader | None, preemption) -> list:
    """Validation every `eval_interval` steps (not at a preempted step: gcc/training/callbacks/preemption.py), and
    once more at the end of training (not after a preemption) when the last step is not a multiple of it. The
    step-0 one (`eval_first`) and a resume's catch-up run the same evaluators, from ValidateAtStart."""
    if val_loader is None:
        return []

    def due(step: int) -> bool:
        return step % cfg.eval_interval == 0

    preemption.skippable("validation", due)

    def eval_interval(state, event) -> bool:
        step = int(state.timestamp.batch)
        if event == Event.BATCH_END:  # Composer runs it after BATCH_END, before the step's BATCH_CHECKPOINT
            return due(step) and not preemption.skips("validation", step)
        if event == Event.FIT_END:
            return preemption.preempted_at is None and step >= cfg.max_steps and step % cfg.eval_interval != 0
        return False

    return [
        Evaluator(
            label="val",
            dataloader=DataSpec(val_loader, get_num_samples_in_batch=samples_in),
            eval_interval=eval_interval,
        )
    ]


def build_optimization(cfg: TrainConfig, model) -> tuple[torch.optim.AdamW, dict]:
    """The yaml's `optimizer:` (AdamW, two parameter groups) and the Trainer kwargs of its `scheduler:` over
    max_duration (gcc/model/optim.py, gcc/training/schedule.py)."""
    opt = build_optimizer(model, cfg.optimizer)
    return opt, trainer_schedule_kwargs(opt, composer_scheduler(cfg.scheduler), cfg.max_steps)


def build_trainer(
    cfg: TrainConfig,
    device,
    model,
    train_loader: DataLoader,
    evaluators: list,
    callbacks: list,
    loggers: list,
    fsdp: dict | None,
):
    """Composer's Trainer with autoresume and batch-based checkpoints (an epoch-end save would lose Streaming's
    position), its saver writing periodic checkpoints in the background (`save_async`:
    gcc/training/checkpoint/background.py). Under FSDP Composer shards the meta-device model and each rank initialises its shard."""

    opt, schedule = build_optimization(cfg, model)
    bar = progress_bar_draws(cfg.progress_bar)
    with meta_init_on("cuda" if torch.cuda.is_available() else "cpu"):
        trainer = Trainer(
            model=model,
            run_name=Path(cfg.run_dir).name,
            device=device,
            train_dataloader=DataSpec(
                train_loader,
                get_num_samples_in_batch=samples_in,
                split_batch=split_batch,
                microbatch_transforms=MicroBatch,
            ),
            eval_dataloader=evaluators or None,
            max_duration=f"{cfg.max_steps}ba",
            optimizers=opt,
            **schedule,
            device_train_microbatch_size=cfg.device_train_microbatch_size,
            precision="fp32" if cfg.precision == "fp32" else "amp_bf16",
            parallelism_config=fsdp,
            save_folder=str(ckpt_dir(Path(cfg.run_dir))),
            save_interval=f"{cfg.save_interval}ba",
            save_num_checkpoints_to_keep=-1,  # CheckpointRotation keeps N across restarts
            autoresume=cfg.autoresume,
            loggers=loggers,
            callbacks=callbacks,
            # the yaml's progress_bar allows it; it draws only on a terminal, never into train.log
            progress_bar=bar,
            console_stream=progress_bar_stream() if bar else "stderr",
            log_to_console=False,
            seed=cfg.seed,
            dist_timeout=cfg.dist_timeout,
        )
    writes = next(cb for cb in callbacks if isinstance(cb, CheckpointWrites))
    clock = next(cb for cb in callbacks if isinstance(cb, SaveClock))
    use_checkpoint_saver(trainer, AsyncCheckpointSaver, writes=writes, clock=clock, committed=[])
    if cfg.lean_engine:
        use_lean_engine(trainer)
    if fsdp is not None:
        gloo_gradients_as_means(model)
    return trainer
