"""Config validation, the data check, the run folder (lock, signature, checkpoint repair/rotation) and the CSV logger."""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from hostile import examples
from hypothesis import given
from hypothesis import strategies as st

from gcc.training.config import ConfigError, load_config
from gcc.training.csv_logger import CSVLogger
from gcc.training.run_folder import (
    Refusal,
    RunLock,
    check_identity,
    check_run_folder,
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    repair_checkpoints,
    rotate_checkpoints,
    what_a_restart_loses,
    why_not_remade,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runfolder")


YAMLS = sorted((ROOT / "yamls").glob("*.yaml"))


# each shipped yaml at the world size(s) its header's launch command uses: (world_size, accumulation, per-rank
# batch), worked out by hand from its global_train_batch_size and device_train_microbatch_size
LAUNCHES = {
    "mini.yaml": [(4, 2, 2)],  # composer -n 4: 8 / (4 × 1) = 2 micro-batches of 1
    "sft_v10.yaml": [(8, 2, 2), (16, 1, 1)],  # composer -n 8: 16 / (8 × 1); two nodes of 8: 16 / (16 × 1)
    "tiny_cpu.yaml": [(2, 2, 4)],  # composer -n 2: 8 / (2 × 2) = 2 micro-batches of 2
}


@pytest.mark.parametrize("yaml", YAMLS, ids=[p.name for p in YAMLS])
def test_shipped_yamls_load(yaml):
    cfg = load_config(yaml)
    assert yaml.name in LAUNCHES, f"{yaml.name}: add its launch world size(s) to LAUNCHES"
    for world, accumulation, per_rank in LAUNCHES[yaml.name]:
        assert (cfg.accumulation(world), cfg.per_rank_batch(world)) == (accumulation, per_rank), world


def test_sft_v10_is_the_spec_defaults():
    c = load_config(ROOT / "yamls" / "sft_v10.yaml")
    o = c.optimizer
    assert (o.name, o.lr, o.cond_lr, o.weight_decay, o.betas, o.eps) == ("adamw", 1e-5, 1e-4, 0.01, [0.9, 0.999], 1e-8)
    assert (c.scheduler.name, c.scheduler.t_warmup, c.scheduler.alpha_f) == ("constant_with_warmup", 500, 0.0)
    assert c.algorithms.gradient_clipping.clipping_threshold == 1.0
    assert (c.global_train_batch_size, c.device_train_microbatch_size, c.accumulation(8), c.max_steps) == (
        16,
        1,
        2,
        20000,
    )
    assert (c.export_every, c.save_num_checkpoints_to_keep, c.eval_interval, c.val_n, c.val_timesteps) == (
        1000,
        2,
        500,
        16,
        [200, 500, 800],
    )
    assert c.save_interval == 1000  # the old trainer's cadence (why: docs/design.md §8)
    assert c.eval_first and load_config(None).eval_first  # the baseline row, by default too
    assert (c.data.text_dropout, c.data.cond_dropout, c.data.mask_p, c.data.num_workers) == (0.1, 0.05, 0.5, 4)
    assert (c.model.activation_checkpointing, c.model.vocab, c.parallelism, c.precision) == (
        "block",
        "parts",
        "fsdp",
        "amp_bf16",
    )
    # samples during training: every 2nd validation, 2 clips, 20 steps (docs/sample.md: ~0.8 % of training time)
    assert (c.sample_every, c.sample_n, c.sample_steps, c.sample_cfg, c.keep_samples) == (2, 2, 20, 1.0, 0)
    # the typed config's defaults are these values (docs/design.md §8), all but where the base weights and VAE lie
    # and Composer's monitors, which a run names (none by default: docs/training.md, "Callbacks")
    defaults = asdict(load_config(None))
    defaults["model"]["model_dir"] = c.model.model_dir
    defaults["model"]["vae_path"] = c.model.vae_path
    assert c.callbacks == {"speed_monitor": {"window_size": 10}, "memory_monitor": {}, "lr_monitor": {}}
    defaults["callbacks"] = c.callbacks
    assert defaults == asdict(c)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["optim.lrr=1"], "unknown key.*optim.lrr"),
        (["nonsense=1"], "unknown key.*nonsense"),
        (["optimizer.lr=fast"], "optimizer.lr: expected float"),
        (["max_duration=1.5"], r"max_duration: expected a whole number of batches \(500 or \"500ba\"\) or of epochs"),
        (["max_duration=20000tok"], "max_duration: the unit 'tok' of '20000tok' cannot be used here"),
        (
            ["eval_interval=2ep"],
            "eval_interval: the unit 'ep' of '2ep' cannot be used here .*expected a whole number of batches",
        ),
        (["save_interval=100sp"], "save_interval: the unit 'sp' of '100sp' cannot be used here"),
        (["scheduler.t_warmup=0.1dur"], "scheduler.t_warmup: expected a whole number of batches"),
        (["max_duration=0ep"], "max_duration: must be >= 1"),
        (["optimizer.name=sgd"], r"optimizer.name: must be one of \('adamw',\), got 'sgd'"),
        (["scheduler.name=step"], "scheduler.name: must be one of"),
        (["optimizer.betas=[0.9]"], r"optimizer.betas: expected two numbers in \[0, 1\)"),
        (["optimizer.betas=[0.9, 1.5]"], r"optimizer.betas: expected two numbers in \[0, 1\)"),
        (["scheduler.alpha_f=2"], r"scheduler.alpha_f: must be in \[0, 1\]"),
        (["model.compile=3"], "model.compile: expected bool"),
        (["model.activation_checkpointing=all"], "model.activation_checkpointing"),
        (["model.vocab=words"], "model.vocab: must be one of"),
        (
            ["global_train_batch_size=10", "device_train_microbatch_size=4"],
            "global_train_batch_size=10 is not a multiple of device_train_microbatch_size=4",
        ),
        (["data.mask_p=1.5"], r"data.mask_p: must be in \[0, 1\]"),
        (["optimizer=3"], "optimizer: expected a mapping"),
        (["preemption_grace_s=0"], "preemption_grace_s: must be > 0 seconds"),
        (["console_log_interval=-1"], "console_log_interval: must be >= 0"),
        (["save_folder=/shared/ckpts"], "save_folder: must be empty .* or s3://bucket/prefix"),
        (["save_folder=s3://bucket"], "save_folder: must be empty .* or s3://bucket/prefix"),
        (["data.limit=0"], r"data.limit: must be a positive number of train clips, or null \(the whole train split\)"),
        (["data.limit=-4"], "data.limit: must be a positive number"),
        (["data.limit=2.5"], "data.limit: expected int or null, got float 2.5"),
        (["data.limit=true"], "data.limit: expected int or null, got bool True"),
        (["data.limit=all"], "data.limit: expected int or null, got str 'all'"),
        (["sample_steps=0"], "sample_steps: must be >= 1 and at most 1000, got 0"),
        (["sample_n=-1"], "sample_n: must be >= 0 and at most 1000, got -1"),
        (["sample_cfg=.nan"], "sample_cfg: expected a finite number, got nan"),
    ],
)
def test_bad_config_names_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(ROOT / "yamls" / "tiny_cpu.yaml", overrides)


