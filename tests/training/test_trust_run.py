"""The run's own files and locks (docs/training.md, "Trust and safety"): credentials stay out of gcc's files and
logs, files follow the user's umask, node-wide locks are the user's own and time out with a message, and the run
lock never follows a planted link."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hostile import run_entry
from safetensors import safe_open

from gcc.training.run_folder import Refusal, RunLock

ROOT = Path(__file__).resolve().parents[2]
SECRET = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.slow
def test_credentials_stay_out_of_gccs_files_and_logs(e2e_shards, tmp_path):
    """A W&B key in the yaml and a token in a URL's user info: config.json, run.json, done.json, the CSV logs,
    the export's metadata and the job log never hold them. (W&B's own files under wandb/ hold what W&B is given:
    docs/training.md says to pass credentials through the environment.)"""
    run_dir = tmp_path / "run"
    env = dict(os.environ, WANDB_MODE="offline", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "gcc" / "train.py"),
            str(ROOT / "yamls" / "tiny_cpu.yaml"),
            f"run_dir={run_dir}",
            f"data.path={e2e_shards}",
            "max_duration=2",
            "global_train_batch_size=2",
            "device_train_microbatch_size=1",
            "eval_interval=0",
            "export_every=2",
            "save_interval=2",
            "progress_bar=false",
            "data.num_workers=0",
            f"loggers={{wandb: {{project: p, init_kwargs: {{settings: {{api_key: {SECRET}, base_url: "
            f"'https://alice:{SECRET}@wandb.example'}}}}}}}}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ours = [run_dir / n for n in ("config.json", "run.json", "done.json", "train_log.csv", "val_log.csv")]
    for path in ours:
        assert SECRET not in path.read_text(), path
    with safe_open(str(run_dir / "step-2.safetensors"), "pt") as f:
        assert SECRET not in json.dumps(f.metadata())
    assert SECRET not in r.stdout + r.stderr
    assert "loggers.wandb.init_kwargs.settings.api_key holds a credential" in r.stderr
    settings = json.loads((run_dir / "config.json").read_text())["config"]["loggers"]["wandb"]["init_kwargs"][
        "settings"
    ]
    assert settings == {"api_key": "***", "base_url": "https://***@wandb.example"}


def test_log_lines_mask_credentials(capsys):
    import logging

    from gcc.training.console import configure_logging

    configure_logging("INFO", 0)
    logging.getLogger("gcc.test").info("fetching %s", f"https://bob:{SECRET}@host/x?token={SECRET}&a=1")
    logging.getLogger("gcc.test").warning(f"s3://AKIA:{SECRET}@bucket/p")
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err
    assert "fetching https://***@host/x?token=***&a=1" in out.out and "s3://***@bucket/p" in out.err


@pytest.mark.parametrize("umask, mode", [(0o027, 0o640), (0o002, 0o664), (0o022, 0o644)])
def test_files_follow_the_umask(tmp_path, umask, mode):
    code = (
        "import os, sys; os.umask(int(sys.argv[2], 8)); from gcc.storage import atomic_write; "
        "from gcc.training.console import open_run_log; atomic_write(sys.argv[1], b'x'); "
        "open_run_log(os.path.dirname(sys.argv[1]), 0, 1)"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "f"), oct(umask)],
        check=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert stat.S_IMODE(os.stat(tmp_path / "f").st_mode) == mode
    assert stat.S_IMODE(os.stat(tmp_path / "train.log").st_mode) == mode


def test_the_run_lock_never_follows_a_planted_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("someone's file")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".lock").symlink_to(victim)
    with pytest.raises(Refusal, match=r"\.lock: a symbolic link, which gcc never writes through; it is the run's lock"):
        RunLock(run_dir).acquire()
    assert victim.read_text() == "someone's file"


def _args(run_dir: Path, shards: Path, *overrides: str) -> list[str]:
    """The trainer's arguments for a single-process run of the tiny model, without samples during training."""
    return [
        str(ROOT / "yamls" / "tiny_cpu.yaml"),
        f"run_dir={run_dir}",
        f"data.path={shards}",
        "global_train_batch_size=2",
        "device_train_microbatch_size=1",
        "eval_interval=2",
        "val_n=2",
        "val_batch=2",
        "export_every=2",
        "save_interval=2",
        "progress_bar=false",
        "data.num_workers=0",
        "loggers={}",
        "sample_every=0",  # samples during training (20 denoising steps each) are none of these tests' concern
        *overrides,
    ]


