"""Inspect a gc25d export, a run folder's provenance, or a model preset.

    gcc-inspect FILE.safetensors   # key count, dtypes, parameter count, metadata, the code that wrote it; runs
                                   # check_gc_ckpt
    gcc-inspect FILE.safetensors --model tiny   # ... and checks every key and shape against that preset
    gcc-inspect RUN_DIR            # the last step and whether the run is done, the best validation, each launch
                                   # (its start, resumed or not, and its code: run.json), global batch changes,
                                   # config.json and each export's code; data.limit
    gcc-inspect --model ti2v-5b    # builds the preset on the meta device: key count, parameter count

(also `python -m gcc.tools.inspect_ckpt`). The file's header alone is read (never its tensors, never a model built
from it): without --model its key names must be a GcDiT's and fix the block count, every block shaped alike.
The code is gcc's version and the git revision of its checkout, "(modified)" when tracked files differed from it,
or "not a checkout" (gcc/provenance.py); a file of an earlier gcc did not record it. Exit status 2 when a file
cannot be read or the check fails, as every gcc tool's for bad input.
"""

from __future__ import annotations

import argparse
import collections
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gcc import redact
from gcc.cli import ToolParser, fail, input_file_problem
from gcc.errors import BadInput
from gcc.inputs import load_json_object, safetensors_header, shown
from gcc.provenance import Provenance
from gcc.tools.plot import read_columns, run_events
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
    print(f"code       {export_code(meta)}")
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


def _code(provenance: Provenance | None) -> str:
    return shown(str(provenance)) if provenance else "not recorded (written by an earlier gcc)"


def export_code(meta: Mapping[str, str]) -> str:
    """The code that wrote an export, from its metadata (`trainer`, `git_revision`, `git_dirty`)."""
    version = meta.get("trainer", "").removeprefix("gcc ")
    return _code(Provenance.recorded(version, meta.get("git_revision"), meta.get("git_dirty")))


def recorded_code(entry: Any) -> str:
    """The code a JSON entry of config.json or run.json recorded (`Provenance.as_dict`'s keys)."""
    entry = entry if isinstance(entry, dict) else {}
    return _code(Provenance.recorded(entry.get("gcc_version"), entry.get("git_revision"), entry.get("git_dirty")))


def _export_order(p: Path) -> tuple[int, str]:
    m = re.match(r"step-([0-9]{1,18})\.", p.name)
    return (int(m[1]) if m else -1, p.name)


def inspect_run(path: str) -> int:
    """A run folder's provenance (docs/training.md, "The run folder"): data.limit from run.json's signature, which
    code made each launch (its launch history), the latest launch's config.json, and each export's code."""
    run = Path(path)
    if not (run / "run.json").exists():
        return fail(PROG, f"{shown(path)}: a folder without run.json, expected a run folder or a .safetensors export")
    try:
        record = load_json_object(run / "run.json", "a run record")
        config = load_json_object(run / "config.json", "a config.json") if (run / "config.json").exists() else None
    except BadInput as e:  # the message names the file
        return fail(PROG, f"{e}; not a run folder gcc wrote")
    signature, lineage = record.get("signature"), record.get("lineage")
    launches = lineage.get("launches", []) if isinstance(lineage, dict) else None
    if not isinstance(signature, dict) or not isinstance(launches, list):
        return fail(PROG, f"{shown(run / 'run.json')}: not a run record gcc wrote (no signature and lineage)")
    limit = signature.get("data.limit")
    print(f"run        {shown(path)}")
    print(f"data.limit {'null (the whole train split)' if limit is None else shown(limit)}")
    try:
        train = read_columns(run / "train_log.csv", ("step",))["step"]
        val = read_columns(run / "val_log.csv", ("step", "timestep"), ("mse",))
        resumes, changes = run_events(run)
    except BadInput as e:
        return fail(PROG, str(e))
    settings = config.get("config") if config is not None else None
    total = settings.get("max_duration") if isinstance(settings, dict) else None
    print(f"step       {progress(train, total)}")
    print(f"validation {best_validation(val)}")
    said = f", {len(resumes)} resumed" if any(isinstance(x, dict) and "from_step" in x for x in launches) else ""
    print(
        f"launches   {len(launches)} (run.json){said}"
        + ("" if launches else ": not recorded (a run of an earlier gcc)")
    )
    for i, launch in enumerate(launches, 1):
        launch = launch if isinstance(launch, dict) else {}
        start = launch.get("from_step")
        where = "" if not isinstance(start, int) else "  from step 0" if start == 0 else f"  resumed at step {start}"
        print(
            f"  {i:<3} {shown(launch.get('time'), 40)}  world {shown(launch.get('world'), 20)}{where}  "
            f"{recorded_code(launch)}"
        )
    for at, old, new in changes:
        print(f"  global batch {old} -> {new} at step {at}")
    if config is not None:
        print(f"config     config.json (the latest launch, from step {shown(config.get('start_step'), 20)}): ", end="")
        print(recorded_code(config.get("provenance")))
    exports = sorted(run.glob("step-*.safetensors"), key=_export_order)
    print(f"exports    {len(exports)}")
    for p in exports:
        try:
            meta = safetensors_header(p)[1]  # the header alone, bounded
        except BadInput as e:
            return fail(PROG, f"cannot be read as safetensors: {e}")
        print(f"  {shown(p.name, 80)}  {export_code(meta)}")
    return 0


def progress(steps: Sequence[float], total: Any) -> str:
    """`12 of 40 (train_log.csv): not done` / `... done`: the run's last logged step (`steps`: train_log.csv's step
    column) against its max_duration (the latest launch's config.json, in batches)."""
    last = int(steps[-1]) if steps else 0
    if not isinstance(total, int) or isinstance(total, bool):
        return f"{last} (train_log.csv; max_duration not recorded: no config.json)"
    return f"{last} of {total} (train_log.csv): {'done' if last >= total else 'not done'}"


def best_validation(val: Mapping[str, Sequence[float]]) -> str:
    """The validation of the lowest mse (its mean over the val timesteps), and the last one (`val`: val_log.csv's
    columns step and mse, `gcc.tools.plot.read_columns`)."""
    by_step: dict[int, list[float]] = collections.defaultdict(list)
    for step, mse in zip(val["step"], val["mse"]):
        if not math.isnan(mse):  # a cell that is not a number
            by_step[int(step)].append(mse)
    if not by_step:
        return "none yet (val_log.csv)"
    mean = {s: sum(v) / len(v) for s, v in by_step.items()}
    best, last = min(mean, key=lambda s: (mean[s], s)), max(mean)
    return (
        f"best mse {mean[best]:.4f} at step {best}, last {mean[last]:.4f} at step {last} (the mean over "
        f"{len(by_step[last])} timestep(s); val_log.csv)"
    )


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
    ap.add_argument("file", nargs="?", help="a gc25d .safetensors export, or a run folder (its provenance)")
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
    if Path(args.file).is_dir():
        if args.model is not None or args.vocab is not None:
            ap.error("--model and --vocab check an export, not a run folder")
        return inspect_run(args.file)
    return inspect_file(args.file, args.vocab, args.model)


if __name__ == "__main__":
    sys.exit(main())