def test_batch_consistency_with_world_size():
    c = load_config(ROOT / "yamls" / "tiny_cpu.yaml", ["global_train_batch_size=8", "device_train_microbatch_size=2"])
    assert c.accumulation(2) == 2 and c.per_rank_batch(2) == 4 and c.accumulation(1) == 4
    with pytest.raises(ConfigError, match="not a multiple of world_size"):
        c.accumulation(3)
    c = load_config(
        ROOT / "yamls" / "tiny_cpu.yaml",
        ["global_train_batch_size=8", "device_train_microbatch_size=2", "grad_accum=4"],
    )
    with pytest.raises(ConfigError, match="grad_accum=4 disagrees"):
        c.accumulation(2)


def test_train_entry_exits_2_before_any_work(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "gcc" / "train.py"),
            str(ROOT / "yamls" / "tiny_cpu.yaml"),
            f"run_dir={tmp_path / 'run'}",
            "optim.bogus=1",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert r.returncode == 2
    assert "config error: unknown key(s): optim.bogus" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()


# ---- run folder ----------------------------------------------------------------------------------------
def test_lock_refuses_a_second_holder_and_frees_on_release(tmp_path):
    a, b = RunLock(tmp_path), RunLock(tmp_path)
    a.acquire()
    with pytest.raises(Refusal, match="another live run holds"):
        b.acquire()
    a.release()
    b.acquire()
    b.release()


