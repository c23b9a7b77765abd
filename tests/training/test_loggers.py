"""`loggers:` in yaml: Composer's TensorBoard, W&B (offline, for real) and MLflow (a local file store, for real)
loggers receive the same train/ and val/ keys, each once (not Composer's copies too), and a relaunch continues the
same W&B and MLflow run."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from _launch import cmd

from gcc import exit_codes
from gcc.training.callbacks import TRAIN_COLUMNS
from gcc.training.config import ConfigError, load_config
from gcc.training.loggers import COMPOSER_COPIES, GccNames

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "yamls" / "tiny_cpu.yaml"
ALL = "loggers={tensorboard: {}, wandb: {project: gcc-test}, mlflow: {experiment_name: gcc-test}}"


@pytest.mark.parametrize(
    "override, match",
    [
        ("loggers={neptune: {}}", "loggers.neptune: unknown logger"),
        ("loggers={wandb: {projekt: x}}", r"loggers.wandb.projekt: not an argument of Composer's WandBLogger"),
        ("loggers={mlflow: 3}", "loggers.mlflow: expected a mapping"),
        # each option of its type, as a callback's (one checker, gcc/training/composer_options.py)
        (
            "loggers={tensorboard: {flush_interval: soon}}",
            r"loggers.tensorboard.flush_interval: expected int, got 'soon'",
        ),
        ("loggers={wandb: {tags: gc25d}}", r"loggers.wandb.tags: expected list\[str\] or None, got 'gc25d'"),
        ("loggers={tensorboard: {log_dir: /tmp/x}}", r"loggers.tensorboard.log_dir: not an argument of Composer's"),
        # in range, checked with the config: Composer's class takes them and fails in the run (0: at the first step)
        ("loggers={tensorboard: {flush_interval: 0}}", r"loggers.tensorboard.flush_interval: must be >= 1"),
        ("loggers={mlflow: {logging_buffer_seconds: -1}}", r"loggers.mlflow.logging_buffer_seconds: must be >= 0"),
    ],
)
def test_bad_logger_config_names_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(TINY, [override])


def _numeric(hint) -> bool:
    import types
    import typing

    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return any(o in (int, float) for o in options)


def test_every_numeric_option_of_a_logger_or_a_callback_has_a_range():
    """Each number the yaml may give a logger or a Composer callback is range-checked with the config (their table's
    `bounds`): Composer's classes take values that fail only in the run (`flush_interval: 0` divided by zero at the
    first step). A new argument of a new Composer fails here until its range is stated."""
    from gcc.training.composer_callbacks import COMPOSER_CALLBACKS
    from gcc.training.composer_options import arguments
    from gcc.training.loggers import LOGGERS

    for table in (LOGGERS, COMPOSER_CALLBACKS):
        for name, entry in table.items():
            numeric = [a for a, hint in arguments(entry.composer_class, {"log_dir"}).items() if _numeric(hint)]
            assert sorted(numeric) == sorted(entry.bounds), (name, numeric, sorted(entry.bounds))


@pytest.mark.slow
def test_an_mlflow_server_that_does_not_answer_is_reported_within_seconds(monkeypatch, tmp_path):
    """The MLflow logger gcc builds bounds MLflow's requests (gcc/training/loggers.py `MLFLOW_REQUESTS`): a tracking
    server whose port refuses is reported in seconds, not after MLflow's default ~255 s of retries. A setting in the
    environment is the user's and stays."""
    import socket
    import time

    from gcc.training.loggers import MLFLOW_REQUESTS, _mlflow

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name in MLFLOW_REQUESTS:
        monkeypatch.setenv(name, "")  # restored after the test
        monkeypatch.delenv(name)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "7")
    t0 = time.monotonic()
    with pytest.raises(Exception, match="Max retries exceeded"):  # Composer's logger asks for its experiment at once
        _mlflow(tmp_path, {"tracking_uri": f"http://127.0.0.1:{port}"})
    assert time.monotonic() - t0 < 30
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2" and os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "7"


def test_composers_copies_of_gccs_scalars_are_left_out():
    class Kept:
        def __init__(self):
            self.got = []

        def log_metrics(self, metrics, step=None):
            self.got.append((metrics, step))

    class Logger(GccNames, Kept):
        pass

    logger = Logger()
    logger.log_metrics({"loss/train/total": 1.0, "train/loss": 1.0, "time/batch": 3}, 3)
    logger.log_metrics({"metrics/val/val_mse": 0.5}, 4)  # nothing left: no call
    logger.log_metrics({"val/mse_mean": 0.5, "memory/peak_allocated_mem": 2.0}, 4)
    assert logger.got == [
        ({"train/loss": 1.0, "time/batch": 3}, 3),
        ({"val/mse_mean": 0.5, "memory/peak_allocated_mem": 2.0}, 4),
    ]


