"""RunFiles (gcc/training/callbacks/run_files.py): `<run_dir>/config.json` at the start of each launch (the resolved
config and the step the launch starts at) and `<run_dir>/done.json` at its end (the step reached, this launch's step
count, mean step and data-wait times, and the loader's position for a resume)."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean

import pytest
from _cbfit import Fit
from composer.core import Timestamp

from gcc.data.config import DataConfig
from gcc.data.dataset import GcStreamingDataset
from gcc.provenance import Provenance
from gcc.training.builders import resolved_config
from gcc.training.callbacks import GradClip, RunFiles, StepSync, TrainStats
from gcc.training.config import load_config

CLIPS = [f"c{i}" for i in range(40)]
MANIFEST = {  # the parts of a convert_data manifest.json that the resolved config reads
    "splits": {"train": {"clip_ids": CLIPS}, "val": {"clip_ids": ["v0", "v1"]}},
    "geometry": {"frames": 5, "height": 32, "width": 32},
    "counts": {"train": len(CLIPS), "val": 2},
}


def streaming(shards, cache: Path) -> GcStreamingDataset:
    """The loader tests' train split as the run's train loader reads it (a real StreamingDataset, cache of its own)."""
    return GcStreamingDataset(DataConfig(str(shards)), "train", cache, batch_size=2, seed=5)


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # one process
    cfg = load_config("yamls/tiny_cpu.yaml", [f"run_dir={tmp_path / 'run'}", f"data.path={tmp_path / 'shards'}"])
    (tmp_path / "run").mkdir()
    return cfg


CODE = Provenance("0.1.0", "c0ffee", True)  # the launch's code (gcc/provenance.py), as rank 0 read it


def launch(cfg, start_step: int, dataset=None):
    sync = StepSync(cfg.device_train_microbatch_size)
    GradClip(cfg.algorithms.gradient_clipping.clipping_threshold, sync)
    stats = TrainStats(sync, CLIPS)
    config = resolved_config(cfg, MANIFEST, cfg.device_train_microbatch_size, CODE)
    files = RunFiles(cfg.run_dir, config, stats)
    fit = Fit([sync, stats, files], max_steps=cfg.max_steps, dataset=dataset)
    if start_step:  # autoresume put the timestamp at the checkpoint's step
        fit.state.timestamp = Timestamp(
            batch=start_step, sample=2 * start_step, batch_in_epoch=start_step, sample_in_epoch=2 * start_step
        )
    return fit, stats, config


def read(cfg, name: str) -> dict:
    with open(f"{cfg.run_dir}/{name}") as f:
        return json.load(f)


def test_config_json_at_the_start_names_the_config_and_the_start_step(cfg):
    fit, _, config = launch(cfg, start_step=4)
    fit.fit_start()
    written = read(cfg, "config.json")
    assert written == {**json.loads(json.dumps(config, default=str)), "start_step": 4}
    assert written["config"]["run_dir"] == cfg.run_dir and written["config"]["max_duration"] == 300
    assert written["provenance"] == {"gcc_version": "0.1.0", "git_revision": "c0ffee", "git_dirty": True}
    assert (written["world_size"], written["per_rank_batch"]) == (1, cfg.device_train_microbatch_size)
    assert (
        written["steps_per_epoch"] == len(CLIPS) // cfg.device_train_microbatch_size
        and written["data_counts"]["train"] == 40
    )
    fit2, _, _ = launch(cfg, start_step=0)  # the next launch's file replaces it
    fit2.fit_start()
    assert read(cfg, "config.json")["start_step"] == 0


def test_done_json_at_the_end_has_this_launchs_steps_and_the_loader_position(cfg, shards, tmp_path):
    """The loader's position is Streaming's own state after the launch's samples (8 resumed + 3 steps of 2): a
    dataset that loads it yields the rest of the epoch, from sample 14 on."""
    ds = streaming(shards, tmp_path / "cache")
    fit, stats, _ = launch(cfg, start_step=4, dataset=ds)
    read_so_far = iter(ds)
    for _ in range(8):  # what the launches read: the 4 steps resumed, then 2 a step
        next(read_so_far)
    fit.fit_start()
    for wait in (0.02, 0.0, 0.04):
        next(read_so_far), next(read_so_far)
        fit.step(data_wait=wait)
    assert int(fit.state.timestamp.batch) == 7
    fit.fit_end()
    done = read(cfg, "done.json")
    position = done.pop("data_position")
    assert done == {
        "step": 7,
        "steps_this_launch": 3,
        "s_per_step_mean": pytest.approx(mean(stats.step_times)),
        "data_s_per_step_mean": pytest.approx(mean(stats.data_times)),
    }
    assert done["data_s_per_step_mean"] >= 0.02
    assert (position["epoch"], position["sample_in_epoch"]) == (0, 14)
    whole = [s["sample_id"] for s in streaming(shards, tmp_path / "whole")]
    resumed = streaming(shards, tmp_path / "resumed")
    resumed.load_state_dict(position)
    assert [s["sample_id"] for s in resumed] == whole[14:]
    assert sorted(p.name for p in Path(cfg.run_dir).iterdir()) == ["config.json", "done.json"]  # no temporaries


def test_done_json_without_steps_or_a_resumable_loader(cfg):
    fit, _, _ = launch(cfg, start_step=9)
    fit.fit_start()
    fit.fit_end()  # a launch that had nothing left to train
    assert read(cfg, "done.json") == {
        "step": 9,
        "steps_this_launch": 0,
        "s_per_step_mean": None,
        "data_s_per_step_mean": None,
        "data_position": None,
    }
