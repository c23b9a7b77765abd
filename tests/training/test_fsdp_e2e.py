"""The production path on CPU: `parallelism: fsdp` (Composer's FSDP2, sharded DCP checkpoints) under the real
`composer -n 2` launcher (gloo), with everything docs/training.md promises of a run: the same training as DDP,
exact resume past a partial checkpoint folder, SIGTERM preemption, world-size changes and a global-batch change,
rotation across restarts, the signature refusal, the NaN stop; and the `wide` preset (the real TI2V-5B layer
shapes) loading published-layout base weights shard by shard.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
from pathlib import Path

import pytest
import torch
from _launch import (
    CLIP,
    EMA,
    SAMPLES,
    WORKER,
    assert_grad_norm_logged_before_clipping,
    exact,
    export_tensors,
    finish,
    kill_before_the_first_commit,
    launch,
    ok,
    rows,
    same_samples,
    start_bg,
    stopped_copy,
    wait_for_step,
)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gcc.synth.wan_layout import write_wan_dit
from gcc.training.checkpoint.files import checkpoint_step

pytestmark = pytest.mark.slow
FSDP = "parallelism=fsdp"
AC = "model.activation_checkpointing=block"  # per block, as in production
NUMERIC = ["loss", "mse", "grad_norm", "sem_rms", "x_rms"]  # the same computation, summed in another order


@pytest.fixture(scope="session")
def fsdp_reference(e2e_shards, shared):
    """One uninterrupted 12-step FSDP2 run on 2 ranks with the EMA, launched once for the session; the interrupted
    FSDP runs must reproduce it."""
    return shared("fsdp_ref", lambda p: ok(launch(p / "run", e2e_shards, FSDP, AC, *SAMPLES, EMA))) / "run"


def ckpt_folders(run_dir: Path) -> list[Path]:
    return sorted((p for p in (run_dir / "checkpoints").glob("ep*-ba*") if p.is_dir()), key=checkpoint_step)


def latest_step(run_dir: Path) -> int:
    return checkpoint_step(os.readlink(run_dir / "checkpoints" / "latest-rank0.pt"))


def staging_gb(log: Path) -> float:
    """The host memory rank 0 staged for its background checkpoint writes, by its log's line."""
    (gb,) = re.findall(r"checkpoint staging: (\S+) GB of host memory on this rank", log.read_text())
    return float(gb)


def same_draws(got: list[dict], want: list[dict], rel: float) -> None:
    """Same data and draws; numbers equal up to summation order (`rel`)."""
    assert [int(g["step"]) for g in got] == [int(w["step"]) for w in want]
    for g, w in zip(got, want):
        assert sorted(g["clips"].split(";")) == sorted(w["clips"].split(";")), g["step"]
        for k in ("timestep", "text_drop", "cond_drop", "lr", "cond_lr", "epoch"):
            assert g[k] == w[k], (g["step"], k)
        assert float(g["mask_frac"]) == pytest.approx(float(w["mask_frac"]), rel=1e-9)
        for k in NUMERIC:
            assert float(g[k]) == pytest.approx(float(w[k]), rel=rel, abs=1e-9), (g["step"], k)


