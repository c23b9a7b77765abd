"""Inspect a gc25d export or a model preset.

    gcc-inspect FILE.safetensors   # key count, dtypes, parameter count, metadata; runs check_gc_ckpt
    gcc-inspect --model ti2v-5b    # builds the preset on the meta device: key count, parameter count

(also `python -m gcc.tools.inspect_ckpt`). Exit status 2 when the file cannot be read or the check fails, as
every gcc tool's for bad input (gcc/cli.py).
"""

from __future__ import annotations

import argparse
import collections
import math
import sys

from safetensors import safe_open

from gcc import redact
from gcc.cli import fail, input_file_problem
from gcc.vocab import VOCABS

PROG = "gcc-inspect"


def inspect_file(path: str, vocab: str | None = None) -> int:
    problem = input_file_problem(path)
    if problem:
        return fail(PROG, f"{path}: {problem} (expected a .safetensors export)")
    # heavy (torch, diffsynth ~5 s): keeps --help and argument errors fast
    from gcc.model.export import GcCkptError, check_gc_ckpt

    try:
        with safe_open(path, "pt") as fh:
            keys = list(fh.keys())
            dtypes = collections.Counter(fh.get_slice(k).get_dtype() for k in keys)
            n_params = sum(math.prod(fh.get_slice(k).get_shape()) for k in keys)
            meta = fh.metadata() or {}
    except Exception as e:
        return fail(PROG, f"{path}: cannot be read as safetensors: {e}")
    print(f"file       {path}")
    print(f"keys       {len(keys)}")
    print(f"dtypes     {dict(dtypes)}")
    print(f"params     {n_params:,} ({n_params / 1e9:.3f} B)")
    print("metadata")
    for k, v in meta.items():
        print(f"  {k} = {v!r}")
    try:
        info = check_gc_ckpt(path, vocab=vocab)
    except GcCkptError as e:
        return fail(PROG, f"check failed: {e}")
    print(f"check_gc_ckpt OK: {info['n_keys']} keys, {info['num_layers']} blocks, vocab {info['vocab']}")
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
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", nargs="?", help="a gc25d .safetensors export")
    ap.add_argument("--model", help="a model preset name, e.g. ti2v-5b or tiny")
    ap.add_argument(
        "--vocab", choices=VOCABS, default=None, help="expected vocab (file) / vocab to build (model; default parts)"
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    redact.install()  # as run_tool does for the other tools (gcc/cli.py): credentials masked in every report
    ap = build_parser()
    args = ap.parse_args(argv)
    if (args.file is None) == (args.model is None):
        ap.error("give exactly one of FILE or --model")
    if args.model is not None:
        from gcc.model.dit import PRESETS  # heavy (torch, diffsynth ~5 s): keeps --help and argument errors fast

        if args.model not in PRESETS:
            ap.error(f"--model {args.model!r}: unknown preset; known: {', '.join(sorted(PRESETS))}")
        return inspect_model(args.model, args.vocab or "parts")
    return inspect_file(args.file, args.vocab)


if __name__ == "__main__":
    sys.exit(main())
