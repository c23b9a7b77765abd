"""Builders: config -> the parts of a Composer run (data, model, optimizer, callbacks, loggers, Trainer)."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, Dataset

from gcc import storage
from gcc.config import TrainConfig
from gcc.data import Dropouts, GcStreamingDataset, StallAt, build_dataloader, gc_collate, round_robin_by_run
from gcc.optim import BETAS
from gcc.run_folder import file_digest
from gcc.shards import MANIFEST
from gcc.text_table import TextTable


# ---- where things live ---------------------------------------------------------------------------------
def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def world_size() -> int:
    return env_int("WORLD_SIZE", 1)


def cache_dir(cfg: TrainConfig) -> Path:
    """Per-node shard cache, shared by the node's ranks (Streaming's download/lock protocol needs that)."""
    base = Path(cfg.data.cache_dir) if cfg.data.cache_dir else Path(cfg.run_dir) / "cache"
    return base / f"node{env_int('NODE_RANK', 0)}"


def data_kind(cfg: TrainConfig) -> str:
    """A short name of the data for export metadata (`data`): the conversion folder's name."""
    return cfg.data.path.rstrip("/").rsplit("/", 1)[-1]


# ---- identity ------------------------------------------------------------------------------------------
def run_signature(cfg: TrainConfig, manifest_bytes: bytes, known: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything that makes two launches the same run (SPEC §9.3). Absent on purpose: max_steps, GPU/node
    count, micro-batch/accumulation split, workers, logging, export/checkpoint/validation cadence."""
    m, d, o = cfg.model, cfg.data, cfg.optim
    known = known or {}
    base = ""
    if m.model_dir:
        index = Path(m.model_dir) / "diffusion_pytorch_model.safetensors.index.json"
        base = hashlib.sha256(index.read_bytes()).hexdigest() if index.exists() else os.path.realpath(m.model_dir)
    init = file_digest(m.init_ckpt, known.get("model.init_ckpt")) if m.init_ckpt else ""
    return {
        "model.preset": m.preset, "model.overrides": json.dumps(m.overrides, sort_keys=True),
        "model.vocab": m.vocab, "model.first_frame_cond": m.first_frame_cond,
        "model.base_weights": base, "model.init_ckpt": init,
        "model.legacy_zero_ckpt": os.path.realpath(m.legacy_zero_ckpt) if m.legacy_zero_ckpt else "",
        "data.manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
        "data.text_dropout": d.text_dropout, "data.cond_dropout": d.cond_dropout, "data.mask_p": d.mask_p,
        "data.mask_calibration": d.mask_calibration, "data.max_frame_coverage": d.max_frame_coverage,
        "data.num_canonical_nodes": d.num_canonical_nodes,
        "seed": cfg.seed, "global_batch": cfg.global_batch, "precision": cfg.precision,
        "parallelism": cfg.parallelism,  # DDP and FSDP checkpoints differ in format
        "optim.lr": o.lr, "optim.cond_lr": o.cond_lr, "optim.weight_decay": o.weight_decay,
        "optim.warmup_steps": o.warmup_steps, "optim.grad_clip": o.grad_clip, "optim.betas": list(BETAS),
    }


def read_manifest_bytes(cfg: TrainConfig) -> bytes:
    return storage.read_bytes(storage.join(cfg.data.path, MANIFEST))


# ---- data ----------------------------------------------------------------------------------------------
def dropouts(cfg: TrainConfig) -> Dropouts:
    d = cfg.data
    return Dropouts(text=d.text_dropout, cond=d.cond_dropout, mask=d.mask_p, calibration=d.mask_calibration,
                    max_frame_coverage=d.max_frame_coverage)


def build_train_loader(cfg: TrainConfig, per_rank_batch: int) -> DataLoader:
    ds = GcStreamingDataset(cfg.data.path, "train", cache_dir(cfg), batch_size=per_rank_batch, seed=cfg.seed,
                            vocab=cfg.model.vocab, dropouts=dropouts(cfg), shuffle=True,
                            num_canonical_nodes=cfg.data.num_canonical_nodes,
                            cache_limit=cfg.data.cache_limit or None)
    collate = gc_collate
    if cfg.inject_stall_step and env_int("RANK", 0) == cfg.inject_stall_rank:
        collate = StallAt(gc_collate, cfg.inject_stall_step)
    return build_dataloader(ds, batch_size=per_rank_batch, num_workers=cfg.data.num_workers, collate_fn=collate,
                            preemption_grace_s=cfg.preemption_grace_s)


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
    if cfg.val_n == 0 or cfg.val_every == 0:
        return None
    from composer.utils import dist

    ds = GcStreamingDataset(cfg.data.path, "val", cache_dir(cfg), batch_size=cfg.val_batch, seed=cfg.seed,
                            vocab=cfg.model.vocab, shuffle=False, num_canonical_nodes=cfg.data.num_canonical_nodes)
    clips = ValClips(ds, select_val_ids(ds.manifest, cfg.val_n))
    return DataLoader(clips, batch_size=cfg.val_batch, sampler=dist.get_sampler(clips, shuffle=False),
                      collate_fn=gc_collate, num_workers=0)


# ---- model ----------------------------------------------------------------------------------------------
def build_model(cfg: TrainConfig, text: TextTable, fsdp: bool):
    """GcTrainModel around a GcDiT whose initial values are a pure function of the seed. Under FSDP the DiT stays
    on the meta device: Composer shards it and each rank initialises only its shard. Base / warm-start weights
    come after the Trainer is built (`load_initial_weights`), into the sharded model."""
    from gcc.model import build_gc_dit
    from gcc.objective import GcTrainModel

    dit = build_gc_dit(cfg.model.preset, device="meta" if fsdp else "cpu", vocab=cfg.model.vocab,
                       init_seed=cfg.seed, **cfg.model.overrides)
    # with FSDP, Composer applies activation checkpointing to the blocks itself
    return GcTrainModel(dit, seed=cfg.seed, null_context=text.row(text.null_id), null_id=text.null_id,
                        val_timesteps=tuple(cfg.val_timesteps), grad_ckpt=cfg.model.grad_ckpt and not fsdp,
                        first_frame_cond=cfg.model.first_frame_cond)


def load_initial_weights(dit, cfg: TrainConfig, log=print) -> None:
    """Base Wan weights, then a warm start, into the model as it is (each rank reads only the rows it holds
    when sharded). Not called on resume: the checkpoint brings the weights."""
    from gcc.export import load_gc_weights, load_legacy_zero
    from gcc.model import load_wan_base

    if cfg.model.model_dir:
        load_wan_base(dit, cfg.model.model_dir)
        log(f"model: base Wan weights from {cfg.model.model_dir}")
    if cfg.model.legacy_zero_ckpt:
        load_legacy_zero(dit, cfg.model.legacy_zero_ckpt)
        log(f"model: warm start from DeepSpeed ZeRO checkpoint {cfg.model.legacy_zero_ckpt}")
    if cfg.model.init_ckpt:
        load_gc_weights(dit, cfg.model.init_ckpt)
        log(f"model: warm start from {cfg.model.init_ckpt}")


def parallelism_config(cfg: TrainConfig) -> dict | None:
    """`parallelism: fsdp` is Composer's FSDP2 on GPU and CPU alike, at any world size (a sharded checkpoint
    needs it to be read, also on one rank): each DiT block a unit with activation checkpointing, bf16 compute
    with fp32 master weights and fp32 reduction under amp_bf16, sharded (DCP) checkpoints. `ddp`: None (Composer
    uses DDP when there is more than one rank)."""
    if cfg.parallelism != "fsdp":
        return None
    from composer.utils.parallelism import FSDP2Config

    return {"fsdp": FSDP2Config(reshard_after_forward=cfg.fsdp.reshard_after_forward,
                                activation_checkpointing=cfg.model.grad_ckpt, mixed_precision="DEFAULT",
                                state_dict_type="sharded")}


def resolved_config(cfg: TrainConfig, manifest: dict, per_rank_batch: int) -> dict:
    n_train = manifest["counts"]["train"]
    return {"config": asdict(cfg), "world_size": world_size(), "per_rank_batch": per_rank_batch,
            "grad_accum": cfg.accumulation(world_size()), "data_geometry": manifest["geometry"],
            "data_counts": manifest["counts"], "steps_per_epoch": -(-n_train // cfg.global_batch),
            "samples_per_epoch": n_train}
