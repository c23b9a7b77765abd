"""Launching `composer -n N gcc/train.py` from tests (the real launcher, CPU, gloo) and reading what runs write."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch.distributed as tdist
from safetensors import safe_open

from gcc import exit_codes
from gcc.compat.streaming import release_shm, shm_prefixes
from gcc.launch_command import train_command
from gcc.training.columns import EXACT_TRAIN
from gcc.training.config import RENAMED

ROOT = Path(__file__).resolve().parents[1]
# Composer's launcher (tests/composer_launcher.py says how it differs from the `composer` command: it loads less)
LAUNCHER = [sys.executable, str(ROOT / "tests" / "composer_launcher.py")]
# small and fast, but every mechanism on: checkpoints every 3 steps, validation and exports every 6
BASE = [
    "global_train_batch_size=4",
    "device_train_microbatch_size=1",
    "max_duration=12",
    "save_interval=3",
    "save_num_checkpoints_to_keep=2",
    "export_every=6",
    "eval_interval=6",
    "val_n=4",
    "val_batch=2",
    "scheduler.t_warmup=4",
    "progress_bar=false",
    "loggers={}",
    # no loader worker: a worker's start (a forkserver that imports Streaming, ~10 s of CPU per rank) is most of a
    # short launch's cost; the tests about the worker path (signals, faults met in a worker, teardown, the
    # reference run) add WORKER. Rows are the same either way (the loader's samples do not depend on workers).
    "data.num_workers=0",
    # samples during training off: the launches that check them turn them on (SAMPLES)
    "sample_every=0",
]


def _old_name(override: str) -> str:
    key, value = override.split("=", 1)
    return f"{OLD_NAMES.get(key, key)}={value}"


OLD_NAMES = {new: old for old, new in RENAMED.items()}
# BASE by the names gcc read before it took Composer's (gcc/training/config.py RENAMED), and the yaml's optimizer
# settings by theirs: the reference run is launched with these, so every resume of it, by BASE's names, proves
# that a run started with the old names resumes under the new ones (docs/training.md, "Config keys")
OLD_BASE = [*(_old_name(o) for o in BASE), "optim.lr=1.0e-3", "optim.cond_lr=1.0e-2"]
WORKER = "data.num_workers=1"
# the EMA of the weights (algorithms.ema), exported beside the raw weights as step-N.ema.safetensors; a half life short
# enough that the average differs from the weights in 12 steps
EMA = "algorithms.ema.half_life=4ba"
# samples at every validation (0, 6, 12), 3 clips on 2 ranks (one rank samples a padding clip in lockstep), to the
# TensorBoard logger
SAMPLES = ["sample_every=1", "sample_n=3", "sample_steps=4", "loggers={tensorboard: {}}"]


def same_samples(a: Path, b: Path, steps: Sequence[int] = (0, 6, 12)) -> None:
    """Two runs' samples/step-N/ hold the same pictures (contact sheets) and scores."""
    for s in steps:
        fa, fb = a / "samples" / f"step-{s}", b / "samples" / f"step-{s}"
        sheets = sorted(p.name for p in fa.glob("*.png"))
        assert len(sheets) == 3 and sheets == sorted(p.name for p in fb.glob("*.png")), (s, sheets)
        for name in sheets:
            assert (fa / name).read_bytes() == (fb / name).read_bytes(), (s, name)
        clips = [json.loads((f / "samples.json").read_text())["clips"] for f in (fa, fb)]
        assert clips[0] == clips[1], s


def cmd(
    run_dir: Path,
    shards: Path,
    *overrides: str,
    n: int = 2,
    launcher: Sequence[str] = (),
    prefix: Sequence[str] = (),
    direct: bool = False,
    base: Sequence[str] = BASE,
    by: Sequence[str] = LAUNCHER,
) -> list[str]:
    """`composer -n <n> gcc/train.py tiny_cpu.yaml ...`, or with `direct` one rank without the launcher (`python
    gcc/train.py ...`, as on one GPU: where the launcher is not what a test is about, its start is saved). `prefix`
    runs the command under another (e.g. `unshare`); `launcher` are the launcher's flags, `by` the launcher (e.g.
    gcc-launch: gcc.launch_command.gcc_launch()); `base` the overrides before `overrides` (BASE, or OLD_BASE)."""
    return [
        *prefix,
        *train_command(
            ROOT / "yamls" / "tiny_cpu.yaml",
            f"run_dir={run_dir}",
            f"data.path={shards}",
            *base,
            *overrides,
            n=None if direct else n,
            launcher=by,
            flags=launcher,
        ),
    ]


