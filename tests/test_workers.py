"""Worker processes (gcc/workers.py) and the stall watchdog (gcc/training/watchdog.py): no fork of a threaded process, no
idle compile pool, persistent loader workers from the forkserver, deadlines that end a blocked process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from gcc import exit_codes
from gcc.data.batch import gc_collate
from gcc.data.config import DataConfig
from gcc.data.dataset import GcStreamingDataset, build_dataloader

ROOT = Path(__file__).resolve().parents[1]

PROCESS_REPORT = """
import os, sys
import gcc.compat.composer  # first, as a training rank does (gcc/training/entry.py)
import gcc.compat.diffsynth, gcc.model.dit, gcc.model.objective, gcc.training.trainer, gcc.tools.sample.cli
exec(sys.argv[1])
import time; time.sleep(1)  # a pool would be starting by now
me = os.getpid()
threads = os.listdir(f"/proc/{me}/task")
children = [c for t in threads for c in open(f"/proc/{me}/task/{t}/children").read().split()]
print(len(threads), len(children))
"""


def _threads_and_children(extra_env: dict, then: str = "") -> tuple[int, int]:
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_COMPILE_THREADS"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra_env)
    r = subprocess.run(
        [sys.executable, "-c", PROCESS_REPORT, then], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    threads, children = map(int, r.stdout.split()[-2:])
    return threads, children


@pytest.mark.slow
def test_importing_the_model_starts_no_thread_and_no_process():
    """Nothing compiles when the model's libraries load (DiffSynth's flex-attention wrapper is never made:
    gcc/compat/diffsynth.py), so no compile pool starts, even where inductor's compile threads are allowed."""
    assert _threads_and_children({"TORCHINDUCTOR_COMPILE_THREADS": "2"}) == (1, 0)
    # the check can fail: with compile threads allowed, a compilation starts the pool
    compiles = "import torch; torch.compile(torch.sin)"  # what DiffSynth did at import
    threads, children = _threads_and_children({"TORCHINDUCTOR_COMPILE_THREADS": "2"}, then=compiles)
    assert threads > 1 and children >= 1


FORKSERVER_MASK = """
import signal
from multiprocessing import forkserver
from gcc.workers import PREEMPTION_SIGNALS, stop_forkserver, worker_context

worker_context()
status = open(f"/proc/{forkserver._forkserver._forkserver_pid}/status").read()
blocked = int(next(l for l in status.splitlines() if l.startswith("SigBlk:")).split()[1], 16)
print(all(blocked >> (s - 1) & 1 for s in PREEMPTION_SIGNALS))
print(signal.pthread_sigmask(signal.SIG_BLOCK, []) == set())
import os
worker = worker_context().Process(target=os.getpid)  # a worker forked: the forkserver has loaded its preload
worker.start()
worker.join()
stop_forkserver()  # as a rank's end does: SIGKILLed, no exit handler of its runs
"""


