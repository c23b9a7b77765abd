"""End to end: the real `composer -n 2` launcher on CPU (gloo), the tiny model, synthetic shards.

Exact resume after SIGKILL, preemption by SIGTERM and by SIGUSR1, elastic resume on fewer ranks, a changed global
batch, a data.limit subset, data on S3 (moto server), preemption during the step-0 validation, signature refusals,
the run lock, a NaN on one rank, warm start + lineage over resumes, and learning; train.log's lines.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path

import psutil
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
    launch_logs,
    ok,
    rows,
    same_samples,
    start_bg,
    stopped_copy,
    wait_for,
    wait_for_step,
)

from gcc.data import convert as C
from gcc.launch_command import gcc_launch
from gcc.provenance import this_code
from gcc.tools.compare import main as compare_main
from gcc.training.checkpoint.files import checkpoint_step
from gcc.training.config import RENAMED

pytestmark = pytest.mark.slow


def test_reference_run_outputs(reference, e2e_shards):
    r = rows(reference)
    assert [int(x["step"]) for x in r] == list(range(1, 13))
    assert float(r[0]["sem_rms"]) == 0.0 < float(r[-1]["sem_rms"])  # zero-init cond, then it trains
    assert [float(x["lr"]) for x in r[:5]] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    sizes = [len(x["clips"].split(";")) for x in r]  # every rank's clips; an epoch's tail batch is smaller
    assert max(sizes) == 4 and sizes.count(4) >= 9
    v = rows(reference, "val_log")
    # the step-0 validation of the starting weights (eval_first), then every eval_interval
    assert [(int(x["step"]), int(x["n"])) for x in v] == [(0, 4)] * 3 + [(6, 4)] * 3 + [(12, 4)] * 3
    assert sorted(round(float(x["timestep"]), 1) for x in v[:3]) == [201.3, 500.6, 799.7]
    # at step 0 the zero-initialised condition path adds nothing: ids or no ids, the same prediction
    assert [float(x["gap_uncond"]) for x in v[:3]] == [0.0] * 3 and all(float(x["gap_uncond"]) for x in v[3:])
    assert sorted(p.name for p in reference.glob("step-*.safetensors")) == [
        *("step-12.ema.safetensors", "step-12.safetensors", "step-6.ema.safetensors", "step-6.safetensors")
    ]
    # `data` is the dataset's name from its manifest (convert_data's default for gcc-synth data), not the folder's
    meta = export_tensors(reference / "step-12.safetensors")[1]
    assert (meta["data"], meta["data_root"], e2e_shards.name) == ("synth", str(e2e_shards), "shards")
    ckpts = sorted(p.name for p in (reference / "checkpoints").glob("ep*-ba*-rank0.pt"))
    assert len(ckpts) == 2 and any("ba12" in c for c in ckpts)  # rotation kept 2
    done = json.loads((reference / "done.json").read_text())
    assert done["step"] == 12 and done["s_per_step_mean"] > 0 and done["data_position"]["epoch"] >= 0
    cfg = json.loads((reference / "config.json").read_text())
    assert cfg["steps_per_epoch"] > 0 and cfg["data_geometry"]["latents"][0] == 48
    log = (reference / "train.log").read_text().splitlines()  # rank 0's console lines, under the launch's header
    assert log[0].startswith("==== launch ") and " world 2 " in log[0] and sum("==== launch" in ln for ln in log) == 1
    # the code that made the run (gcc/provenance.py: the checkout the tests run from), read once by rank 0: in the
    # header, config.json, run.json's launch history (not its signature) and every export
    code = this_code()
    assert f"  {code} ====" in log[0] and cfg["provenance"] == code.as_dict()
    record = json.loads((reference / "run.json").read_text())
    (launch_entry,) = record["lineage"]["launches"]  # one launch
    assert launch_entry == {"time": launch_entry["time"], "world": 2, "from_step": 0, **code.as_dict()}
    assert not any(k.startswith(("git", "gcc")) for k in record["signature"])
    for p in reference.glob("step-*.safetensors"):
        got = export_tensors(p)[1]
        assert (got["trainer"], got["git_revision"], got["git_dirty"], got["data_limit"]) == (
            f"gcc {code.version}",
            code.revision,
            "" if code.dirty is None else str(code.dirty),
            "",
        )
    assert [ln.split("gcc.train: ")[1].split()[:3] for ln in log if "gcc.train: val step" in ln][:3] == [
        ["val", "step", "0"]
    ] * 3
    assert " rank 0 INFO gcc.train: done: step 12 in " in log[-1]
    # samples at every validation: 3 clips sampled by 2 ranks (the first 3 of the fixed val clips), each with its
    # condition and without it, in samples/step-N/ and TensorBoard, and the scores as scalars
    val_ids = json.loads((e2e_shards / "manifest.json").read_text())["splits"]["val"]["clip_ids"]
    for s in (0, 6, 12):
        info = json.loads((reference / "samples" / f"step-{s}" / "samples.json").read_text())
        assert len(info["clips"]) == 3 and set(info["clips"]) <= set(val_ids)
        assert info["settings"]["steps"] == 4 and info["decoder"].startswith("synthetic")
        assert len(list((reference / "samples" / f"step-{s}").glob("*.mp4"))) == 6
    assert sum("samples at step" in ln for ln in log) == 3
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (reference / "tensorboard").rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events), size_guidance={"images": 0}).Reload()
    assert len(acc.Tags()["images"]) == 3 * 3  # per clip: cond, uncond, sheet
    assert all([im.step for im in acc.Images(t)] == [0, 6, 12] for t in acc.Tags()["images"])
    assert [ev.step for ev in acc.Scalars("sample/agreement_cond")] == [0, 6, 12]


def test_every_step_has_the_full_global_batch_and_a_resume_at_an_epochs_end_is_exact(reference, e2e_shards, tmp_path):
    """22 train clips on 2 ranks: 11 a rank an epoch, 2 a step, so 5 full steps and one sample a rank that would
    make a half step: it is dropped, and which samples are dropped changes from epoch to epoch. A run stopped
    exactly at an epoch's end (step 5) continues exactly."""
    cfg = json.loads((reference / "config.json").read_text())
    assert cfg["data_counts"]["train"] == 22 and (cfg["steps_per_epoch"], cfg["samples_per_epoch"]) == (5, 20)
    got = rows(reference)
    assert all(len(r["clips"].split(";")) == 4 for r in got)  # the global batch, at every step
    assert [int(r["epoch"]) for r in got] == [0] * 5 + [1] * 5 + [2] * 2
    seen = [set(";".join(r["clips"] for r in got if int(r["epoch"]) == e).split(";")) for e in (0, 1)]
    assert seen[0] != seen[1]  # the dropped tail varies with the epoch's shuffle
    run_dir = tmp_path / "run"
    ok(launch(run_dir, e2e_shards, "max_duration=5", "save_interval=5"))
    r = ok(launch(run_dir, e2e_shards))
    assert "resuming from" in r.stdout and "ep0-ba5-rank0.pt" in r.stdout
    assert exact(rows(run_dir)) == exact(rows(reference))
    # a job log's progress: a line every console_log_interval (10) steps and at the last; val lines per timestep
    progress = [ln for ln in r.stdout.splitlines() if ln.startswith("gcc.train: step ")]
    assert [ln.split()[2] for ln in progress] == ["10/12", "12/12"], r.stdout
    got = rows(run_dir)
    assert f"loss {statistics.fmean(float(x['loss']) for x in got[5:10]):.4f}" in progress[0]  # steps 6..10
    assert all(k in progress[1] for k in ("lr ", "grad_norm ", "s/step", "data ", "sem_rms ", "elapsed ", "eta 0s"))
    val = [ln for ln in r.stdout.splitlines() if ln.startswith("gcc.train: val step ")]
    # the resume validates at 6 and 12, not at its start: the step-0 rows are the first launch's
    assert [ln.split()[3:5] for ln in val] == [
        ["6", "t=201.3"],
        ["6", "t=500.6"],
        ["6", "t=799.7"],
        ["12", "t=201.3"],
        ["12", "t=500.6"],
        ["12", "t=799.7"],
    ], val
    # step 0's rows once, every value as uninterrupted (and the first launch's end-of-training validation at 5)
    assert [x for x in rows(run_dir, "val_log") if x["step"] != "5"] == rows(reference, "val_log")
    log = (run_dir / "train.log").read_text()
    assert log.count("==== launch ") == 2 and log.count("resuming from") == 1 and log.count("val step 0 ") == 3


