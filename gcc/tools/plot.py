"""Curves of a run as one PNG: `gcc-plot RUN_DIR` (or `python -m gcc.tools.plot RUN_DIR`) (docs/training.md).

Reads `train_log.csv` and `val_log.csv` from the run folder. They hold one row per step (train) and per step and
timestep (val) across every launch of the run (a relaunch trims the rows it trains again), so a resumed run
plots as one continuous run. Panels: train loss (raw and smoothed), lr and cond_lr, grad_norm, the statistics
declared with a plot legend (gcc/stats.py), and the validation's mse, gap_uncond and gap_nulltext per timestep
against step.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from array import array
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from gcc.cli import ToolParser, file_problem, run_tool
from gcc.errors import BadInput
from gcc.inputs import open_text, os_error_message, shown
from gcc.storage import atomic_path
from gcc.training.columns import STEP_STATS


def _number(cells: list[str], i: int | None) -> float | None:
    """The cell `i` of a row as a float (inf and nan included); None when it is not a number or not there."""
    if i is None or i >= len(cells):
        return None
    try:
        return float(cells[i])
    except ValueError:
        return None


def read_columns(path: Path, needs: tuple[str, ...], wanted: tuple[str, ...] = ()) -> dict[str, array]:
    """The CSV's columns `needs` and `wanted` as arrays of floats, one entry per row, nan where a cell is not a number
    or the header lacks the column; all empty when the file is missing. Streamed: what is held is 8 bytes a cell of
    those columns, never the rows' text. The last row without a number in each of `needs` (a run is writing it) is
    left out; a file that is not such a CSV (no `needs` columns in its header, not UTF-8 text, an earlier row
    without a number in one of `needs`, an inf or nan there in any row) is BadInput naming it, the row and the
    column, the cell shown escaped (`gcc.inputs.shown`)."""
    columns = {c: array("d") for c in dict.fromkeys((*needs, *wanted))}
    if not os.path.lexists(path):
        return columns
    partial = None
    try:
        # a regular file of bounded size, never a FIFO or a device (docs/training.md, "Trust and safety")
        with open_text(path, "csv") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            missing = [c for c in needs if c not in header]
            if missing:
                raise BadInput(
                    f"{path}: no {', '.join(repr(c) for c in missing)} column(s) (header: "
                    f"{shown(repr(','.join(header)))}); not a log that gcc/train.py wrote"
                )
            where = {c: header.index(c) if c in header else None for c in columns}
            for line, cells in enumerate(reader, 2):  # the header is line 1
                if partial is not None:  # not the last row: the file is not a log the trainer wrote
                    raise BadInput(partial)
                row = {c: _number(cells, i) for c, i in where.items()}
                for c in needs:  # a number no step or timestep is: never partial
                    x = row[c]
                    if x is not None and not math.isfinite(x):
                        raise BadInput(f"{path}:{line}: column {c!r} is {x}, expected a finite number")
                bad = next((c for c in needs if row[c] is None), None)
                if bad is None:
                    for c, values in columns.items():
                        x = row[c]
                        values.append(math.nan if x is None else x)
                else:
                    at = where[bad]  # in the header: `bad` is one of `needs`
                    cell = cells[at] if at is not None and at < len(cells) else None
                    partial = f"{path}:{line}: column {bad!r} is {shown(repr(cell), 80)}, expected a number"
    except OSError as e:
        raise BadInput(os_error_message(e)) from None
    except csv.Error as e:
        raise BadInput(f"{path}: not a CSV log that gcc/train.py wrote ({e})") from None
    return columns


def smooth(values: Sequence[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average, debiased so the first points are not pulled to 0."""
    out, avg = [], 0.0
    for i, v in enumerate(values, 1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight**i) if weight < 1 else v)
    return out


