"""`gcc-compare RUN_A RUN_B [--from STEP] [--to STEP] [--rtol R]`: do two run folders hold the same training?

Made to prove a resume exact (docs/training.md, "Checking a resume"): a run that was interrupted and relaunched
against the same run uninterrupted. Compared, step by step, over the steps in [--from, --to]:
* `train_log.csv` on the columns a resumed run reproduces (`gcc.training.columns.EXACT_TRAIN`: the step's clips,
  epoch, timestep, drops and mask, loss, mse, lr, grad_norm, ...; the timing and memory columns are skipped);
* `val_log.csv` on every column (`EXACT_VAL`), row by (step, timestep), when the folders hold one (both must);
* the exports both folders hold (`step-N.safetensors`, and with algorithms.ema `step-N.ema.safetensors`), tensor
  by tensor (names, dtypes, shapes, values); their metadata differs by design (`resumed_from`; the code that
  wrote them, `git_revision` and `git_dirty`, when a relaunch ran other code) and is not compared.

A step that one log holds and the other does not is a difference (a relaunch on a fresh machine starts its
train_log.csv at the resumed step: compare with `--from` that step). Numbers compare as the logs hold them, to the
last digit (the CSV holds each float's exact repr), or with `--rtol` within a relative tolerance (another world
size sums in another order); the draws (step, epoch, clips, timestep, drops, n) always compare exactly.

Two folders of different runs (their run.json signatures differ: another preset, lr, data, ...) never agree: the
fields that differ are named first, by the config's names of now, then the logs are compared as always.

Prints the first step that differs and exits 1, or that they agree (exit 0); bad input (a folder without
train_log.csv, a log or export that is not the trainer's) is exit 2 with one line naming it (gcc/cli.py), and so is
nothing to compare: a train_log.csv without a row in the range, a val_log.csv that one folder holds and the other
does not. A cell or a name from the files is printed escaped (`gcc.inputs.shown`).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError, safe_open

from gcc import exit_codes
from gcc.cli import ToolParser, run_tool
from gcc.errors import BadInput
from gcc.inputs import load_json_object, open_text, parse_int, safetensors_header, shown
from gcc.training.columns import EXACT_TRAIN, EXACT_VAL
from gcc.training.signature import diff_signatures

# the draws and the identity of a row: equal or not, never within a tolerance
IDENTITY = {"step", "epoch", "clips", "timestep", "text_drop", "cond_drop", "n"}
LOGS = (("train_log", EXACT_TRAIN, True), ("val_log", EXACT_VAL, False))  # (name, columns, required)


@dataclass(frozen=True)
class Difference:
    step: int
    what: str  # where and how, e.g. "train_log.csv step 7: loss 0.25 (RUN_A) != 0.26 (RUN_B)"


# the cells of one row that are compared, held as one string (a tuple of strings or a dict of them costs 5-40x the
# file): joined by NUL, which no cell of a log gcc wrote holds
SEP = "\0"


def read_log(run_dir: Path, name: str, columns: list[str], required: bool) -> dict[tuple, str] | None:
    """A log's rows by key ((step,) in train_log, (step, timestep) in val_log), each row its cells of `columns`
    joined by SEP; None when an optional log is missing. BadInput when the file is not a log the trainer wrote: a
    missing column, a row of another length, a step that is not an integer, a key twice (a relaunch's log holds
    each step once), a NUL character."""
    path = run_dir / f"{name}.csv"
    if not os.path.lexists(path):
        if required:
            raise BadInput(f"{path}: not found; is {run_dir} a run folder?")
        return None
    key_columns = ["step"] if name == "train_log" else ["step", "timestep"]
    rows: dict[tuple, str] = {}
    try:
        # a regular file of bounded size, never a FIFO or a device (docs/training.md, "Trust and safety")
        with open_text(path, "csv") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            missing = [c for c in columns if c not in header]
            if missing:
                raise BadInput(
                    f"{path}: no {', '.join(map(repr, missing[:4]))} column(s); not a {name}.csv that "
                    f"gcc/train.py wrote"
                )
            where = [header.index(c) for c in columns]
            keys = [header.index(c) for c in key_columns]
            for line, values in enumerate(reader, 2):
                if len(values) != len(header):
                    raise BadInput(f"{path}:{line}: {len(values)} fields, the header has {len(header)}")
                step = parse_int(values[keys[0]], f"{path}:{line}: step")
                key = (step, *(values[i] for i in keys[1:]))
                if key in rows:
                    raise BadInput(f"{path}:{line}: a second row of {_where(key)}; a run's log holds each once")
                row = SEP.join(values[i] for i in where)
                if row.count(SEP) != len(where) - 1:
                    raise BadInput(f"{path}:{line}: a NUL character in a cell; not a log that gcc/train.py wrote")
                rows[key] = row
    except csv.Error as e:
        raise BadInput(f"{path}: not a CSV log that gcc/train.py wrote ({e})") from None
    return rows


def _where(key: tuple) -> str:
    return f"step {key[0]}" + (f", timestep {shown(key[1], 40)}" if len(key) > 1 else "")


def _same(column: str, a: str, b: str, rtol: float) -> bool:
    if a == b or rtol == 0 or column in IDENTITY:
        return a == b
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=rtol, abs_tol=0.0)


def diff_log(
    name: str, a: dict, b: dict, columns: list[str], lo: int, hi: int, rtol: float
) -> tuple[int, list[Difference]]:
    """(rows of RUN_A compared, each row that differs: its first differing column) over steps in [lo, hi]."""
    keys = sorted((k for k in {*a, *b} if lo <= k[0] <= hi), key=lambda k: (k[0], *map(str, k[1:])))
    out = []
    for k in keys:
        if k not in a or k not in b:
            out.append(Difference(k[0], f"{name}.csv {_where(k)}: only in {'RUN_A' if k in a else 'RUN_B'}"))
            continue
        if a[k] == b[k]:
            continue
        for c, x, y in zip(columns, a[k].split(SEP), b[k].split(SEP)):
            if not _same(c, x, y, rtol):
                out.append(
                    Difference(k[0], f"{name}.csv {_where(k)}: {c} {shown(x, 80)} (RUN_A) != {shown(y, 80)} (RUN_B)")
                )
                break
    return sum(lo <= k[0] <= hi for k in a), out


def _rows_in(rows: dict, lo: int, hi: int) -> int:
    return sum(lo <= k[0] <= hi for k in rows)


EXPORT_KINDS = ("", ".ema")  # step-N.safetensors, and with algorithms.ema step-N.ema.safetensors (the EMA)


def export_steps(run_dir: Path, kind: str = "") -> dict[int, Path]:
    """The exports `step-N{kind}.safetensors` of a run folder by N (the trainer's names; anything else is ignored)."""
    out = {}
    for p in run_dir.glob(f"step-*{kind}.safetensors"):
        m = re.fullmatch(rf"step-(0|[1-9][0-9]{{0,17}}){re.escape(kind)}\.safetensors", p.name)
        if m is not None:
            out[int(m[1])] = p
    return out


def diff_export(a: Path, b: Path, step: int, rtol: float) -> Difference | None:
    """The first tensor that differs between two exports (by name, dtype, shape, value), or None."""
    import torch  # heavy (~1.3 s): keeps --help and argument errors fast

    # the headers first (gcc.inputs.safetensors_header: bounded, every tensor inside its file), names, dtypes and
    # shapes compared from them before a tensor is read
    ha, hb = safetensors_header(a)[0], safetensors_header(b)[0]
    ka, kb = set(ha), set(hb)
    if ka != kb:
        only = sorted(ka - kb)[:3] or sorted(kb - ka)[:3]
        return Difference(
            step,
            f"{a.name}: tensor names differ ({[shown(k, 80) for k in only]} only in {'RUN_A' if ka - kb else 'RUN_B'})",
        )
    for k in sorted(ka):
        if ha[k][:2] != hb[k][:2]:
            return Difference(
                step,
                f"{a.name}: tensor {shown(k, 80)} is {ha[k].dtype} {list(ha[k].shape)} (RUN_A), "
                f"{hb[k].dtype} {list(hb[k].shape)} (RUN_B)",
            )

    def opened(p: Path):
        try:
            return safe_open(str(p), "pt")
        except SafetensorError as e:
            raise BadInput(f"{p}: not a safetensors export ({e})") from None

    with opened(a) as fa, opened(b) as fb:
        for k in sorted(ka):
            try:
                x, y = fa.get_tensor(k), fb.get_tensor(k)
            except (SafetensorError, TypeError) as e:  # a dtype torch does not know, say
                raise BadInput(f"{a.name}: tensor {shown(k, 80)} cannot be read ({e})") from None
            same = (
                torch.equal(x, y)
                if rtol == 0
                else torch.allclose(x.float(), y.float(), rtol=rtol, atol=0.0, equal_nan=True)
            )
            if not same:
                return Difference(
                    step,
                    f"{a.name}: tensor {shown(k, 80)} differs (max abs difference "
                    f"{(x.float() - y.float()).abs().max().item():.3g})",
                )
    return None


def compare(a: Path, b: Path, lo: int = 0, hi: int = sys.maxsize, rtol: float = 0.0) -> tuple[bool, list[str]]:
    """(agree, report lines): the runs' identities first (run.json's signatures: runs of other identities never
    agree, and the fields that differ say why before any number does), then every log row and common export in
    steps [lo, hi]."""
    identity = identity_differences(a, b)
    lines: list[str] = []
    if identity:
        lines.append(
            "different runs: their run.json signatures differ (RUN_A -> RUN_B): "
            + "; ".join(shown(d) for d in identity)
        )
    first: list[Difference] = []
    steps = f"steps {lo}..{hi}" if hi < sys.maxsize else f"steps from {lo}"
    for name, columns, required in LOGS:
        ra, rb = read_log(a, name, columns, required), read_log(b, name, columns, required)
        if ra is None or rb is None:
            if ra is not None or rb is not None:  # "they agree" would not be true of a file not compared
                here, there = (a, b) if rb is None else (b, a)
                raise BadInput(f"nothing to compare: {here / f'{name}.csv'} exists, {there / f'{name}.csv'} does not")
            continue
        if name == "train_log":  # a row every step: a side without one in the range has nothing to compare
            for run, rows in ((a, ra), (b, rb)):
                if not _rows_in(rows, lo, hi):
                    held = f"it holds steps {min(rows)[0]}..{max(rows)[0]}" if rows else "it holds no row"
                    raise BadInput(f"nothing to compare: {run / f'{name}.csv'} holds no row in {steps} ({held})")
        n, diffs = diff_log(name, ra, rb, columns, lo, hi, rtol)
        if diffs:
            first.append(diffs[0])
            lines.append(f"{name}.csv: {len(diffs)} row(s) differ, the first: {diffs[0].what}")
        else:
            lines.append(f"{name}.csv: {n} row(s) agree")
    for kind in EXPORT_KINDS:
        ea, eb = export_steps(a, kind), export_steps(b, kind)
        if kind and not (ea or eb):  # a run without algorithms.ema
            continue
        what = "exports" + (f" ({kind[1:]})" if kind else "")
        common = sorted(s for s in set(ea) & set(eb) if lo <= s <= hi)
        diffs = [d for d in (diff_export(ea[s], eb[s], s, rtol) for s in common) if d is not None]
        if diffs:
            first.append(diffs[0])
            lines.append(f"{what}: {len(diffs)} of {len(common)} differ, the first: {diffs[0].what}")
        else:
            names = ", ".join(f"step-{s}{kind}" for s in common)
            lines.append(f"{what}: {names + ' agree' if common else 'none in common'}")
        alone = sorted(s for s in set(ea) ^ set(eb) if lo <= s <= hi)
        if alone:
            lines.append(f"{what} in one folder only (not compared): {', '.join(f'step-{s}{kind}' for s in alone)}")
    if first:
        d = min(first, key=lambda d: d.step)
        lines.append(f"they differ; the first step that differs is {d.step} ({d.what})")
    elif identity:
        lines.append("they differ: other run identities (above)")
    else:
        lines.append("they agree")
    return not first and not identity, lines


def identity_differences(a: Path, b: Path) -> list[str]:
    """The fields that differ between two run folders' run.json signatures, by the config's names of now (the
    launch's own rule: gcc/training/signature.py); [] when one holds no run.json (nothing says they differ)."""
    records = []
    for run in (a, b):
        if not os.path.lexists(run / "run.json"):
            return []
        record = load_json_object(run / "run.json", "a run record")
        if not isinstance(record.get("signature"), dict):
            raise BadInput(f"{run / 'run.json'}: not a run record gcc wrote (no signature)")
        records.append(record["signature"])
    return diff_signatures(*records)


def build_parser() -> argparse.ArgumentParser:
    p = ToolParser(
        "gcc-compare",
        "Do two run folders hold the same training? Compares train_log.csv (timings skipped), val_log.csv and the\n"
        "exports both hold, step by step; exit 0 they agree, 1 they differ (the first step that differs printed),\n"
        "2 bad input. Made to prove a resume exact: a run interrupted and relaunched against the same run\n"
        "uninterrupted.",
    )
    p.add_argument("run_a", help="a run folder (e.g. the run uninterrupted)")
    p.add_argument("run_b", help="another run folder (e.g. the same run, interrupted and relaunched)")
    p.add_argument(
        "--from",
        dest="from_step",
        type=int,
        default=0,
        metavar="STEP",
        help="compare only steps >= this (e.g. the step a relaunch on a fresh machine resumed at)",
    )
    p.add_argument(
        "--to", dest="to_step", type=int, default=None, metavar="STEP", help="compare only steps <= this (default: all)"
    )
    p.add_argument(
        "--rtol",
        type=float,
        default=0.0,
        metavar="R",
        help="relative tolerance of the numbers (0: to the last digit; e.g. 1e-4 across world sizes); the draws "
        "(clips, timestep, drops) always compare exactly",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if not (args.rtol >= 0 and math.isfinite(args.rtol)):
        p.error(f"--rtol: must be a finite number >= 0, got {args.rtol}")
    if args.to_step is None:
        args.to_step = sys.maxsize
    if args.from_step > args.to_step:
        p.error(f"--from {args.from_step} is after --to {args.to_step}")

    def body() -> int:
        for run in (args.run_a, args.run_b):
            if not Path(run).is_dir():
                raise BadInput(
                    f"{run}: {'not found' if not Path(run).exists() else 'is a file'}, expected a run folder"
                )
        ok, lines = compare(Path(args.run_a), Path(args.run_b), args.from_step, args.to_step, args.rtol)
        print("\n".join(f"gcc-compare: {line}" for line in lines), flush=True)
        return exit_codes.OK if ok else exit_codes.DIFFER

    return run_tool(p.prog, body)


if __name__ == "__main__":
    sys.exit(main())
