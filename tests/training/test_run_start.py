"""The launch's verdict (gcc/training/run_start.py `agree_on_start`) in a real 2-process gloo group: rank 0 is this
test's process, rank 1 a process of its own. The rest of launch.py: tests/training/test_config_roles.py (the
signature), tests/test_errors.py (refusals), tests/training/test_trust_run.py (the run folder it reads)."""

from __future__ import annotations

import json
import math
import re

import pytest
from _launch import rank_0_here

from gcc.training import run_start as launch

# rank 1 (in the group: tests/_launch.py `rank_0_here`): asks for the verdict three times, printing each; were it
# asked to decide, its own verdict would say so
RANK1 = """
import json
from gcc.training import run_start as launch

launch.prepare_run = lambda cfg, lock: launch.RunStart({"decided by": 1}, {}, "", None, "", None, provenance=None)
for _ in range(3):
    try:
        print(json.dumps(["RunStart", launch.agree_on_start(None, None).manifest]), flush=True)
    except (launch.Refusal, launch.ConfigError) as e:
        print(json.dumps([type(e).__name__, str(e)]), flush=True)
"""

VERDICTS = [
    launch.RunStart({"decided by": 0}, {}, "", None, "", None, provenance=None),
    launch.Refusal("data /d: the train split has no clips (rank 0)"),
    launch.ConfigError("model.vae_path: /v.pth does not exist (rank 0)"),
]


@pytest.mark.slow  # starts rank 1's process
def test_every_rank_gets_rank_0s_verdict(monkeypatch):
    """Rank 0's RunStart is every rank's; rank 0's Refusal or ConfigError is raised on every rank with its message."""
    with rank_0_here(RANK1) as rank1:
        for verdict in VERDICTS:

            def prepare_run(cfg, lock, verdict=verdict):
                if isinstance(verdict, Exception):
                    raise verdict
                return verdict

            monkeypatch.setattr(launch, "prepare_run", prepare_run)
            if isinstance(verdict, Exception):
                with pytest.raises(type(verdict)) as raised:
                    launch.agree_on_start(None, None)
                assert str(raised.value) == str(verdict)
            else:
                assert launch.agree_on_start(None, None).manifest == {"decided by": 0}
        out, err = rank1.communicate(timeout=120)
    assert rank1.returncode == 0, err[-3000:]
    assert [json.loads(line) for line in out.splitlines()] == [
        ["RunStart", {"decided by": 0}],
        ["Refusal", str(VERDICTS[1])],
        ["ConfigError", str(VERDICTS[2])],
    ], err[-3000:]


# ---- what the launch computes of the config and the data --------------------------------------------------------
def _manifest(n: int, **more) -> dict:
    return {"splits": {"train": {"clip_ids": [f"c{i}" for i in range(n)]}}, **more}


def test_an_epoch_is_the_train_split_or_its_limit_in_whole_batches_per_rank():
    assert [launch.train_clips(_manifest(10), limit) for limit in (None, 3, 10, 50)] == [10, 3, 10, 10]
    # Streaming gives each rank ceil(n / world) samples; a rank's partial last batch is dropped
    cases = [((10, 1, 2), 5), ((10, 3, 2), 2), ((7, 2, 1), 4), ((9, 2, 2), 2), ((8, 2, 2), 2), ((3, 4, 1), 1)]
    assert [launch.steps_per_epoch(*args) for args, _ in cases] == [want for _, want in cases]


def test_the_schedule_runs_over_max_duration_in_batches(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # one process
    from gcc.training.config import load_config

    def horizon(*overrides):
        cfg = load_config(
            None, ["loggers={}", "global_train_batch_size=4", "device_train_microbatch_size=2", *overrides]
        )
        return launch.schedule_horizon(cfg, _manifest(10))

    assert horizon("max_duration=7") == 7
    assert horizon("max_duration=3ep") == 3 * 2  # 10 clips in batches of 4: 2 an epoch
    assert horizon("max_duration=3ep", "data.limit=5") == 3 * 1


def _cosine(step: int, horizon: int, warmup: int) -> float:
    """Composer's cosine_with_warmup, written out: past the warm-up, 0.5 (1 + cos(π · the share of the rest))."""
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (horizon - warmup)))