@pytest.mark.slow
def test_the_forkserver_of_a_fresh_process_survives_preemption_signals_and_leaves_no_temp_folder(request):
    """Started with SIGTERM/SIGUSR1 blocked (a group SIGTERM must not kill it under the workers), while the
    process that started it keeps them deliverable. Stopped (SIGKILLed) as a rank stops it, it leaves nothing in
    the temp folder: not the folder torch's import makes there, which only an exit handler would remove. (The temp
    folder is a short one of its own: the forkserver's socket lives there, and a Unix socket's path is short.)"""
    tmp = Path(tempfile.mkdtemp(prefix="gcc-t-"))
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    r = subprocess.run(
        [sys.executable, "-c", FORKSERVER_MASK],
        env=dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["True", "True"]
    assert not any(tmp.iterdir()), [(p.name, [c.name for c in p.iterdir()]) for p in tmp.iterdir()]


class PidCollate:
    """gc_collate plus the worker's pid, parent pid and one environment variable (picklable: module level)."""

    def __call__(self, samples):
        batch = gc_collate(samples)
        batch["worker"] = (os.getpid(), os.getppid(), os.environ.get("GCC_TEST_MARK"))
        return batch


@pytest.mark.slow  # over 5 s: make test, not the edit loop's test-fast
def test_loader_workers_come_from_the_forkserver_and_serve_every_epoch(shards, tmp_path, monkeypatch):
    ds = GcStreamingDataset(DataConfig(str(shards)), "train", tmp_path / uuid.uuid4().hex, batch_size=2, seed=0)
    dl = build_dataloader(ds, batch_size=2, num_workers=1, collate_fn=PidCollate())
    assert dl.multiprocessing_context.get_start_method() == "forkserver" and dl.persistent_workers
    seen = []
    for _epoch in range(3):
        seen += [b["worker"] for b in dl]
        assert seen[-1][0] != os.getpid()
    pids = {pid for pid, _, _ in seen}
    assert len(pids) == 1 and len(seen) >= 3 * 3  # one worker process served all three epochs
    pid, parent, _ = seen[0]
    assert parent != os.getpid()  # not forked from this (threaded) process...
    assert "multiprocessing.forkserver" in Path(f"/proc/{parent}/cmdline").read_text()  # ...but by the forkserver
    # a later loader's worker sees the environment of now, not the forkserver's at its start
    monkeypatch.setenv("GCC_TEST_MARK", "set after the forkserver started")
    ds2 = GcStreamingDataset(DataConfig(str(shards)), "train", tmp_path / uuid.uuid4().hex, batch_size=2, seed=0)
    b = next(iter(build_dataloader(ds2, batch_size=2, num_workers=1, collate_fn=PidCollate())))
    assert b["worker"][2] == "set after the forkserver started" and b["worker"][0] != pid


ORPHAN_SCRIPT = """
import os, sys, time, uuid
from gcc.data.config import DataConfig
from gcc.data.dataset import GcStreamingDataset, build_dataloader
from test_workers import PidCollate

if __name__ == "__main__":
    ds = GcStreamingDataset(DataConfig(sys.argv[1]), "train", os.path.join(sys.argv[2], uuid.uuid4().hex), batch_size=2)
    dl = build_dataloader(ds, batch_size=2, num_workers=1, collate_fn=PidCollate())  # kept: its worker lives
    worker, forkserver, _ = next(iter(dl))["worker"]
    print(worker, forkserver, flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.slow
def test_a_killed_rank_leaves_no_worker_and_no_forkserver(shards, tmp_path):
    """SIGKILL to the rank alone (an OOM kill): its loader worker and forkserver, which are not its children's
    children in the kernel's eyes, exit too."""
    script = tmp_path / "rank.py"
    script.write_text(ORPHAN_SCRIPT)
    p = subprocess.Popen(
        [sys.executable, str(script), str(shards), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")])),
    )
    worker, forkserver = map(int, p.stdout.readline().split())
    assert _alive(worker) and _alive(forkserver)
    p.kill()
    p.wait()
    deadline = time.monotonic() + 30
    while (_alive(worker) or _alive(forkserver)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(worker) and not _alive(forkserver)


WATCHDOG_SCRIPT = """
import os, signal, sys, time
from gcc.training.watchdog import StallWatchdog

# a rank with many files and sockets open: the watchdog's own descriptors come after them (above 1024, where
# select() cannot go; the open-files limit is the test process's, raised by tests/conftest.py)
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(int(sys.argv[3]))]
wd = StallWatchdog(sys.argv[1], rank=3, poll_s=0.1)
if sys.argv[2] == "signal":
    signal.signal(signal.SIGTERM, lambda *a: None)  # does nothing: the watchdog's thread must arm the deadline
    wd.on_signal(signal.SIGTERM, 1.0, "SIGTERM and no checkpoint within 1 s")
else:
    wd.arm("step", 1.0, "no step within 1 s")
print("ready", flush=True)

def waiting_for_data():
    while True:
        time.sleep(0.05)

waiting_for_data()
"""


@pytest.mark.parametrize("how, open_fds", [("signal", 0), ("arm", 0), ("signal", 1100)])
def test_a_missed_deadline_writes_the_stacks_and_exits(tmp_path, how, open_fds):
    script = tmp_path / "blocked.py"
    script.write_text(textwrap.dedent(WATCHDOG_SCRIPT))
    p = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "run"), how, str(open_fds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    try:
        assert p.stdout.readline().strip() == "ready"
        if how == "signal":
            time.sleep(1.5)
            assert p.poll() is None  # nothing is armed before the signal
            t0 = time.monotonic()
            p.send_signal(signal.SIGTERM)
        else:
            t0 = time.monotonic()
        code = p.wait(timeout=60)
        waited = time.monotonic() - t0
    finally:
        p.kill()
    assert code == exit_codes.STALLED
    assert 0.9 < waited < 30
    stacks = (tmp_path / "run" / "stacks" / "rank3.txt").read_text()
    assert "waiting_for_data" in stacks and "MainThread" in stacks and "gcc-stall-watchdog" in stacks
    reason = "SIGTERM and no checkpoint within 1 s" if how == "signal" else "no step within 1 s"
    assert reason in stacks and reason in p.stderr.read()


def test_a_temp_folder_too_long_for_the_forkservers_socket_is_named_before_anything_starts(monkeypatch):
    """Python's own error would be "OSError: AF_UNIX path too long" from deep inside the loader's start."""
    from gcc.compat.python import forkserver_pid, longest_temp_folder
    from gcc.errors import BadInput
    from gcc.workers import worker_context

    long = "/tmp/" + "t" * longest_temp_folder()
    monkeypatch.setattr(tempfile, "tempdir", long)
    before = forkserver_pid()
    with pytest.raises(BadInput) as e:
        worker_context()
    assert f"the temp folder {long} (TMPDIR) is {len(long)} bytes long" in str(e.value)
    assert f"at most {longest_temp_folder()} for the folder" in str(e.value) and "data.num_workers: 0" in str(e.value)
    assert forkserver_pid() == before  # none started