def _train(run_dir: Path, shards: Path, *overrides: str) -> subprocess.CompletedProcess:
    """One single-process launch (`_args`; world 1: no launcher needed)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, str(ROOT / "gcc" / "train.py"), *_args(run_dir, shards, *overrides)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes() for p in run_dir.iterdir() if p.name.startswith("step-") or p.name.endswith("_log.csv")
    }


@pytest.fixture(scope="session")
def two_steps(e2e_shards, shared):
    """A finished single-process run of 2 steps (`_train`): its checkpoint and its step-2 export; read-only (copy
    it: `_copy`)."""

    def build(path: Path) -> None:
        r = _train(path / "run", e2e_shards, "max_duration=2")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    return shared("two_steps", build) / "run"


def _copy(run: Path, dst: Path) -> Path:
    shutil.copytree(run, dst, symlinks=True, ignore=shutil.ignore_patterns("cache", ".lock"))
    return dst


@pytest.mark.slow
def test_a_run_folder_with_outputs_but_no_checkpoint_is_refused_and_allow_existing_moves_them_aside(
    two_steps, e2e_shards, tmp_path
):
    run_dir = _copy(two_steps, tmp_path / "run")
    shutil.rmtree(run_dir / "checkpoints")  # deleted, or a run stopped before its first checkpoint
    (run_dir / "run.json").unlink()  # and its record: the refused launch must not write one first
    before = _snapshot(run_dir)
    assert "step-2.safetensors" in before and before["train_log.csv"].count(b"\n") == 3
    r = _train(run_dir, e2e_shards, "max_duration=2")
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
    assert "1 export(s) (newest step-2.safetensors), train_log.csv with 2 row(s)" in r.stderr
    assert "allow_existing=true" in r.stderr and "Traceback" not in r.stderr
    assert _snapshot(run_dir) == before  # nothing rewritten, nothing trimmed
    assert not (run_dir / "run.json").exists()
    r = _train(run_dir, e2e_shards, "max_duration=2", "allow_existing=true")
    assert r.returncode == 0, r.stderr[-3000:]
    (replaced,) = (run_dir / "replaced").iterdir()
    assert f"what the run had written is now in {replaced}" in r.stdout
    assert _snapshot(replaced) == before
    assert (run_dir / "train_log.csv").read_bytes().count(b"\n") == 3  # the new start's own two rows


@pytest.mark.slow
def test_autoresume_off_in_a_used_folder_is_refused(two_steps, e2e_shards, tmp_path):
    run_dir = _copy(two_steps, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in (run_dir / "checkpoints").iterdir()}
    assert list(before) and all(n.startswith(("ep0-ba2", "latest")) for n in before), sorted(before)
    r = _train(run_dir, e2e_shards, "max_duration=4", "autoresume=false")
    assert r.returncode == 3 and "autoresume is off" in r.stderr and "1 checkpoint(s)" in r.stderr, r.stderr[-2000:]
    # the refused launch left the checkpoints as they were
    assert {p.name: p.read_bytes() for p in (run_dir / "checkpoints").iterdir()} == before


@pytest.mark.slow
def test_a_warm_started_run_resumes_after_its_init_ckpt_moved(two_steps, e2e_shards, tmp_path):
    init = tmp_path / "init.safetensors"
    shutil.copyfile(two_steps / "step-2.safetensors", init)
    run_dir = tmp_path / "run"
    r = _train(run_dir, e2e_shards, "max_duration=2", f"model.init_ckpt={init}")
    assert r.returncode == 0, r.stderr[-3000:]
    recorded = json.loads((run_dir / "run.json").read_text())["signature"]["model.init_ckpt"]
    init.rename(tmp_path / "moved.safetensors")
    r = _train(run_dir, e2e_shards, "max_duration=4", f"model.init_ckpt={init}")
    assert r.returncode == 0 and "resuming from" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
    assert json.loads((run_dir / "run.json").read_text())["signature"]["model.init_ckpt"] == recorded
    # a start from step 0 needs the file: exit 2 naming the key, before any work (so in this process)
    r = run_entry("gcc.train", _args(tmp_path / "fresh", e2e_shards, "max_duration=2", f"model.init_ckpt={init}"))
    assert r.returncode == 2 and "model.init_ckpt" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_a_credential_in_the_config_is_named_in_a_warning():
    from gcc.redact import secret_keys

    tree = {
        "loggers": {
            "wandb": {"project": "p", "init_kwargs": {"settings": {"api_key": "k"}}},
            "mlflow": {"tracking_uri": "https://u:t@h"},
        },
        "seed": 0,
        "val_timesteps": [200],
    }
    assert secret_keys(tree) == ["loggers.wandb.init_kwargs.settings.api_key", "loggers.mlflow.tracking_uri"]


def _prepare(run_dir: Path, shards: Path, *overrides: str):
    """Rank 0's checks and first writes of a launch (`launch.prepare_run`), in this process: the launch that
    `_train` would start stops there on a refusal, before the model is built."""
    from gcc.training.config import load_config
    from gcc.training.run_start import prepare_run  # Composer: loaded only by the tests that need it

    yaml, *args = _args(run_dir, shards, *overrides)
    lock = RunLock(run_dir)
    try:
        return prepare_run(load_config(yaml, args), lock)
    finally:
        lock.release()


def test_a_warm_started_runs_resume_is_refused_with_another_init_ckpt_and_stops_on_a_missing_one(e2e_shards, tmp_path):
    """docs/training.md, "Resuming": the run signature holds init_ckpt's digest. A resume with other weights is
    refused (exit 3, the field listed), at another path or in place of the first file; a copy of the same weights
    elsewhere resumes (the digest, not the path, is the run's). A missing file the run never recorded is exit 2
    naming the key, the file and the one recorded; the recorded one gone, the resume goes on with its digest (the
    resume loads the checkpoint, not the file). Every refused launch leaves run.json as it was."""
    import zipfile

    from gcc.training.config import ConfigError

    init, other = tmp_path / "init.safetensors", tmp_path / "other.safetensors"
    init.write_bytes(b"the warm start's weights")  # read only for its digest by these checks
    other.write_bytes(b"other weights")
    run_dir = tmp_path / "run"
    first = _prepare(run_dir, e2e_shards, f"model.init_ckpt={init}")
    assert first.resumed_step is None and first.lineage["init_ckpt"] == str(init)
    digest = json.loads((run_dir / "run.json").read_text())["signature"]["model.init_ckpt"]["sha256"]
    ckpts = run_dir / "checkpoints"  # a checkpoint of step 2 (a complete torch.save zip), so that a launch resumes
    ckpts.mkdir()
    with zipfile.ZipFile(ckpts / "ep0-ba2-rank0.pt", "w") as z:
        z.writestr("data.pkl", b"")
    (ckpts / "latest-rank0.pt").symlink_to("ep0-ba2-rank0.pt")
    record = (run_dir / "run.json").read_bytes()

    with pytest.raises(Refusal, match="differ") as refused:
        _prepare(run_dir, e2e_shards, f"model.init_ckpt={other}")
    assert refused.value.exit_code == 3 and f"model.init_ckpt: '{digest}' -> '" in str(refused.value)
    with pytest.raises(ConfigError) as missing:
        _prepare(run_dir, e2e_shards, f"model.init_ckpt={tmp_path / 'gone.safetensors'}")
    assert missing.value.exit_code == 2 and str(missing.value).startswith(
        f"model.init_ckpt: {tmp_path / 'gone.safetensors'}: not found"
    )
    assert f"warm-started from {init}" in str(missing.value)
    init.write_bytes(b"the warm start's weights, changed")  # new weights in place of the recorded file
    with pytest.raises(Refusal, match=f"model.init_ckpt: '{digest}' -> '"):
        _prepare(run_dir, e2e_shards, f"model.init_ckpt={init}")
    assert (run_dir / "run.json").read_bytes() == record

    copy = tmp_path / "copy.safetensors"
    copy.write_bytes(b"the warm start's weights")  # the same weights elsewhere: the same run
    start = _prepare(run_dir, e2e_shards, f"model.init_ckpt={copy}")
    assert start.resumed_step == 2 and start.lineage["init_ckpt"] == str(init)  # the lineage keeps the first
    init.unlink()
    start = _prepare(run_dir, e2e_shards, f"model.init_ckpt={init}")
    assert start.resumed_step == 2
    assert json.loads((run_dir / "run.json").read_text())["signature"]["model.init_ckpt"]["sha256"] == digest


def _used(run_dir: Path, last_step: int, export_step: int = 2) -> dict[str, bytes]:
    """What a launch killed after step `last_step` leaves beside its run.json: train_log.csv rows up to there, the
    step-0 validation's and one later val_log.csv row, an export; their bytes."""
    (run_dir / "train_log.csv").write_text("step,loss\n" + "".join(f"{s},0.5\n" for s in range(1, last_step + 1)))
    (run_dir / "val_log.csv").write_text("step,timestep\n0,201.3\n2,201.3\n")
    (run_dir / f"step-{export_step}.safetensors").write_bytes(b"an export")
    return _snapshot(run_dir)


def test_a_relaunch_after_a_kill_before_the_first_checkpoint_starts_over_and_one_after_it_is_refused(
    e2e_shards, tmp_path, caplog
):
    """docs/training.md, "Resuming": a launch killed before the run's first checkpoint leaves rows and exports but
    nothing to resume. The same command then starts the run over, moving what was there to replaced/<time>/ with
    one line; a folder whose run committed a checkpoint (run.json notes the first), now gone, is refused as before.
    A record of an earlier gcc, which notes none, starts over only when nothing is later than the first save point
    (save_interval=2 here)."""
    import logging

    from gcc.training.run_folder import FIRST_CHECKPOINT, record_first_checkpoint

    run_dir = tmp_path / "run"
    _prepare(run_dir, e2e_shards)
    assert json.loads((run_dir / "run.json").read_text())["lineage"][FIRST_CHECKPOINT] is None
    before = _used(run_dir, 5)  # past save_interval: a background write of step 2's checkpoint never completed
    with caplog.at_level(logging.INFO, logger="gcc"):
        start = _prepare(run_dir, e2e_shards)
    assert start.resumed_step is None
    (replaced,) = (run_dir / "replaced").iterdir()
    assert _snapshot(replaced) == before and not _snapshot(run_dir)
    [line] = [r.getMessage() for r in caplog.records if "replaced" in r.getMessage()]
    assert "before the run's first checkpoint" in line and f"is now in {replaced}" in line
    assert "train_log.csv with 5 row(s)" in line

    before = _used(run_dir, 3)
    assert record_first_checkpoint(run_dir, 2) and not record_first_checkpoint(run_dir, 4)  # the first, once
    with pytest.raises(Refusal) as refused:
        _prepare(run_dir, e2e_shards)
    assert "committed a checkpoint at step 2 (run.json), gone since" in str(refused.value)
    assert "allow_existing=true" in str(refused.value) and _snapshot(run_dir) == before

    record = json.loads((run_dir / "run.json").read_text())
    del record["lineage"][FIRST_CHECKPOINT]  # an earlier gcc's record
    (run_dir / "run.json").write_text(json.dumps(record))
    with pytest.raises(Refusal, match="step 3's rows or export, past the first checkpoint"):
        _prepare(run_dir, e2e_shards)
    (run_dir / "train_log.csv").write_text("step,loss\n1,0.5\n2,0.5\n")
    assert _prepare(run_dir, e2e_shards).resumed_step is None
    assert len(list((run_dir / "replaced").iterdir())) == 2


def _checkpoint_at(run_dir: Path, step: int) -> None:
    """A checkpoint of `step` (a complete torch.save zip, its contents never read by these checks) as `latest`."""
    import zipfile

    ckpts = run_dir / "checkpoints"
    ckpts.mkdir(exist_ok=True)
    with zipfile.ZipFile(ckpts / f"ep0-ba{step}-rank0.pt", "w") as z:
        z.writestr("data.pkl", b"")
    (ckpts / "latest-rank0.pt").unlink(missing_ok=True)
    (ckpts / "latest-rank0.pt").symlink_to(f"ep0-ba{step}-rank0.pt")


def test_a_decaying_schedules_length_is_part_of_the_run_and_a_constant_ones_is_not(e2e_shards, tmp_path):
    """docs/training.md, "Resuming": cosine_with_warmup decays over max_duration, so raising it on resume would make
    the rate jump (at step 60 of a 10-step warmup: the factor 0.413 of a 100-step run becomes 0.839 of a 200-step
    one). Such a relaunch is refused naming both lengths and the jump; with the constant default, max_duration is
    raised freely; a run recorded before the horizon was signed resumes as before."""
    import math

    def cosine(step: int, total: int, warmup: int = 10) -> float:  # Composer's cosine with warmup, alpha_f 0
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))

    cos = ["scheduler.name=cosine_with_warmup", "scheduler.t_warmup=10"]
    run_dir = tmp_path / "cosine"
    _prepare(run_dir, e2e_shards, *cos, "max_duration=100")
    _checkpoint_at(run_dir, 59)
    assert _prepare(run_dir, e2e_shards, *cos, "max_duration=100").resumed_step == 59
    with pytest.raises(Refusal) as refused:
        _prepare(run_dir, e2e_shards, *cos, "max_duration=200")
    said = str(refused.value)
    assert "max_duration (in batches: the decaying schedule's horizon): 100 -> 200" in said
    assert f"at step 60 the lr factor would jump from {cosine(60, 100):.3f} to {cosine(60, 200):.3f}" in said
    assert f"{cosine(60, 100):.3f}" == "0.413" and "relaunch with max_duration=100" in said
    record = json.loads((run_dir / "run.json").read_text())
    del record["signature"]["scheduler.horizon"]  # a run recorded before the horizon was signed
    (run_dir / "run.json").write_text(json.dumps(record))
    assert _prepare(run_dir, e2e_shards, *cos, "max_duration=200").resumed_step == 59

    run_dir = tmp_path / "constant"
    _prepare(run_dir, e2e_shards, "max_duration=100")
    _checkpoint_at(run_dir, 59)
    assert _prepare(run_dir, e2e_shards, "max_duration=200").resumed_step == 59
