"""Curves of a run as one PNG: `gcc-plot RUN_DIR` (or `python -m gcc.tools.plot RUN_DIR`) (docs/training.md);
`gcc-plot A B ...` overlays several runs, a colour each. Each run's resumes and global-batch changes (run.json)
are marked at their step.

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
from dataclasses import dataclass
from pathlib import Path

from gcc.cli import ToolParser, file_problem, run_tool
from gcc.errors import BadInput, os_error_message
from gcc.inputs import load_json_object, open_text, shown
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


# the columns gcc-plot draws, besides `step` (and `timestep` in val_log.csv)
TRAIN_COLUMNS = ("loss", "lr", "cond_lr", "grad_norm", *(st.name for st in STEP_STATS if st.plot))
VAL_COLUMNS = ("mse", "gap_uncond", "gap_nulltext")


@dataclass(frozen=True)
class Run:
    """What gcc-plot draws of one run folder: its logs' columns (`read_columns`: floats, never the rows' text) and
    the events its run.json records."""

    folder: Path
    train: dict[str, array]  # train_log.csv: step and TRAIN_COLUMNS
    val: dict[str, array]  # val_log.csv: step, timestep and VAL_COLUMNS
    resumes: list[int]  # the steps launches resumed from (run.json's launches: `from_step` > 0)
    batch_changes: list[tuple[int, int, int]]  # (step, old, new) global batch changes (run.json's lineage)


def run_events(run_dir: Path) -> tuple[list[int], list[tuple[int, int, int]]]:
    """The resumes and global-batch changes run.json records ([] without one, or from a gcc that did not record
    them); a run.json that is not a run record is BadInput naming it."""
    if not os.path.lexists(run_dir / "run.json"):
        return [], []
    lineage = load_json_object(run_dir / "run.json", "a run record").get("lineage")
    lineage = lineage if isinstance(lineage, dict) else {}
    resumes = [
        int(launch["from_step"])
        for launch in lineage.get("launches", [])
        if isinstance(launch, dict) and isinstance(launch.get("from_step"), int) and launch["from_step"] > 0
    ]
    changes = [
        (int(c["step"]), int(c["old"]), int(c["new"]))
        for c in lineage.get("global_batch_changes", [])
        if isinstance(c, dict) and all(isinstance(c.get(k), int) for k in ("step", "old", "new"))
    ]
    return resumes, changes


def read_run(run_dir: Path) -> Run:
    train = read_columns(run_dir / "train_log.csv", ("step",), TRAIN_COLUMNS)
    if not train["step"]:
        raise BadInput(f"{run_dir / 'train_log.csv'}: no train rows to plot (is {run_dir} a run folder?)")
    val = read_columns(run_dir / "val_log.csv", ("step", "timestep"), VAL_COLUMNS)
    return Run(run_dir, train, val, *run_events(run_dir))


def plot_runs(run_dirs: list[Path], out: Path, smoothing: float = 0.9) -> list[tuple[str, str, int]]:
    """One PNG of the runs' curves, overlaid (a colour per run), each run's resumes (dotted) and global-batch
    changes (dashed) marked on every panel at their step. One run: its loss raw and smoothed, and its validation
    per timestep; several: the smoothed loss and the validation's mean over its timesteps, per run. Returns the
    marks drawn: (run folder's name, "resumed" | "batch OLD -> NEW", step)."""
    import matplotlib  # heavy: only when plotting

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: only when plotting (after the Agg backend is chosen)

    runs = [read_run(d) for d in run_dirs]
    one = len(runs) == 1
    fig, axes = plt.subplots(2, 4, figsize=(20, 8.5), constrained_layout=True)
    plotted = [st for st in STEP_STATS if st.plot]
    marks: list[tuple[str, str, int]] = []
    for n, run in enumerate(runs):
        color, name = f"C{n}", run.folder.name
        label = "" if one else f"{name}: "
        _plot_train(axes, run.train, color, label, one, plotted, smoothing)
        _plot_val(axes, run.val, color, name, one)
        marks += _mark_events(axes, run, color, name)
    _finish_panels(axes, runs, plotted)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)
    return marks


def _plot_train(axes, train: dict[str, array], color: str, label: str, one: bool, plotted, smoothing: float) -> None:
    """A run's train curves on the top row: loss (raw with one run, and smoothed), lr and cond_lr, grad_norm and
    the statistics declared with a plot legend."""
    step = train["step"]
    ax = axes[0, 0]
    if one:
        ax.plot(step, train["loss"], color=color, alpha=0.3, lw=0.8, label="loss")
    ax.plot(step, smooth(train["loss"], smoothing), color=color, lw=1.6, label=f"{label}smoothed ({smoothing:g})")
    axes[0, 1].plot(step, train["lr"], color=color, label=f"{label}lr")
    axes[0, 1].plot(step, train["cond_lr"], color=color, ls="--", label=f"{label}cond_lr")
    axes[0, 2].plot(step, train["grad_norm"], color=color, lw=0.9, label=f"{label}grad_norm (before clipping)")
    for st, ls in zip(plotted, ("-", "--", ":", "-.")):
        axes[0, 3].plot(step, train[st.name], color=color if not one else None, ls=ls, label=f"{label}{st.plot}")