def env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


# what an unclean end prints: the abort of a thread unwound through C++, the resource tracker cleaning up after a
# rank, an error that escaped a rank (Composer's launcher prints its own traceback when it gets a SIGTERM: not a
# rank's, see `_ranks_tracebacks`)
UNCLEAN = ("terminate called", "resource_tracker", "Traceback")


def _ranks_tracebacks(text: str) -> int:
    """Tracebacks in `text` other than the launcher's own (its first frame in composer/cli/launcher.py, or in
    tests/composer_launcher.py that calls it)."""
    blocks = text.split("Traceback (most recent call last):")[1:]
    first = [b.lstrip().split("\n", 1)[0] for b in blocks]
    return sum("composer/cli/launcher.py" not in f and "composer_launcher.py" not in f for f in first)


def _flag(launcher: Sequence[str], name: str) -> str | None:
    return launcher[launcher.index(name) + 1] if name in launcher else None


def _rank_logs(run_dir: Path, launcher: Sequence[str]) -> list[str]:
    """The launcher's --stdout/--stderr flags: where the ranks other than rank 0 print (rank 0 prints on the
    launcher's own streams). The test's own, or files of this launch beside its run folder (`launch_logs`)."""
    if _flag(launcher, "--stdout") is not None and _flag(launcher, "--stderr") is not None:
        return list(launcher)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(dir=run_dir.parent, prefix=f"{run_dir.name}.launch."))
    flags = list(launcher)
    for name, ext in (("--stdout", "out"), ("--stderr", "err")):
        if _flag(launcher, name) is None:
            flags += [name, str(logs / f"rank{{rank}}.{ext}")]
    return flags


class Launch(subprocess.Popen):
    """A launch in a session of its own (the launcher and every process it starts), with what `finish` needs to
    check how it ended: its run folder, its rank count, where its other ranks print."""

    run_dir: Path
    n: int
    launcher: list[str]
    overrides: tuple[str, ...]
    shm_before: set[int]  # the Streaming segments registered for its node cache before it started

    def rank_output(self) -> str:
        """What ranks 1..n-1 printed (their files), each under a header line."""
        parts = []
        for name in ("--stdout", "--stderr"):
            for rank in range(1, self.n):
                f = Path(_flag(self.launcher, name).format(rank=rank, world_size=self.n, local_rank=rank))
                if f.is_file():
                    parts.append(f"--- rank {rank} {name[2:]} ({f.name})\n{f.read_text(errors='replace')}")
        return "\n".join(parts)