def test_exact_resume_after_sigkill(reference, e2e_shards, tmp_path):
    """SIGKILL while step 9's checkpoint is written in the background (`faults.hold_async_write_step` keeps that write
    from completing; training goes on): `latest` still names step 6's, and the relaunch resumes from it, removes
    the unfinished write and gives the uninterrupted run's rows, exports and samples exactly."""
    run_dir = tmp_path / "run"
    p = start_bg(run_dir, e2e_shards, WORKER, *SAMPLES, EMA, "faults.hold_async_write_step=9")
    try:  # the held write never completes: the launch is killed whatever the checks find
        wait_for_step(run_dir, 10, p)  # step 9's write in flight, step 10 trained beside it
        ckpts = run_dir / "checkpoints"
        assert checkpoint_step(os.readlink(ckpts / "latest-rank0.pt")) == 6  # `latest` only names complete writes
        unfinished = [c.name for c in ckpts.iterdir() if "-ba9-" in c.name]
        assert len(unfinished) == 1 and ".pt.tmp" in unfinished[0], unfinished  # step 9's, under its temporary name
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    r = ok(launch(run_dir, e2e_shards, *SAMPLES, EMA))
    assert "resuming from" in r.stdout and "-ba6-rank0.pt" in r.stdout
    assert f"removing incomplete/stale {unfinished[0]}" in r.stdout + r.stderr
    assert exact(rows(run_dir)) == exact(rows(reference))  # clips, drops, mask, timestep, loss: exactly
    assert compare_main([str(reference), str(run_dir)]) == 0  # what a user runs to check it: logs and exports
    # the EMA came back from the checkpoint exactly: its export is the uninterrupted run's, bit for bit
    a, meta_a = export_tensors(reference / "step-12.ema.safetensors")
    b, meta_b = export_tensors(run_dir / "step-12.ema.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a) and meta_a["weights"] == meta_b["weights"] == "ema"
    a, meta_a = export_tensors(reference / "step-12.safetensors")
    b, meta_b = export_tensors(run_dir / "step-12.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert meta_b["resumed_step"] == "6" and meta_b["resumed_from"].endswith("-ba6-rank0.pt")
    assert meta_a["resumed_from"] == ""
    same_samples(reference, run_dir)  # step 12's by the resumed launch: the same pictures as uninterrupted


@pytest.mark.parametrize("seed", [0])
def test_a_kill_before_the_first_checkpoint_then_ctrl_c_then_the_same_command_finishes_the_uninterrupted_run(
    seed, reference, e2e_shards, tmp_path
):
    """An operator's day (docs/training.md, "Resuming"). A SIGKILL at a random instant (seeded) before the run's
    first checkpoint is committed (its background write held: `faults.hold_async_write_step`, so the launch may be
    past the first save point): the same command starts the run over, moving what the killed launch wrote to
    replaced/<time>/ with one line. Then Ctrl-C (SIGINT to the process group, as a terminal sends it): every rank
    finishes its step, checkpoints and exits 0 with the "relaunch the same command" line. The same command again
    finishes the run: exactly the uninterrupted one (gcc-compare)."""
    run_dir = tmp_path / "run"
    instant = kill_before_the_first_commit(
        start_bg(run_dir, e2e_shards, "faults.hold_async_write_step=3"), random.Random(seed)
    )
    wrote = (run_dir / "train_log.csv").is_file() and len(rows(run_dir)) > 0
    # through gcc-launch; the bar allowed, as sft_v10.yaml does, and a progress line a step; the output is a pipe
    # (the Ctrl-C: the last rank sends SIGINT to the launch's process group as step 7 starts, as a terminal sends
    # it to its foreground group)
    p = start_bg(
        run_dir, e2e_shards, "progress_bar=true", "console_log_interval=1", "faults.sigint_at_step=7", by=gcc_launch()
    )
    out = finish(p, 600)
    assert p.returncode == 0, (instant, out[-4000:])
    # a quiet end: the ranks' own lines, nothing of the launcher's (a traceback, its wait, rank blocks)
    assert out.rstrip().splitlines()[-1].endswith("relaunch the same command to continue"), out[-3000:]
    assert not any(w in out for w in ("Traceback", "Waiting up to", "----------Begin", "Killing")), out[-3000:]
    assert ("its launch stopped before the run's first checkpoint" in out) == wrote, (instant, out[-4000:])
    assert len(list((run_dir / "replaced").glob("*"))) == (1 if wrote else 0), instant
    assert "preempted: stopped after step" in out and "relaunch the same command to continue" in out, out[-3000:]
    at = int(out.split("preempted: stopped after step ")[1].split()[0])
    assert checkpoint_step(os.readlink(run_dir / "checkpoints" / "latest-rank0.pt")) == at == 7
    # no terminal: no progress bar (on any rank), the progress lines in its place; train.log plain text
    log = (run_dir / "train.log").read_text()
    assert "gcc.train: step 5/12  loss " in out and "%|" not in out + p.rank_output() + log
    assert "\x1b" not in log and "\\x1b" not in log
    r = launch(run_dir, e2e_shards, "optimizer.lr=5e-4", by=gcc_launch())
    assert r.returncode == 3 and r.stderr.startswith("gcc.train: refused: ") and "Traceback" not in r.stderr
    assert "  optimizer.lr: 0.001 -> 0.0005\n" in r.stderr  # the key's name now, as the command line gave it
    assert r.stderr.count("gcc.train: ") == 1 and not any(w in r.stdout + r.stderr for w in ("Waiting up", "Begin"))
    r = ok(launch(run_dir, e2e_shards))
    assert "resuming from" in r.stdout and f"-ba{at}-rank0.pt" in r.stdout
    assert exact(rows(run_dir)) == exact(rows(reference)), instant
    assert compare_main([str(reference), str(run_dir)]) == 0  # the val rows and the raw exports too


def test_a_second_ctrl_c_stops_at_once(e2e_shards, tmp_path):
    """Ctrl-C while the rank cannot finish its step (its loader never delivers step 3's batch:
    `faults.stall_step`) arms the preemption's grace; a second Ctrl-C stops it at once, exit 130, with one line
    saying so and no checkpoint of the stalled step."""
    run_dir = tmp_path / "run"
    p = start_bg(run_dir, e2e_shards, "faults.stall_step=3", "preemption_grace_s=120", direct=True)
    wait_for_step(run_dir, 2, p)
    time.sleep(1)  # into the wait for step 3's batch
    os.killpg(p.pid, signal.SIGINT)
    time.sleep(1)
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)
    out = finish(p, 60)
    assert p.returncode == 130 and time.monotonic() - t0 < 15, out[-3000:]
    assert "a second Ctrl-C (SIGINT): stopped at once, without a checkpoint" in out
    assert "Traceback" not in out
    assert not any("-ba3-" in c.name for c in (run_dir / "checkpoints").glob("ep*"))


def _ranks_of(run_dir: Path) -> list[int]:
    return [q.pid for q in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(q.info["cmdline"] or [])]


def test_preemption_by_sigterm_then_sigusr1_checkpoints_and_resumes(reference, e2e_shards, tmp_path):
    """SIGTERM to the process group (launcher and ranks, as a cluster's preemption does), sent by the last rank as
    step 6 starts (`faults.sigterm_at_step`): step 6's validation and export are due, and the ranks skip them and
    checkpoint at once (train.log says so; no step-6 row in val_log.csv, no step-6 export). The relaunch validates
    and exports step 6 first (the checkpoint holds step 6's weights); then SIGUSR1 to its ranks alone (`pkill -USR1
    -P <launcher pid>`, docs/training.md "Resuming"): the ranks checkpoint and the launcher exits 0. The last launch,
    with a grace no save fits in (preemption_grace_s=0.001), warns at its first save and ends the run: exactly the
    uninterrupted one (gcc-compare: train and val rows, exports)."""
    run_dir = tmp_path / "run"

    def logs(name: str) -> list[str]:  # not the dying launcher's temp folder
        return [
            "--stdout",
            str(tmp_path / f"{name}.rank{{rank}}.out"),
            "--stderr",
            str(tmp_path / f"{name}.rank{{rank}}.err"),
        ]

    def preempted(p, name: str) -> int:
        """The launch ended on a preemption with exit 0, its checkpoint the latest, no rank left, and the ranks'
        resource trackers alive to the end; the step it stopped after."""
        out = finish(p, 600)  # EOF once rank 0 exited
        assert p.returncode == 0 and "preempted: stopped after step" in out, out[-4000:]
        at = int(out.split("preempted: stopped after step ")[1].split()[0])
        assert any(f"-ba{at}-" in c.name for c in (run_dir / "checkpoints").glob("ep*-ba*-rank0.pt"))
        assert checkpoint_step(os.readlink(run_dir / "checkpoints" / "latest-rank0.pt")) == at
        deadline = time.time() + 60
        while _ranks_of(run_dir) and time.time() < deadline:  # rank 1 ends a moment after rank 0
            time.sleep(0.2)
        assert not _ranks_of(run_dir)
        # the ranks' resource trackers outlive the signal (started with it blocked): a dead one is replaced and
        # the new one fails every unregister of what the dead one tracked
        rank1 = (tmp_path / f"{name}.rank1.err").read_text()
        assert "resource_tracker" not in out + rank1 and "KeyError" not in out + rank1, (out + rank1)[-3000:]
        return at

    p = start_bg(run_dir, e2e_shards, WORKER, "faults.sigterm_at_step=6", launcher=logs("SIGTERM"))
    assert preempted(p, "SIGTERM") == 6
    log = (run_dir / "train.log").read_text()
    assert "preempted at step 6: saving now, skipped export, validation (the relaunch runs them first)" in log
    assert [int(x["step"]) for x in rows(run_dir, "val_log")] == [0, 0, 0]  # the validation did not run
    assert not (run_dir / "step-6.safetensors").exists()

    p = start_bg(run_dir, e2e_shards, WORKER, launcher=logs("SIGUSR1"))
    wait_for_step(run_dir, 8, p)
    subprocess.run(["pkill", "-USR1", "-P", str(p.pid)], check=True)  # the ranks, not the launcher
    at = preempted(p, "SIGUSR1")
    assert 8 <= at < 12
    log = (run_dir / "train.log").read_text()
    assert "step 6: running first what the preempted launch skipped there: export, validation" in log
    assert [int(x["step"]) for x in rows(run_dir, "val_log")] == [0] * 3 + [6] * 3
    assert (run_dir / "step-6.safetensors").is_file()

    ok(launch(run_dir, e2e_shards, "preemption_grace_s=0.001"))
    assert exact(rows(run_dir)) == exact(rows(reference))
    assert compare_main([str(reference), str(run_dir)]) == 0  # val rows at 0, 6, 12 and the exports of 6 and 12
    log = (run_dir / "train.log").read_text().split("==== launch ")[-1]  # the last launch's part
    [warning] = [ln for ln in log.splitlines() if "the first checkpoint took" in ln]
    assert (
        " WARNING " in warning and " s > preemption_grace_s=0.001: a preemption would exit 5 and lose up to" in warning
    )


UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]