def test_default_is_tensorboard_and_an_empty_mapping_keeps_only_csv():
    assert load_config(TINY, []).loggers == {"tensorboard": {}}
    assert load_config(TINY, ["loggers={}"]).loggers == {}


def _wandb_history(run_dir: Path) -> list[tuple[int, set[str]]]:
    """(step, keys) of every history record in W&B's offline run files (a LevelDB-style log of protobuf Records:
    a 7-byte header, then 32 KiB blocks of chunks, each with a 7-byte header: crc32, length, type)."""
    from wandb.proto import wandb_internal_pb2 as pb2

    out = []
    for f in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, buf = f.read_bytes(), 7, b""
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
            if left < 7 or (n == 0 and kind == 0):  # block padding
                pos += left
                continue
            buf, pos = buf + data[pos + 7 : pos + 7 + n], pos + 7 + n
            if kind in (1, 4):  # FULL or LAST chunk: a whole record
                rec = pb2.Record()
                rec.ParseFromString(buf)
                buf = b""
                if rec.WhichOneof("record_type") == "history":
                    out.append((rec.history.step.num, {i.key or "/".join(i.nested_key) for i in rec.history.item}))
    return out


def _ours(keys) -> set[str]:
    return {k for k in keys if k.startswith(("train/", "val/"))}