def start_bg(
    run_dir,
    shards,
    *overrides,
    n=2,
    launcher=(),
    prefix=(),
    pipe_stderr=False,
    direct=False,
    base=BASE,
    by=LAUNCHER,
    cwd=None,
) -> Launch:
    """A launch in its own process group, so a signal reaches the launcher and every rank, as on a cluster. Rank 0
    and the launcher print on the pipe (stdout; stderr apart with `pipe_stderr`), the other ranks into files.
    `direct`: one rank without the launcher; `by`: the launcher (`cmd`); `cwd`: the folder it is started in (this
    process's)."""
    n = 1 if direct else n
    flags = _rank_logs(Path(run_dir), launcher)
    shm_before = set(shm_prefixes(_node_cache(Path(run_dir), overrides)))
    p = Launch(
        cmd(run_dir, shards, *overrides, n=n, launcher=flags, prefix=prefix, direct=direct, base=base, by=by),
        env=env(),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if pipe_stderr else subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    p.run_dir, p.n, p.launcher, p.overrides, p.shm_before = Path(run_dir), n, flags, overrides, shm_before
    return p


def launch(run_dir, shards, *overrides, timeout=600, clean=True, **how) -> subprocess.CompletedProcess:
    """One launch to its end (a hang fails with every process's stacks: `finish`); what it printed, every rank's
    ended cleanly (`clean`: `assert_clean_end`). `how`: `start_bg`'s (n, launcher, direct: one rank without the
    launcher, base, by: the launcher, cwd: the folder it is started in)."""
    p = start_bg(run_dir, shards, *overrides, pipe_stderr=True, **how)
    with p:
        out, err = finish(p, timeout, both=True, clean=clean)
    logs = Path(_flag(p.launcher, "--stderr")).parent
    if logs.name.startswith(f"{Path(run_dir).name}.launch."):  # ours: the launcher's (and rank 0's) output too
        (logs / "launcher.out").write_text(out)
        (logs / "launcher.err").write_text(err)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def run_ranks(folder: Path, script: str, *args: str, n: int = 2, env: dict | None = None, timeout: float = 600):
    """The Python source `script` run as `n` ranks by Composer's launcher, which gives each its rank and the
    rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: a port of its own choosing, none that a test picks and
    hands over); the ranks print into `folder`. Returns (the launcher's exit code, what each rank printed: rank 0
    beside the launcher's own lines). A launch still running after `timeout` fails with its stacks (`finish`)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rank_script.py"
    path.write_text(script)
    flags = ["-n", str(n), "--stdout", str(folder / "rank{rank}.out"), "--stderr", str(folder / "rank{rank}.err")]
    p = subprocess.Popen(
        [*LAUNCHER, *flags, str(path), *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    with p:
        out = finish(p, timeout)
    ranks = [out] + [
        "".join(
            (folder / f"rank{r}.{ext}").read_text() for ext in ("out", "err") if (folder / f"rank{r}.{ext}").exists()
        )
        for r in range(1, n)
    ]
    return p.returncode, ranks


@contextmanager
def rank_0_here(script: str, *args: str, timeout: float = 120):
    """A real 2-process gloo group whose rank 0 is this process (so that what it runs is a test's own code, in
    reach of its spies and of mutmut's bookkeeping) and rank 1 the Python source `script`, started with the port of
    rank 0's store (`sys.argv[1]`: the store binds port 0 and reports the one it got) and `args`; `script` joins
    with `join_as_rank_1`'s lines. Yields rank 1's Popen (stdout and stderr piped, text); on leaving, the group is
    destroyed and rank 1 killed if still running."""
    store = tdist.TCPStore(
        "127.0.0.1", 0, 2, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout)
    )
    rank1 = subprocess.Popen(
        [sys.executable, "-c", JOIN_AS_RANK_1 + script, str(store.port), *args],
        env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **group_env(1)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Composer reads the launcher's variables beside the group and refuses a disagreement: an earlier in-process
    # Trainer of this worker may have left WORLD_SIZE=1 in its environment
    saved = {k: os.environ.get(k) for k in group_env(0)}
    os.environ.update(group_env(0))
    try:
        tdist.init_process_group("gloo", store=store, rank=0, world_size=2, timeout=timedelta(seconds=timeout))
        yield rank1
    finally:
        if tdist.is_initialized():
            tdist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if rank1.poll() is None:
            rank1.kill()
            rank1.communicate()


def group_env(rank: int) -> dict[str, str]:
    """The launcher's variables of `rank_0_here`'s group (one node, 2 ranks) for that rank."""
    return {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "0"}


# rank 1 of `rank_0_here`: joins the group through rank 0's store
JOIN_AS_RANK_1 = """
import sys
from datetime import timedelta
import torch.distributed as tdist
_store = tdist.TCPStore("127.0.0.1", int(sys.argv[1]), 2, is_master=False, timeout=timedelta(seconds=120))
tdist.init_process_group("gloo", store=_store, rank=1, world_size=2, timeout=timedelta(seconds=120))
"""


def launch_logs(run_dir: Path) -> list[Path]:
    """The folders of what each `launch` of `run_dir` printed, oldest first: `launcher.out`/`launcher.err` (the
    launcher and rank 0), `rank<N>.out`/`rank<N>.err` (the other ranks)."""
    return sorted(run_dir.parent.glob(f"{run_dir.name}.launch.*"), key=lambda p: p.stat().st_mtime)


def session_processes(sid: int) -> list[tuple[int, str]]:
    """(pid, name) of the live processes of session `sid` (a launch started in a session of its own: the launcher
    and all it started)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        head, tail = text.rsplit(")", 1)
        fields = tail.split()  # after "pid (comm)": state ppid pgrp session ...
        if int(fields[3]) == sid and fields[0] != "Z":
            pid, name = head.split(" (", 1)
            found.append((int(pid), name))
    return found


def hang_report(sid: int, run_dir: Path | None) -> str:
    """What a launch that does not end is doing: every process's Python stacks (py-spy, a dev dependency) and the
    tail of the run's train.log. A hang on a loaded CI machine then says where it was."""
    parts = []
    if run_dir is not None and (run_dir / "train.log").is_file():
        parts.append("--- train.log (tail)\n" + "\n".join((run_dir / "train.log").read_text().splitlines()[-30:]))
    spy = Path(sys.executable).with_name("py-spy")
    for pid, name in session_processes(sid):
        if not spy.exists():
            parts.append(f"--- {pid} ({name}): py-spy not installed, no stacks")
            continue
        try:
            r = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
            parts.append(f"--- {pid} ({name})\n{_compact(r.stdout + r.stderr)}")
        except subprocess.TimeoutExpired:
            parts.append(f"--- {pid} ({name}): py-spy took more than 60 s")
    return "\n".join(parts)


def _compact(stacks: str) -> str:
    """py-spy's dump without what is the same in every process (interpreter line, thread bootstrap frames), lines
    cut to 160 characters: a CI log keeps only part of a long failure, and the stacks of every process must fit."""
    skip = ("Python v", "(threading.py:", "(multiprocessing/process.py:", "(multiprocessing/spawn.py:")
    return "\n".join(line[:160] for line in stacks.splitlines() if line.strip() and not any(k in line for k in skip))


def _node_cache(run_dir: Path, overrides: Sequence[str]) -> list[Path]:
    """The run's node cache folders (Streaming keys its shared memory on them)."""
    cache = next((Path(o.split("=", 1)[1]) for o in overrides if o.startswith("data.cache_dir=")), None)
    cache = (cache or run_dir / "cache") / "node0"
    return [cache / "train", cache / "val"]


def assert_clean_end(p: Launch, output: str) -> None:
    """How every launch that ended by itself (or on a preemption signal) must end (docs/training.md, "How a launch
    ends"): no process of it left 30 s after the launcher, none of the UNCLEAN lines from any rank, no Streaming
    shared memory of its cache left. A fault (exit 5-8) leaves at once, past the cleanup: its resource trackers
    release what the ranks held (and say so), and a relaunch releases the rest of the run's shared memory; so does a
    second Ctrl-C (exit 130)."""
    deadline = time.time() + 30
    while (left := session_processes(p.pid)) and time.time() < deadline:
        time.sleep(0.2)
    if left:
        report = hang_report(p.pid, p.run_dir)
        os.killpg(p.pid, signal.SIGKILL)
        raise AssertionError(f"still running 30 s after the launcher exited: {left}\n{report}")
    fault = p.returncode in (*exit_codes.FAULTS, exit_codes.INTERRUPTED)  # left at once (a second Ctrl-C too)
    everything = output + "\n" + p.rank_output()
    unclean = [u for u in UNCLEAN if u in everything and not (fault and u == "resource_tracker")]
    if "Traceback" in unclean and not _ranks_tracebacks(everything):
        unclean.remove("Traceback")
    assert not unclean, (f"the launch ended uncleanly: {unclean}", everything[-6000:])
    # the segments this launch registered and left (not a killed launch's before it, nor a live one's beside it),
    # released now either way
    left_shm = sorted(set(shm_prefixes(_node_cache(p.run_dir, p.overrides))) - p.shm_before)
    release_shm(left_shm)
    assert fault or not left_shm, f"the launch left Streaming shared memory behind: prefixes {left_shm}"


def finish(p: subprocess.Popen, timeout: float, both: bool = False, clean: bool = True):
    """The output of a launch started in a session of its own (`start_bg`), once it has ended. A launch still running
    after `timeout` is a hang: the failure carries its stacks and train.log (hang_report), and the whole session is
    killed (ranks left behind would burn the CPU that the other tests share). With `clean`, a `Launch` must have
    ended cleanly (`assert_clean_end`). `both`: (stdout, stderr)."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        report = hang_report(p.pid, getattr(p, "run_dir", None))
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        tail = out[-3000:] if isinstance(out, str) else out.decode(errors="replace")[-3000:]
        raise AssertionError(
            f"the launch did not end within {timeout} s\n{report}\n--- its output (tail)\n{tail}"
        ) from None
    except BaseException:  # pytest-timeout's, a KeyboardInterrupt: no launch outlives its test (nor its Popen's
        os.killpg(p.pid, signal.SIGKILL)  # __exit__, which would wait for it forever)
        p.communicate()
        raise
    if clean and isinstance(p, Launch):
        assert_clean_end(p, out + (err or ""))
    return (out, err) if both else out


def stopped_copy(reference: Path, run_dir: Path, at: int = 9, dereferenced: bool = False) -> Path:
    """`run_dir`: the reference run as a launch killed while it wrote step 12's checkpoint leaves it (every row and
    export up to step 12 written, `latest` on step `at`'s checkpoint, none newer): a relaunch resumes from step
    `at` and must give the reference's rows from there on. The reference keeps the checkpoints of steps 9 and 12.
    `dereferenced`: copied as `cp -rL` or `rsync -L` copy it, `latest` a file holding the checkpoint's bytes."""
    from gcc.training.checkpoint.files import checkpoint_step

    ignore = shutil.ignore_patterns("cache", "tensorboard", "samples", ".lock")
    shutil.copytree(reference, run_dir, symlinks=True, ignore=ignore)
    ckpts = run_dir / "checkpoints"
    kept = []
    for p in ckpts.glob("ep*-ba*"):
        if checkpoint_step(p.name) > at:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        elif checkpoint_step(p.name) == at:
            kept.append(p.name)
    assert len(kept) == 1, f"the reference has no checkpoint of step {at}: {sorted(q.name for q in ckpts.iterdir())}"
    (ckpts / "latest-rank0.pt").unlink()
    if dereferenced:
        shutil.copyfile(ckpts / kept[0], ckpts / "latest-rank0.pt")
    else:
        os.symlink(kept[0], ckpts / "latest-rank0.pt")
    return run_dir


def ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-5000:])
    return r