def test_a_decaying_schedules_new_length_is_refused_with_the_jump_it_would_make():
    from gcc.training.config import load_config

    cfg = load_config(None, ["loggers={}", "scheduler.name=cosine_with_warmup", "scheduler.t_warmup=10"])
    said = launch.schedule_jump(cfg, {launch.SCHEDULE_HORIZON: 100}, 200, 49)
    assert "max_duration 100 -> 200 batches changes the schedule: cosine_with_warmup decays" in said
    factors = re.search(r"at step 50 the lr factor would jump from (\d+\.\d+) to (\d+\.\d+)", said)
    assert factors, said
    assert float(factors[1]) == pytest.approx(_cosine(50, 100, 10), abs=6e-4)
    assert float(factors[2]) == pytest.approx(_cosine(50, 200, 10), abs=6e-4)
    assert "relaunch with max_duration=100" in said
    # nothing to say: the same length, no length recorded, a schedule that does not decay
    assert launch.schedule_jump(cfg, {launch.SCHEDULE_HORIZON: 200}, 200, 49) == ""
    assert launch.schedule_jump(cfg, {}, 200, 49) == ""
    constant = load_config(None, ["loggers={}", "scheduler.t_warmup=10"])
    assert launch.schedule_jump(constant, {launch.SCHEDULE_HORIZON: 100}, 200, 49) == ""
    assert "at step 1 the lr factor" in launch.schedule_jump(cfg, {launch.SCHEDULE_HORIZON: 100}, 200, None)


def test_the_datas_name_is_the_manifests_else_its_folders():
    from gcc.training.config import TrainConfig

    cfg = TrainConfig()
    cfg.data.path = "s3://bucket/gc25d_v10_mds/"
    assert launch.data_name(cfg, _manifest(1, name="v10")) == "v10"
    assert launch.data_name(cfg, _manifest(1)) == "gc25d_v10_mds"


def test_a_missing_warm_start_names_the_file_and_what_a_resume_would_do(tmp_path):
    plain = "model.init_ckpt: /w/x.safetensors: not found (the warm start's weights)"
    assert launch.missing_init_ckpt("/w/x.safetensors", tmp_path, None) == plain
    assert launch.missing_init_ckpt("/w/x.safetensors", tmp_path, {"path": ""}) == plain
    said = launch.missing_init_ckpt("/w/x.safetensors", tmp_path, {"path": "/w/old.safetensors"})
    assert said.startswith(plain + f"; the run in {tmp_path} was warm-started from /w/old.safetensors")
    assert said.endswith("so it resumes even when the file is gone")