@pytest.mark.slow
def test_tensorboard_wandb_and_mlflow_get_the_same_keys_and_a_relaunch_continues_their_runs(
    tmp_path, monkeypatch, e2e_shards
):
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    env = dict(os.environ, WANDB_MODE="offline", PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    for max_steps in (4, 6):
        r = subprocess.run(
            [
                sys.executable,
                str(ROOT / "gcc" / "train.py"),
                str(TINY),
                f"run_dir={run_dir}",
                f"data.path={e2e_shards}",
                f"max_duration={max_steps}",
                "global_train_batch_size=4",
                "device_train_microbatch_size=2",
                "eval_interval=2",
                "val_n=2",
                "val_batch=2",
                "export_every=0",
                "save_interval=2",
                "progress_bar=false",
                "data.num_workers=0",
                # samples reach the loggers whatever their number of denoising steps (the default 20 took over
                # half of this test's time)
                "sample_steps=2",
                ALL,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    expected = {f"train/{c}" for c in TRAIN_COLUMNS if c not in ("step", "time", "clips")} | {"train/sem_over_x"}
    expected |= {
        f"val/{k}_{t}"
        for k in ("mse", "mse_uncond", "mse_nulltext", "gap_uncond", "gap_nulltext")
        for t in ("t201.3", "t500.6", "t799.7", "mean")
    }

    events = sorted((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    assert len(events) == 2  # one per launch
    tb, tb_val_steps = set(), []
    for e in events:
        acc = EventAccumulator(str(e)).Reload()
        tb |= set(acc.Tags()["scalars"])
        tb_val_steps += [ev.step for ev in acc.Scalars("val/mse_mean")]

    history = _wandb_history(run_dir)
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 2
    assert len({p.name.rsplit("-", 2)[-1] for p in run_dir.glob("wandb/offline-run-*")}) == 1  # one run id
    wb = set().union(*(keys for _, keys in history))

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient((run_dir / "mlruns").resolve().as_uri())
    exp = client.get_experiment_by_name("gcc-test")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1 and runs[0].info.run_name == "run"  # the relaunch resumed the same MLflow run
    ml = set(runs[0].data.metrics)
    assert sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, "train/loss")) == [1, 2, 3, 4, 5, 6]
    # the step-0 validation (the starting weights) reaches every logger, once: the relaunch resumed
    val_steps = sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, "val/mse_mean"))
    assert (
        val_steps == sorted(tb_val_steps) == [step for step, keys in history if "val/mse_mean" in keys] == [0, 2, 4, 6]
    )

    assert _ours(tb) == _ours(wb) == _ours(ml) == expected
    # each scalar once, under gcc's name: Composer's copies of the loss and the val metric are left out
    for keys in (tb, wb, ml):
        assert {"loss/train/total", "metrics/val/val_mse"} & keys == set()
        assert not [k for k in keys if k.startswith(COMPOSER_COPIES)]
    assert {e.parent.name for e in events} == {"run"}  # TensorBoard's run: the run folder's name
    assert not list(run_dir.glob("mlruns/**/artifacts/*.json"))  # the CSV rows stay out of MLflow (no tables)

    # samples during training (every second validation and the last step: 0, 4 in the first launch, 6 in the
    # second) reach every logger: TensorBoard images (a GIF per clip and variant, the contact sheet), W&B videos and
    # images, MLflow artifacts, and the scalars
    sample_steps = [0, 4, 6]
    clips = sorted(json.loads((run_dir / "samples" / "step-0" / "samples.json").read_text())["clips"])
    assert len(clips) == 2 and sorted(p.name for p in (run_dir / "samples").iterdir()) == [
        f"step-{s}" for s in sample_steps
    ]
    tags = {f"samples/{c}/{v}" for c in clips for v in ("cond", "uncond", "sheet")}
    tb_images: dict[str, list[int]] = {}
    for e in events:
        acc = EventAccumulator(str(e), size_guidance={"images": 0}).Reload()
        for tag in acc.Tags()["images"]:
            for im in acc.Images(tag):
                assert im.encoded_image_string[:6] in (b"GIF89a", b"\x89PNG\r\n")
                tb_images.setdefault(tag, []).append(im.step)
    assert tb_images == {t: sample_steps for t in tags}
    # a W&B media value is a nested record ({_type: video-file | image-file, path, ...}) under its key
    wb_media = {step: m for step, keys in history if (m := {k.removesuffix("/_type") for k in keys} & tags)}
    assert wb_media == {s: tags for s in sample_steps}
    offline = sorted(run_dir.glob("wandb/offline-run-*/files/media"))
    assert len(list(offline[0].rglob("*.mp4"))) == 2 * len(clips) * 2  # steps 0 and 4: a video per clip and variant
    assert len(list(offline[0].rglob("*.png"))) == 2 * len(clips)
    run_id = runs[0].info.run_id
    for s in sample_steps:
        names = {Path(a.path).name for a in client.list_artifacts(run_id, f"samples/step-{s}")}
        assert names == {f"{c}.{v}" for c in clips for v in ("cond.mp4", "uncond.mp4", "png")} | {"samples.json"}
    for keys in (tb, wb, ml):
        assert {"sample/agreement_cond", "sample/agreement_uncond", "sample/seconds"} <= keys


@pytest.mark.slow
def test_the_password_of_an_unreachable_mlflow_uri_is_masked_on_the_console_and_in_the_run_folder(tmp_path, shards):
    """MLFLOW_TRACKING_URI=http://alice:PASSWORD@host that does not answer: MLflow's error names the URL; before,
    its traceback reached the console and train.log with the password in it. Now exit 7 with one line, the URL
    masked everywhere. The process is the point: the console's report is the interpreter's."""
    run_dir = tmp_path / "run"
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        MLFLOW_TRACKING_URI="http://alice:PASSWORD@127.0.0.1:9",  # the discard port: nothing answers
        MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
        MLFLOW_HTTP_REQUEST_TIMEOUT="5",
    )
    # the tests' one trainer command (tests/_launch.py `cmd`), one rank without the launcher
    argv = cmd(
        run_dir,
        shards,
        "max_duration=1",
        "progress_bar=false",
        "data.num_workers=0",
        "loggers={mlflow: {}}",
        direct=True,
    )
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    console = r.stdout + r.stderr
    assert r.returncode == exit_codes.STORAGE and "a server did not answer" in console, console[-4000:]
    assert "http://***@127.0.0.1:9" in console and "Traceback" not in console, console[-4000:]
    log = (run_dir / "train.log").read_text()
    assert "http://***@127.0.0.1:9" in log, log[-4000:]
    written = [p for p in run_dir.rglob("*") if p.is_file() and b"PASSWORD" in p.read_bytes()]
    assert "PASSWORD" not in console and "alice" not in console and not written, (written, console[-4000:])


@pytest.mark.slow
def test_wandb_without_a_login_is_one_line_naming_offline_and_wandb_login_and_exit_7(tmp_path, shards):
    """W&B asked for, no API key anywhere (a fresh HOME, no WANDB_API_KEY) and not offline: the service refuses the
    login. Before, a traceback and exit 1; now exit 7 (a tracking service: relaunch once it is fixed) and one line
    that names the two ways out, WANDB_MODE=offline and `wandb login`."""
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(PYTHONPATH=str(ROOT), HOME=str(tmp_path / "home"), WANDB_DIR=str(tmp_path / "wandb"))
    argv = cmd(run_dir, shards, "max_duration=1", "progress_bar=false", "loggers={wandb: {project: p}}", direct=True)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    console = r.stdout + r.stderr
    assert r.returncode == exit_codes.STORAGE and "Traceback" not in console, console[-4000:]
    [line] = [ln for ln in console.splitlines() if "refused the login" in ln]
    assert line.startswith("gcc.train: rank 0: W&B refused the login (") and "WANDB_MODE=offline" in line, line
    assert "`wandb login`" in line
