"""gcc-plot: a run folder's train_log.csv / val_log.csv as one PNG."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from hostile import time_limit
from PIL import Image

from gcc import exit_codes
from gcc.tools import plot
from gcc.training.callbacks import TRAIN_COLUMNS, VAL_COLUMNS


def _write(path, columns, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        w.writerows([[r.get(c, 0.0) for c in columns] for r in rows])


def _run_folder(tmp_path, steps=40, val_every=10):
    train = [
        {
            "step": s,
            "loss": 2.0 / s + 0.1 * math.sin(s),
            "lr": min(1e-3, s * 1e-4),
            "cond_lr": 1e-2,
            "grad_norm": 1.0 / s,
            "sem_rms": 0.01 * s,
            "x_rms": 0.5,
            "clips": "a;b",
        }
        for s in range(1, steps + 1)
    ]
    # from step 0 (val_at_start: the starting weights) every val_every steps
    val = [
        {
            "step": s,
            "timestep": t,
            "mse": 1.0 / (s + 1) + t / 1e4,
            "gap_uncond": 0.001 * s,
            "gap_nulltext": 0.0005 * s,
            "n": 4,
        }
        for s in range(0, steps + 1, val_every)
        for t in (201.3, 500.6, 799.7)
    ]
    _write(tmp_path / "train_log.csv", TRAIN_COLUMNS, train)
    _write(tmp_path / "val_log.csv", VAL_COLUMNS, val)
    return train, val


def _colored_panels(png) -> list[list[bool]]:
    """Per panel of the 2 × 4 grid: does it hold colored pixels (curves; frames, grids and text are gray)?"""
    img = np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)
    assert img.shape == (680, 1600, 3)
    colored = (img.max(axis=2) - img.min(axis=2)) > 60
    return [
        [bool(colored[r * 340 : (r + 1) * 340, c * 400 : (c + 1) * 400].mean() > 0.001) for c in range(4)]
        for r in range(2)
    ]


def test_plot_writes_one_png_with_every_panel(tmp_path, capsys):
    train, _ = _run_folder(tmp_path)
    assert plot.main([str(tmp_path)]) == 0
    out = tmp_path / "curves.png"
    assert f"wrote {out}" in capsys.readouterr().out
    assert _colored_panels(out) == [[True] * 4, [True] * 3 + [False]]  # 7 panels with curves, then the notes
    (tmp_path / "val_log.csv").unlink()  # before the first validation: the val panels are empty, not an error
    assert plot.main([str(tmp_path)]) == 0
    assert _colored_panels(out) == [[True] * 4, [False] * 4]
    columns = plot.read_columns(tmp_path / "train_log.csv", ("step",), ("loss", "clips"))
    assert list(columns["step"]) == [r["step"] for r in train]
    assert all(math.isnan(x) for x in columns["clips"])  # a text column is no number


def test_smoothing_is_debiased_and_bounded():
    assert plot.smooth([3.0, 3.0, 3.0], 0.9) == pytest.approx([3.0, 3.0, 3.0])  # no pull toward 0 at the start
    s = plot.smooth([0.0, 10.0] * 50, 0.9)
    assert 4.0 < s[-1] < 6.0 and max(s[2:]) < 10.0
    assert plot.smooth([1.0, 2.0], 0.0) == [1.0, 2.0]


def test_a_folder_without_a_train_log_is_a_clear_error(tmp_path, capsys):
    assert plot.main([str(tmp_path / "nope")]) == exit_codes.CONFIG
    assert "train_log.csv: no train rows to plot" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        plot.main([str(tmp_path), "--smoothing", "1.5"])


def test_the_demos_validation_table_shows_step_0_beside_the_later_steps(tmp_path):
    from gcc.tools.demo import validation_table

    _, val = _run_folder(tmp_path)
    with open(tmp_path / "val_log.csv", newline="") as f:
        lines = validation_table(list(csv.DictReader(f)))
    assert "t = 201.3, 500.6, 799.7" in lines[0] and lines[1].split() == ["step", "mse", "gap_uncond", "gap_nulltext"]
    steps = sorted({r["step"] for r in val})
    assert [int(ln.split()[0]) for ln in lines[2:]] == steps == [0, 10, 20, 30, 40]
    assert lines[2].endswith("(the starting weights)") and not lines[3].endswith("weights)")
    for step, line in zip(steps, lines[2:]):
        rs = [r for r in val if r["step"] == step]
        want = [
            f"{sum(r[k] for r in rs) / len(rs):{f}}"
            for k, f in (("mse", ".4f"), ("gap_uncond", "+.4f"), ("gap_nulltext", "+.4f"))
        ]
        assert line.split()[1:4] == want


def _one_error(capsys) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert "Traceback" not in out + err and len(lines) == 1 and lines[0].startswith("gcc-plot: error: "), err
    return lines[0]


@pytest.mark.parametrize("row, value", [(1, "inf"), (40, "inf"), (20, "nan"), (40, "-inf")])
def test_a_step_inf_or_nan_is_exit_2_naming_file_row_and_column(tmp_path, capsys, row, value):
    """A step no log holds (inf, nan), first, last or in between: one line naming the file, the row and the
    column, not a traceback (int(inf)) nor a plot of it."""
    _run_folder(tmp_path)
    path = tmp_path / "train_log.csv"
    lines = path.read_text().splitlines()
    lines[row] = value + lines[row][lines[row].index(",") :]  # line 0 is the header
    path.write_text("\n".join(lines) + "\n")
    assert plot.main([str(tmp_path)]) == 2
    line = _one_error(capsys)
    assert f"{path}:{row + 1}: column 'step' is {float(value)}, expected a finite number" in line
    assert not (tmp_path / "curves.png").exists()


def test_a_timestep_inf_in_the_val_log_is_exit_2(tmp_path, capsys):
    _run_folder(tmp_path)
    path = tmp_path / "val_log.csv"
    lines = path.read_text().splitlines()
    fields = lines[2].split(",")
    fields[1] = "inf"
    lines[2] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")
    assert plot.main([str(tmp_path)]) == 2
    assert f"{path}:3: column 'timestep' is inf, expected a finite number" in _one_error(capsys)


def test_control_characters_in_a_cell_are_printed_escaped(tmp_path, capsys):
    """A step cell holding ESC and CR in the middle of the log (not a row being written: it is not the last) is
    refused, the cell shown escaped; the last row without a step (a run is writing it) is still left out."""
    _run_folder(tmp_path)
    path = tmp_path / "train_log.csv"
    lines = path.read_text().splitlines()
    lines[5] = '"1\x1b[2J\rx"' + lines[5][lines[5].index(",") :]
    path.write_text("\n".join(lines) + "\n")
    assert plot.main([str(tmp_path)]) == 2
    line = _one_error(capsys)
    assert "\x1b" not in line and "\r" not in line, repr(line)
    assert f"{path}:6: column 'step' is '1\\x1b[2J\\rx', expected a number" in line
    path.write_text("\n".join(lines[:5] + lines[6:] + ['"1\x1b']) + "\n")  # the last row: left out
    assert list(plot.read_columns(path, ("step",))["step"]) == [float(s) for s in range(1, 41) if s != 5]


def test_a_fifo_as_a_log_is_refused_not_waited_on(tmp_path, capsys):
    import os

    os.mkfifo(tmp_path / "train_log.csv")  # no writer: an open() for reading would wait for ever
    with time_limit(10):
        assert plot.main([str(tmp_path)]) == 2
    assert f"{tmp_path / 'train_log.csv'}: is a FIFO (named pipe)" in _one_error(capsys)


def test_several_runs_are_overlaid_with_their_resumes_and_batch_changes_marked(tmp_path, capsys):
    """`gcc-plot A B`: both runs' curves in one PNG (a colour each), and each run's resumes and global-batch changes
    from its run.json marked at their step (a run.json of an earlier gcc, without `from_step`: none)."""
    import json

    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        _run_folder(d)
    lineage = {
        "init_ckpt": "",
        "launches": [{"time": "t", "world": 2, "from_step": 0}, {"time": "t", "world": 1, "from_step": 18}],
        "global_batch_changes": [{"step": 30, "old": 4, "new": 2}],
    }
    (a / "run.json").write_text(json.dumps({"signature": {}, "lineage": lineage}))
    (b / "run.json").write_text(json.dumps({"signature": {}, "lineage": {"launches": [{"time": "t", "world": 2}]}}))
    assert plot.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"gcc-plot: wrote {a / 'curves-overlay.png'} (2 runs)",
        "gcc-plot: a: resumed at step 18",
        "gcc-plot: a: batch 4 -> 2 at step 30",
    ]
    img = np.asarray(Image.open(a / "curves-overlay.png").convert("RGB"), dtype=np.int16)
    loss = img[:340, :400]  # the loss panel: a curve of each run's colour (matplotlib's C0 and C1)
    for rgb in ((31, 119, 180), (255, 127, 14)):
        assert (np.abs(loss - rgb).sum(axis=2) < 40).sum() > 50, rgb
    assert _colored_panels(a / "curves-overlay.png") == [[True] * 4, [True] * 3 + [False]]