@pytest.mark.slow  # over 5 s: make test, not the edit loop's test-fast
def test_lock_of_a_killed_process_does_not_block(tmp_path):
    """A process that took the lock and died without releasing it (its exit code says it got that far)."""
    code = (
        f"from gcc.training.run_folder import RunLock; RunLock({str(tmp_path)!r}).acquire(); "
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    )
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]  # killed holding the lock, not failed before taking it
    assert (tmp_path / ".lock").is_file()
    lock = RunLock(tmp_path)
    lock.acquire()
    lock.release()


def test_signature_mismatch_names_every_field(tmp_path):
    sig = {"optim.lr": 1e-5, "seed": 0, "model.init_ckpt": {"path": "/x", "sha256": "aa", "size": 1}}
    check_identity(tmp_path, sig, {"init_ckpt": ""})
    # same content digest at another path/mtime: same run
    check_identity(tmp_path, {**sig, "model.init_ckpt": {"path": "/y", "sha256": "aa", "size": 1}}, {})
    with pytest.raises(Refusal) as e:
        check_identity(tmp_path, {**sig, "optim.lr": 2e-5, "seed": 1}, {})
    # named as the config names them now (the signature keeps the names of the run's first launch)
    assert "optimizer.lr: 1e-05 -> 2e-05" in str(e.value) and "seed: 0 -> 1" in str(e.value)


def test_data_limit_is_null_or_a_positive_int():
    assert load_config(ROOT / "yamls" / "tiny_cpu.yaml").data.limit is None
    assert load_config(ROOT / "yamls" / "tiny_cpu.yaml", ["data.limit=8"]).data.limit == 8
    assert load_config(ROOT / "yamls" / "tiny_cpu.yaml", ["data.limit=8", "data.limit=null"]).data.limit is None


def test_a_run_recorded_with_global_batch_in_its_signature_still_resumes(tmp_path):
    """Earlier runs recorded global_batch in the signature (it may now change on resume) and had no data.limit (the
    whole split): such a run.json matches today's signature, and a limit is still a different run."""
    from gcc.training.batch_change import CHANGES, record_change
    from gcc.training.run_folder import stored_record

    sig = {"optim.lr": 1e-5, "seed": 0, "data.limit": None}
    old = {k: v for k, v in sig.items() if k != "data.limit"}
    check_identity(tmp_path, {**old, "global_batch": 16}, {"init_ckpt": ""})
    check_identity(tmp_path, sig, {})
    with pytest.raises(Refusal, match="data.limit: None -> 8"):
        check_identity(tmp_path, {**sig, "data.limit": 8}, {})
    # a change of global batch is appended to the lineage once, however often a relaunch meets it
    for change in (
        {"step": 12, "old": 16, "new": 8},
        {"step": 12, "old": 16, "new": 8},
        {"step": 30, "old": 8, "new": 16},
    ):
        record_change(tmp_path, change)
    record = stored_record(tmp_path)
    assert record["lineage"][CHANGES] == [{"step": 12, "old": 16, "new": 8}, {"step": 30, "old": 8, "new": 16}]
    assert record["lineage"]["init_ckpt"] == "" and record["signature"]["global_batch"] == 16
    check_identity(tmp_path, sig, {})