def plot_run(run_dir: Path, out: Path, smoothing: float = 0.9) -> Path:
    import matplotlib  # heavy: only when plotting

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: only when plotting (after the Agg backend is chosen)

    plotted = [s for s in STEP_STATS if s.plot]
    train = read_columns(
        run_dir / "train_log.csv", ("step",), ("loss", "lr", "cond_lr", "grad_norm", *(s.name for s in plotted))
    )
    step = train["step"]
    if not step:
        raise BadInput(f"{run_dir / 'train_log.csv'}: no train rows to plot (is {run_dir} a run folder?)")
    val = read_columns(run_dir / "val_log.csv", ("step", "timestep"), ("mse", "gap_uncond", "gap_nulltext"))

    fig, axes = plt.subplots(2, 4, figsize=(20, 8.5), constrained_layout=True)
    ax = axes[0, 0]
    ax.plot(step, train["loss"], color="tab:blue", alpha=0.3, lw=0.8, label="loss")
    ax.plot(step, smooth(train["loss"], smoothing), color="tab:blue", lw=1.6, label=f"smoothed ({smoothing:g})")
    ax.set_title("train loss")
    ax = axes[0, 1]
    ax.plot(step, train["lr"], label="lr")
    ax.plot(step, train["cond_lr"], label="cond_lr")
    ax.set_yscale("log")
    ax.set_title("learning rate")
    ax = axes[0, 2]
    ax.plot(step, train["grad_norm"], color="tab:red", lw=0.9, label="grad_norm (before clipping)")
    ax.set_title("grad_norm")
    ax = axes[0, 3]
    for s in plotted:
        ax.plot(step, train[s.name], label=s.plot)
    ax.set_title(" and ".join(s.name for s in plotted))
    by_t: dict[float, list[int]] = defaultdict(list)  # the val rows of each timestep
    for i, t in enumerate(val["timestep"]):
        by_t[t].append(i)
    for ax, key in zip(axes[1, :3], ("mse", "gap_uncond", "gap_nulltext")):
        for t, rows in sorted(by_t.items()):
            ax.plot([val["step"][i] for i in rows], [val[key][i] for i in rows], marker="o", ms=3, label=f"t={t:.1f}")
        if key.startswith("gap"):
            ax.axhline(0.0, color="gray", lw=0.8, ls=":")
        ax.set_title(f"val {key}" + ("" if by_t else " (no validation yet)"))
    axes[1, 3].axis("off")
    axes[1, 3].text(
        0.0,
        0.9,
        f"{run_dir}\nsteps {int(step[0])}..{int(step[-1])}, {len(val['step'])} val rows\n\n"
        "gap_uncond = mse(cond UNKNOWN) - mse\ngap_nulltext = mse(null text) - mse\n"
        "above 0: the model uses the condition / the text",
        va="top",
        family="monospace",
    )
    for ax in axes.flat[:7]:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = ToolParser(
        "gcc-plot",
        "Write a run's curves as one PNG: train loss (raw and smoothed), lr, grad_norm, the logged statistics and\n"
        "the validation per timestep against step, from the run folder's train_log.csv and val_log.csv (every\n"
        "launch of a resumed run: one continuous run).",
    )
    p.add_argument("run_dir", help="the run folder (the yaml's run_dir)")
    p.add_argument("--out", default=None, help="PNG to write (default: RUN_DIR/curves.png)")
    p.add_argument(
        "--smoothing",
        type=float,
        default=0.9,
        help="weight of the loss's exponential moving average, in [0, 1) (TensorBoard's slider)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    run_dir = Path(args.run_dir)
    if not 0.0 <= args.smoothing < 1.0:
        p.error(f"--smoothing: must be in [0, 1), got {args.smoothing}")

    def body() -> int:
        out = Path(args.out) if args.out else run_dir / "curves.png"
        problem = file_problem(out) if args.out else None
        if problem:
            raise BadInput(f"--out {args.out}: {problem}")
        print(f"gcc-plot: wrote {plot_run(run_dir, out, args.smoothing)}")
        return 0

    return run_tool(p.prog, body)


if __name__ == "__main__":
    sys.exit(main())
