"""What a launch writes, and when (docs/training.md, "Trust and safety"): every check runs before its first write,
so a refused launch leaves its run folder as it was; a run_dir that cannot name a folder, a checkpoints entry that
is not a folder and an export that is a link are refused naming them; a data.cache_dir is one run's at a time.
Rank 0's checks (`prepare_run`) are called in this process; the config's in the entry's `prepare`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hostile import PLANTED, examples, plant
from hypothesis import given
from hypothesis import strategies as st

from gcc import exit_codes
from gcc.errors import BadInput
from gcc.training.config import load_config
from gcc.training.run_folder import Refusal, RunLock, check_run_folder

ROOT = Path(__file__).resolve().parents[2]
YAML = ROOT / "yamls" / "tiny_cpu.yaml"


def _cfg(run_dir: Path, shards: Path, *overrides: str):
    return load_config(YAML, [f"run_dir={run_dir}", f"data.path={shards}", "global_train_batch_size=2", *overrides])


def _prepare(cfg):
    from gcc.training.launch import prepare_run  # Composer: loaded only by the tests that need it

    lock = RunLock(Path(cfg.run_dir))
    try:
        return prepare_run(cfg, lock), lock
    except BaseException:
        lock.release()
        raise


def _files(run_dir: Path) -> dict[str, bytes | str]:
    """Every entry under `run_dir` but the lock file: a file's bytes, a link's target, a folder's name."""
    out: dict[str, bytes | str] = {}
    for p in sorted(run_dir.rglob("*")):
        rel = str(p.relative_to(run_dir))
        if rel != ".lock":
            out[rel] = os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "<folder>"
    return out