def test_the_global_batch_a_checkpoint_was_written_with():
    from gcc.training.batch_change import GlobalBatchRecord, checkpoint_global_batch

    rec = GlobalBatchRecord(8)
    assert rec.state_dict() == {"global_batch": 8} and rec.saved is None
    rec.load_state_dict({"global_batch": 16})
    assert checkpoint_global_batch(rec.saved, 3, 24) == 16  # the record wins
    # a checkpoint written before the record: its epoch's samples over its steps in the epoch
    assert checkpoint_global_batch(None, 3, 48) == 16 and checkpoint_global_batch(None, 0, 0) is None


def test_checkpoint_step_reads_a_checkpoint_name_and_names_any_other():
    assert checkpoint_step("run/checkpoints/ep1-ba12-rank0.pt") == 12 and checkpoint_step(Path("ep0-ba3")) == 3
    with pytest.raises(ValueError, match=r"^run/checkpoints/latest-rank0\.pt: not a checkpoint name"):
        checkpoint_step("run/checkpoints/latest-rank0.pt")


def _fake_ckpt(d: Path, batch: int, complete: bool = True) -> Path:
    p = d / f"ep0-ba{batch}-rank0.pt"
    torch.save({"batch": batch}, p)
    if not complete:  # what a SIGKILL mid-write leaves
        p.write_bytes(p.read_bytes()[:40])
    return p


def test_repair_points_latest_at_newest_complete_and_drops_partials(tmp_path):
    d = tmp_path / "checkpoints"
    d.mkdir()
    for b in (3, 6):
        _fake_ckpt(d, b)
    os.symlink("ep0-ba6-rank0.pt", d / "latest-rank0.pt")
    _fake_ckpt(d, 9, complete=False)  # killed while writing step 9, before the symlink moved
    assert repair_checkpoints(tmp_path).name == "ep0-ba6-rank0.pt"
    assert [b for b, _ in list_checkpoints(tmp_path)] == [3, 6]
    # killed between Composer's symlink remove and create: no latest at all
    (d / "latest-rank0.pt").unlink()
    _fake_ckpt(d, 9, complete=False)
    assert repair_checkpoints(tmp_path).name == "ep0-ba6-rank0.pt"
    assert latest_checkpoint(tmp_path).name == "ep0-ba6-rank0.pt"
    assert zipfile.is_zipfile(latest_checkpoint(tmp_path))


def _dcp_ckpt(d: Path, batch: int, complete: bool = True) -> Path:
    """A sharded (FSDP) checkpoint folder written by torch DCP itself; incomplete = what a kill mid-save leaves:
    the shard files, and the metadata not yet renamed into place."""
    import torch.distributed.checkpoint as dcp

    p = d / f"ep0-ba{batch}"
    dcp.save({"w": torch.full((4,), float(batch))}, checkpoint_id=str(p), no_dist=True)
    if not complete:
        (p / ".metadata").rename(p / ".metadata.tmp")
    return p


def test_sharded_folders_repaired_and_rotated(tmp_path):
    d = tmp_path / "checkpoints"
    d.mkdir()
    for b in (2, 4, 6):
        _dcp_ckpt(d, b)
    _dcp_ckpt(d, 8, complete=False)
    os.symlink("ep0-ba8", d / "latest-rank0.pt")  # at worst `latest` already points at the partial folder
    assert repair_checkpoints(tmp_path).name == "ep0-ba6"
    assert os.readlink(d / "latest-rank0.pt") == "ep0-ba6" and not (d / "ep0-ba8").exists()
    assert [b for b, _ in list_checkpoints(tmp_path)] == [2, 4, 6]
    assert rotate_checkpoints(tmp_path, keep=2) == [d / "ep0-ba2"]
    assert [p.name for _, p in list_checkpoints(tmp_path)] == ["ep0-ba4", "ep0-ba6"]


