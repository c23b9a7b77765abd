"""`gcc-compare RUN_A RUN_B [--from STEP] [--to STEP] [--rtol R]`: do two run folders hold the same training?

Used to prove a resume exact (docs/training.md, "Checking a resume"): an interrupted and relaunched run against an
uninterrupted one. Compares, step by step:
* `train_log.csv` on the columns a resumed run must reproduce (`EXACT_TRAIN`: the step's clips, epoch, timestep and
  drops, loss, mse, lr, grad_norm, ...; the timing and memory columns are skipped);
* `val_log.csv` on every column;
* the exports both folders hold (`step-N.safetensors`), tensor by tensor.

Numbers compare exactly (`--rtol 0`, the default: the CPU demo resumes bit for bit) or within a relative tolerance
(another world size sums in another order). The identity columns (step, epoch, clips, drops, timestep) always
compare exactly. Prints the first step that differs and exits 1, or says what agrees and exits 0; exit 2 for bad
input (a folder without train_log.csv, say).
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path
from typing import Iterator

EXACT_TRAIN = ["step", "loss", "mse", "timestep", "lr", "cond_lr", "grad_norm", "sem_rms", "x_rms", "text_drop",
               "cond_drop", "mask_frac", "epoch", "clips"]
IDENTITY = {"step", "epoch", "clips", "timestep", "text_drop", "cond_drop", "n"}  # never within a tolerance
EXIT_DIFFER, EXIT_BAD_INPUT = 1, 2


class CompareError(Exception):
    """Bad input: the message names the folder or file."""


def read_rows(run_dir: Path, name: str, required: bool) -> dict[int, dict[str, str]] | None:
    """A log's rows by step (the last row of a step wins, as a relaunch's trimmed log holds each step once)."""
    path = Path(run_dir) / f"{name}.csv"
    if not path.is_file():
        if required:
            raise CompareError(f"{path}: not found (is {run_dir} a run folder?)")
        return None
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise CompareError(f"{path}: cannot be read as a CSV log ({e})") from None
    out: dict[int, dict[str, str]] = {}
    for n, r in enumerate(rows, 2):
        try:
            step = int(float(r.get("step") or ""))
        except ValueError:
            raise CompareError(f"{path}:{n}: no integer 'step' column") from None
        key = step if name == "train_log" else (step, r.get("timestep"))
        out[key] = r
    return out


def _same(column: str, a: str, b: str, rtol: float) -> bool:
    if a == b or rtol == 0 or column in IDENTITY:
        return a == b
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=rtol, abs_tol=0.0)


def diff_logs(a: dict, b: dict, columns: list[str] | None, lo: int, hi: int, rtol: float) -> Iterator[str]:
    """Each difference over the rows whose step is in [lo, hi], in step order."""
    def step_of(key) -> int:
        return key if isinstance(key, int) else key[0]

    keys = sorted({k for k in (*a, *b) if lo <= step_of(k) <= hi}, key=lambda k: (step_of(k), str(k)))
    for k in keys:
        where = f"step {step_of(k)}" + ("" if isinstance(k, int) else f", timestep {k[1]}")
        if k not in a or k not in b:
            yield f"{where}: only in {'RUN_A' if k in a else 'RUN_B'}"
            continue
        cols = columns or [c for c in a[k] if c in b[k]]
        for c in cols:
            if not _same(c, a[k].get(c, "<absent>"), b[k].get(c, "<absent>"), rtol):
                yield f"{where}: {c} {a[k].get(c, '<absent>')} (RUN_A) != {b[k].get(c, '<absent>')} (RUN_B)"
                break


def diff_exports(a: Path, b: Path, lo: int, hi: int, rtol: float) -> tuple[list[str], list[str]]:
    """(the exports compared, their differences): the step-N.safetensors both folders hold, N in [lo, hi]."""
    import torch
    from safetensors import safe_open

    def steps(d: Path) -> dict[int, Path]:
        out = {}
        for p in d.glob("step-*.safetensors"):
            try:
                out[int(p.name[len("step-"):-len(".safetensors")])] = p
            except ValueError:
                continue
        return out

    sa, sb = steps(a), steps(b)
    common = sorted(s for s in set(sa) & set(sb) if lo <= s <= hi)
    diffs = []
    for s in common:
        try:
            with safe_open(str(sa[s]), "pt") as fa, safe_open(str(sb[s]), "pt") as fb:
                ka, kb = set(fa.keys()), set(fb.keys())
                if ka != kb:
                    diffs.append(f"step-{s}.safetensors: keys differ ({sorted(ka ^ kb)[:3]} ...)")
                    continue
                for k in sorted(ka):
                    x, y = fa.get_tensor(k), fb.get_tensor(k)
                    same = x.shape == y.shape and (torch.equal(x, y) if rtol == 0 else
                                                   torch.allclose(x.float(), y.float(), rtol=rtol, atol=0.0))
                    if not same:
                        diffs.append(f"step-{s}.safetensors: tensor {k} differs")
                        break
        except (OSError, RuntimeError, ValueError) as e:  # safetensors' errors for a file that is not one
            raise CompareError(f"step-{s}.safetensors: cannot be read in both folders ({e})") from None
    return [f"step-{s}" for s in common], diffs


def compare(a: Path, b: Path, lo: int = 0, hi: int = sys.maxsize, rtol: float = 0.0) -> tuple[bool, list[str]]:
    """(agree, report lines)."""
    lines, ok = [], True
    for name, columns, required in (("train_log", EXACT_TRAIN, True), ("val_log", None, False)):
        ra, rb = read_rows(a, name, required), read_rows(b, name, required)
        if ra is None or rb is None:
            lines.append(f"{name}.csv: not in {'RUN_A' if ra is None else 'RUN_B'}; not compared")
            continue
        diffs = list(diff_logs(ra, rb, columns, lo, hi, rtol))
        n = len({k for k in ra if lo <= (k if isinstance(k, int) else k[0]) <= hi})
        if diffs:
            ok = False
            lines.append(f"{name}.csv: first difference at {diffs[0]} ({len(diffs)} row(s) differ)")
        else:
            lines.append(f"{name}.csv: {n} row(s) agree")
    common, diffs = diff_exports(a, b, lo, hi, rtol)
    if diffs:
        ok = False
        lines.append(f"exports: {diffs[0]}")
    else:
        lines.append(f"exports: {', '.join(common) + ' agree' if common else 'none in common'}")
    return ok, lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gcc-compare", description="Do two run folders hold the same training? "
                                "Compares train_log.csv, val_log.csv and the common exports step by step.")
    p.add_argument("run_a", help="a run folder (e.g. an uninterrupted run)")
    p.add_argument("run_b", help="another run folder (e.g. the same run, interrupted and relaunched)")
    p.add_argument("--from", dest="from_step", type=int, default=0,
                   help="compare only steps >= this (e.g. the step a fresh machine resumed at)")
    p.add_argument("--to", dest="to_step", type=int, default=sys.maxsize, help="compare only steps <= this")
    p.add_argument("--rtol", type=float, default=0.0,
                   help="relative tolerance for the numbers (0: exact; e.g. 1e-4 across world sizes)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.rtol < 0 or not math.isfinite(args.rtol):
        p.error(f"--rtol: must be a finite number >= 0, got {args.rtol}")
    try:
        ok, lines = compare(Path(args.run_a), Path(args.run_b), args.from_step, args.to_step, args.rtol)
    except CompareError as e:
        print(f"gcc-compare: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print("\n".join(f"gcc-compare: {line}" for line in lines))
    print(f"gcc-compare: {'they agree' if ok else 'they differ'}")
    return 0 if ok else EXIT_DIFFER


if __name__ == "__main__":
    sys.exit(main())