@pytest.mark.parametrize("pid1", [False, True], ids=["launcher", "launcher_as_pid1"])
def test_preemption_delivered_to_the_launcher_alone(pid1, e2e_shards, tmp_path):
    """Kubernetes sends SIGTERM to the container's PID 1 only: the composer launcher. The launcher passes it on
    to the ranks, which checkpoint and exit 0; nothing is left running. As PID 1 of its own PID namespace the
    launcher is the namespace's init (its exit kills whatever is left in it)."""
    if pid1:
        probe = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True)
        if probe.returncode != 0:
            pytest.skip(f"a PID namespace needs the right to create one (root): unshare said {probe.stderr.strip()!r}")
    run_dir = tmp_path / "run"
    p = start_bg(run_dir, e2e_shards, WORKER, "max_duration=1000", prefix=UNSHARE if pid1 else ())
    wait_for_step(run_dir, 4, p)
    target = psutil.Process(p.pid).children()[0].pid if pid1 else p.pid  # the launcher (unshare forks it)
    os.kill(target, signal.SIGTERM)
    out = finish(p, 300)
    assert p.returncode == 0 and "preempted: stopped after step" in out, out[-4000:]
    stopped = int(out.split("preempted: stopped after step ")[1].split()[0])
    assert checkpoint_step(os.readlink(run_dir / "checkpoints" / "latest-rank0.pt")) == stopped
    assert (run_dir / "checkpoints" / os.readlink(run_dir / "checkpoints" / "latest-rank0.pt")).is_file()
    left = _ranks_of(run_dir)
    assert not left, f"processes left running: {left}"  # (and every rank ended cleanly: finish)
    # that the run continues exactly from such a checkpoint: test_preemption_by_sigterm_then_sigusr1_...


