"""Worker processes: how gcc starts them (never by forking a process that has threads) and how they behave
when a scheduler preempts the job.

Why not `fork`: on CPython 3.8–3.11 a child forked while another thread of the parent holds the interpreter's
thread-state lock deadlocks in `PyOS_AfterFork_Child` before it runs a line of Python (python/cpython issue
112275, fixed in 3.12). A training rank always has threads (TensorBoard's writer, the queue feeders of the
previous loader iterator, the stall watchdog), and torch's DataLoader forks by default on Linux, so a worker
start could hang the run for good. Every worker of gcc is instead forked by a *forkserver*: a fresh interpreter
started by exec (no fork of this process), single-threaded, which imports `gcc.data.dataset` once and forks each worker
from itself. Loader workers are also persistent: one start per run, not one per epoch.

Preemption: a scheduler signals the whole process group, and so does a terminal's Ctrl-C (SIGINT). The forkserver
and the resource tracker are started with SIGTERM/SIGUSR1/SIGINT blocked (the mask survives exec), so neither dies
under the rank mid-step
(`start_resource_tracker`). Each worker sets its own
handling (`LoaderWorkerInit`, `pool_worker_init`) and exits as soon as the process that asked for it exits,
however that ends (`exit_with`): a forkserver's child is not its requester's child, so neither the kernel's
parent-death signal nor torch's worker watchdog notice a SIGKILLed rank, and the forkserver itself exits only
once every process it forked has (they hold its "alive" pipe). At a launch's end the rank stops its loader
workers and then its forkserver (`stop_forkserver`) before it closes the process group (docs/training.md, "How a
launch ends").

Shared memory: a loader worker receives its dataset pickled, and unpickling re-attaches the dataset's Streaming
segments, which CPython 3.11 registers with the resource tracker of the worker's rank (Streaming avoids that for
the segments it attaches itself, not for these). On a rank that did not create them (all but a node's local
rank 0) nothing ever unregisters them: when that rank ended, its tracker unlinked the run's segments under its
peers ("resource_tracker: There appear to be N leaked shared_memory objects"), and the creator's own cleanup
then found them gone. `LoaderWorkerInit` takes these registrations back (`forget_attached_shm`).
"""

from __future__ import annotations

import multiprocessing
import os
import select
import shutil
import signal
import sys
import tempfile
import threading
from multiprocessing import forkserver, resource_tracker

from gcc.compat.python import forkserver_pid, longest_temp_folder, reap_forkserver, shm_name
from gcc.errors import BadInput
from gcc.inputs import env_int

# a scheduler's (SIGTERM, SIGUSR1) and a terminal's Ctrl-C (SIGINT): each checkpoints and exits 0 (docs/training.md)
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
# After a preemption signal a rank has this long to finish its step, checkpoint and exit, or it leaves its stacks
# and exits 5 (docs/training.md). Under 30 s: Composer's launcher, when it gets the SIGTERM too, SIGKILLs the
# ranks 30 s later (its CLEANUP_TIMEOUT), and a stuck rank should leave its stacks before that.
PREEMPTION_GRACE_S = 25.0
START_METHOD = "forkserver"
# what the forkserver imports once, so that a worker starts by a fork of it, not by importing torch again; torch
# first, its import's temp folder in `forkserver_tmp` (gcc/compat/torch_preload.py)
FORKSERVER_PRELOAD = ["gcc.compat.torch_preload", "gcc.data.dataset"]


def forkserver_tmp(pid: int) -> str:
    """The folder a forkserver's import of torch puts its temp folder in (gcc/compat/torch_preload.py)."""
    return os.path.join(tempfile.gettempdir(), f"gcc-forkserver-{pid}")


def check_temp_folder() -> None:
    """BadInput naming TMPDIR when the temp folder is too long for the forkserver's Unix socket (Python's own
    error, "AF_UNIX path too long", would come from deep inside a loader's start)."""
    tmp = tempfile.gettempdir()
    length = len(os.fsencode(tmp))
    if length > longest_temp_folder():
        raise BadInput(
            f"the temp folder {tmp} (TMPDIR) is {length} bytes long: worker processes start from a "
            f"server whose Unix socket lives there, and a socket's path is at most 107 bytes, which leaves at most "
            f"{longest_temp_folder()} for the folder. Set TMPDIR to a shorter folder (e.g. /tmp), or start no "
            f"worker processes (data.num_workers: 0; convert_data --workers 1)"
        )


