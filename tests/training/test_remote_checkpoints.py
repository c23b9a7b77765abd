"""End to end with `save_folder: s3://...` (a real S3 server on loopback, moto): the real `composer -n 2`
launcher on CPU. A run killed with SIGKILL resumes exactly on a "fresh machine" (its run folder deleted: only the
remote checkpoints are left), rotation applies to the remote objects across restarts, exports are uploaded beside
the checkpoints, a run folder of another run is refused, FSDP's sharded checkpoints travel the same way, and a
launch that finds another launch owning its prefix stops with exit code 3 committing nothing."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
from contextlib import contextmanager, suppress

import pytest
import torch
from _launch import WORKER, exact, export_tensors, finish, launch, ok, rows, start_bg, stopped_copy, wait_for

from gcc import storage
from gcc.training.checkpoint.files import checkpoint_step
from gcc.training.checkpoint.store import CheckpointStore

pytestmark = pytest.mark.slow


def stopped(p: subprocess.Popen) -> bool:
    """Whether the launcher is stopped (SIGSTOP: `faults.stop_after_commit_step` stops its whole process group)."""
    with open(f"/proc/{p.pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


@contextmanager
def frozen_after_commit(run_dir, shards, step: int, *overrides):
    """A launch in the background that stops itself right after committing `step`'s checkpoint: what is committed
    is then known exactly. Yields it stopped; killed with its whole process group if the block fails."""
    p = start_bg(run_dir, shards, WORKER, f"faults.stop_after_commit_step={step}", *overrides)
    try:
        wait_for(lambda: stopped(p), p, f"the stop after step {step}'s commit")
        yield p
    except BaseException:
        with suppress(ProcessLookupError):  # the group is gone when the launch ended by itself
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise


def test_sigkill_then_a_fresh_machine_resumes_exactly_from_remote_checkpoints(
    reference, e2e_shards, tmp_path, s3_bucket
):
    remote = f"{s3_bucket}/runs/a"
    store = CheckpointStore(remote)
    run_dir = tmp_path / "run"
    with frozen_after_commit(run_dir, e2e_shards, 6, f"save_folder={remote}") as p:
        os.killpg(p.pid, signal.SIGKILL)  # step 6 committed, step 9 not begun
        p.wait()
    committed = store.latest()
    assert committed == "ep1-ba6-rank0.pt"
    assert list(store.checkpoints()) == ["ep0-ba3-rank0.pt", committed]  # rotated: keep 2
    shutil.rmtree(run_dir)  # a fresh machine: nothing local is left

    r = ok(launch(run_dir, e2e_shards, f"save_folder={remote}"))
    assert f"fetched {committed} from {remote}/checkpoints" in r.stdout, r.stdout[-3000:]
    resumed = checkpoint_step(committed)
    got, want = exact(rows(run_dir)), exact(rows(reference))
    assert got == want[resumed:]  # the steps after the checkpoint, exactly as the uninterrupted run
    a, _ = export_tensors(reference / "step-12.safetensors")
    b, meta = export_tensors(run_dir / "step-12.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a) and meta["resumed_step"] == str(resumed)

    # rotation across the two launches applied to the remote objects; exports and the run record are beside them
    assert list(store.checkpoints()) == ["ep1-ba9-rank0.pt", "ep2-ba12-rank0.pt"]
    assert store.latest() == "ep2-ba12-rank0.pt"
    assert store.read_record()["signature"] == json.loads((run_dir / "run.json").read_text())["signature"]
    uploaded = {k for k in storage.list_prefix(remote) if k.endswith(".safetensors")}
    assert uploaded == {"step-6.safetensors", "step-12.safetensors"}

    # a run folder that holds another run (the reference's, as a run of seed 5: its run.json says so) is refused
    # against the prefix, before any work: the prefix stays its owner's (the refused launch claims nothing)
    other = stopped_copy(reference, tmp_path / "other", at=12)
    record = json.loads((other / "run.json").read_text())
    record["signature"]["seed"] = 5
    (other / "run.json").write_text(json.dumps(record))
    owner = store.head()
    r = launch(other, e2e_shards, f"save_folder={remote}", "seed=5", direct=True)  # refused before any work
    assert r.returncode == 3 and "hold different runs" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    assert store.head() == owner


def test_fsdp_sharded_checkpoints_resume_from_the_prefix_on_a_fresh_machine(reference, e2e_shards, tmp_path, s3_bucket):
    remote = f"{s3_bucket}/runs/fsdp"
    run_dir = tmp_path / "run"
    ok(launch(run_dir, e2e_shards, "parallelism=fsdp", f"save_folder={remote}", "max_duration=3"))
    shutil.rmtree(run_dir)
    r = ok(launch(run_dir, e2e_shards, "parallelism=fsdp", f"save_folder={remote}", "max_duration=9"))
    assert f"fetched ep0-ba3 from {remote}/checkpoints" in r.stdout, r.stdout[-3000:]
    store = CheckpointStore(remote)
    assert list(store.checkpoints()) == ["ep1-ba6", "ep1-ba9"]  # the first launch's step 3 rotated out of the prefix
    assert sorted(store.checkpoints()["ep1-ba9"]) == [
        "ep1-ba9/.metadata",
        "ep1-ba9/__0_0.distcp",
        "ep1-ba9/__1_0.distcp",
    ]
    # FSDP follows the DDP reference step for step (the same draws; numbers up to summation order), past an epoch's end
    assert [int(x["step"]) for x in rows(run_dir)] == list(range(4, 10))
    for g, w in zip(rows(run_dir), rows(reference)[3:]):
        assert (g["step"], g["clips"], g["timestep"], g["text_drop"], g["cond_drop"]) == (
            w["step"],
            w["clips"],
            w["timestep"],
            w["text_drop"],
            w["cond_drop"],
        )
        assert float(g["loss"]) == pytest.approx(float(w["loss"]), rel=1e-4)


@pytest.mark.parametrize("next_upload", ["checkpoint", "export"])
def test_a_launch_that_lost_its_prefix_uploads_nothing_more_and_stops_with_3(
    next_upload, e2e_shards, tmp_path, s3_bucket
):
    """The launch stops right after committing step 2; a second launch claims the prefix; the first continues. Its
    next upload (the checkpoint of step 4, or the export of step 4, which comes first) finds the prefix taken: it
    uploads nothing and stops on every rank with exit 3."""
    remote = f"{s3_bucket}/runs/guard"
    store = CheckpointStore(remote)
    run_dir = tmp_path / "run"
    with frozen_after_commit(
        run_dir,
        e2e_shards,
        2,
        f"save_folder={remote}",
        "save_interval=2",
        "max_duration=40",
        "eval_interval=0",
        f"export_every={4 if next_upload == 'export' else 0}",
    ) as p:
        before = storage.list_prefix(remote)
        second = CheckpointStore(remote).claim()  # what a second launch on the same prefix does first
        os.killpg(p.pid, signal.SIGCONT)
        out = finish(p, 300)
    assert p.returncode == 3, out[-3000:]
    assert f"{remote}: another launch claimed this checkpoint prefix" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    # it stopped at its next upload: the export at step 4, or step 4's checkpoint, uploaded once its background write
    # is complete (docs/training.md "Checkpoints in the background"): at the step-6 save at the latest
    assert max(int(x["step"]) for x in rows(run_dir)) <= (4 if next_upload == "export" else 6)
    head = store.head()
    assert head.launch == second and head.checkpoint == "ep0-ba2-rank0.pt"
    assert storage.list_prefix(remote) == before  # nothing uploaded after the claim


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(run_dir, shards, *overrides) -> tuple[str, str]:
    """Two launchers of one rank each (`--world_size 2 --nproc 1 --node_rank R`) on this machine, as two nodes whose
    run folders are node-local: node 1 runs in its own mount namespace with an empty tmpfs over `run_dir` (and over
    /dev/shm, and its own TMPDIR, as another machine has). Node 1 prints its checkpoints folder when it ends.
    Returns both outputs; both launchers must exit 0. The launchers meet at a port named to both (as on a cluster:
    the system cannot give one port to two processes); one that another process took between its pick and node 0's
    bind (EADDRINUSE) is picked again."""
    from _launch import ROOT, cmd, env

    for _ in range(3):
        port = str(_unused_port())

        def args(node: int, port: str = port) -> list[str]:
            flags = ["--world_size", "2", "--master_addr", "127.0.0.1", "--master_port", port]
            return cmd(run_dir, shards, *overrides, n=1, launcher=[*flags, "--node_rank", str(node)])

        tmp1 = tempfile.mkdtemp(prefix="gcc-node1-")  # short: the forkserver's socket path must fit AF_UNIX's limit
        script = (
            f"mount -t tmpfs none {run_dir} && mount -t tmpfs none /dev/shm && "
            f"{shlex.join(args(1))}; rc=$?; "
            f"echo NODE1_CHECKPOINTS; (cd {run_dir}/checkpoints && find . -type f | sort); exit $rc"
        )
        log1 = open(os.path.join(tmp1, "node1.out"), "w+")
        node0 = subprocess.Popen(
            args(0), env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        node1 = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
            env=dict(env(), TMPDIR=tmp1),
            stdout=log1,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            cwd=ROOT,
        )
        try:
            out0 = finish(node0, 600)
            if node0.returncode != 0 and "EADDRINUSE" in out0:
                continue  # the port was taken meanwhile: both again, on another
            finish(node1, 600)
            log1.seek(0)
            out1 = log1.read()
            assert node0.returncode == 0, out0[-4000:]
            assert node1.returncode == 0, out1[-4000:]
            return out0, out1
        finally:
            for q in (node0, node1):  # the other node, when one failed or did not end
                with suppress(ProcessLookupError):
                    os.killpg(q.pid, signal.SIGKILL)
                q.wait()
            log1.close()
            shutil.rmtree(tmp1, ignore_errors=True)
    raise AssertionError("three ports in a row were taken before node 0 could bind them")


def test_two_nodes_with_node_local_run_folders_resume_from_the_prefix(reference, e2e_shards, tmp_path, s3_bucket):
    """Multi-node on machines with only object storage between them: each node's run folder is its own (node 1's
    is empty at each launch, as on a fresh machine), the FSDP shards travel through the prefix. Every node downloads
    the whole checkpoint it resumes from, and rotates its own folder."""
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"a mount namespace needs the right to create one (root): unshare said {probe.stderr.strip()!r}")
    remote = f"{s3_bucket}/runs/nodes"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    two_nodes(run_dir, e2e_shards, "parallelism=fsdp", f"save_folder={remote}", "max_duration=3")
    assert sorted(p.name for p in (run_dir / "checkpoints" / "ep0-ba3").iterdir()) == [".metadata", "__0_0.distcp"]
    out0, out1 = two_nodes(run_dir, e2e_shards, "parallelism=fsdp", f"save_folder={remote}", "max_duration=9")
    assert f"fetched ep0-ba3 from {remote}/checkpoints" in out0, out0[-3000:]  # node 0 lacked rank 1's shard
    node1_files = out1.split("NODE1_CHECKPOINTS")[1].split()
    assert node1_files == ["./ep1-ba6/__1_0.distcp", "./ep1-ba9/__1_0.distcp"], out1[-3000:]  # rotated, its own
    for g, w in zip(rows(run_dir), rows(reference)[:9], strict=True):  # node 0's log of both launches: the DDP run's
        assert (g["step"], g["clips"], g["timestep"]) == (w["step"], w["clips"], w["timestep"])
        assert float(g["loss"]) == pytest.approx(float(w["loss"]), rel=1e-4)