def test_two_launches_on_one_machine_at_once_both_succeed(e2e_shards, tmp_path):
    """Two jobs started together on one node (their launchers, ranks, Streaming shared memory and loader
    workers side by side): both finish cleanly, each with the rows the other got. `GCC_STRESS_ROUNDS` rounds
    (1 in `make test`; `python bench/stress.py` runs many)."""
    for attempt in range(int(os.environ.get("GCC_STRESS_ROUNDS", "1"))):
        runs = [tmp_path / f"try{attempt}" / name for name in ("a", "b")]
        procs = [start_bg(r, e2e_shards, WORKER, "max_duration=6", "save_interval=2") for r in runs]
        outs = [finish(p, 600) for p in procs]
        for p, out in zip(procs, outs):
            assert p.returncode == 0, f"attempt {attempt}: {out[-4000:]}"
        assert exact(rows(runs[0])) == exact(rows(runs[1]))


def test_loader_workers_start_once_per_rank_from_the_forkserver(reference):
    """The reference's one loader worker per rank starts once for the whole run (three epochs), forked by the
    forkserver."""
    assert {int(x["epoch"]) for x in rows(reference)} == {0, 1, 2}
    (logs,) = launch_logs(reference)
    for rank, err in ((0, "launcher.err"), (1, "rank1.err")):
        text = (logs / err).read_text()
        starts = [line for line in text.splitlines() if f"rank {rank} loader worker" in line]
        assert len(starts) == 1, text[-3000:]
        assert starts[0].endswith("(forkserver)"), starts