def test_fsdp_trains_as_ddp_and_writes_sharded_checkpoints(fsdp_reference, reference):
    # the same weights at the start (a pure function of the seed), the same data and draws, and a gradient that
    # is the global-batch mean on gloo too: FSDP2 follows the DDP run step for step
    same_draws(rows(fsdp_reference), rows(reference), rel=1e-4)
    for g, w in zip(rows(fsdp_reference, "val_log"), rows(reference, "val_log")):
        assert float(g["mse"]) == pytest.approx(float(w["mse"]), rel=1e-4)
    folders = ckpt_folders(fsdp_reference)
    assert [checkpoint_step(p) for p in folders] == [9, 12]  # rotation kept 2
    for p in folders:  # one shard per rank and the metadata DCP writes last
        assert sorted(f.name for f in p.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert latest_step(fsdp_reference) == 12
    # a background write stages this rank's shards, not the whole model: rank 0's host memory about half DDP's
    fsdp_gb, ddp_gb = (staging_gb(r / "train.log") for r in (fsdp_reference, reference))
    assert 0.4 * ddp_gb < fsdp_gb < 0.6 * ddp_gb, (fsdp_gb, ddp_gb)
    for ema in ("", ".ema"):  # the raw weights, and their EMA averaged on each rank's shard
        a, meta_a = export_tensors(fsdp_reference / f"step-12{ema}.safetensors")
        b, _ = export_tensors(reference / f"step-12{ema}.safetensors")
        assert set(a) == set(b) and len(a) == len(b)
        # equal up to summation order in fp32, then rounded to the export's bf16: at most one bf16 step apart (a
        # relative 2**-7 at worst), where a loose tolerance (2e-2) would let a wrong update through
        far = [k for k in a if not torch.allclose(a[k].float(), b[k].float(), rtol=2**-7, atol=1e-6)]
        assert not far, [(k, float((a[k].float() - b[k].float()).abs().max())) for k in far[:5]]
        assert meta_a["format"] == "gc25d" and meta_a["step"] == "12"
    # samples with the model sharded: every rank samples in lockstep (3 clips on 2 ranks), rank 0 gathers; the same
    # clips and, from the same noise and nearly the same weights, nearly the same scores as DDP
    for s in (0, 6, 12):
        got, want = (
            json.loads((r / "samples" / f"step-{s}" / "samples.json").read_text()) for r in (fsdp_reference, reference)
        )
        assert got["clips"].keys() == want["clips"].keys() and len(got["clips"]) == 3
        for c in got["clips"]:
            for v in ("cond", "uncond"):
                assert got["clips"][c][v] == pytest.approx(want["clips"][c][v], abs=0.05), (s, c, v)
    (events,) = (fsdp_reference / "tensorboard").rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events), size_guidance={"images": 0}).Reload()
    assert len(acc.Tags()["images"]) == 9 and all(
        [i.step for i in acc.Images(t)] == [0, 6, 12] for t in acc.Tags()["images"]
    )