def test_a_fresh_start_needs_its_weights_and_never_destroys_what_a_run_wrote(tmp_path):
    """check_fresh_start: the weights a start from step 0 loads must exist (exit 2 naming the key); a prefix that
    commits a checkpoint is refused; a run folder with what a run wrote is refused (autoresume off, or nothing to
    resume from), started over when its run never committed a checkpoint, or with allow_existing."""
    from gcc.training.checkpoint.store import Head
    from gcc.training.config import ConfigError, TrainConfig
    from gcc.training.run_folder import FIRST_CHECKPOINT

    run = tmp_path / "run"
    run.mkdir()
    cfg = TrainConfig(run_dir=str(run))
    assert launch.check_fresh_start(cfg, run, None) == ""  # nothing there: nothing to lose
    for key, kind in (("init_ckpt", "file"), ("model_dir", "folder"), ("legacy_zero_ckpt", "folder")):
        bad = TrainConfig(run_dir=str(run))
        setattr(bad.model, key, str(tmp_path / "gone"))
        with pytest.raises(ConfigError) as e:
            launch.check_fresh_start(bad, run, None)
        assert str(e.value) == (
            f"model.{key}: {tmp_path / 'gone'}: no such {kind}; a start from step 0 loads its weights (a resume "
            f"would not: {run} has no checkpoint)"
        )
    cfg.save_folder = "s3://b/run"
    with pytest.raises(
        launch.Refusal, match=r"^s3://b/run: commits ep0-ba6-rank0.pt of this run, but autoresume is off"
    ):
        launch.check_fresh_start(cfg, run, Head("l1", {}, "ep0-ba6-rank0.pt"))
    assert launch.check_fresh_start(cfg, run, Head("l1", {}, None)) == ""  # claimed, nothing committed
    (run / "step-6.safetensors").write_bytes(b"x")
    lost = "1 export(s) (newest step-6.safetensors)"
    cfg.autoresume = False
    with pytest.raises(
        launch.Refusal, match=rf"^{re.escape(str(run))}: holds {re.escape(lost)}, and autoresume is off"
    ):
        launch.check_fresh_start(cfg, run, None)
    cfg.autoresume = True
    with pytest.raises(launch.Refusal, match=r"it holds no checkpoint to resume from \(no run.json says which run"):
        launch.check_fresh_start(cfg, run, None)
    never = {"lineage": {FIRST_CHECKPOINT: None}}  # killed before its first checkpoint: started over
    assert launch.check_fresh_start(cfg, run, None, record=never) == lost
    cfg.allow_existing = True
    assert launch.check_fresh_start(cfg, run, None) == ""


def test_validation_is_off_when_either_its_interval_or_its_clips_are_0_and_the_cache_is_per_node(tmp_path, monkeypatch):
    from gcc.training.config import TrainConfig

    def cfg(**kw):
        c = TrainConfig(run_dir=str(tmp_path / "run"))
        for k, v in kw.items():
            setattr(c, k, v)
        return c

    assert [launch.validates(cfg(eval_interval=e, val_n=n)) for e, n in ((1, 1), (0, 4), (6, 0), (0, 0))] == [
        True,
        False,
        False,
        False,
    ]
    monkeypatch.delenv("NODE_RANK", raising=False)
    assert launch.cache_dir(cfg()) == tmp_path / "run" / "cache" / "node0"
    monkeypatch.setenv("WORLD_SIZE", "8")  # 8 nodes of one rank: node 3 is one of them
    monkeypatch.setenv("NODE_RANK", "3")
    elsewhere = cfg()
    elsewhere.data.cache_dir = str(tmp_path / "cache")
    assert launch.cache_dir(elsewhere) == tmp_path / "cache" / "node3"


def test_the_signature_names_the_base_weights_by_their_index_or_their_folder_and_signs_a_decays_horizon(tmp_path):
    """No base weights: "" (not null, which an older run.json never held); a folder without the sharded
    checkpoint's index: its real path; with the index: its hash. A decaying schedule signs the horizon the launch
    gives, else max_duration."""
    import hashlib
    import os

    from gcc.training.config import TrainConfig

    cfg = TrainConfig()
    assert launch.run_signature(cfg, b"{}")["model.base_weights"] == ""
    cfg.model.model_dir = str(tmp_path / "wan")
    os.makedirs(cfg.model.model_dir)
    assert launch.run_signature(cfg, b"{}")["model.base_weights"] == os.path.realpath(cfg.model.model_dir)
    index = tmp_path / "wan" / "diffusion_pytorch_model.safetensors.index.json"
    index.write_text("{}")
    assert launch.run_signature(cfg, b"{}")["model.base_weights"] == hashlib.sha256(b"{}").hexdigest()
    assert launch.SCHEDULE_HORIZON not in launch.run_signature(cfg, b"{}")  # constant: no horizon
    cfg.scheduler.name = "cosine_with_warmup"
    assert launch.run_signature(cfg, b"{}", horizon=500)[launch.SCHEDULE_HORIZON] == 500
    assert launch.run_signature(cfg, b"{}")[launch.SCHEDULE_HORIZON] == cfg.max_duration == 20000