def test_the_reference_launched_by_the_old_key_names_warned_once_on_rank_0(reference):
    """The reference is launched by the old key names (tests/_launch.py OLD_BASE; every resume of it is by the
    new ones): rank 0 names each old key once, with its new name; the other rank stays quiet."""
    (logs,) = launch_logs(reference)
    err = (logs / "launcher.err").read_text()
    for old in ("max_steps", "optim.warmup_steps", "optim.lr"):
        assert err.count(f"{old}: an old key name, read as {RENAMED[old]};") == 1, err[-3000:]
    assert "an old key name" not in (logs / "rank1.err").read_text()


def test_sigterm_while_a_rank_waits_for_data_stops_the_run_with_stacks(e2e_shards, tmp_path):
    """Rank 1's loader never delivers step 5's batch, rank 0 waits for rank 1 inside step 5: a SIGTERM to the
    process group still ends both within the grace, with rank 1's stacks in the run folder; the last
    checkpoint (step 4's) is left as it was, the one a relaunch resumes from."""
    run_dir = tmp_path / "run"
    grace = 12
    p = start_bg(
        run_dir,
        e2e_shards,
        WORKER,
        "faults.stall_step=5",
        "faults.stall_rank=1",
        f"preemption_grace_s={grace}",
        "save_interval=4",
        "save_async=false",  # `latest` names step 4 as its save ends (a background write commits a step later)
        launcher=["--stderr", str(tmp_path / "rank{rank}.stderr")],
    )
    # step 4's checkpoint is saved after both ranks agreed at step 4's end that no signal had come: from then
    # on, rank 1 can only be on its way to, or in, the wait for step 5's batch (and rank 0 waiting for rank 1)
    latest = run_dir / "checkpoints" / "latest-rank0.pt"
    wait_for(lambda: latest.is_symlink() and checkpoint_step(os.readlink(latest)) == 4, p, "step 4's checkpoint")
    time.sleep(2)
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGTERM)
    out = finish(p, grace + 120)  # EOF: every process of the launch has exited
    assert grace - 1 < time.monotonic() - t0 < grace + 45, out[-3000:]
    assert p.returncode != 0
    stacks = (run_dir / "stacks" / "rank1.txt").read_text()
    assert f"SIGTERM received, and the rank did not checkpoint and exit within preemption_grace_s={grace} s" in stacks
    assert "_try_get_data" in stacks, stacks  # its main thread was waiting on the DataLoader
    assert "rank 1: SIGTERM received" in (tmp_path / "rank1.stderr").read_text()
    assert (
        " rank 1 ERROR gcc.train: rank 1: SIGTERM received, and the rank did not checkpoint"
        in (run_dir / "train.log").read_text()
    )  # every rank's own errors
    assert [int(x["step"]) for x in rows(run_dir)] == [1, 2, 3, 4]
    assert checkpoint_step(os.readlink(latest)) == 4 and (latest.parent / os.readlink(latest)).is_file()