def rows(run_dir: Path, name: str = "train_log") -> list[dict]:
    with open(run_dir / f"{name}.csv", newline="") as f:
        return list(csv.DictReader(f))


def exact(rs: list[dict]) -> list[dict]:
    """train_log.csv rows on the columns a resumed run must reproduce to the last digit (gcc-compare's too)."""
    return [{k: r[k] for k in EXACT_TRAIN} for r in rs]


CLIP = (
    0.5  # an `algorithms.gradient_clipping.clipping_threshold` under most steps' gradient norm in these runs (0.2-1.0)
)


def assert_grad_norm_logged_before_clipping(got: list[dict]) -> None:
    """For a run with `algorithms.gradient_clipping.clipping_threshold=CLIP`: train_log.csv's grad_norm is the norm before clipping (after it, no
    norm is above CLIP). That the gradient is then at CLIP: tests/model/test_model_fsdp.py, under DDP and FSDP."""
    assert sum(float(x["grad_norm"]) > CLIP for x in got) >= 2, [x["grad_norm"] for x in got]


def wait_for(done, proc: subprocess.Popen, what: str, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if done():
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended before {what}:\n{proc.stdout.read()[-4000:]}")
        time.sleep(0.2)
    raise AssertionError(f"{what} not reached in {timeout} s")


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 600) -> None:
    wait_for(
        lambda: (run_dir / "train_log.csv").exists() and any(int(r["step"]) >= step for r in rows(run_dir)),
        proc,
        f"step {step}",
        timeout,
    )


def export_tensors(path: Path) -> tuple[dict, dict]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def kill_before_the_first_commit(p: Launch, rng, last_step: int = 5) -> str:
    """SIGKILL the launch `p` (started with `faults.hold_async_write_step`, whose write of the first checkpoint never
    completes: nothing is committed however far it gets) at an instant `rng` draws: a moment into its start, or a
    moment after one of its steps 1..`last_step` (past the first save point: the held write in flight). Returns
    the instant, for the failure message of the test that asks."""
    at = rng.randint(0, last_step)
    if at:
        wait_for_step(p.run_dir, at, p)
    delay = rng.uniform(0, 0.5 if at else 8.0)
    time.sleep(delay)
    latest = p.run_dir / "checkpoints" / "latest-rank0.pt"
    try:
        assert not latest.is_symlink(), f"a checkpoint was committed: {os.readlink(latest)}"
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    return f"SIGKILL {delay:.2f} s " + (f"after step {at}" if at else "into the launch")