# what `latest` may be when a launch starts: a link Composer or gcc wrote (to the newest, an older or a partial
# checkpoint), or what a copy, a kill or a hand left (missing, a file or a folder by `cp -rL`, a loop, a name that
# is no checkpoint's or a path out of the folder, a dangling link)
LATEST = ("missing", "newest", "oldest", "partial", "itself", "out", "not a checkpoint", "copy", "dangling")


def _write_checkpoints(d: Path, steps: dict[int, bool], fsdp: bool) -> dict[int, Path]:
    """A checkpoints folder: each step's checkpoint, complete or cut short (a zip without its end record, a DCP
    folder without its .metadata), as `is_complete` tells them apart."""
    d.mkdir(parents=True)
    out = {}
    for step, complete in steps.items():
        if fsdp:
            p = d / f"ep0-ba{step}"
            p.mkdir()
            (p / "__0_0.distcp").write_bytes(b"shard")
            (p / (".metadata" if complete else ".metadata.tmp")).write_bytes(b"metadata")
        else:
            p = d / f"ep0-ba{step}-rank0.pt"
            with zipfile.ZipFile(p, "w") as z:
                z.writestr("data.pkl", f"step {step}")
            if not complete:
                p.write_bytes(p.read_bytes()[:20])
        out[step] = p
    return out


@examples(80)
@given(
    steps=st.dictionaries(st.integers(1, 40), st.booleans(), max_size=5),
    latest=st.sampled_from(LATEST),
    fsdp=st.booleans(),
)
def test_latest_is_a_hint_a_resume_finds_the_newest_complete_checkpoint_itself(scratch, steps, latest, fsdp):
    """Whatever `latest` is, the repair resumes from the checkpoint it names when it is a link to a complete one of
    this folder, else from the newest complete one it finds; `latest` is then a link to it (or gone, with none), and
    nothing newer is left. A copy by `cp -rL` (latest a file or a folder) resumes from its newest checkpoint."""
    run = Path(tempfile.mkdtemp(dir=scratch))
    d = run / "checkpoints"
    made = _write_checkpoints(d, steps, fsdp)
    complete = sorted(s for s, ok in steps.items() if ok)
    link = d / "latest-rank0.pt"
    target = {
        "newest": max(steps, default=None),
        "oldest": complete[0] if complete else None,
        "partial": min((s for s, ok in steps.items() if not ok), default=None),
    }.get(latest)
    if target is not None:
        os.symlink(made[target].name, link)
    elif latest == "itself":
        os.symlink(link.name, link)
    elif latest == "out":
        os.symlink(f"../../{made[complete[-1]].name}" if complete else "/etc", link)
    elif latest == "not a checkpoint":
        os.symlink("ep0-ba1-rank0.pt\n" if steps else "model.pt", link)
    elif latest == "copy" and complete:  # cp -rL: the newest checkpoint's bytes in its place
        (shutil.copytree if fsdp else shutil.copyfile)(made[complete[-1]], link)
    elif latest == "dangling":
        os.symlink("ep0-ba999-rank0.pt", link)
    want = target if target in complete else (complete[-1] if complete else None)
    check_run_folder(run)  # every one of these is a folder a launch may resume
    got = repair_checkpoints(run)
    assert (got.name if got else None) == (made[want].name if want else None), (steps, latest)
    if want is None:
        assert not os.path.lexists(link)
    else:
        assert os.readlink(link) == made[want].name and latest_checkpoint(run) == made[want]
        assert [s for s, _ in list_checkpoints(run)] == [s for s in complete if s <= want]