def test_elastic_resume_on_one_rank_keeps_global_batches(reference, e2e_shards, tmp_path):
    """The reference at step 9's checkpoint (2 ranks, mid-epoch 1) continued on 1 rank with the same global batch 4
    (micro 1 × accumulation 4): the same clips and draws at every step, across the epoch's end. It names Composer's
    SpeedMonitor, which the reference did not (docs/training.md, "Callbacks"): its throughput, FLOP/s and MFU (of a
    stated peak: a CPU has none Composer knows) reach TensorBoard from the second step on, without a warning."""
    run_dir = stopped_copy(reference, tmp_path / "run", at=9)
    speed = "callbacks={speed_monitor: {window_size: 1, gpu_flops_available: 1.0e+12}}"
    # one rank (without the launcher: it is not the point)
    r = ok(launch(run_dir, e2e_shards, speed, "loggers={tensorboard: {}}", direct=True))
    assert "resuming from" in r.stdout and "ep1-ba9-rank0.pt" in r.stdout
    assert "not in the state_dict" not in r.stdout + r.stderr
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (run_dir / "tensorboard").rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events)).Reload()
    for tag in ("throughput/samples_per_sec", "throughput/flops_per_sec", "throughput/device/mfu"):
        assert [ev.step for ev in acc.Scalars(tag)] == [11, 12], tag
    assert all(ev.value > 0 for ev in acc.Scalars("throughput/device/mfu"))
    got, want = rows(run_dir), rows(reference)
    assert [int(r["step"]) for r in got] == list(range(1, 13))
    assert {int(r["epoch"]) for r in got[9:]} == {1, 2}
    for g, w in zip(got[9:], want[9:]):
        assert sorted(g["clips"].split(";")) == sorted(w["clips"].split(";"))
        assert (g["text_drop"], g["cond_drop"], g["timestep"]) == (w["text_drop"], w["cond_drop"], w["timestep"])
        assert float(g["mask_frac"]) == pytest.approx(float(w["mask_frac"]), rel=1e-9)
        assert float(g["loss"]) == pytest.approx(float(w["loss"]), rel=1e-3)


def test_a_changed_global_batch_continues_at_the_next_epoch(reference, e2e_shards, tmp_path):
    """The reference run (2 ranks, global batch 4, stopped at step 12: 2 steps into epoch 2) continued on 1 rank
    with global batch 2: it continues at step 13 from epoch 3's first sample (epoch 2's last 14 samples are
    skipped), the lr schedule and the exports go on by step, and run.json's lineage holds the change. Back on 2
    ranks (which share the node's Streaming state) with global batch 4, both start epoch 4."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir, symlinks=True, ignore=shutil.ignore_patterns("cache", "tensorboard", ".lock"))
    r = ok(launch(run_dir, e2e_shards, "global_train_batch_size=2", "max_duration=23", direct=True))  # one rank
    assert "resuming from" in r.stdout and "ep2-ba12-rank0.pt" in r.stdout
    assert (
        "global batch changed from 4 (the checkpoint's) to 2: step 12 continues at the start of epoch 3; the "
        "rest of epoch 2, 14 of its 22 samples, is skipped"
    ) in r.stdout, r.stdout
    got = rows(run_dir)
    assert [int(x["step"]) for x in got] == list(range(1, 24))
    assert exact(got[:12]) == exact(rows(reference))
    after = got[12:]  # 11 steps of 2: exactly one epoch of the 22 train clips, from its start
    assert {int(x["epoch"]) for x in after} == {3}
    clips = ";".join(x["clips"] for x in after).split(";")
    train = json.loads((e2e_shards / "manifest.json").read_text())["splits"]["train"]["clip_ids"]
    assert len(clips) == 22 and sorted(clips) == sorted(train)
    assert {float(x["lr"]) for x in after} == {1e-3}  # past the warmup by step (a restart would give 2.5e-4)
    val = [(int(x["step"]), int(x["n"])) for x in rows(run_dir, "val_log")]
    assert [v for v in val if v[0] > 12] == [(18, 4)] * 3 + [(23, 4)] * 3
    meta = {n: export_tensors(run_dir / f"step-{n}.safetensors")[1] for n in (18, 23)}
    assert {(m["step"], m["resumed_step"]) for m in meta.values()} == {("18", "12"), ("23", "12")}
    lineage = json.loads((run_dir / "run.json").read_text())["lineage"]
    assert lineage["global_batch_changes"] == [{"step": 12, "old": 4, "new": 2}]
    assert json.loads((run_dir / "config.json").read_text())["steps_per_epoch"] == 11
    r = ok(launch(run_dir, e2e_shards, "max_duration=25"))
    assert "to 4: step 23 continues at the start of epoch 4; the rest of epoch 3, 0 of its 22 samples" in r.stdout
    last = rows(run_dir)[23:]
    assert [(int(x["step"]), int(x["epoch"])) for x in last] == [(24, 4), (25, 4)]
    clips = ";".join(x["clips"] for x in last).split(";")
    assert len(clips) == len(set(clips)) == 8
    assert json.loads((run_dir / "run.json").read_text())["lineage"]["global_batch_changes"] == [
        {"step": 12, "old": 4, "new": 2},
        {"step": 23, "old": 2, "new": 4},
    ]


def test_data_limit_trains_on_one_seeded_subset_across_ranks_and_a_resume(e2e_shards, tmp_path):
    """data.limit=8 of the 22 train clips, global batch 4 (2 steps an epoch): 2 ranks for 3 steps, then a resume on
    1 rank. Every epoch, across the ranks and across the resume in the middle of epoch 1, is exactly the 8
    clips that Random(seed) picks."""
    from gcc.data.dataset import subset_ids

    run_dir = tmp_path / "run"
    quiet = ["data.limit=8", "eval_interval=0", "export_every=0"]
    ok(launch(run_dir, e2e_shards, "max_duration=3", *quiet))
    r = ok(launch(run_dir, e2e_shards, "max_duration=6", *quiet, direct=True))  # one rank
    assert "resuming from" in r.stdout and "global batch changed" not in r.stdout
    train = json.loads((e2e_shards / "manifest.json").read_text())["splits"]["train"]["clip_ids"]
    want = sorted(train[i] for i in subset_ids(len(train), 8, seed=0))  # tiny_cpu.yaml's seed
    got = rows(run_dir)
    assert [(int(x["step"]), int(x["epoch"])) for x in got] == [(1, 0), (2, 0), (3, 1), (4, 1), (5, 2), (6, 2)]
    for epoch in (0, 1, 2):
        assert sorted(";".join(x["clips"] for x in got if int(x["epoch"]) == epoch).split(";")) == want, epoch
    assert json.loads((run_dir / "config.json").read_text())["steps_per_epoch"] == 2


def test_data_on_s3_with_a_node_cache_trains_and_resumes_the_same(reference, e2e_shards, tmp_path, s3_bucket):
    """Shards on s3:// (a real S3 server on loopback): the same rows as the local-data run (its first 6 steps,
    past an epoch's end), across a resume."""
    remote = f"{s3_bucket}/shards"
    C.convert(e2e_shards.parent / "prepared", remote, chunk_clips=8, progress=False)
    run_dir = tmp_path / "run"
    for steps in (3, 6):  # the second launch resumes at step 3 with a warm cache
        r = ok(launch(run_dir, e2e_shards, f"data.path={remote}", f"max_duration={steps}"))
    assert "resuming from" in r.stdout
    assert exact(rows(run_dir)) == exact(rows(reference))[:6]
    cache = run_dir / "cache" / "node0"
    assert (cache / "text" / "table.safetensors").exists()
    assert any((cache / "train").rglob("*.mds*"))  # the shards streamed into the node cache


