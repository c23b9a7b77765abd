"""The DiT to sample with: a checkpoint's vocab and kind, and loading its weights (or the base Wan weights)."""

from __future__ import annotations

import logging
import os

from safetensors import SafetensorError

from gcc.cli import input_file_problem
from gcc.inputs import shown
from gcc.tools.sample.errors import SampleError

logger = logging.getLogger(__name__)


def ckpt_vocab(path: str | os.PathLike, requested: str | None, model: str | None = None) -> tuple[str, str, str]:
    """(vocab, kind, weights) of a checkpoint: a gc25d export's metadata vocab (a `requested` vocab that differs is
    an error) and `weights` (raw, or ema: the EMA export of a run with algorithms.ema), or `requested` (default
    parts) for a plain Wan export (raw). Its header alone is read and checked against the `model` preset
    (`gcc.model.export.read_export`: key set, dtypes, shapes), before any model is built."""
    # heavy (diffsynth, ~4 s): gcc-sample imports this module; keeps --help and argument errors fast
    from gcc.model.export import GcCkptError, read_export

    path = str(path)
    problem = input_file_problem(path)
    if problem:
        raise SampleError(f"--ckpt {shown(path)}: {problem} (expected a .safetensors export)")
    try:
        info = read_export(path, preset=model, vocab=None, allow_wan=True)
    except GcCkptError as e:
        raise SampleError(f"--ckpt {e}" + (f" (the model: --model {model!r})" if model else "")) from None
    if info["kind"] == "wan":
        return requested or "parts", "wan", "raw"
    if requested is not None and info["vocab"] != requested:
        raise SampleError(
            f"--ckpt {shown(path)} has vocab {info['vocab']!r} (metadata), but --vocab {requested!r} was requested"
        )
    return info["vocab"], "gc25d", info["metadata"]["weights"]


def ckpt_model(path: str | os.PathLike) -> str:
    """The model preset to build for a checkpoint when --model is not given: the one its metadata records (the
    run's model.preset), else the one whose layout its header has (an export of an earlier gcc, a plain Wan
    export). A SampleError asking for --model when neither says."""
    from gcc.model.export import GcCkptError, read_export  # heavy (diffsynth): as in ckpt_vocab

    path = str(path)
    problem = input_file_problem(path)
    if problem:
        raise SampleError(f"--ckpt {shown(path)}: {problem} (expected a .safetensors export)")
    try:
        info = read_export(path, allow_wan=True)
    except GcCkptError as e:
        raise SampleError(f"--ckpt {e}") from None
    if info["preset"] is None:
        raise SampleError(
            f"--ckpt {shown(path)}: its metadata records no model preset and its layout is none of the presets' "
            f"(a run with model.overrides?): pass --model"
        )
    logger.info(
        f"model: {info['preset']} ("
        + ("the export's metadata" if info["metadata"].get("preset") else "the export's layout")
        + "; --model overrides it)"
    )
    return info["preset"]


def check_fits(model: str, vocab: str, ckpt: str | None = None, model_dir: str | None = None) -> None:
    """The weights `load_dit` would load, checked against the `model` preset from their headers alone (keys,
    shapes, vocab), with the model on the meta device: a checkpoint of another size is refused at once, not
    after the preset is built in full (the 5B preset takes minutes and tens of GB on a CPU)."""
    # heavy (diffsynth, ~4 s): gcc-sample imports this module; keeps --help and argument errors fast
    from gcc.model.dit import build_gc_dit, load_wan_base
    from gcc.model.export import load_gc_weights

    dit = build_gc_dit(model, device="meta", vocab=vocab)
    flag = "--ckpt" if ckpt else "--model_dir"
    try:
        if ckpt:
            load_gc_weights(dit, ckpt, check_only=True)
        else:
            assert model_dir is not None  # without --ckpt, --model_dir is required (cli.py)
            load_wan_base(dit, model_dir, check_only=True)
    except (ValueError, OSError, SafetensorError) as e:  # GcCkptError is a ValueError
        raise SampleError(f"{flag}: {e} (the model: --model {model!r}, vocab {vocab!r})") from None


def load_dit(model: str, vocab: str, device, dtype, ckpt: str | None = None, model_dir: str | None = None):
    """The `model` preset's GcDiT with the gc25d/Wan export `ckpt`, or the base Wan weights of `model_dir`."""
    # heavy (diffsynth, ~4 s): gcc-sample imports this module; keeps --help and argument errors fast
    from gcc.model.dit import build_gc_dit, load_wan_base
    from gcc.model.export import GcCkptError, load_gc_weights

    dit = build_gc_dit(model, device=device, vocab=vocab)
    try:
        if ckpt:
            load_gc_weights(dit, ckpt)
        else:
            assert model_dir is not None  # without --ckpt, --model_dir is required (cli.py)
            load_wan_base(dit, model_dir)
    except (GcCkptError, FileNotFoundError) as e:
        raise SampleError(str(e)) from None
    except ValueError as e:
        raise SampleError(f"{ckpt or model_dir}: does not fit the {model!r} model: {e}") from None
    return dit.to(dtype).eval().requires_grad_(False)