def worker_context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context of every worker gcc starts (loader workers, converter processes)."""
    check_temp_folder()
    ctx = multiprocessing.get_context(START_METHOD)
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    start_resource_tracker()  # first: starting it unblocks SIGTERM in this thread, which must stay blocked below
    old = signal.pthread_sigmask(signal.SIG_BLOCK, PREEMPTION_SIGNALS)
    try:
        forkserver.ensure_running()  # no-op when it runs; otherwise starts it with this thread's mask
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return ctx


def start_resource_tracker() -> None:
    """Start this process's multiprocessing resource tracker, if it is not running, with the preemption signals
    blocked. CPython's tracker ignores SIGINT and SIGTERM but not SIGUSR1, whose default action ends it when a
    scheduler sends SIGUSR1 to the process group: the rank then starts another tracker, which knows nothing of the
    shared memory and semaphores registered with the first (a KeyError traceback at each unregister, and nothing
    cleaned up after a crash). Call it before anything registers a resource (a rank's first lines)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, PREEMPTION_SIGNALS)
    try:
        resource_tracker.ensure_running()  # no-op when it runs; else spawns it (fork + exec) with this mask
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def wait_readable(fd: int, timeout_s: float | None = None) -> bool:
    """Wait until `fd` is readable (at most `timeout_s`, None for ever); False on the timeout. Through poll, not
    select: select cannot take a descriptor numbered 1024 or above (ValueError), which a rank with many files and
    sockets open reaches, and the thread that waits would die of it."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout_s is None else max(0, int(timeout_s * 1000))))


def exit_with(pid: int) -> None:
    """End this process as soon as process `pid` ends (a thread waits on its pidfd)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # already gone
        os._exit(0)

    def wait() -> None:
        wait_readable(fd)  # a pidfd becomes readable when its process exits
        os._exit(0)

    threading.Thread(target=wait, name="gcc-exit-with-requester", daemon=True).start()


def adopt_environ(environ: dict[str, str]) -> None:
    """Take the environment of the process that asked for this worker. The forkserver holds the environment of
    the moment it started, but a worker must see what a forked one would: the parent's environment now (its
    object-store endpoint and credentials, say)."""
    if environ != os.environ:
        os.environ.clear()
        os.environ.update(environ)


def pool_worker_init(requester: int, environ: dict[str, str]) -> None:
    """Process-pool initializer, with `initargs=(os.getpid(), dict(os.environ))`: exits with the requester,
    takes its environment, and the preemption signals act as usual (they end the process at once)."""
    exit_with(requester)
    adopt_environ(environ)
    for s in PREEMPTION_SIGNALS:
        signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PREEMPTION_SIGNALS)


def stop_forkserver() -> None:
    """Stop this process's forkserver, if it started one, and wait for it (call once its workers are gone). It
    only forks and holds nothing to save or release, so it is killed rather than asked to exit: its interpreter
    shutdown alone, a last collection over all of torch, takes seconds. Its torch's temp folder goes with it, while
    its pid is not yet reaped (so no other process's)."""
    pid = forkserver_pid()
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(forkserver_tmp(pid), ignore_errors=True)  # never follows a link
        reap_forkserver()


def forget_attached_shm(obj, depth: int = 5) -> int:
    """In a loader worker: unregister from the resource tracker the Streaming segments that unpickling `obj`
    (the worker's dataset) attached and that the worker's rank did not create (see the module's docstring).
    Returns how many it unregistered."""
    # heavy (streaming, torch): gcc.training.config imports this module
    from streaming.base.shared.memory import SharedMemory

    seen: set[int] = set()
    forgotten = 0

    def visit(o, d: int) -> None:
        nonlocal forgotten
        if d < 0 or id(o) in seen:
            return
        seen.add(id(o))
        if isinstance(o, SharedMemory):
            name = shm_name(o.shm)
            if not o.created_shms and name:  # the rank attached it: not its to track
                resource_tracker.unregister(name, "shared_memory")
                forgotten += 1
            return
        attrs = getattr(o, "__dict__", None)
        if isinstance(attrs, dict):
            for v in list(attrs.values()):
                visit(v, d - 1)

    visit(obj, depth)
    return forgotten


def _parent_name() -> str:
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "unknown"
    return "forkserver" if "multiprocessing.forkserver" in cmd else cmd[:80]


class LoaderWorkerInit:
    """`worker_init_fn` of gcc's loaders (a picklable object: the forkserver sends it to each worker).

    A loader worker outlives a preemption signal by `grace_s`, then exits cleanly. It must outlive it: the rank
    finishes its step and checkpoints after the signal, and a worker that died at once would crash that step.
    It must not ignore it for good either: the DataLoader stops a stuck worker with SIGTERM when it shuts down,
    and joins it. `grace_s` is longer than the rank's own preemption grace, after which the rank has either
    checkpointed or exited (and the worker dies with it).

    Each worker prints one line when it starts (its pid and who forked it): with persistent workers that is
    one line per worker per launch.
    """

    def __init__(self, grace_s: float):
        self.grace_s = float(grace_s)
        self.requester = os.getpid()  # the rank that builds the loader
        self.environ = dict(os.environ)  # the loader's builder's environment (see adopt_environ)
        self.rank = env_int("RANK", 0, 0)  # checked at the launch's start (gcc/training/ranks.py)
        self._armed = False

    def __call__(self, worker_id: int) -> None:
        from torch.utils.data import get_worker_info  # heavy (torch): gcc.training.config imports this module

        exit_with(self.requester)
        adopt_environ(self.environ)
        for s in PREEMPTION_SIGNALS:
            signal.signal(s, self._deferred_exit)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, PREEMPTION_SIGNALS)
        info = get_worker_info()
        if info is not None:
            forget_attached_shm(info.dataset)
        n = info.num_workers if info is not None else "?"
        print(
            f"gcc.data: rank {self.rank} loader worker {worker_id}/{n} started: pid {os.getpid()}, "
            f"parent {os.getppid()} ({_parent_name()})",
            file=sys.stderr,
            flush=True,
        )

    def _deferred_exit(self, signum, frame) -> None:
        if not self._armed:
            self._armed = True
            threading.Timer(self.grace_s, os._exit, [0]).start()