def test_preempted_in_the_step0_validation_then_a_changed_signature_refused_then_a_fresh_start(e2e_shards, tmp_path):
    """A SIGTERM that only rank 1 gets, during the step-0 validation: both ranks stop before step 1 (exit 0, no
    checkpoint: nothing trained). The folder then holds only step-0 validation rows: a relaunch of another signature
    is still refused (run.json), one of the same run starts over from step 0 (the rows are not a used folder's)
    and writes them again, once, then trains."""
    run_dir = tmp_path / "run"
    r = ok(
        launch(
            run_dir, e2e_shards, "max_duration=2", "eval_interval=3", "export_every=0", "faults.sigterm_at_val0=true"
        )
    )
    assert "preempted: stopped before step 1, after the step-0 validation" in r.stdout, r.stdout[-3000:]
    assert rows(run_dir) == [] and not list((run_dir / "checkpoints").glob("ep*"))  # no step, no checkpoint
    step0 = rows(run_dir, "val_log")
    assert [int(x["step"]) for x in step0] == [0, 0, 0]
    r = launch(run_dir, e2e_shards, "max_duration=2", "optimizer.lr=5e-4", "model.vocab=ids", "data.limit=8")
    assert r.returncode == 3
    assert "optimizer.lr: 0.001 -> 0.0005" in r.stderr and "model.vocab: 'parts' -> 'ids'" in r.stderr
    assert "data.limit: None -> 8" in r.stderr
    assert "Traceback" not in r.stderr
    assert (run_dir / "train.log").read_text().count("refused: ") == 1  # rank 0's verdict, not one per rank
    r = ok(launch(run_dir, e2e_shards, "max_duration=2", "eval_interval=3", "export_every=0"))
    assert "resuming" not in r.stdout and "val_log.csv: removed 3 row(s) of a start from step 0" in r.stdout
    got = rows(run_dir, "val_log")  # step 0's written again (the same numbers: the same starting weights), then 2's
    assert got[:3] == step0 and [int(x["step"]) for x in got] == [0, 0, 0, 2, 2, 2]
    assert [int(x["step"]) for x in rows(run_dir)] == [1, 2]
    assert checkpoint_step(os.readlink(run_dir / "checkpoints" / "latest-rank0.pt")) == 2  # what a relaunch resumes
    assert (run_dir / "train.log").read_text().count("==== launch ") == 3


def test_second_launch_refused_stale_lock_ignored(e2e_shards, tmp_path):
    run_dir = tmp_path / "run"
    # far more steps than it can take while the second launch starts (on a loaded machine that takes a while)
    # one rank each, without the launcher: the lock is global rank 0's
    p = start_bg(run_dir, e2e_shards, "max_duration=1000000", "eval_interval=0", "export_every=0", direct=True)
    try:
        wait_for_step(run_dir, 4, p)
        r = launch(run_dir, e2e_shards, "max_duration=1000000", direct=True)
        assert p.poll() is None, "the first launch ended: this test needs it alive"
        assert r.returncode == 3 and "another live run holds" in r.stderr, (r.stdout[-3000:], r.stderr[-3000:])
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    at = checkpoint_step(os.readlink(run_dir / "checkpoints" / "latest-rank0.pt"))
    # the dead run's lock does not block: the relaunch takes the lock, finds the run at its checkpoint, which is
    # already max_steps, says so and exits 0 (that a relaunch after a SIGKILL resumes: test_exact_resume_after_sigkill)
    r = ok(launch(run_dir, e2e_shards, f"max_duration={at}", direct=True))
    assert f"nothing to do: {run_dir} is at step {at} >= max_duration={at}" in r.stdout


