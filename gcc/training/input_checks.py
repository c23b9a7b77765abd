"""What a config names outside itself (folders, buckets, weights), checked before any work: `check_inputs`
(every rank does it before the process group; gcc/training/entry.py). The config's own values are checked where it
is loaded (gcc/training/config.py `validate`)."""

from __future__ import annotations

import os
from pathlib import Path

from safetensors import SafetensorError

from gcc import storage
from gcc.cli import folder_problem, input_file_problem
from gcc.inputs import shown
from gcc.settings import ConfigError
from gcc.training.config import TrainConfig, samples_during_training, value_at
from gcc.workers import check_temp_folder

MAX_PARAMS = 50e9  # a model.overrides beyond this is refused (built on the meta device and counted first)


def check_inputs(cfg: TrainConfig) -> None:
    """What the config names outside itself, checked before any work (every rank does it, before the process
    group): the folders it writes (run_dir, data.cache_dir) must be folders; an s3:// data.path or save_folder
    needs a bucket the store serves; the weights it names (model.model_dir, model.init_ckpt,
    model.legacy_zero_ckpt), where they exist, and model.vae_path (when the run samples), must be of the right kind and fit the model, read from their
    headers against the model built on the meta device (nothing allocated). Missing weights and a local
    data.path without a finished conversion are left to rank 0 (a resume loads no weights; data not ready is a
    refusal, exit 3: docs/training.md). Raises ConfigError naming the key; StorageUnavailable when the store
    does not answer."""
    for key in ("run_dir", "data.cache_dir"):  # run_dir "" would be the current folder; data.cache_dir "": the default
        value = value_at(cfg, key)
        problem = (key == "run_dir" or value) and (storage.local_path_problem(value) or folder_problem(value))
        if problem:
            raise ConfigError(f"{key}: {shown(value)}: {problem}")
    for key in ("data.path", "save_folder"):
        url = value_at(cfg, key)
        if url and storage.is_remote(url):
            problem = storage.bucket_problem(url)
            if problem:
                raise ConfigError(f"{key}: {url}: {problem}")
    if cfg.data.num_workers:  # the loader's workers start from a forkserver, whose socket lives in the temp folder
        check_temp_folder()
    if not storage.is_remote(cfg.data.path) and Path(cfg.data.path).is_file():
        raise ConfigError(f"data.path: {cfg.data.path} is a file, expected a convert_data output folder")
    model = cfg.model
    if model.init_ckpt and Path(model.init_ckpt).is_dir():
        raise ConfigError(f"model.init_ckpt: {model.init_ckpt}: is a folder, expected a .safetensors export")
    for key, wanted in (
        ("model_dir", "the Wan2.2-TI2V-5B folder as published"),
        ("legacy_zero_ckpt", "a DeepSpeed ZeRO checkpoint folder"),
    ):
        path = getattr(model, key)
        if path and Path(path).exists() and not Path(path).is_dir():
            raise ConfigError(f"model.{key}: {path}: is a file, expected {wanted}")
    problem = model.vae_path and samples_during_training(cfg) and input_file_problem(model.vae_path)
    if problem:  # unlike weights, a resume needs it too
        raise ConfigError(f"model.vae_path: {model.vae_path}: {problem} (expected Wan2.2_VAE.pth as published)")
    legacy = Path(model.legacy_zero_ckpt) if model.legacy_zero_ckpt else None
    if legacy is not None and legacy.is_dir() and not (legacy / "latest").is_file():
        raise ConfigError(
            f"model.legacy_zero_ckpt: {legacy}: no 'latest' file (expected a DeepSpeed ZeRO "
            f"checkpoint folder as accelerate's save_state writes it)"
        )
    _check_weights_fit(cfg)


def _check_weights_fit(cfg: TrainConfig) -> None:
    if not (cfg.model.overrides or cfg.model.model_dir or cfg.model.init_ckpt):
        return
    # heavy (torch, diffsynth): validating a config without model weights stays light
    from gcc.model.dit import build_gc_dit, count_params, load_wan_base
    from gcc.model.export import load_gc_weights

    try:
        dit = build_gc_dit(cfg.model.preset, device="meta", vocab=cfg.model.vocab, **cfg.model.overrides)
        n = count_params(dit)  # on the meta device: counted, never allocated
        if n > MAX_PARAMS:
            raise ValueError(f"{n / 1e9:.0f} B parameters, more than gcc trains ({MAX_PARAMS / 1e9:.0f} B)")
        head_dim, rem = divmod(dit.config.dim, dit.config.num_heads)
        if rem or head_dim % 2 or head_dim // 3 % 2:  # Wan's 3D RoPE splits a head in three even parts
            raise ValueError(
                f"dim={dit.config.dim} / num_heads={dit.config.num_heads} must give a head width d "
                f"with d and d // 3 even (Wan's 3D RoPE)"
            )
    except (ValueError, TypeError, AssertionError, RuntimeError) as e:
        raise ConfigError(
            f"model.overrides: the {cfg.model.preset!r} preset with {cfg.model.overrides} cannot be "
            f"built ({type(e).__name__}: {e})"
        ) from None
    for key, check in (("model_dir", load_wan_base), ("init_ckpt", load_gc_weights)):
        path = getattr(cfg.model, key)
        if not (path and os.path.exists(path)):  # missing: rank 0 decides (a resume does not load it)
            continue
        try:
            check(dit, path, check_only=True)
        except (ValueError, OSError, SafetensorError) as e:  # GcCkptError is a ValueError; each names the file
            raise ConfigError(
                f"model.{key}: {e} (the model: model.preset {cfg.model.preset!r}, model.vocab {cfg.model.vocab!r})"
            ) from None
