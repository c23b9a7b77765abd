"""Inspect a gc25d export or a model preset.

    gcc-inspect FILE.safetensors   # key count, dtypes, parameter count, metadata; runs check_gc_ckpt
    gcc-inspect FILE.safetensors --model tiny   # ... and checks every key and shape against that preset
    gcc-inspect --model ti2v-5b    # builds the preset on the meta device: key count, parameter count

(also `python -m gcc.tools.inspect_ckpt`). The file's header alone is read (never its tensors, never a model built
from it): without --model its key names must be a GcDiT's and fix the block count, every block shaped alike.
Exit status 2 when the file cannot be read or the check fails, as every gcc tool's for bad input.
"""

from __future__ import annotations

import argparse
import collections
import math
import sys

from gcc import redact
from gcc.cli import ToolParser, fail, input_file_problem
from gcc.errors import BadInput
from gcc.inputs import safetensors_header, shown
from gcc.vocab import VOCABS

PROG = "gcc-inspect"


def inspect_file(path: str, vocab: str | None = None, preset: str | None = None) -> int:
    problem = input_file_problem(path)
    if problem:
        return fail(PROG, f"{shown(path)}: {problem} (expected a .safetensors export)")
    try:
        tensors, meta = safetensors_header(path)  # the header alone, bounded (docs/training.md "Trust and safety")
    except BadInput as e:  # the message names the file
        return fail(PROG, f"cannot be read as safetensors: {e}")
    dtypes = collections.Counter(e.dtype for e in tensors.values())
    n_params = sum(math.prod(e.shape) for e in tensors.values())
    print(f"file       {shown(path)}")
    print(f"keys       {len(tensors)}")
    print(f"dtypes     {dict(dtypes)}")
    print(f"params     {n_params:,} ({n_params / 1e9:.3f} B)")
    print("metadata")
    for k, v in meta.items():
        print(f"  {shown(k, 80)} = {shown(repr(v))}")
    # heavy (torch, diffsynth ~5 s): keeps --help and argument errors fast
    from gcc.model.export import GcCkptError, check_gc_ckpt

    try:
        info = check_gc_ckpt(path, vocab=vocab, preset=preset)
    except GcCkptError as e:
        return fail(PROG, f"check failed: {e}")
    layout = f"the {info['preset']!r} preset" if info["preset"] else "no preset's widths (a run with model.overrides)"
    print(
        f"check_gc_ckpt OK: {info['n_keys']} keys, {info['num_layers']} blocks, vocab {info['vocab']}, shaped as "
        f"{layout}; {info['metadata']['weights']} weights (ema: the EMA of a run's weights)"
    )
    return 0


def inspect_model(name: str, vocab: str) -> int:
    # heavy (torch, diffsynth ~5 s): keeps --help and argument errors fast
    from gcc.model.dit import build_gc_dit, cond_keys, count_params, wan_keys

    m = build_gc_dit(name, device="meta", vocab=vocab)
    n = count_params(m)
    print(f"model      {name} (vocab {vocab}, built on meta)")
    print(f"config     {m.config.to_dict()}")
    print(f"keys       {len(m.state_dict())} ({len(wan_keys(m))} Wan + {len(cond_keys(m))} cond)")
    print(f"params     {n:,} ({n / 1e9:.3f} B)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = ToolParser(PROG, __doc__.rstrip())
    ap.add_argument("file", nargs="?", help="a gc25d .safetensors export")
    ap.add_argument(
        "--model", help="a model preset name, e.g. ti2v-5b or tiny (with FILE: the preset the file must match)"
    )
    ap.add_argument(
        "--vocab",
        choices=VOCABS,
        default=None,
        help="expected vocab (with FILE) / vocab to build (--model alone; default: parts)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    redact.install()  # as run_tool does for the other tools (gcc/cli.py): credentials masked in every report
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.file is None and args.model is None:
        ap.error("give FILE, --model, or both")
    if args.model is not None:
        from gcc.model.dit import PRESETS  # heavy (torch, diffsynth ~5 s): keeps --help and argument errors fast

        if args.model not in PRESETS:
            ap.error(f"--model {shown(args.model)!r}: unknown preset; known: {', '.join(sorted(PRESETS))}")
    if args.file is None:
        return inspect_model(args.model, args.vocab or "parts")
    return inspect_file(args.file, args.vocab, args.model)


if __name__ == "__main__":
    sys.exit(main())