def test_nonfinite_loss_on_one_rank_stops_all(e2e_shards, tmp_path):
    run_dir = tmp_path / "run"
    r = launch(
        run_dir,
        e2e_shards,
        "faults.nonfinite_step=5",
        "faults.nonfinite_rank=1",
        "eval_interval=0",
        f"algorithms.gradient_clipping.clipping_threshold={CLIP}",
    )
    assert r.returncode == 4, (r.stdout[-2000:], r.stderr[-3000:])
    assert "non-finite loss at step 5 (rank 1: clips clip" in r.stderr
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("ep*-ba*-rank0.pt"))
    assert [checkpoint_step(c) for c in ckpts] == [3]  # nothing of the poisoned state
    assert [int(x["step"]) for x in rows(run_dir)] == [1, 2, 3, 4]
    assert_grad_norm_logged_before_clipping(rows(run_dir))


def test_warm_start_and_lineage_over_two_resumes(reference, e2e_shards, tmp_path):
    init = reference / "step-12.safetensors"
    run_dir = tmp_path / "run"
    quiet = ["eval_interval=0", "export_every=2", "save_interval=2"]
    # one rank each, without the launcher: the warm start and its lineage are rank 0's
    ok(launch(run_dir, e2e_shards, "max_duration=2", f"model.init_ckpt={init}", *quiet, direct=True))
    assert float(rows(run_dir)[0]["sem_rms"]) > 0  # the warm-started cond is not zero
    ok(launch(run_dir, e2e_shards, "max_duration=4", f"model.init_ckpt={init}", *quiet, direct=True))
    ok(launch(run_dir, e2e_shards, "max_duration=6", f"model.init_ckpt={init}", *quiet, direct=True))
    meta = {n: export_tensors(run_dir / f"step-{n}.safetensors")[1] for n in (2, 4, 6)}
    assert {m["init_ckpt"] for m in meta.values()} == {str(init.resolve())}
    assert (meta[2]["resumed_from"], meta[2]["resumed_step"]) == ("", "")
    assert meta[4]["resumed_step"] == "2" and meta[6]["resumed_step"] == "4"
    assert meta[6]["resumed_from"].endswith("-ba4-rank0.pt")
    # (a plain Wan export as init_ckpt starts the condition at zero: tests/model/test_export.py, through the same
    # load_gc_weights that this warm start went through)


def test_learning_uses_the_condition(e2e_shards, tmp_path):
    """The chain is right end to end: the loss falls and validation shows the semantic condition is used. 120 steps
    of 8 clips in one micro-batch on one rank, at twice the tiny yaml's lr and three times its cond_lr (at its own
    rates the condition shows only after ~150 steps, and 200 steps took 1.4 times the CPU). The loss at 120 is ~0.68
    of the first steps', gap_uncond 0.024-0.026 per timestep: the thresholds leave a margin of 2.4 and more."""
    run_dir = tmp_path / "run"
    ok(
        launch(
            run_dir,
            e2e_shards,
            "max_duration=120",
            "eval_interval=120",
            "val_n=8",
            "export_every=0",
            "save_interval=120",
            "global_train_batch_size=8",
            "device_train_microbatch_size=8",  # one forward a step: a third of the cost of 4 micro-batches of 2, the same global batch
            "optimizer.lr=2e-3",
            "optimizer.cond_lr=3e-2",
            direct=True,  # one rank, without the launcher
            timeout=1800,
        )
    )
    r = rows(run_dir)
    first, last = [float(x["mse"]) for x in r[:20]], [float(x["mse"]) for x in r[-20:]]
    assert sum(last) / 20 < 0.8 * sum(first) / 20
    v = rows(run_dir, "val_log")
    gaps = {s: [float(x["gap_uncond"]) for x in v if int(x["step"]) == s] for s in (0, 120)}
    # at step 0 the zero-initialised condition adds nothing (the gap is exactly 0); learned, it is a few 1e-2
    assert gaps[0] == [0.0] * 3, v
    assert all(g > 0.005 for g in gaps[120]) and sum(gaps[120]) / len(gaps[120]) > 0.01, v


@pytest.mark.slow  # two one-rank launches, each compiling the blocks (inductor, CPU)
def test_a_compiled_run_resumes_exactly(e2e_shards, tmp_path):
    """`model.compile=true` with selective checkpointing: the blocks compiled in place keep their parameters' names,
    so the checkpoint is an eager run's; a relaunch from step 3's checkpoint (compiling again) gives the
    uninterrupted compiled run's rows from there on, to the last digit, and the same last export."""
    compiled = ["model.compile=true", "model.activation_checkpointing=selective", "max_duration=6", "export_every=6"]
    whole = tmp_path / "whole"
    r = ok(launch(whole, e2e_shards, *compiled, direct=True, timeout=1200))
    # the launch's first lines say how the blocks run and which attention kernel runs them
    assert "blocks: activation checkpointing selective, compiled" in r.stdout
    assert (
        "attention PyTorch SDPA, backends in order flash > cudnn > efficient > math (model.attention: auto)" in r.stdout
    )
    assert "self-attention flash, cross-attention flash" in r.stdout
    resumed = stopped_copy(whole, tmp_path / "resumed", at=3)
    r = ok(launch(resumed, e2e_shards, *compiled, direct=True, timeout=1200))
    assert "resuming from" in r.stdout and "-ba3-rank0.pt" in r.stdout
    assert exact(rows(resumed)) == exact(rows(whole)) and len(rows(whole)) == 6
    a, _ = export_tensors(whole / "step-6.safetensors")
    b, meta = export_tensors(resumed / "step-6.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a) and meta["resumed_step"] == "3"