def test_fsdp_exact_resume_never_reads_a_partial_checkpoint(fsdp_reference, e2e_shards, tmp_path):
    """The FSDP reference as a launch killed while it wrote step 12's sharded checkpoint leaves it
    (tests/_launch.py stopped_copy): the ranks' shards of step 12 without DCP's .metadata (DCP writes it last, via a
    temporary name) and, at worst, `latest` already pointing at them. The relaunch removes that folder, resumes
    from step 9 and gives the reference's rows, export and samples exactly. A real SIGKILL and its relaunch:
    tests/training/test_train_e2e.py (the kill is the same for both parallelisms; what it leaves is this)."""
    run_dir = stopped_copy(fsdp_reference, tmp_path / "run", at=9)
    for step in (0, 6):  # the samples written before step 9 (stopped_copy keeps none)
        shutil.copytree(fsdp_reference / "samples" / f"step-{step}", run_dir / "samples" / f"step-{step}")
    ckpts = run_dir / "checkpoints"
    done = ckpts / os.readlink(ckpts / "latest-rank0.pt")
    partial = ckpts / "ep2-ba12"
    shutil.copytree(fsdp_reference / "checkpoints" / partial.name, partial)
    (partial / ".metadata").rename(partial / ".metadata.tmp")
    (ckpts / "latest-rank0.pt").unlink()
    os.symlink(partial.name, ckpts / "latest-rank0.pt")
    (run_dir / "step-12.ema.safetensors").unlink()  # the relaunch writes it anew
    r = ok(launch(run_dir, e2e_shards, FSDP, AC, *SAMPLES, EMA))
    assert f"removing incomplete/stale {partial.name}" in r.stdout and f"resuming from {done}" in r.stdout, r.stdout
    assert exact(rows(run_dir)) == exact(rows(fsdp_reference))  # to the last digit
    for ema in ("", ".ema"):  # the EMA's shards came back from the sharded checkpoint exactly
        a, _ = export_tensors(fsdp_reference / f"step-12{ema}.safetensors")
        b, meta_b = export_tensors(run_dir / f"step-12{ema}.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a) and meta_b["weights"] == (ema[1:] or "raw")
    raw, _ = export_tensors(run_dir / "step-12.safetensors")
    assert not all(torch.equal(raw[k], b[k]) for k in raw)  # the EMA is not the weights
    assert meta_b["resumed_step"] == "9" and meta_b["resumed_from"].endswith(f"/{done.name}")
    assert [checkpoint_step(p) for p in ckpt_folders(run_dir)] == [9, 12]  # rotation across the restart
    same_samples(fsdp_reference, run_dir)  # sharded sampling after a resume: the same pictures


def test_fsdp_preemption_writes_a_complete_sharded_checkpoint(e2e_shards, tmp_path):
    """SIGTERM to the process group: the ranks finish the step, write the sharded checkpoint (every rank's shard and
    DCP's .metadata, which completes it) and exit 0. That a sharded checkpoint resumes exactly:
    test_fsdp_exact_resume_never_reads_a_partial_checkpoint; a preempted DDP run's relaunch:
    tests/training/test_train_e2e.py."""
    run_dir = tmp_path / "run"
    p = start_bg(run_dir, e2e_shards, WORKER, FSDP, AC)
    wait_for_step(run_dir, 4, p)
    os.killpg(p.pid, signal.SIGTERM)
    out = finish(p, 600)
    assert p.returncode == 0 and "preempted: stopped after step" in out, out[-4000:]
    stopped = int(out.split("preempted: stopped after step ")[1].split()[0])
    assert latest_step(run_dir) == stopped
    assert sorted(f.name for f in ckpt_folders(run_dir)[-1].iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert checkpoint_step(ckpt_folders(run_dir)[-1]) == stopped


@pytest.mark.parametrize("seed", [1])
def test_fsdp_a_kill_before_the_first_checkpoint_then_the_same_command_finishes_the_uninterrupted_run(
    seed, fsdp_reference, e2e_shards, tmp_path
):
    """A SIGKILL at a random instant (seeded) before the run's first sharded checkpoint is committed (its background
    write held, so the launch may be past the first save point, as an FSDP2 run with background saves often is):
    the same command starts the run over (what the killed launch wrote moved to replaced/<time>/) and finishes it,
    exactly the uninterrupted one: rows, the raw and the EMA exports (docs/training.md, "Resuming")."""
    run_dir = tmp_path / "run"
    p = start_bg(run_dir, e2e_shards, FSDP, AC, EMA, "faults.hold_async_write_step=3")
    instant = kill_before_the_first_commit(p, random.Random(seed))
    wrote = (run_dir / "train_log.csv").is_file() and len(rows(run_dir)) > 0
    r = ok(launch(run_dir, e2e_shards, FSDP, AC, EMA))
    assert ("its launch stopped before the run's first checkpoint" in r.stdout) == wrote, (instant, r.stdout[-3000:])
    assert "resuming" not in r.stdout, instant
    assert exact(rows(run_dir)) == exact(rows(fsdp_reference)), instant
    for ema in ("", ".ema"):
        a, _ = export_tensors(fsdp_reference / f"step-12{ema}.safetensors")
        b, _ = export_tensors(run_dir / f"step-12{ema}.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a), (instant, ema)


def test_fsdp_world_size_changes_continue_the_run(fsdp_reference, e2e_shards, tmp_path):
    """Another number of ranks, 2 -> 1 -> 2: the FSDP reference at step 9's checkpoint (tests/_launch.py
    stopped_copy) continued on 1 rank to step 11 with the same global batch: the sharded checkpoint is read back
    resharded (weights, AdamW moments), the data continues where it stopped, numbers equal the reference's up to
    summation order. Then on 2 ranks with global batch 2 instead of 4 (docs/training.md, "A changed global batch"):
    the 1-rank checkpoint is read back resharded, model, optimizer and step come from it, the data continues at the
    start of epoch 3 (the rest of epoch 2 skipped, said once by rank 0), and every step after it has the full new
    global batch. The EMA goes off and on again on the way (it is not part of the run's identity): the 1-rank
    launch ignores the reference's averages, and the last one, resuming a checkpoint without any, starts them from
    the resumed weights."""
    run_dir = stopped_copy(fsdp_reference, tmp_path / "run", at=9)
    r = ok(launch(run_dir, e2e_shards, FSDP, AC, "max_duration=11", direct=True))  # one rank
    assert "resuming from" in r.stdout and "ep1-ba9" in r.stdout
    assert sorted(f.name for f in ckpt_folders(run_dir)[-1].iterdir()) == [".metadata", "__0_0.distcp"]  # 1 rank's
    first = rows(run_dir)
    same_draws(first, rows(fsdp_reference)[:11], rel=1e-4)
    (run_dir / "step-12.ema.safetensors").unlink()  # the reference's: the last launch writes its own
    r = ok(launch(run_dir, e2e_shards, FSDP, AC, EMA, "global_train_batch_size=2", "max_duration=13"))
    assert "resuming from" in r.stdout and "ep2-ba11" in r.stdout
    assert "EMA: the checkpoint holds no average" in r.stderr and "weights of step 11" in r.stderr, r.stderr
    change = (
        "global batch changed from 4 (the checkpoint's) to 2: step 11 continues at the start of epoch 3; the rest "
        "of epoch 2, 18 of its 22 samples, is skipped"
    )
    assert r.stdout.count(change) == 1, r.stdout[-3000:]  # rank 0's line (rank 1 prints to its own log)
    got = rows(run_dir)
    assert [int(x["step"]) for x in got] == list(range(1, 14))
    assert got[:11] == first
    after = got[11:]  # 2 steps of 2 clips from the start of epoch 3
    assert [int(x["epoch"]) for x in after] == [3, 3]
    clips = ";".join(x["clips"] for x in after).split(";")
    train = json.loads((e2e_shards / "manifest.json").read_text())["splits"]["train"]["clip_ids"]
    assert len(clips) == len(set(clips)) == 4 and set(clips) <= set(train)
    assert {float(x["lr"]) for x in after} == {1e-3}  # the schedule by step (a fresh start would be warming up)
    assert json.loads((run_dir / "run.json").read_text())["lineage"]["global_batch_changes"] == [
        {"step": 11, "old": 4, "new": 2}
    ]
    assert json.loads((run_dir / "config.json").read_text())["steps_per_epoch"] == 11
    ema, meta = export_tensors(run_dir / "step-12.ema.safetensors")
    raw, meta_raw = export_tensors(run_dir / "step-12.safetensors")
    assert meta_raw["resumed_step"] == "11" and meta_raw["step"] == "12"  # written by the last launch
    assert meta["weights"] == "ema" and set(ema) == set(raw) and not all(torch.equal(ema[k], raw[k]) for k in raw)


def test_fsdp_refusals_and_the_nonfinite_stop(e2e_shards, tmp_path):
    run_dir = tmp_path / "run"
    clip = f"algorithms.gradient_clipping.clipping_threshold={CLIP}"
    r = launch(run_dir, e2e_shards, FSDP, "faults.nonfinite_step=5", "faults.nonfinite_rank=1", "eval_interval=0", clip)
    assert r.returncode == 4, (r.stdout[-2000:], r.stderr[-3000:])
    assert "non-finite loss at step 5 (rank 1: clips clip" in r.stderr
    assert [checkpoint_step(p) for p in ckpt_folders(run_dir)] == [3]  # nothing of the poisoned state
    assert [int(x["step"]) for x in rows(run_dir)] == [1, 2, 3, 4]
    assert_grad_norm_logged_before_clipping(rows(run_dir))
    # DDP cannot read these checkpoints: refused before any work, on one rank as on two
    r = launch(run_dir, e2e_shards, "parallelism=ddp", "eval_interval=0", clip, direct=True)
    assert r.returncode == 3 and "parallelism: 'fsdp' -> 'ddp'" in r.stderr
    assert [checkpoint_step(p) for p in ckpt_folders(run_dir)] == [3] and latest_step(run_dir) == 3  # untouched


def test_wide_preset_loads_published_layout_base_weights_by_shard(tmp_path):
    """The real TI2V-5B layer shapes (one block of them), base weights as published (3 files + index, bf16): after
    one step at lr 0 the export holds exactly the files' Wan weights and the seeded, zero-output condition."""
    from gcc.data.convert import convert
    from gcc.synth.world import write_prepared

    model_dir = tmp_path / "wan"
    model_dir.mkdir()
    base = write_wan_dit(model_dir, n_shards=3, preset="wide", seed=5, dtype=torch.bfloat16, num_layers=1)
    shards = tmp_path / "shards"
    convert(write_prepared(tmp_path / "prepared", clips=8, geometry="wide", seed=3), str(shards), progress=False)
    run_dir = tmp_path / "run"
    r = ok(
        launch(
            run_dir,
            shards,
            FSDP,
            AC,
            "model.preset=wide",
            "model.overrides={num_layers: 1}",
            f"model.model_dir={model_dir}",
            "optimizer.lr=0",
            "optimizer.cond_lr=0",
            "max_duration=1",
            "export_every=1",
            "eval_interval=0",
            "save_interval=1",
            "global_train_batch_size=2",
            timeout=1800,
        )
    )
    assert f"model: base Wan weights from {model_dir}" in r.stdout
    got, _meta = export_tensors(run_dir / "step-1.safetensors")
    assert len(got) == len(base) + 6
    assert all(torch.equal(got[k], base[k]) for k in base)
    assert (got["gc_sem_cond.proj_out.weight"] == 0).all()
    assert [f.name for f in sorted(ckpt_folders(run_dir)[0].glob("__*"))] == ["__0_0.distcp", "__1_0.distcp"]
