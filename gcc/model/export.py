"""gc25d safetensors exports (docs/design.md §9.4, §9.9): write, check, and load as warm-start weights.

An export is the GcDiT state dict (Wan keys + gc_sem_cond.*) in BF16 with string metadata. It only "counts" once
it is complete on disk and re-read: writes go to `<path>.tmp<pid>`, are checked and fsynced, then renamed
(`gcc.storage.atomic_path`), so a crash at any instant leaves either no `step-N.safetensors` or a complete, checked one.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from gcc import __version__, exit_codes
from gcc.compat.deepspeed import zero_to_fp32
from gcc.errors import BadInput
from gcc.inputs import TensorEntry, safetensors_header
from gcc.model.dit import COND_PREFIX, PRESETS, GcDiT, build_gc_dit, model_config, read_slice, wan_keys
from gcc.model.fsdp import fill_local
from gcc.storage import atomic_path
from gcc.vocab import VOCABS, num_classes

logger = logging.getLogger(__name__)

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
    "weights",
    "data_limit",
    "git_revision",
    "git_dirty",
    "preset",
)
GC_META = {"arm": "gc25d", "format": "gc25d", "sem_cond": "gc_sem_cond", "mask_channel": "False"}
# what a trainer of this gcc writes unless it says otherwise (a start from step 0 has no resume)
META_DEFAULTS = {
    "stage": "sft_bidirectional",
    "cond_type": "ids",
    "cond_key": "ids",
    "trainer": f"gcc {__version__}",
    "resumed_from": "",
    "resumed_step": "",
    "weights": "raw",
    "data_limit": "",
    "git_revision": "",
    "git_dirty": "",
    "preset": "",
}
# `weights`: which weights the file holds, the trained ones or their EMA (algorithms.ema); an export written before
# the key existed holds the raw ones and reads as such
WEIGHTS = ("raw", "ema")
# a key older exports lack -> the value they read as: `data_limit` "" (the whole split, the only way an export could
# say it then), the code's provenance (gcc/provenance.py) "" (unknown)
LATER_KEYS = {"weights": "raw", "data_limit": "", "git_revision": "", "git_dirty": "", "preset": ""}
# `preset`: the model preset the run trained (model.preset; "" with model.overrides, whose layout no preset names,
# and in an export written before the key existed): gcc-sample builds that model unless --model says otherwise.
# The lineage keys the legacy trainer wrote only after its lineage fix: an export of before is read as not resumed,
# with one warning (`read_export`)
LINEAGE_KEYS = {"resumed_from": "", "resumed_step": ""}
_warned_lineage: set[str] = set()
EXPORT_DTYPE = torch.bfloat16
_ST_DTYPE = "BF16"


class GcCkptError(ValueError):
    """A file that is not a valid gc25d export (or not loadable into this model); the message names it."""

    exit_code = exit_codes.CONFIG


def _s(v: Any) -> str:
    return "" if v is None else str(v)


def gc_metadata(**values: Any) -> dict[str, str]:
    """The export metadata (docs/design.md §9.9) in META_KEYS' order, every value a string (None -> ""): GC_META, and
    `values` (the trainer's: gcc/training/builders.py export_metadata) over META_DEFAULTS. A key of GC_META or
    outside META_KEYS, or one missing, is a ValueError naming it (a caller's mistake: the file would be refused)."""
    unexpected = sorted(set(values) - set(META_KEYS) | set(values) & set(GC_META))
    missing = sorted(set(META_KEYS) - set(GC_META) - set(META_DEFAULTS) - set(values))
    if unexpected or missing:
        raise ValueError(f"export metadata: unexpected {unexpected}, missing {missing} (docs/design.md §9.9)")
    meta = {**GC_META, **META_DEFAULTS, **{k: _s(v) for k, v in values.items()}}
    return {k: meta[k] for k in META_KEYS}


def _check_metadata(meta: Mapping[str, Any], where: str, written: bool = False) -> None:
    """The metadata of an export read (an older one may lack LATER_KEYS and LINEAGE_KEYS), or `written` by this gcc
    (every key of META_KEYS)."""
    keys = set(meta) if written else set(meta) | set(LATER_KEYS) | set(LINEAGE_KEYS)
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
            raise GcCkptError(f"{where}: metadata {k}={meta[k][:80]!r}, expected {v!r}")
    if meta["vocab"] not in VOCABS:
        raise GcCkptError(f"{where}: metadata vocab={meta['vocab'][:80]!r} is not one of {VOCABS}")
    if meta.get("weights", "raw") not in WEIGHTS:
        raise GcCkptError(f"{where}: metadata weights={meta['weights'][:80]!r} is not one of {WEIGHTS}")
    if meta.get("git_dirty", "") not in ("", "True", "False"):
        raise GcCkptError(f'{where}: metadata git_dirty={meta["git_dirty"][:80]!r}, expected True, False or ""')
    if meta.get("preset", "") not in ("", *PRESETS):
        raise GcCkptError(f'{where}: metadata preset={meta["preset"][:80]!r} is not one of {sorted(PRESETS)} or ""')
    if not re.fullmatch(r"|[1-9][0-9]{0,18}", meta.get("data_limit", "")):
        raise GcCkptError(
            f'{where}: metadata data_limit={meta["data_limit"][:80]!r}, expected a number of clips or "" (none)'
        )


# a block's key: `blocks.<index>.<suffix>`; an index of more than 9 digits is no GcDiT's
_BLOCK_KEY = re.compile(r"blocks\.(0|[1-9][0-9]{0,8})\.(.+)", re.DOTALL)
# the dtypes a plain Wan export may hold (the copy into the model casts them); a gc25d export is BF16 alone
_WAN_DTYPES = ("BF16", "F16", "F32", "F64")


@lru_cache(maxsize=16)
def _structure(preset: str, vocab: str) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """({key outside the blocks: shape}, {a block's key suffix: shape}) of the preset, read from the preset built
    with ONE block on the meta device: every other block is that block again, so the layout of any block count is
    known without building a model of that many blocks."""
    sd = build_gc_dit(model_config(preset, num_layers=1, vocab=vocab), device="meta").state_dict()
    outside = {k: tuple(v.shape) for k, v in sd.items() if not k.startswith("blocks.")}
    block = {k[len("blocks.0.") :]: tuple(v.shape) for k, v in sd.items() if k.startswith("blocks.0.")}
    return outside, block


def preset_layout(preset: str, vocab: str, num_layers: int | None = None) -> dict[str, tuple[int, ...]]:
    """{key: shape} of the preset's GcDiT (its own block count unless `num_layers` is given)."""
    outside, block = _structure(preset, vocab)
    n = PRESETS[preset].num_layers if num_layers is None else num_layers
    return {**outside, **{f"blocks.{i}.{s}": shape for i in range(n) for s, shape in block.items()}}


def gc_key_set(num_layers: int) -> frozenset[str]:
    """The export key set of a GcDiT with `num_layers` blocks (key names do not depend on widths)."""
    return frozenset(preset_layout("tiny", "parts", num_layers))


def _block_count(keys, where: str) -> int:
    """The number of blocks a key set holds, from the names alone and bounded by them: every key is one of a
    GcDiT (outside the blocks, or a block's), and the block indices are exactly 0..n-1 with n the number of
    distinct indices, so n never exceeds the number of keys (a key `blocks.100000000.x` is refused by name, it
    never becomes a model of that many blocks)."""
    outside, block = _structure("tiny", "parts")  # key names do not depend on widths or vocab
    indices: dict[int, str] = {}
    for k in keys:
        m = _BLOCK_KEY.fullmatch(k)
        if m is None or m[2] not in block:
            if k not in outside:
                raise GcCkptError(f"{where}: unexpected key {k[:120]!r}, not a key of a GcDiT")
            continue
        indices.setdefault(int(m[1]), k)
    n = len(indices)
    for i, k in sorted(indices.items()):
        if i >= n:
            raise GcCkptError(
                f"{where}: key {k[:120]!r} names block {i}, but the file holds {n} block(s): expected "
                f"indices 0..{n - 1}"
            )
    return n


def _key_diff(have: set[str], want: set[str], where: str) -> None:
    missing, unexpected = sorted(want - have), sorted(have - want)
    if missing or unexpected:
        raise GcCkptError(
            f"{where}: key set differs: missing {missing[:8]}{'...' if len(missing) > 8 else ''} "
            f"({len(missing)}), unexpected {[k[:120] for k in unexpected[:8]]}"
            f"{'...' if len(unexpected) > 8 else ''} ({len(unexpected)})"
        )


def _header(path: str) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    try:
        return safetensors_header(path)
    except BadInput as e:  # the message names the file
        raise GcCkptError(f"cannot be read as safetensors: {e}") from None


def _matching_preset(tensors: Mapping[str, TensorEntry], vocab: str, n: int) -> str | None:
    """The preset whose layout with `n` blocks is the file's, or None (a run with model.overrides)."""
    for name in PRESETS:
        if all(tensors[k].shape == shape for k, shape in preset_layout(name, vocab, n).items()):
            return name
    return None


def _check_shapes_alike(tensors: Mapping[str, TensorEntry], vocab: str, where: str) -> None:
    """Without a declared preset: every tensor has the rank of its GcDiT key, every block is shaped as block 0,
    and the cond's input is the vocab's width."""
    outside, block = _structure("tiny", vocab)
    for k in sorted(tensors):
        m = _BLOCK_KEY.fullmatch(k) if k.startswith("blocks.") else None
        ref = outside[k] if m is None else block[m[2]]
        shape = tensors[k].shape
        if len(shape) != len(ref):
            raise GcCkptError(
                f"{where}: {k} has shape {shape}, expected {len(ref)} dimension(s), as in every GcDiT"
                + (f" ({ref} in the 'tiny' preset)" if ref else "")
            )
        if m is not None and shape != tensors[f"blocks.0.{m[2]}"].shape:
            raise GcCkptError(
                f"{where}: {k} has shape {shape}, expected {tensors[f'blocks.0.{m[2]}'].shape} (as blocks.0.{m[2]}: "
                "every block is alike)"
            )


def _check_cond_width(tensors: Mapping[str, TensorEntry], vocab: str, where: str) -> None:
    k = COND_PREFIX + "proj_in.weight"
    if tensors[k].shape[1] != num_classes(vocab):  # its rank is checked first
        raise GcCkptError(
            f"{where}: {k} has {tensors[k].shape[1]} input classes, vocab {vocab!r} has {num_classes(vocab)}"
        )


def read_export(
    path: str | os.PathLike,
    expected: Mapping[str, tuple[int, ...]] | None = None,
    vocab: str | None = None,
    preset: str | None = None,
    allow_wan: bool = False,
    vocab_from: str = "the expected",
) -> dict:
    """The one reader of an export's header (docs/training.md, "Trust and safety"): gcc-inspect, gcc-sample and
    the trainer's warm start all come here before a tensor is read or a model is built from a file.

    The header alone is read (`gcc.inputs.safetensors_header`: its size bounded, every tensor's bytes inside the
    file), then the metadata (docs/design.md §9.9) and the vocab (== `vocab` when given), then the key set and every
    tensor's dtype and shape against the layout declared by the caller: `expected` ({key: shape}, a model's), or
    the `preset` (its own block count), or, with neither, the key names of a GcDiT whose block count the names
    bound (`_block_count`). Any difference is a GcCkptError naming the file, the key and what was expected.

    `allow_wan`: a plain Wan export (no gc25d metadata, no cond keys) is accepted, its keys checked against the
    Wan keys of the layout. Returns {"tensors": {key: TensorEntry}, "metadata" (a gc25d export's with every key:
    one an older export lacks has the value it reads as, `LATER_KEYS`), "kind": "gc25d"|"wan", "vocab",
    "num_layers", "preset" (the caller's; else the one the export's metadata records, or the one whose layout the
    file matches, or None)}."""
    path = str(path)
    tensors, meta = _header(path)
    has_cond = any(k.startswith(COND_PREFIX) for k in tensors)
    if meta.get("format") != "gc25d" and (has_cond or not allow_wan):
        what = f"holds {COND_PREFIX}* keys but is " if has_cond and allow_wan else ""
        fmt = meta.get("format")
        raise GcCkptError(f"{path}: {what}not a gc25d export (metadata format={fmt if fmt is None else fmt[:40]!r})")
    kind = "gc25d" if meta.get("format") == "gc25d" else "wan"
    if kind == "gc25d":
        _check_metadata(meta, path)
        lacking = [k for k in LINEAGE_KEYS if k not in meta]
        if lacking and path not in _warned_lineage:
            _warned_lineage.add(path)
            logger.warning(
                f"{path}: no {' or '.join(lacking)} in its metadata (an export of the legacy trainer, written "
                f"before its lineage fix): read as not resumed"
            )
        meta = {**meta, **{k: v for k, v in {**LATER_KEYS, **LINEAGE_KEYS}.items() if k not in meta}}
        if vocab is not None and meta["vocab"] != vocab:
            raise GcCkptError(f"{path}: vocab {meta['vocab']!r} differs from {vocab_from} {vocab!r}")
    file_vocab = meta["vocab"] if kind == "gc25d" else (vocab or "parts")
    if expected is None and preset is not None:
        expected = preset_layout(preset, file_vocab)
    if expected is not None:
        want = {k: s for k, s in expected.items() if kind == "gc25d" or not k.startswith(COND_PREFIX)}
        _key_diff(set(tensors), set(want), path)
        n = len({k.split(".")[1] for k in want if k.startswith("blocks.")})  # the caller's, not the file's
    else:
        n = _block_count(tensors, path)
        _key_diff(set(tensors), set(gc_key_set(n)), path)
    dtypes = (_ST_DTYPE,) if kind == "gc25d" else _WAN_DTYPES
    for k in sorted(tensors):
        if tensors[k].dtype not in dtypes:
            raise GcCkptError(f"{path}: {k} is {tensors[k].dtype}, expected {' or '.join(dtypes)}")
    if expected is not None:
        who = f"the {preset!r} preset" if preset is not None else "the model"
        for k in sorted(want):
            if tensors[k].shape != tuple(want[k]):
                raise GcCkptError(f"{path}: {k} has shape {tensors[k].shape}, {who} expects {tuple(want[k])}")
    else:
        _check_shapes_alike(tensors, file_vocab, path)
        # the model the run trained, as the export records it; else the preset whose layout the file has
        preset = (meta["preset"] if kind == "gc25d" else "") or _matching_preset(tensors, file_vocab, n)
    if kind == "gc25d":
        _check_cond_width(tensors, file_vocab, path)
    return {"tensors": tensors, "metadata": meta, "kind": kind, "vocab": file_vocab, "num_layers": n, "preset": preset}


def check_gc_ckpt(
    path: str | os.PathLike,
    vocab: str | None = None,
    expected: Mapping[str, tuple[int, ...]] | None = None,
    preset: str | None = None,
) -> dict:
    """Check a gc25d export (`read_export`): metadata (docs/design.md §9.9), vocab (== `vocab` if given), key set,
    every tensor BF16 and of the expected shape (`expected`, or the `preset`'s, else GcDiT-shaped), cond input width
    = the vocab's V. Returns a summary."""
    info = read_export(path, expected=expected, vocab=vocab, preset=preset)
    tensors = info["tensors"]
    return {
        "path": str(path),
        "n_keys": len(tensors),
        "num_layers": info["num_layers"],
        "n_params": sum(math.prod(e.shape) for e in tensors.values()),
        "vocab": info["vocab"],
        "preset": info["preset"],
        "dtypes": dict(collections.Counter(e.dtype for e in tensors.values())),
        "metadata": dict(info["metadata"]),
    }


def save_gc(state_dict: Mapping[str, torch.Tensor], path: str | os.PathLike, metadata: Mapping[str, str]) -> Path:
    """Write an export atomically: BF16, `dit.` prefix stripped, written to a temporary name, checked, then fsynced and renamed (mode 644)."""
    path = Path(path)
    _check_metadata(metadata, str(path), written=True)
    tensors = {
        (k[4:] if k.startswith("dit.") else k): v.detach().to("cpu", EXPORT_DTYPE).contiguous()
        for k, v in state_dict.items()
    }
    # refuse anything but a GcDiT state dict before touching the disk
    where = f"{path} (state dict to export)"
    _key_diff(set(tensors), set(gc_key_set(_block_count(tensors, where))), where)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=dict(metadata))
        check_gc_ckpt(tmp, vocab=metadata["vocab"], expected={k: tuple(v.shape) for k, v in tensors.items()})
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
        fill_local(params[k], partial(read, k))
    if not has_cond:
        model.reset_cond()


def load_gc_weights(model: GcDiT, path: str | os.PathLike, check_only: bool = False) -> dict:
    """Warm start from a gc25d export of the model's vocab, or from a plain Wan export (no gc_sem_cond.* keys:
    the cond starts at zero). Returns {"kind": "gc25d"|"wan", "path", "vocab"}. The file's header is checked
    against `model` first (`read_export`); with `check_only` nothing more is read, and `model` may be on the meta
    device: a file that does not fit is refused before the model is built."""
    path = str(path)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    info = read_export(path, expected=expected, vocab=model.vocab, allow_wan=True, vocab_from="the model's")
    has_cond = info["kind"] == "gc25d"
    if not check_only:
        shapes = {k: e.shape for k, e in info["tensors"].items()}
        try:
            fh = safe_open(path, "pt")
        except Exception as e:  # changed since its header was read
            raise GcCkptError(f"{path}: cannot be read as safetensors: {e}") from e
        with fh:
            _load_checked(model, shapes, lambda k, sl: read_slice(fh, k, sl), path, has_cond)
    return {"kind": info["kind"], "path": path, "vocab": info["vocab"] if has_cond else model.vocab}


def load_legacy_zero(model: GcDiT, ckpt_dir: str | os.PathLike, tag: str | None = None) -> dict:
    """Warm start from a legacy accelerate + DeepSpeed ZeRO `save_state` directory, consolidated by deepspeed's
    own zero_to_fp32. Needs the optional extra `legacy` (deepspeed)."""
    try:
        get_fp32_state_dict_from_zero_checkpoint = zero_to_fp32()
    except ImportError as e:
        raise RuntimeError(
            "importing a DeepSpeed ZeRO checkpoint needs deepspeed, the optional extra `legacy`: "
            "pip install --no-build-isolation -c constraints.txt deepspeed (docs/training.md, Warm start and lineage)"
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
    "META_DEFAULTS",
    "META_KEYS",
    "WEIGHTS",
    "GcCkptError",
    "check_gc_ckpt",
    "gc_key_set",
    "gc_metadata",
    "load_gc_weights",
    "load_legacy_zero",
    "load_state_dict_gc",
    "preset_layout",
    "read_export",
    "save_gc",
]