def _plot_val(axes, val: dict[str, array], color: str, name: str, one: bool) -> None:
    """A run's validation curves on the bottom row: per timestep with one run, else the mean over timesteps."""
    by_t: dict[float, list[int]] = defaultdict(list)  # the val rows of each timestep
    for i, t in enumerate(val["timestep"]):
        by_t[t].append(i)
    for ax, key in zip(axes[1, :3], VAL_COLUMNS):
        if one:
            for t, rows in sorted(by_t.items()):
                xs, ys = [val["step"][i] for i in rows], [val[key][i] for i in rows]
                ax.plot(xs, ys, marker="o", ms=3, label=f"t={t:.1f}")
        elif by_t:
            by_step: dict[float, list[float]] = defaultdict(list)
            for s, x in zip(val["step"], val[key]):
                by_step[s].append(x)
            steps = sorted(by_step)
            means = [sum(by_step[s]) / len(by_step[s]) for s in steps]
            ax.plot(steps, means, marker="o", ms=3, color=color, label=f"{name} (mean over timesteps)")


def _mark_events(axes, run: Run, color: str, name: str) -> list[tuple[str, str, int]]:
    """A run's resumes (dotted) and global-batch changes (dashed) drawn on every panel; returns them as marks."""
    marks: list[tuple[str, str, int]] = []
    for at in run.resumes:
        marks.append((name, "resumed", at))
    for at, old, new in run.batch_changes:
        marks.append((name, f"batch {old} -> {new}", at))
    for ax in axes.flat[:7]:
        for at in run.resumes:
            ax.axvline(at, color=color, lw=0.8, ls=":")
        for at, _, _ in run.batch_changes:
            ax.axvline(at, color=color, lw=0.8, ls="--")
    return marks


def _finish_panels(axes, runs: list[Run], plotted) -> None:
    """Titles, the zero line of the gaps, the notes panel (each run's steps and events, the legend of the marks),
    axis labels, grids and legends."""
    axes[0, 0].set_title("train loss")
    axes[0, 1].set_yscale("log")
    axes[0, 1].set_title("learning rate")
    axes[0, 2].set_title("grad_norm")
    axes[0, 3].set_title(" and ".join(st.name for st in plotted))
    any_val = any(run.val["step"] for run in runs)
    for ax, key in zip(axes[1, :3], VAL_COLUMNS):
        if key.startswith("gap"):
            ax.axhline(0.0, color="gray", lw=0.8, ls=":")
        ax.set_title(f"val {key}" + ("" if any_val else " (no validation yet)"))
    axes[1, 3].axis("off")
    notes = [
        f"{run.folder}\n  steps {int(run.train['step'][0])}..{int(run.train['step'][-1])}, "
        f"{len(run.val['step'])} val rows"
        + (f"\n  resumed at {', '.join(map(str, run.resumes))}" if run.resumes else "")
        + "".join(f"\n  global batch {old} -> {new} at {at}" for at, old, new in run.batch_changes)
        for run in runs
    ]
    axes[1, 3].text(
        0.0,
        0.9,
        "\n".join(notes) + "\n\nresumes: dotted, global batch changes: dashed\n"
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


def build_parser() -> argparse.ArgumentParser:
    p = ToolParser(
        "gcc-plot",
        "Write a run's curves as one PNG: train loss (raw and smoothed), lr, grad_norm, the logged statistics and\n"
        "the validation per timestep against step, from the run folder's train_log.csv and val_log.csv (every\n"
        "launch of a resumed run: one continuous run, its resumes and global-batch changes marked). Several run\n"
        "folders: their curves overlaid, a colour each.",
    )
    p.add_argument("run_dir", nargs="+", help="the run folder (the yaml's run_dir); several: overlaid")
    p.add_argument(
        "--out",
        default=None,
        help="PNG to write (default: RUN_DIR/curves.png; several runs: the first's curves-overlay.png)",
    )
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
    run_dirs = [Path(d) for d in args.run_dir]
    if not 0.0 <= args.smoothing < 1.0:
        p.error(f"--smoothing: must be in [0, 1), got {args.smoothing}")

    def body() -> int:
        default = "curves.png" if len(run_dirs) == 1 else "curves-overlay.png"
        out = Path(args.out) if args.out else run_dirs[0] / default
        problem = file_problem(out) if args.out else None
        if problem:
            raise BadInput(f"--out {args.out}: {problem}")
        marks = plot_runs(run_dirs, out, args.smoothing)
        print(f"gcc-plot: wrote {out}" + (f" ({len(run_dirs)} runs)" if len(run_dirs) > 1 else ""))
        for name, what, at in marks:
            print(f"gcc-plot: {shown(name)}: {what} at step {at}")
        return 0

    return run_tool(p.prog, body)


if __name__ == "__main__":
    sys.exit(main())
