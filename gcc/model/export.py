"""gc25d safetensors exports (docs/design.md §9.4, §9.9): write, check, and load as warm-start weights.

An export is the GcDiT state dict (Wan keys + gc_sem_cond.*) in BF16 with string metadata. It only "counts" once
it is complete on disk and re-read: writes go to `<path>.tmp<pid>`, are checked and fsynced, then renamed
(`gcc.storage.atomic_path`), so a crash at any instant leaves either no `step-N.safetensors` or a complete, checked one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from gcc import __version__
from gcc.compat.deepspeed import zero_to_fp32
from gcc.model.dit import COND_PREFIX, GcDiT, build_gc_dit, model_config, read_slice, wan_keys
from gcc.model.fsdp import fill_local
from gcc.storage import atomic_path
from gcc.vocab import VOCABS, num_classes

# docs/design.md §9.9, in order
META_KEYS = (
    "arm",
    "format",
    "sem_cond",
    "mask_channel",
    "vocab",
    "data",
    "data_root",
    "step",
    "stage",
    "cond_type",
    "cond_key",
    "text_dropout",
    "cond_dropout",
    "mask_p",
    "lr",
    "cond_lr",
    "weight_decay",
    "warmup_steps",
    "first_frame_cond",
    "seed",
    "init_ckpt",
    "model_dir",
    "trainer",
    "resumed_from",
    "resumed_step",
)
GC_META = {"arm": "gc25d", "format": "gc25d", "sem_cond": "gc_sem_cond", "mask_channel": "False"}
EXPORT_DTYPE = torch.bfloat16
_ST_DTYPE = "BF16"


class GcCkptError(ValueError):
    """A file that is not a valid gc25d export (or not loadable into this model); the message names it."""


def _s(v: Any) -> str:
    return "" if v is None else str(v)


def gc_metadata(
    *,
    vocab: str,
    data: str,
    data_root: str,
    step: int,
    text_dropout: float,
    cond_dropout: float,
    mask_p: float,
    lr: float,
    cond_lr: float,
    weight_decay: float,
    warmup_steps: int,
    first_frame_cond: bool,
    seed: int,
    init_ckpt: str,
    model_dir: str,
    resumed_from: str = "",
    resumed_step: int | str = "",
    stage: str = "sft_bidirectional",
    cond_type: str = "ids",
    cond_key: str = "ids",
    trainer: str = f"gcc {__version__}",
) -> dict[str, str]:
    """The export metadata (docs/design.md §9.9), every value a string (None -> "")."""
    fields = dict(
        vocab=vocab,
        data=data,
        data_root=data_root,
        step=step,
        stage=stage,
        cond_type=cond_type,
        cond_key=cond_key,
        text_dropout=text_dropout,
        cond_dropout=cond_dropout,
        mask_p=mask_p,
        lr=lr,
        cond_lr=cond_lr,
        weight_decay=weight_decay,
        warmup_steps=warmup_steps,
        first_frame_cond=first_frame_cond,
        seed=seed,
        init_ckpt=init_ckpt,
        model_dir=model_dir,
        trainer=trainer,
        resumed_from=resumed_from,
        resumed_step=resumed_step,
    )
    meta = {**GC_META, **{k: _s(v) for k, v in fields.items()}}
    return {k: meta[k] for k in META_KEYS}


def _check_metadata(meta: Mapping[str, Any], where: str) -> None:
    keys = set(meta)
    if keys != set(META_KEYS):
        raise GcCkptError(
            f"{where}: metadata keys differ from docs/design.md §9.9: missing {sorted(set(META_KEYS) - keys)}, "
            f"unexpected {sorted(keys - set(META_KEYS))}"
        )
    bad = [k for k, v in meta.items() if not isinstance(v, str)]
    if bad:
        raise GcCkptError(f"{where}: metadata values must be strings: {bad}")
    for k, v in GC_META.items():
        if meta[k] != v:
            raise GcCkptError(f"{where}: metadata {k}={meta[k]!r}, expected {v!r}")
    if meta["vocab"] not in VOCABS:
        raise GcCkptError(f"{where}: metadata vocab={meta['vocab']!r} is not one of {VOCABS}")


@lru_cache(maxsize=8)
def gc_key_set(num_layers: int) -> frozenset[str]:
    """The export key set of a GcDiT with `num_layers` blocks (key names do not depend on widths)."""
    return frozenset(build_gc_dit(model_config("tiny", num_layers=num_layers), device="meta").state_dict())


def _num_layers(keys) -> int:
    idx = {int(k.split(".")[1]) for k in keys if k.startswith("blocks.") and k.split(".")[1].isdigit()}
    return max(idx) + 1 if idx else 0


def _key_diff(have: set[str], want: set[str], where: str) -> None:
    missing, unexpected = sorted(want - have), sorted(have - want)
    if missing or unexpected:
        raise GcCkptError(
            f"{where}: key set differs: missing {missing[:8]}{'...' if len(missing) > 8 else ''} "
            f"({len(missing)}), unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''} "
            f"({len(unexpected)})"
        )


def check_gc_ckpt(path: str | os.PathLike, vocab: str | None = None, expected_keys: set[str] | None = None) -> dict:
    """Check a gc25d export: metadata (docs/design.md §9.9), vocab (== `vocab` if given), key set (== `expected_keys`, else the
    GcDiT key set for its block count), every tensor BF16, cond input width = the vocab's V. Returns a summary."""
    path = str(path)
    try:
        fh = safe_open(path, "pt")
    except Exception as e:  # not a safetensors file at all
        raise GcCkptError(f"{path}: cannot be read as safetensors: {e}") from e
    with fh:
        meta = fh.metadata() or {}
        if meta.get("format") != "gc25d":
            raise GcCkptError(f"{path}: not a gc25d export (metadata format={meta.get('format')!r})")
        _check_metadata(meta, path)
        if vocab is not None and meta["vocab"] != vocab:
            raise GcCkptError(f"{path}: vocab {meta['vocab']!r} differs from the expected {vocab!r}")
        keys = set(fh.keys())
        _key_diff(keys, set(expected_keys) if expected_keys is not None else set(gc_key_set(_num_layers(keys))), path)
        n_params = 0
        for k in sorted(keys):
            sl = fh.get_slice(k)
            if sl.get_dtype() != _ST_DTYPE:
                raise GcCkptError(f"{path}: {k} is {sl.get_dtype()}, expected {_ST_DTYPE}")
            shape = sl.get_shape()
            n_params += int(torch.Size(shape).numel())
            if k == COND_PREFIX + "proj_in.weight" and shape[1] != num_classes(meta["vocab"]):
                raise GcCkptError(
                    f"{path}: {k} has {shape[1]} input classes, vocab {meta['vocab']!r} has "
                    f"{num_classes(meta['vocab'])}"
                )
    return {
        "path": path,
        "n_keys": len(keys),
        "num_layers": _num_layers(keys),
        "n_params": n_params,
        "vocab": meta["vocab"],
        "metadata": dict(meta),
    }


