"""Which code ran (gcc/provenance.py): the revision and dirty flag of a git checkout, "not a checkout" otherwise; an
export's metadata carries it (and data.limit) and reads back, an export of an earlier gcc without it still reads;
gcc-inspect prints it for an export and a run folder. (In a real launch: tests/training/test_train_e2e.py,
test_reference_run_outputs; gcc-compare ignores it: tests/tools/test_compare.py, test_a_resumed_run_agrees.)"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _gc_helpers import tiny_dit
from safetensors.torch import save_file

from gcc import __version__
from gcc.model.export import check_gc_ckpt, save_gc
from gcc.provenance import NOT_A_CHECKOUT, Provenance, read_provenance
from gcc.tools import inspect_ckpt

ROOT = Path(__file__).resolve().parents[1]


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True)
    return r.stdout.strip()


def test_a_checkout_gives_its_revision_and_whether_tracked_files_changed(tmp_path, monkeypatch):
    if shutil.which("git") is None:
        pytest.skip("no git")
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "code.py").write_text("x = 1\n")
    assert read_provenance(repo) == Provenance(__version__, NOT_A_CHECKOUT, None)  # no commit yet: git cannot say
    _git(repo, "add", "code.py")
    _git(repo, "commit", "-qm", "one")
    head = _git(repo, "rev-parse", "HEAD")
    monkeypatch.setenv("GIT_DIR", str(ROOT / ".git"))  # git's environment (a hook's) does not redirect it
    assert read_provenance(repo) == Provenance(__version__, head, False)
    (repo / "notes.txt").write_text("an untracked file is not the code")
    assert read_provenance(repo).dirty is False
    (repo / "code.py").write_text("x = 2\n")
    got = read_provenance(repo)
    assert got == Provenance(__version__, head, True) and str(got) == f"gcc {__version__}, git {head} (modified)"
    assert got.as_dict() == {"gcc_version": __version__, "git_revision": head, "git_dirty": True}


def test_a_copy_of_the_code_outside_git_is_not_a_checkout(tmp_path, monkeypatch):
    """The code copied out of its checkout (as an installed package is): the module finds no `.git` beside its
    package, and says so, though git could still read the checkout it came from."""
    (tmp_path / "gcc").mkdir()
    shutil.copy(ROOT / "gcc" / "provenance.py", tmp_path / "gcc" / "provenance.py")
    spec = importlib.util.spec_from_file_location("copied_provenance", tmp_path / "gcc" / "provenance.py")
    assert spec is not None and spec.loader is not None
    copied = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, copied)  # as an import would (its dataclass needs it)
    spec.loader.exec_module(copied)
    assert copied.CODE_ROOT == tmp_path
    got = copied.this_code()
    assert (got.version, got.revision, got.dirty) == (__version__, NOT_A_CHECKOUT, None)
    assert str(got) == f"gcc {__version__}, not a checkout"


def _run_start(provenance: Provenance):
    from gcc.training.run_start import RunStart

    return RunStart({"name": "synth"}, {"init_ckpt": ""}, "", None, "", None, provenance=provenance)


def _export(cfg, start, path: Path) -> Path:
    from gcc.training.builders import export_metadata

    return save_gc(tiny_dit().state_dict(), path, export_metadata(cfg, start, 6))


@pytest.fixture
def cfg(tmp_path):
    from gcc.training.config import load_config

    return load_config(ROOT / "yamls" / "tiny_cpu.yaml", [f"run_dir={tmp_path}", "data.limit=5"])


def test_an_export_carries_the_code_and_data_limit_and_gcc_inspect_prints_them(cfg, tmp_path, capsys):
    code = Provenance("0.1.0", "c0ffee", True)
    path = _export(cfg, _run_start(code), tmp_path / "step-6.safetensors")
    meta = check_gc_ckpt(path)["metadata"]
    assert (meta["trainer"], meta["git_revision"], meta["git_dirty"], meta["data_limit"]) == (
        *("gcc 0.1.0", "c0ffee", "True"),
        "5",
    )
    assert inspect_ckpt.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "code       gcc 0.1.0, git c0ffee (modified)\n" in out and "  data_limit = '5'\n" in out
    cfg.data.limit = None
    path = _export(cfg, _run_start(Provenance("0.1.0", NOT_A_CHECKOUT, None)), tmp_path / "step-7.safetensors")
    meta = check_gc_ckpt(path)["metadata"]
    assert (meta["git_revision"], meta["git_dirty"], meta["data_limit"]) == (NOT_A_CHECKOUT, "", "")
    assert inspect_ckpt.main([str(path)]) == 0
    assert "code       gcc 0.1.0, not a checkout\n" in capsys.readouterr().out


def test_an_export_of_an_earlier_gcc_reads_without_them(cfg, tmp_path, capsys):
    """No data_limit, git_revision, git_dirty: check_gc_ckpt (gcc-inspect, gcc-sample and a warm start read through
    it) gives them as "", gcc-sample and a warm start read it, gcc-inspect says the code was not recorded; a value
    they cannot hold is refused."""
    from gcc.model.export import GcCkptError, load_gc_weights
    from gcc.tools.sample.dit import ckpt_vocab

    path = _export(cfg, _run_start(Provenance("0.1.0", "c0ffee", False)), tmp_path / "step-6.safetensors")
    meta = check_gc_ckpt(path)["metadata"]
    tensors = {k: v.bfloat16() for k, v in tiny_dit().state_dict().items()}
    older = {k: v for k, v in meta.items() if k not in ("data_limit", "git_revision", "git_dirty")}
    save_file(tensors, str(tmp_path / "older.safetensors"), metadata=older)
    got = check_gc_ckpt(tmp_path / "older.safetensors")["metadata"]
    assert (got["data_limit"], got["git_revision"], got["git_dirty"]) == ("", "", "")
    assert ckpt_vocab(tmp_path / "older.safetensors", None, "tiny") == ("parts", "gc25d", "raw")  # gcc-sample's
    assert load_gc_weights(tiny_dit(), tmp_path / "older.safetensors")["kind"] == "gc25d"  # a warm start's
    assert inspect_ckpt.main([str(tmp_path / "older.safetensors")]) == 0
    assert "code       not recorded (written by an earlier gcc)\n" in capsys.readouterr().out
    for key, bad in (("git_dirty", "yes"), ("data_limit", "-1"), ("data_limit", "all")):
        save_file(tensors, str(tmp_path / "odd.safetensors"), metadata={**meta, key: bad})
        with pytest.raises(GcCkptError, match=f"metadata {key}='{bad}'"):
            check_gc_ckpt(tmp_path / "odd.safetensors")


def test_gcc_inspect_prints_a_run_folders_provenance(cfg, tmp_path, capsys):
    """run.json's launch history (which code made each launch), config.json's (the latest launch's), each export's,
    and data.limit; a record of an earlier gcc has no history, and says so."""
    run = tmp_path
    launches = [
        {
            "time": "2026-12-01T10:00:00Z",
            "world": 2,
            "gcc_version": "0.1.0",
            "git_revision": "c0ffee",
            "git_dirty": False,
        },
        {"time": "2026-12-02T10:00:00Z", "world": 1, "gcc_version": "0.1.0", "git_revision": "beef", "git_dirty": True},
    ]
    record = {"signature": {"data.limit": 5, "seed": 0}, "lineage": {"init_ckpt": "", "launches": launches}}
    (run / "run.json").write_text(json.dumps(record))
    config = {"config": {}, "provenance": {k: v for k, v in launches[1].items() if k.startswith("g")}, "start_step": 4}
    (run / "config.json").write_text(json.dumps(config))
    for step, code in ((12, Provenance("0.1.0", "beef", True)), (6, Provenance("0.1.0", "c0ffee", False))):
        _export(cfg, _run_start(code), run / f"step-{step}.safetensors")
    assert inspect_ckpt.main([str(run)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"run        {run}",
        "data.limit 5",
        "step       0 (train_log.csv; max_duration not recorded: no config.json)",
        "validation none yet (val_log.csv)",
        "launches   2 (run.json)",
        "  1   2026-12-01T10:00:00Z  world 2  gcc 0.1.0, git c0ffee",
        "  2   2026-12-02T10:00:00Z  world 1  gcc 0.1.0, git beef (modified)",
        "config     config.json (the latest launch, from step 4): gcc 0.1.0, git beef (modified)",
        "exports    2",
        "  step-6.safetensors  gcc 0.1.0, git c0ffee",
        "  step-12.safetensors  gcc 0.1.0, git beef (modified)",
    ]
    (run / "run.json").write_text(json.dumps({"signature": {"seed": 0}, "lineage": {"init_ckpt": ""}}))
    for p in (run / "config.json", run / "step-6.safetensors", run / "step-12.safetensors"):
        p.unlink()
    assert inspect_ckpt.main([str(run)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "data.limit null (the whole train split)",
        "step       0 (train_log.csv; max_duration not recorded: no config.json)",
        "validation none yet (val_log.csv)",
        "launches   0 (run.json): not recorded (a run of an earlier gcc)",
        "exports    0",
    ]
    (run / "run.json").write_text("[]")
    assert inspect_ckpt.main([str(run)]) == 2
    assert "run.json: expected a run record (a JSON object)" in capsys.readouterr().err
    (run / "run.json").unlink()
    assert inspect_ckpt.main([str(run)]) == 2
    assert f"{run}: a folder without run.json, expected a run folder or" in capsys.readouterr().err


def test_gcc_inspect_says_where_a_run_is_its_best_validation_and_its_resumes(tmp_path, capsys):
    """A run folder at a glance: its last step against max_duration (done or not), the validation of the lowest
    mse (the mean over the timesteps) and the last one, each launch's start (from step 0, or resumed) and the global
    batch changes."""
    run = tmp_path
    launches = [{"time": "t1", "world": 2, "from_step": 0}, {"time": "t2", "world": 1, "from_step": 6}]
    lineage = {"init_ckpt": "", "launches": launches, "global_batch_changes": [{"step": 6, "old": 4, "new": 2}]}
    (run / "run.json").write_text(json.dumps({"signature": {"seed": 0}, "lineage": lineage}))
    (run / "config.json").write_text(json.dumps({"config": {"max_duration": 12}, "start_step": 6}))
    (run / "train_log.csv").write_text("step,loss\n" + "".join(f"{s},0.5\n" for s in range(1, 10)))
    val = [(0, 201.3, 1.0), (0, 799.7, 2.0), (6, 201.3, 0.5), (6, 799.7, 1.1), (9, 201.3, 0.7), (9, 799.7, 0.8)]
    (run / "val_log.csv").write_text("step,timestep,mse\n" + "".join(f"{s},{t},{m}\n" for s, t, m in val))
    assert inspect_ckpt.main([str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2:8] == [
        "step       9 of 12 (train_log.csv): not done",
        "validation best mse 0.7500 at step 9, last 0.7500 at step 9 (the mean over 2 timestep(s); val_log.csv)",
        "launches   2 (run.json), 1 resumed",
        "  1   t1  world 2  from step 0  not recorded (written by an earlier gcc)",
        "  2   t2  world 1  resumed at step 6  not recorded (written by an earlier gcc)",
        "  global batch 4 -> 2 at step 6",
    ]
    (run / "val_log.csv").write_text("step,timestep,mse\n" + "".join(f"{s},{t},{m}\n" for s, t, m in val[:4]))
    (run / "train_log.csv").write_text("step,loss\n" + "".join(f"{s},0.5\n" for s in range(1, 13)))
    assert inspect_ckpt.main([str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "step       12 of 12 (train_log.csv): done"
    assert out[3].startswith("validation best mse 0.8000 at step 6, last 0.8000 at step 6")


def test_each_launch_is_appended_to_the_run_records_launch_history(tmp_path):
    """run.json's lineage keeps one entry per launch (`with_launch`), a record of an earlier gcc starting with none;
    a history that is not a list is not a record gcc wrote (exit 3 naming the file)."""
    from gcc.training.run_folder import Refusal, stored_record, with_launch, write_record

    earlier = {"signature": {"seed": 0}, "lineage": {"init_ckpt": ""}}
    first, second = ({"time": t, "world": 1, **Provenance("0.1.0", "c0ffee", False).as_dict()} for t in ("a", "b"))
    record = with_launch(with_launch(earlier, first), second)
    assert record == {"signature": {"seed": 0}, "lineage": {"init_ckpt": "", "launches": [first, second]}}
    assert earlier == {"signature": {"seed": 0}, "lineage": {"init_ckpt": ""}}  # a new record, the old one as it was
    write_record(tmp_path, {**earlier, "lineage": {"init_ckpt": "", "launches": {"a": 1}}})
    with pytest.raises(Refusal, match=r"run.json: not a run record gcc wrote \(.*'launches' a list\)") as refused:
        stored_record(tmp_path)
    assert refused.value.exit_code == 3
