"""gcc-compare (docs/training.md, "Checking a resume") on small run folders written by the trainer's own writers:
train_log.csv / val_log.csv by the CSV logger with the trainer's columns, exports by `save_gc`. (On real launches:
tests/training/test_train_e2e.py, test_exact_resume_after_sigkill.)"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from _gc_helpers import export_metadata, tiny_dit
from hostile import time_limit

from gcc import exit_codes
from gcc.inputs import safetensors_header
from gcc.model.export import save_gc
from gcc.tools.compare import main
from gcc.training.callbacks import TRAIN_COLUMNS, VAL_COLUMNS
from gcc.training.csv_logger import CSVLogger

ROOT = Path(__file__).resolve().parents[2]
STEPS, VAL_EVERY, EXPORT_EVERY = 12, 6, 6
TIMESTEPS = (201.3, 500.6, 799.7)


def train_row(step: int, launch: int) -> dict:
    """A train_log row: its draws and numbers a function of the step; the timings of the launch (they differ). A
    column not named here (a newly declared statistic) is a function of the step too."""
    return {c: 0.01 * step for c in TRAIN_COLUMNS} | {
        "step": step,
        "loss": 1.0 / step,
        "mse": 0.5 / step,
        "timestep": 100.0 + step,
        "lr": 1e-4 * min(step, 4),
        "cond_lr": 1e-3 * min(step, 4),
        "grad_norm": 0.1 * step,
        "sem_rms": 0.0 if step == 1 else 0.01 * step,
        "x_rms": 0.7,
        "text_drop": 0.25 * (step % 2),
        "cond_drop": 0.0,
        "mask_frac": 0.125,
        "step_time": 0.3 + launch,
        "data_time": 0.01 * launch,
        "mem_gb": 1.5 + launch,
        "epoch": (step - 1) // 5,
        "time": 1.7e9 + 10 * step + launch,
        "clips": ";".join(f"clip{(4 * step + i) % 22:05d}" for i in range(4)),
    }


def val_rows(step: int) -> list[dict]:
    return [
        {
            "step": step,
            "timestep": t,
            "mse": t / 1e3 / step,
            "mse_uncond": t / 1e3 / step + 0.01,
            "mse_nulltext": t / 1e3 / step + 0.002,
            "gap_uncond": 0.01,
            "gap_nulltext": 0.002,
            "n": 4,
        }
        for t in TIMESTEPS
    ]


def export_of(step: int, resumed_step: int | None):
    dit = tiny_dit(seed=step)  # weights a function of the step
    meta = export_metadata(
        data_root="shards",
        step=step,
        lr=1e-3,
        cond_lr=1e-2,
        warmup_steps=4,
        resumed_from="" if resumed_step is None else "ckpt",
        resumed_step="" if resumed_step is None else resumed_step,
        # the relaunch ran other code (gcc/provenance.py): the same training all the same
        git_revision="c0ffee" if resumed_step is None else "beef",
        git_dirty=resumed_step is not None,
    )
    return dit.state_dict(), meta


def write_run(
    run_dir: Path,
    first: int = 1,
    launch: int = 0,
    resumed_step: int | None = None,
    train_edit=None,
    exports: bool = True,
) -> Path:
    """A run folder holding steps first..STEPS, as the trainer writes it. `train_edit(row)` changes a row."""
    log = CSVLogger(run_dir, {"train_log": TRAIN_COLUMNS, "val_log": VAL_COLUMNS})
    run_dir.mkdir(parents=True, exist_ok=True)
    for step in range(first, STEPS + 1):
        row = train_row(step, launch)
        if train_edit:
            train_edit(row)
        log.log_table(TRAIN_COLUMNS, [[row[c] for c in TRAIN_COLUMNS]], name="train_log")
        if step % VAL_EVERY == 0:
            log.log_table(VAL_COLUMNS, [[r[c] for c in VAL_COLUMNS] for r in val_rows(step)], name="val_log")
        if exports and step % EXPORT_EVERY == 0:
            sd, meta = export_of(step, resumed_step)
            save_gc(sd, run_dir / f"step-{step}.safetensors", meta)
    return run_dir


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("compare") / "a")


def _changed(value):
    return value + ";clip99999" if isinstance(value, str) else value + 1


# the columns a resumed run may not reproduce (docs/training.md, "Checking a resume"): pinned here, not read from
# gcc.training.columns
TIMINGS = {"step_time", "data_time", "mem_gb", "time"}


def test_every_column_but_the_timings_is_compared(uninterrupted, tmp_path, capsys):
    """A run that differs from the uninterrupted one in one column of one row only: gcc-compare names that column
    at that step, unless it is a timing."""
    assert TIMINGS < set(TRAIN_COLUMNS)
    for column in [c for c in TRAIN_COLUMNS if c != "step"]:  # the step: the rows' key
        b = write_run(
            tmp_path / column,
            exports=False,
            train_edit=lambda r, c=column: r.update({c: _changed(r[c])}) if r["step"] == 5 else None,
        )
        code = main([str(uninterrupted), str(b)])
        out = capsys.readouterr().out
        if column in TIMINGS:
            assert "train_log.csv: 12 row(s) agree" in out, (column, out)
        else:
            assert code == 1 and f"train_log.csv step 5: {column}" in out, (column, out)


def test_a_resumed_run_agrees(uninterrupted, tmp_path, capsys):
    """Other timings and export metadata (resumed_from, the code's git_revision and git_dirty) by design: they
    agree."""
    b = write_run(tmp_path / "b", launch=1, resumed_step=6)
    metas = [safetensors_header(run / "step-6.safetensors")[1] for run in (uninterrupted, b)]
    assert [(m["git_revision"], m["git_dirty"]) for m in metas] == [("c0ffee", "False"), ("beef", "True")]
    assert main([str(uninterrupted), str(b)]) == 0
    out = capsys.readouterr().out
    assert "train_log.csv: 12 row(s) agree" in out and "val_log.csv: 6 row(s) agree" in out
    assert "exports: step-6, step-12 agree" in out and out.rstrip().endswith("gcc-compare: they agree")


@pytest.mark.parametrize(
    "edit, where",
    [
        (lambda r: r.update(loss=math.nextafter(r["loss"], 1.0)) if r["step"] == 7 else None, "step 7: loss"),
        (
            lambda r: r.update(clips="clip00001;clip00002;clip00003;clip00005") if r["step"] == 3 else None,
            "step 3: clips",
        ),
        (lambda r: r.update(text_drop=0.5) if r["step"] == 10 else None, "step 10: text_drop"),
    ],
)
def test_the_first_step_that_differs_is_named(uninterrupted, tmp_path, capsys, edit, where):
    def twice(r):  # a second, later difference must not hide the first
        edit(r)
        if r["step"] == 11:
            r["grad_norm"] += 1.0

    b = write_run(tmp_path / "b", launch=1, train_edit=twice, exports=False)
    assert main([str(uninterrupted), str(b)]) == 1
    out = capsys.readouterr().out
    step = int(where.split()[1].rstrip(":"))
    assert f"train_log.csv: 2 row(s) differ, the first: train_log.csv {where}" in out
    assert f"they differ; the first step that differs is {step} (train_log.csv {where}" in out
    assert "exports: none in common" in out


def test_a_difference_in_validation_or_an_export(uninterrupted, tmp_path, capsys):
    b = write_run(tmp_path / "b")
    val = (b / "val_log.csv").read_text().splitlines()
    assert val[4].startswith("12,201.3,")  # step 12's first row: its mse one digit off
    fields = val[4].split(",")
    fields[2] = repr(math.nextafter(float(fields[2]), 1.0))
    (b / "val_log.csv").write_text("\n".join(val[:4] + [",".join(fields)] + val[5:]) + "\n")
    assert main([str(uninterrupted), str(b)]) == 1
    assert "the first step that differs is 12 (val_log.csv step 12, timestep 201.3: mse" in capsys.readouterr().out
    # an export that differs in one tensor
    c = write_run(tmp_path / "c")
    sd, meta = export_of(6, None)
    name = sorted(sd)[0]
    sd[name] = sd[name] * (1 + 2**-5)  # a change that bf16 keeps
    save_gc(sd, c / "step-6.safetensors", meta)
    assert main([str(uninterrupted), str(c)]) == 1
    out = capsys.readouterr().out
    assert "exports: 1 of 2 differ" in out and f"differs is 6 (step-6.safetensors: tensor {name} differs" in out
    assert main([str(uninterrupted), str(c), "--rtol", "0.1"]) == 0  # within a relative tolerance
    capsys.readouterr()


def test_the_ema_exports_are_compared_too(tmp_path, capsys):
    """With algorithms.ema each export step has step-N.ema.safetensors beside it: compared as the raw ones."""
    runs = [write_run(tmp_path / name) for name in ("a", "b")]
    for run, scale in zip(runs, (1.0, 1 + 2**-5)):
        sd, meta = export_of(6, None)
        name = sorted(sd)[0]
        sd[name] = sd[name] * scale  # in b: the average differs in one tensor
        save_gc(sd, run / "step-6.ema.safetensors", {**meta, "weights": "ema"})
    assert main([str(runs[0]), str(runs[0])]) == 0
    out = capsys.readouterr().out
    assert "exports: step-6, step-12 agree" in out and "exports (ema): step-6.ema agree" in out
    assert "exports (ema) in one folder only" not in out
    assert main([str(runs[0]), str(runs[1])]) == 1
    out = capsys.readouterr().out
    assert "exports: step-6, step-12 agree" in out and "exports (ema): 1 of 1 differ" in out
    assert f"the first step that differs is 6 (step-6.ema.safetensors: tensor {name} differs" in out


def test_from_compares_from_the_resumed_step(uninterrupted, tmp_path, capsys):
    """A relaunch on a fresh machine starts its logs at the resumed step; the steps before it are only in RUN_A."""
    b = write_run(tmp_path / "b", first=7, launch=1, resumed_step=6)
    assert main([str(uninterrupted), str(b)]) == 1
    out = capsys.readouterr().out
    assert "the first step that differs is 1 (train_log.csv step 1: only in RUN_A)" in out
    assert "exports in one folder only (not compared): step-6" in out  # exported by the first machine
    assert main([str(uninterrupted), str(b), "--from", "7"]) == 0
    out = capsys.readouterr().out
    assert "train_log.csv: 6 row(s) agree" in out and "val_log.csv: 3 row(s) agree" in out
    assert "exports: step-12 agree" in out and "one folder only" not in out and "they agree" in out
    # steps outside [--from, --to] are not compared, differences there included
    c = write_run(tmp_path / "c", train_edit=lambda r: r.update(loss=0.0) if r["step"] in (2, 12) else None)
    assert main([str(uninterrupted), str(c)]) == 1
    assert main([str(uninterrupted), str(c), "--from", "3", "--to", "11"]) == 0
    capsys.readouterr()


def test_bad_input_is_exit_2_naming_it(uninterrupted, tmp_path, capsys):
    def error(*args) -> str:
        assert main([str(a) for a in args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("gcc-compare: error: "), err
        return err[0]

    assert "missing: not found, expected a run folder" in error(uninterrupted, tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert f"{empty / 'train_log.csv'}: not found" in error(empty, uninterrupted)
    bad = write_run(tmp_path / "bad", exports=False)
    text = (bad / "train_log.csv").read_text()
    (bad / "train_log.csv").write_text(text.replace("loss,", "lost,", 1))
    assert "no 'loss' column(s)" in error(uninterrupted, bad)
    (bad / "train_log.csv").write_text(text + "13,0.5\n")  # a row cut short
    assert f"train_log.csv:14: 2 fields, the header has {len(TRAIN_COLUMNS)}" in error(uninterrupted, bad)
    (bad / "train_log.csv").write_text(text)
    (bad / "step-6.safetensors").write_bytes(b"not an export")
    assert "step-6.safetensors: its header claims" in error(uninterrupted, bad)  # read alone (gcc/inputs.py)
    with pytest.raises(SystemExit) as e:  # a usage error: argparse's exit 2
        main([str(uninterrupted), str(bad), "--rtol", "-1"])
    assert e.value.code == 2 and capsys.readouterr().err.splitlines()[-1].startswith("gcc-compare: error: --rtol")
    # the module form, as a console script runs it: one line, no traceback
    r = subprocess.run(
        [sys.executable, "-m", "gcc.tools.compare", str(uninterrupted), str(empty)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == f"gcc-compare: error: {empty / 'train_log.csv'}: not found; is {empty} a run folder?"


def _one_error(capsys) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert "Traceback" not in out + err and len(lines) == 1 and lines[0].startswith("gcc-compare: error: "), err
    return lines[0]


def test_two_empty_train_logs_are_nothing_to_compare_not_agreement(tmp_path, capsys):
    """Logs holding their header alone: no row was compared, so "they agree" would say nothing; exit 2."""
    a, b = tmp_path / "a", tmp_path / "b"
    for run in (a, b):
        run.mkdir()
        (run / "train_log.csv").write_text(",".join(TRAIN_COLUMNS) + "\n")  # the header only
    assert main([str(a), str(b)]) == 2
    assert f"nothing to compare: {a / 'train_log.csv'} holds no row" in _one_error(capsys)


def test_from_past_both_logs_is_nothing_to_compare(uninterrupted, tmp_path, capsys):
    b = write_run(tmp_path / "b", launch=1, exports=False)
    assert main([str(uninterrupted), str(b), "--from", str(STEPS + 1)]) == 2
    line = _one_error(capsys)
    assert "nothing to compare" in line and f"steps from {STEPS + 1}" in line and f"holds steps 1..{STEPS}" in line
    assert main([str(uninterrupted), str(b), "--from", "100", "--to", "200"]) == 2
    assert "holds no row in steps 100..200" in _one_error(capsys)


def test_a_val_log_in_one_run_only_is_nothing_to_compare(uninterrupted, tmp_path, capsys):
    b = write_run(tmp_path / "b", launch=1, exports=False)
    (b / "val_log.csv").unlink()
    for argv, here in (([uninterrupted, b], uninterrupted), ([b, uninterrupted], uninterrupted)):
        assert main([str(p) for p in argv]) == 2
        line = _one_error(capsys)
        assert f"nothing to compare: {here / 'val_log.csv'} exists, {b / 'val_log.csv'} does not" in line


def test_control_characters_in_a_cell_are_printed_escaped(uninterrupted, tmp_path, capsys):
    """A clips cell holding ESC and CR (a terminal's clear-screen, a carriage return that would overwrite the
    line) is shown escaped in the report, never raw."""
    hostile = "clip\x1b[2J\x1b[31mred\rgone"
    b = write_run(
        tmp_path / "b",
        launch=1,
        exports=False,
        train_edit=lambda r: r.update(clips=hostile) if r["step"] == 3 else None,
    )
    assert main([str(uninterrupted), str(b)]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out, repr(out)
    assert "step 3: clips" in out and "clip\\x1b[2J\\x1b[31mred\\rgone (RUN_B)" in out


def test_a_fifo_as_a_log_is_refused_not_waited_on(uninterrupted, tmp_path, capsys):
    import os

    b = write_run(tmp_path / "b", launch=1, exports=False)
    (b / "val_log.csv").unlink()
    os.mkfifo(b / "val_log.csv")  # no writer: an open() for reading would wait for ever
    with time_limit(10):
        assert main([str(uninterrupted), str(b)]) == 2
    assert f"{b / 'val_log.csv'}: is a FIFO (named pipe)" in _one_error(capsys)


def test_runs_of_other_identities_are_named_first_and_never_agree(uninterrupted, tmp_path, capsys):
    """Two run folders whose run.json signatures differ (another preset, another lr under its old name) are other
    runs: the differing fields come first, by the config's names of now, and they do not agree even where the
    numbers would; the same signature compares as before."""
    import json
    import shutil

    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(uninterrupted, a)
    shutil.copytree(uninterrupted, b)
    signature = {"model.preset": "tiny", "optim.lr": 0.001, "seed": 0}
    (a / "run.json").write_text(json.dumps({"signature": signature, "lineage": {}}))
    (b / "run.json").write_text(json.dumps({"signature": signature, "lineage": {}}))
    assert main([str(a), str(b)]) == 0
    capsys.readouterr()
    other = {**signature, "model.preset": "wide", "optim.lr": 0.002}
    (b / "run.json").write_text(json.dumps({"signature": other, "lineage": {}}))
    assert main([str(a), str(b)]) == exit_codes.DIFFER
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "gcc-compare: different runs: their run.json signatures differ (RUN_A -> RUN_B): "
        "model.preset: 'tiny' -> 'wide'; optimizer.lr: 0.001 -> 0.002"
    )
    assert out[-1] == "gcc-compare: they differ: other run identities (above)"