def save_gc(state_dict: Mapping[str, torch.Tensor], path: str | os.PathLike, metadata: Mapping[str, str]) -> Path:
    """Write an export atomically: BF16, `dit.` prefix stripped, written to a temporary name, checked, then fsynced and renamed (mode 644)."""
    path = Path(path)
    _check_metadata(metadata, str(path))
    tensors = {
        (k[4:] if k.startswith("dit.") else k): v.detach().to("cpu", EXPORT_DTYPE).contiguous()
        for k, v in state_dict.items()
    }
    # refuse anything but a GcDiT state dict before touching the disk
    _key_diff(set(tensors), set(gc_key_set(_num_layers(tensors))), f"{path} (state dict to export)")
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=dict(metadata))
        check_gc_ckpt(tmp, vocab=metadata["vocab"], expected_keys=set(tensors))
    return path


# ---- import ------------------------------------------------------------------------------------------------


@torch.no_grad()
def _load_checked(
    model: GcDiT,
    shapes: Mapping[str, tuple],
    read: Callable[[str, tuple], torch.Tensor],
    where: str,
    has_cond: bool,
    check_only: bool = False,
) -> None:
    """Verify the key set and every shape first, then copy (`read(key, slices)`: that part of the full tensor;
    an FSDP-sharded model asks each rank for its rows only); without cond keys (plain Wan) the cond restarts at
    its initial, zero-output values. Nothing is modified if any check fails, nor with `check_only`."""
    params = model.state_dict()
    want = set(params) if has_cond else set(wan_keys(model))
    _key_diff(set(shapes), want, where)
    for k in sorted(want):
        if tuple(shapes[k]) != tuple(params[k].shape):
            raise GcCkptError(f"{where}: {k} has shape {tuple(shapes[k])}, model expects {tuple(params[k].shape)}")
    if check_only:
        return
    for k in sorted(want):
        fill_local(params[k], lambda sl, k=k: read(k, sl))
    if not has_cond:
        model.reset_cond()


