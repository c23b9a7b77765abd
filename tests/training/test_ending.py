"""How a launch ends (docs/training.md, "How a launch ends"): every rank stops its loader workers, forkserver and
threads, then the ranks wait for each other, then each exits with the run's code past interpreter shutdown,
without destroying the process group. A finished run exits
0 on every rank, never -6 ("terminate called without an active exception": a daemon thread still inside a
store call when the interpreter shut down), and leaves no shared memory and no process of its own behind.

Every launch of the suite checks that it ended so (tests/_launch.py, `assert_clean_end`); the tests here add the
conditions that made it fail before: short launches beside a busy process, a refused launch, and deterministic
reproductions of the thread that aborted interpreter shutdown and of the gloo worker that hung it. `GCC_STRESS_ROUNDS` sets how many short launches
the stress test makes (1 in `make test`; `python bench/stress.py` runs many)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _launch import ROOT, WORKER, launch

pytestmark = pytest.mark.slow

# a launch as short as the whole mechanism allows: two steps, one checkpoint, a loader worker from the forkserver
SHORT = [
    "max_duration=2",
    "save_interval=2",
    "export_every=0",
    "eval_interval=0",
    "val_n=2",
    "val_batch=2",
    "scheduler.t_warmup=1",
    WORKER,
]


# A process that takes whatever CPU is left: it yields to everything else, so it stands for a neighbour, not a
# rival of the suite. Nice 19 alone ranks it only within its scheduling group; where the kernel groups processes by
# session (autogroup), its session's group competes with every other at nice 0 and it took a whole core's share
# (slowing the launch beside it and the tests on the other worker), so that group is set to nice 19 as well.
BUSY = """
import os
os.nice(19)
try:
    with open("/proc/self/autogroup", "w") as f:
        f.write("19")
except OSError:  # no autogroups on this kernel: the process's nice is the whole of its priority
    pass
while True:
    pass
"""


def stress_rounds() -> int:
    return int(os.environ.get("GCC_STRESS_ROUNDS", "1"))


@pytest.mark.timeout(3600)
def test_short_launches_beside_a_busy_process_all_end_cleanly(e2e_shards, tmp_path):
    n = stress_rounds()
    busy = subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
    took = []
    try:
        for i in range(n):
            t0 = time.time()
            r = launch(tmp_path / f"run{i}", e2e_shards, *SHORT, timeout=300)  # ended cleanly: assert_clean_end
            took.append(time.time() - t0)
            assert r.returncode == 0, (f"launch {i + 1} of {n}", r.stdout[-3000:], r.stderr[-3000:])
            assert "done: step 2 in" in r.stdout, r.stdout[-4000:]
    finally:
        busy.kill()
        busy.wait()
    print(f"{n} launches: {sum(took):.0f} s, {min(took):.0f}-{max(took):.0f} s each")


def test_a_refused_launch_ends_as_cleanly(tmp_path):
    """Refused before any loader exists (no manifest): exit 3 from the launcher, both ranks through the same end."""
    empty = tmp_path / "not-a-conversion"
    empty.mkdir()
    r = launch(tmp_path / "run", empty, *SHORT, timeout=300)  # ended cleanly: assert_clean_end
    assert r.returncode == 3, r.stderr[-4000:]
    assert "refused" in r.stderr and "manifest.json" in r.stderr, r.stderr[-4000:]


# a process that ends while a daemon thread is inside a store call: the peer-fault watch polling without pause
BUSY_WATCH = """
import sys, time
import torch.distributed as dist
from gcc.training.ending import end_launch, exit_process
from gcc.training.peer_fault import watch_peers
from gcc.training.watchdog import StallWatchdog

store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)  # port 0: the system gives a free one
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
watch_peers(0, lambda code, message: None, poll_s=0)
StallWatchdog(sys.argv[2], 0, poll_s=0.01)
time.sleep(0.5)
exit_process(end_launch(0)) if sys.argv[1] == "end" else sys.exit(0)
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


# Rank 0 ends while gloo's worker still holds the tensor of a collective it left behind (its peer, rank 1, joins
# the collective 2 s later and never reaches the end barrier, which rank 0 waits out in 0.5 s). Destroying the
# process group there ("destroy") joins that worker while holding the GIL, and the worker needs the GIL to drop the
# tensor: a certain hang, the race that hung about one launch in thirty at its end.
LATE_PEER = """
import os, sys, time
import torch, torch.distributed as dist
from gcc.training import ending, peer_fault  # peer_fault: loaded by a run before its end, as by gcc.training.trainer
from gcc.training.ending import exit_process

rank, port, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
# rank 0's store binds port 0 and says which port it got; rank 1 is started with it
store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, wait_for_workers=False)
print(f"PORT {store.port}", flush=True)
dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
if rank == 1:
    time.sleep(2)
    dist.all_reduce(torch.ones(1))
    time.sleep(1)  # rank 0 has its result
    os._exit(0)
work = dist.all_reduce(torch.ones(1), async_op=True)
del work  # the worker now holds the only reference to the tensor
ending.END_BARRIER_S = 0.5
code = ending.end_launch(0)
if mode == "destroy":
    dist.destroy_process_group()
exit_process(code)
"""


def _late_peer(mode: str) -> tuple[subprocess.Popen, subprocess.Popen]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")

    def rank(r: int, port: int) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", LATE_PEER, str(r), str(port), mode],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    first = rank(0, 0)
    said = first.stdout.readline()  # the port rank 0's store got
    assert said.startswith("PORT "), (said, first.poll())
    return first, rank(1, int(said.split()[1]))


def test_a_rank_ends_while_a_gloo_worker_still_holds_its_tensor_and_exits():
    ended, hung = _late_peer("end"), _late_peer("destroy")
    try:
        _, err = ended[0].communicate(timeout=120)
        assert ended[0].returncode == 0, (ended[0].returncode, err[-3000:])
        assert "1 of 2 ranks reached the end of the launch" in err, err[-3000:]  # the barrier was waited out
        ended[1].wait(timeout=60)
        # the control: the same end with the group destroyed never finishes
        hung[1].wait(timeout=60)
        with pytest.raises(subprocess.TimeoutExpired):
            hung[0].wait(timeout=5)
    finally:
        for p in (*ended, *hung):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