def test_a_refused_launch_leaves_the_run_folder_as_it_was(e2e_shards, tmp_path):
    """A warm start from an export of a run folder that holds it but no checkpoint: refused (a start from step 0
    would overwrite it), and run.json is not written first."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    export = run_dir / "step-2.safetensors"
    export.write_bytes(b"an export of this folder")
    before = _files(run_dir)
    with pytest.raises(Refusal, match=r"holds 1 export\(s\) \(newest step-2.safetensors\)"):
        _prepare(_cfg(run_dir, e2e_shards, f"model.init_ckpt={export}"))
    assert _files(run_dir) == before and not (run_dir / "run.json").exists()


def test_a_refused_launch_leaves_partial_checkpoints_for_the_run_to_repair(e2e_shards, tmp_path):
    """The checkpoint repair (which deletes partial checkpoints) is a write too: a launch refused because a start
    from step 0 would overwrite an export leaves the partial checkpoint where it was (and does not count it as
    something a start would lose). (The run had committed a checkpoint, gone since: a run that never had one would
    start over: tests/training/test_trust_run.py.)"""
    from gcc.training.run_folder import record_first_checkpoint

    run_dir = tmp_path / "run"
    _, lock = _prepare(_cfg(run_dir, e2e_shards))
    lock.release()
    record_first_checkpoint(run_dir, 2)
    (run_dir / "step-2.safetensors").write_bytes(b"an export of this run")
    partial = run_dir / "checkpoints" / "ep0-ba3-rank0.pt"
    partial.parent.mkdir()
    partial.write_bytes(b"cut short")
    before = _files(run_dir)
    with pytest.raises(Refusal, match=r"holds 1 export\(s\) \(newest step-2.safetensors\), and it holds no"):
        _prepare(_cfg(run_dir, e2e_shards))
    assert _files(run_dir) == before


@pytest.mark.parametrize(
    "value, expected",
    [
        ("", "run_dir: : empty, expected a folder"),
        ("runs/a\0b", r"run_dir: runs/a\x00b: holds a NUL character"),
        ("runs/" + "x" * 300, "a component of 300 bytes, more than 255"),
    ],
    ids=["empty", "nul", "long-component"],
)
def test_a_run_dir_that_cannot_name_a_folder_is_a_config_error_before_anything_is_written(
    value, expected, e2e_shards, tmp_path, monkeypatch, in_process, capfd
):
    """run_dir from the yaml (an override cannot carry a NUL): "" would be the current folder, a NUL or a component
    over 255 bytes cannot name one; exit 2, one line, and no train.log anywhere."""
    from gcc.training.entry import prepare

    text = YAML.read_text().replace("run_dir: runs/demo/train", f"run_dir: {json.dumps(value)}")
    assert text != YAML.read_text()
    yaml = tmp_path / "run.yaml"
    yaml.write_text(text)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    code = prepare([str(yaml), f"data.path={e2e_shards}"])
    err = capfd.readouterr().err
    assert code == exit_codes.CONFIG and expected in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not list(cwd.iterdir())  # no train.log in the current folder


def test_a_checkpoints_entry_that_is_a_file_is_refused_naming_it(e2e_shards, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").write_bytes(b"not a folder")
    before = _files(run_dir)
    with pytest.raises(Refusal, match=f"{run_dir / 'checkpoints'}: not a folder"):
        _prepare(_cfg(run_dir, e2e_shards))
    assert _files(run_dir) == before


@pytest.mark.parametrize("entry", ["checkpoints", "samples", "train_log.csv", "config.json", "run.json"])
def test_a_run_entry_that_is_a_link_is_refused_and_what_it_points_to_is_untouched(entry, e2e_shards, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    outside = tmp_path / "someone_elses"
    if "." in entry:
        outside.write_bytes(b"someone else's file")
    else:
        outside.mkdir()
        (outside / "theirs").write_bytes(b"someone else's file")
    (run_dir / entry).symlink_to(outside)
    theirs = lambda: outside.read_bytes() if outside.is_file() else _files(outside)  # noqa: E731
    before, kept = _files(run_dir), theirs()
    with pytest.raises(Refusal, match=f"{run_dir / entry}: a symbolic link"):
        _prepare(_cfg(run_dir, e2e_shards))
    assert _files(run_dir) == before and theirs() == kept


@pytest.mark.parametrize("target", ["missing", "outside"])
def test_an_export_that_is_a_link_is_refused_naming_it(target, e2e_shards, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    outside = tmp_path / "elsewhere.safetensors"
    if target == "outside":
        outside.write_bytes(b"someone else's file")
    (run_dir / "step-4.safetensors").symlink_to(outside)
    before = _files(run_dir)
    with pytest.raises(Refusal, match=f"{run_dir / 'step-4.safetensors'}: a symbolic link"):
        _prepare(_cfg(run_dir, e2e_shards))
    assert _files(run_dir) == before


IN_PLACE_COLUMNS = ["step", "loss"]


def _in_place_writers(run: Path) -> dict[str, Callable[[], object]]:
    """Every writer of a file the run folder holds that writes it in place, by that file."""
    from gcc.training.console import open_log_file
    from gcc.training.csv_logger import CSVLogger
    from gcc.training.watchdog import dump_stacks

    def lock() -> None:
        lock = RunLock(run)
        lock.acquire()
        lock.release()

    def cache_lock() -> None:
        lock = RunLock(run)
        lock.hold_cache(run / "cache")
        lock.release()

    def train_log() -> None:
        fd = open_log_file(run / "train.log")
        os.write(fd, b"a line\n")
        os.close(fd)

    def csv_log(name: str) -> Callable[[], None]:
        return lambda: CSVLogger(run, {name: IN_PLACE_COLUMNS}).log_table(IN_PLACE_COLUMNS, [[1, 0.5]], name)

    return {
        ".lock": lock,
        "cache/.lock": cache_lock,
        "train.log": train_log,
        "train_log.csv": csv_log("train_log"),
        "val_log.csv": csv_log("val_log"),
        "stacks/rank0.txt": lambda: dump_stacks(run, 0, "a test"),
    }


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("in_place")


@examples(60)
@given(
    name=st.sampled_from(sorted(_in_place_writers(Path("run")))),
    planted=st.sampled_from(PLANTED),
    names=st.integers(2, 4),
)
def test_a_file_written_in_place_is_never_one_with_other_names(scratch, name, planted, names):
    """Each file the run writes in place, planted over: its writer refuses (naming the file) anything but a regular
    file of its own with one name, and the file elsewhere is unchanged; the launch's own check of the run folder
    (`check_run_folder`) refuses it before any write."""
    case = Path(tempfile.mkdtemp(dir=scratch))
    run, victim = case / "run", case / "victim.csv"
    victim.write_text(",".join(IN_PLACE_COLUMNS) + "\n")  # a CSV log's header: its writer would append to it
    path = run / name
    if planted == "another user's" and os.geteuid() != 0:
        return  # only root can give a file away
    plant(path, planted, victim, names)
    before = victim.read_bytes()
    refused = planted != "own"
    if name != "cache/.lock":  # the shard cache is not the run folder's
        with pytest.raises(Refusal, match=re.escape(str(path))) if refused else contextlib.nullcontext():
            check_run_folder(run)
    # a refusal is the launch's (Refusal), the reader's or the writer's (BadInput, LinkRefused) or the open's (OSError)
    expected = pytest.raises((Refusal, BadInput, OSError), match=re.escape(str(path)))
    with expected if refused else contextlib.nullcontext():
        _in_place_writers(run)[name]()
    assert victim.read_bytes() == before


@pytest.mark.parametrize("shared_cache", ["data.cache_dir", "the first's default"])
def test_a_second_run_sharing_a_cache_dir_is_refused_naming_the_first(shared_cache, e2e_shards, tmp_path):
    """Two runs, one shard cache (both name it, or the second names the first's default `<run_dir>/cache`): the
    second is refused naming the first (whose live Streaming shared memory its start would otherwise release), and
    writes nothing; once the first has ended, it starts."""
    first, second = tmp_path / "first", tmp_path / "second"
    cache = tmp_path / "cache" if shared_cache == "data.cache_dir" else first / "cache"
    own = [f"data.cache_dir={cache}"] if shared_cache == "data.cache_dir" else []
    _, lock = _prepare(_cfg(first, e2e_shards, *own))
    try:
        with pytest.raises(Refusal) as refused:
            _prepare(_cfg(second, e2e_shards, f"data.cache_dir={cache}"))
        message = str(refused.value)
        assert f"another live run holds {cache / 'node0' / '.lock'}" in message, message
        assert f"pid {os.getpid()}" in message and f"run {first}" in message, message
        assert _files(second) == {}
    finally:
        lock.release()
    _, lock = _prepare(_cfg(second, e2e_shards, f"data.cache_dir={cache}"))
    lock.release()


def test_the_prefix_record_is_copied_into_a_fresh_run_folder_only_by_a_launch_that_passed(
    e2e_shards, tmp_path, s3_bucket
):
    """A run folder with no run.json takes the checkpoint prefix's (a fresh machine): not when the launch is then
    refused (another run's signature), and once it passes, as the prefix holds it with this launch appended to its
    launch history, in both."""
    from gcc.training.checkpoint_store import CheckpointStore

    prefix = f"{s3_bucket}/run"
    _, lock = _prepare(_cfg(tmp_path / "first", e2e_shards, f"save_folder={prefix}"))
    lock.release()
    fresh = tmp_path / "fresh"
    with pytest.raises(Refusal, match="different signature"):
        _prepare(_cfg(fresh, e2e_shards, f"save_folder={prefix}", "seed=7"))
    assert not (fresh / "run.json").exists()
    _, lock = _prepare(_cfg(fresh, e2e_shards, f"save_folder={prefix}"))
    lock.release()
    first, record = (json.loads((d / "run.json").read_text()) for d in (tmp_path / "first", fresh))
    assert record == CheckpointStore(prefix).read_record()
    assert record["signature"] == first["signature"]
    assert record["lineage"]["launches"][:-1] == first["lineage"]["launches"] and len(first["lineage"]["launches"]) == 1


@pytest.mark.slow
def test_a_live_run_keeps_its_cache_dir_when_a_second_run_names_it(e2e_shards, tmp_path):
    """Two launches, one data.cache_dir: the second is refused (exit 3) naming the first, which trains on with its
    Streaming shared memory intact (the second's start would have released it), until it is preempted. The first
    is long enough to outlive the second's start whatever the machine's load; SIGTERM then ends it (exit 0)."""
    from _launch import finish, launch, rows, start_bg, wait_for_step

    cache = tmp_path / "cache"
    first = start_bg(tmp_path / "first", e2e_shards, f"data.cache_dir={cache}", "max_duration=300", direct=True)
    try:
        wait_for_step(tmp_path / "first", 1, first)
        r = launch(tmp_path / "second", e2e_shards, f"data.cache_dir={cache}", "max_duration=6", direct=True)
        assert first.poll() is None, "the first run ended before the second started: nothing was shared"
        assert r.returncode == exit_codes.REFUSED, r.stdout[-2000:] + r.stderr[-2000:]
        assert f"another live run holds {cache / 'node0' / '.lock'}" in r.stderr, r.stderr[-2000:]
        assert f"run {tmp_path / 'first'}" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
        at_refusal = max(int(row["step"]) for row in rows(tmp_path / "first"))
        wait_for_step(tmp_path / "first", at_refusal + 2, first)  # it reads its shards on after the refusal
        first.send_signal(signal.SIGTERM)  # preempted: it saves and ends
        out = finish(first, 600)  # its stderr is on the same pipe
    except BaseException:
        with contextlib.suppress(ProcessLookupError):  # the first launch's whole session, if it still runs
            os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
        raise
    assert first.returncode == 0 and "preempt" in out.lower(), out[-4000:]