def load_gc_weights(model: GcDiT, path: str | os.PathLike, check_only: bool = False) -> dict:
    """Warm start from a gc25d export of the model's vocab, or from a plain Wan export (no gc_sem_cond.* keys:
    the cond starts at zero). Returns {"kind": "gc25d"|"wan", "path", "vocab"}. With `check_only` nothing is read
    but the file's header (keys, shapes, metadata), checked against `model`, which may be on the meta device: a
    file that does not fit is refused before the model is built."""
    path = str(path)
    try:
        fh = safe_open(path, "pt")
    except Exception as e:
        raise GcCkptError(f"{path}: cannot be read as safetensors: {e}") from e
    with fh:
        meta = fh.metadata() or {}
        keys = list(fh.keys())
        has_cond = any(k.startswith(COND_PREFIX) for k in keys)
        if has_cond or meta.get("format") == "gc25d":
            if meta.get("format") != "gc25d":
                raise GcCkptError(
                    f"{path}: holds {COND_PREFIX}* keys but is not a gc25d export "
                    f"(metadata format={meta.get('format')!r})"
                )
            if meta.get("vocab") != model.vocab:
                raise GcCkptError(f"{path}: vocab {meta.get('vocab')!r} differs from the model's {model.vocab!r}")
            has_cond = True  # a gc25d file must carry the cond; missing ones are reported by the key check
        shapes = {k: tuple(fh.get_slice(k).get_shape()) for k in keys}
        _load_checked(model, shapes, lambda k, sl: read_slice(fh, k, sl), path, has_cond, check_only)
    return {"kind": "gc25d" if has_cond else "wan", "path": path, "vocab": meta.get("vocab", model.vocab)}


def load_legacy_zero(model: GcDiT, ckpt_dir: str | os.PathLike, tag: str | None = None) -> dict:
    """Warm start from a legacy accelerate + DeepSpeed ZeRO `save_state` directory, consolidated by deepspeed's
    own zero_to_fp32. Needs the optional extra `legacy` (deepspeed)."""
    try:
        get_fp32_state_dict_from_zero_checkpoint = zero_to_fp32()
    except ImportError as e:
        raise RuntimeError(
            "importing a DeepSpeed ZeRO checkpoint needs deepspeed: install the optional extra "
            "`legacy` (pip install 'gcc[legacy]')"
        ) from e
    # lazy: tensors are gathered one at a time while copying (a 5B fp32 state dict would be another 20 GB)
    sd = get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag, lazy_mode=True)
    return load_state_dict_gc(model, sd, str(ckpt_dir))


def load_state_dict_gc(model: GcDiT, state_dict: Mapping[str, torch.Tensor], where: str) -> dict:
    """Load a state dict (legacy trainers wrap the DiT as `dit.`, DDP/accelerate may add `module.`). Values may be
    tensors or lazy tensors with `.shape` and `.contiguous()` (deepspeed's zero_to_fp32 lazy mode)."""
    sd = {}
    for k, v in state_dict.items():
        for prefix in ("module.", "dit."):
            if k.startswith(prefix):
                k = k[len(prefix) :]
        sd[k] = v
    has_cond = any(k.startswith(COND_PREFIX) for k in sd)
    _load_checked(
        model, {k: tuple(v.shape) for k, v in sd.items()}, lambda k, sl: sd[k].contiguous()[sl], where, has_cond
    )
    return {"kind": "gc25d" if has_cond else "wan", "path": where, "vocab": model.vocab}


__all__ = [
    "GC_META",
    "META_KEYS",
    "GcCkptError",
    "check_gc_ckpt",
    "gc_key_set",
    "gc_metadata",
    "load_gc_weights",
    "load_legacy_zero",
    "load_state_dict_gc",
    "save_gc",
]