@pytest.mark.parametrize(
    "name, make",
    [
        ("ep0-ba3-rank0.pt", lambda p: p.mkdir()),  # a DDP checkpoint's name on a folder
        ("ep0-ba3", lambda p: p.write_bytes(b"x")),  # an FSDP checkpoint's name on a file
        ("ep0-ba3-rank0.pt", lambda p: p.symlink_to("/etc/passwd")),
        ("ep0-ba3", lambda p: os.mkfifo(p)),
        ("latest-rank0.pt", lambda p: os.mkfifo(p)),
    ],
)
def test_an_entry_named_like_a_checkpoint_that_is_not_one_is_refused_naming_it(tmp_path, name, make):
    (tmp_path / "checkpoints").mkdir()
    make(tmp_path / "checkpoints" / name)
    with pytest.raises(Refusal, match=rf"checkpoints/{re.escape(name)}: named like a checkpoint but"):
        check_run_folder(tmp_path)


def test_rotation_keeps_n_across_restarts(tmp_path):
    d = tmp_path / "checkpoints"
    d.mkdir()
    for b in (2, 4, 6, 8):  # saved by earlier launches
        _fake_ckpt(d, b)
    os.symlink("ep0-ba8-rank0.pt", d / "latest-rank0.pt")
    rotate_checkpoints(tmp_path, keep=2)
    assert [b for b, _ in list_checkpoints(tmp_path)] == [6, 8]


