"""How a launch ends (docs/training.md, "How a launch ends"): every rank stops its loader workers, forkserver and
threads, then the ranks close the process group together, then exit with the run's code. A finished run exits
0 on every rank, never -6 ("terminate called without an active exception": a daemon thread still inside a
store call when the interpreter shut down), and leaves no shared memory and no process of its own behind.

`GCC_TEARDOWN_LAUNCHES` sets how many short launches the stress test makes (6 by default, to keep the suite
within its time; the deterministic reproduction below is what fails first if the end of a launch regresses)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _launch import ROOT, WORKER, cmd, env, finish, session_processes

pytestmark = pytest.mark.slow

# a launch as short as the whole mechanism allows: two steps, one checkpoint, a loader worker from the forkserver
SHORT = [
    "max_steps=2",
    "checkpoint_every=2",
    "export_every=0",
    "val_every=0",
    "val_n=2",
    "val_batch=2",
    "optim.warmup_steps=1",
    WORKER,
]
# what an unclean end prints: the abort of a thread unwound through C++, the tracker cleaning up after a rank
UNCLEAN = ("terminate called", "resource_tracker", "Traceback")


def launch_to_the_end(run_dir: Path, shards: Path, *overrides: str, timeout: float = 300) -> tuple[int, str]:
    """One 2-rank launch; returns its exit code and everything every process of it printed (the launcher and
    rank 0 on the pipe, rank 1 in its own files), read once no process of the launch is left (a resource
    tracker, for one, prints after its rank has exited). Asserts that none is left 30 s after the launcher."""
    logs = run_dir.parent / f"{run_dir.name}-logs"
    logs.mkdir(parents=True)
    args = cmd(
        run_dir,
        shards,
        *overrides,
        launcher=["--stdout", str(logs / "rank{rank}.out"), "--stderr", str(logs / "rank{rank}.err")],
    )
    with subprocess.Popen(
        args, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    ) as p:
        out = finish(p, timeout, run_dir)
    deadline = time.time() + 30
    while (left := session_processes(p.pid)) and time.time() < deadline:
        time.sleep(0.2)
    for f in sorted(logs.iterdir()):
        out += f"\n--- {f.name}\n{f.read_text()}"
    assert not left, (f"still running 30 s after the launcher exited: {left}", out[-4000:])
    return p.returncode, out


def leftover_shm(run_dir: Path) -> int:
    """Streaming segments still registered for the run's node cache (released now, so that a failure leaves
    nothing either)."""
    from gcc.compat.streaming import release_stale_shm

    cache = run_dir / "cache" / "node0"
    return release_stale_shm([cache / "train", cache / "val"])


@pytest.mark.timeout(1200)  # launches of 20-90 s each on 2 loaded cores
def test_short_launches_beside_a_busy_process_all_end_cleanly(e2e_shards, tmp_path):
    n = int(os.environ.get("GCC_TEARDOWN_LAUNCHES", "6"))
    # the busy process yields to everything else (nice 19): it stands for a neighbour, not a rival of the suite
    busy = subprocess.Popen([sys.executable, "-c", "import os; os.nice(19)\nwhile True: pass"], start_new_session=True)
    took = []
    try:
        for i in range(n):
            run_dir = tmp_path / f"run{i}"
            t0 = time.time()
            code, out = launch_to_the_end(run_dir, e2e_shards, *SHORT)
            took.append(time.time() - t0)
            assert code == 0, (f"launch {i + 1} of {n}", out[-6000:])
            assert "done: step 2 in" in out, out[-4000:]
            unclean = [u for u in UNCLEAN if u in out]
            assert not unclean, (f"launch {i + 1} of {n}: {unclean}", out[-6000:])
            assert leftover_shm(run_dir) == 0, f"launch {i + 1} of {n} left Streaming shared memory behind"
    finally:
        busy.kill()
        busy.wait()
    print(f"{n} launches: {sum(took):.0f} s, {min(took):.0f}-{max(took):.0f} s each")


def test_a_refused_launch_ends_as_cleanly(tmp_path):
    """Refused before any loader exists (no manifest): exit 3 from the launcher, both ranks through the same end."""
    empty = tmp_path / "not-a-conversion"
    empty.mkdir()
    code, out = launch_to_the_end(tmp_path / "run", empty, *SHORT)
    assert code == 3, out[-4000:]
    assert "refused" in out and "manifest.json" in out, out[-4000:]
    unclean = [u for u in UNCLEAN if u in out]
    assert not unclean, (unclean, out[-4000:])


# a process that ends while a daemon thread is inside a store call: the peer-fault watch polling without pause
BUSY_WATCH = """
import socket, sys, time
import torch.distributed as dist
from gcc.training.peer_fault import watch_peers
from gcc.training.trainer import end_launch
from gcc.training.watchdog import StallWatchdog

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
watch_peers(0, lambda code, message: None, poll_s=0)
StallWatchdog(sys.argv[2], 0, poll_s=0.01)
time.sleep(0.5)
sys.exit(end_launch(0) if sys.argv[1] == "end" else 0)
"""


def _busy_watch(mode: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BUSY_WATCH, mode, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"),
    )


def test_the_end_of_a_launch_stops_the_threads_that_would_abort_interpreter_shutdown(tmp_path):
    for _ in range(3):
        r = _busy_watch("end", tmp_path)
        assert r.returncode == 0 and "terminate called" not in r.stderr, (r.returncode, r.stderr[-3000:])
        assert "process group" not in r.stderr, r.stderr[-3000:]  # closed without a warning
    # the same process ending without end_launch: CPython ends the thread inside the store call (-6)
    aborts = [_busy_watch("plain", tmp_path) for _ in range(3)]
    assert any(
        a.returncode == -signal.SIGABRT and "terminate called without an active exception" in a.stderr for a in aborts
    ), [(a.returncode, a.stderr[-500:]) for a in aborts]