def test_refuses_checkpoints_without_run_json(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    _fake_ckpt(tmp_path / "checkpoints", 3)
    with pytest.raises(Refusal, match="no run.json"):
        check_identity(tmp_path, {"seed": 0}, {})


# ---- CSV logger ----------------------------------------------------------------------------------------
class _State:
    class timestamp:
        batch = 0


def _read(p: Path) -> list[list[str]]:
    with open(p, newline="") as f:
        return list(csv.reader(f))


def test_csv_header_rotation_and_rows_after_resume_point(tmp_path):
    (tmp_path / "t.csv").write_text("step,old_col\n1,2\n")
    lg = CSVLogger(tmp_path, {"t": ["step", "loss"]})
    lg.fit_start(_State, None)
    assert _read(tmp_path / "t.old1.csv") == [["step", "old_col"], ["1", "2"]]
    for s in (1, 2, 3):
        lg.log_table(["step", "loss"], [[s, s / 10]], name="t")
    assert _read(tmp_path / "t.csv") == [["step", "loss"], ["1", "0.1"], ["2", "0.2"], ["3", "0.3"]]
    # a relaunch that resumed from step 1's checkpoint: rows 2-3 will be trained (and logged) again
    state = type("S", (), {"timestamp": type("T", (), {"batch": 1})})
    CSVLogger(tmp_path, {"t": ["step", "loss"]}).fit_start(state, None)
    assert _read(tmp_path / "t.csv") == [["step", "loss"], ["1", "0.1"]]
    with pytest.raises(ValueError, match="differ from the declared"):
        lg.log_table(["step"], [[4]], name="t")


def _at(step: int):
    return type("S", (), {"timestamp": type("T", (), {"batch": step})})


def test_step0_validation_rows_survive_a_resume_and_are_written_again_by_a_start_from_step_0(tmp_path):
    columns = ["step", "mse"]
    rows = [["step", "mse"], ["0", "0.9"], ["0", "0.8"], ["2", "0.7"], ["4", "0.6"]]
    path = tmp_path / "v.csv"
    path.write_text("".join(",".join(r) + "\n" for r in rows))
    CSVLogger(tmp_path, {"v": columns}).fit_start(_at(2), None)  # resumed at step 2: step 4 is trained again
    assert _read(path) == rows[:4]
    # a start from step 0 (the launch before died before its first checkpoint): its step-0 validation writes
    # those rows again, so none stays
    lg = CSVLogger(tmp_path, {"v": columns})
    lg.fit_start(_State, None)
    assert _read(path) == [columns]
    lg.log_table(columns, [[0, 0.9]], name="v")
    assert _read(path) == [columns, ["0", "0.9"]]


def test_a_folder_with_only_step0_validation_rows_is_not_used(tmp_path):
    header = "step,timestep,mse,mse_uncond,mse_nulltext,gap_uncond,gap_nulltext,n\n"
    (tmp_path / "val_log.csv").write_text(header + "0,201.3,1,1,1,0,0,4\n0,500.6,1,1,1,0,0,4\n")
    (tmp_path / "train.log").write_text("==== launch ...\n")
    assert what_a_restart_loses(tmp_path) == []  # a start from step 0 writes the same rows again
    with open(tmp_path / "val_log.csv", "a") as f:
        f.write("2,201.3,1,1,1,0,0,4\n")
    assert what_a_restart_loses(tmp_path) == ["val_log.csv with 1 row(s)"]


def test_data_check_refuses_an_empty_train_split_an_empty_val_split_if_validating_and_leaks():
    from gcc.training.launch import check_data

    def manifest(train, val, train_runs=("r1",), val_runs=("r2",)):
        return {
            "splits": {
                "train": {"clip_ids": train, "runs": list(train_runs)},
                "val": {"clip_ids": val, "runs": list(val_runs)},
            }
        }

    check_data(manifest(["a", "b"], ["c"]), "d")
    with pytest.raises(Refusal, match="data d: the train split has no clips"):
        check_data(manifest([], ["c"], train_runs=()), "d")
    check_data(manifest(["a", "b"], [], val_runs=()), "d")  # no validation: no val split needed
    with pytest.raises(Refusal, match="data d: no val split .* and validation is on: set eval_interval: 0"):
        check_data(manifest(["a", "b"], [], val_runs=()), "d", validation=True)
    with pytest.raises(Refusal, match=r"shared clips \['b'\]"):
        check_data(manifest(["a", "b"], ["b"]), "d")
    with pytest.raises(Refusal, match=r"shared runs \['r1'\]"):
        check_data(manifest(["a"], ["c"], val_runs=("r1",)), "d")
    # data.limit: the subset must still give every rank a batch
    check_data(manifest(list("abcdefgh"), ["z"]), "d", per_rank_batch=2, world=2, limit=4)
    with pytest.raises(
        Refusal,
        match=r"data.limit=3 clips of the train split give each of the 2 rank\(s\) 2 "
        r"samples an epoch, fewer than its batch of 4",
    ):
        check_data(manifest(list("abcdefgh"), ["z"]), "d", per_rank_batch=4, world=2, limit=3)
    check_data(manifest(list("abcdefgh"), ["z"]), "d", per_rank_batch=4, world=2, limit=100)  # the whole split


def test_console_durations_and_when_lines_are_on(monkeypatch):
    from gcc.training.callbacks.console_log import console_lines_wanted, duration

    assert [duration(s) for s in (0.4, 12, 245, 3725)] == ["0s", "12s", "4m05s", "1h02m"]
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert not console_lines_wanted(10, progress_bar=True) and console_lines_wanted(10, progress_bar=False)
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)  # a job log: lines even with the bar on
    assert console_lines_wanted(10, progress_bar=True) and not console_lines_wanted(0, progress_bar=False)


def test_a_restart_reads_the_steps_a_run_folder_holds_in_ascii_digits_only(tmp_path):
    """Whether a run of an earlier gcc (no `first_checkpoint` in run.json) committed a checkpoint is read from the
    newest step its logs and exports hold (`why_not_remade`): a cell or a name in other digits (`²`, `٣`) or past 18
    of them is not a step of the run's, never an int() that fails or a step of another script."""
    record = {"signature": {}, "lineage": {}}
    (tmp_path / "train_log.csv").write_text("step,loss\n1,0.5\n²,0.4\n" + "9" * 30 + ",0.3\n")
    (tmp_path / "val_log.csv").write_text("step,timestep,mse\n0,0.5,1.0\n")
    (tmp_path / "step-٣٣.safetensors").write_bytes(b"")
    assert why_not_remade(record, tmp_path, first_save=10) is None
    (tmp_path / "step-12.safetensors").write_bytes(b"")
    assert "step 12's rows or export" in why_not_remade(record, tmp_path, first_save=10)
