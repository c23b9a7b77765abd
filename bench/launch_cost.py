"""What a launch costs before it trains: the fixed cost that every `composer -n 2` launch of the test suite (and every
relaunch of a preempted run) pays, against a baseline measured in the same run.

    .venv/bin/python bench/launch_cost.py [--rounds 3] [--compare OTHER_CHECKOUT]

Measured, each the median of `--rounds` (wall seconds, the machine's other load included: run it on a quiet one):
- `import torch` in a bare process: the baseline every ratio is printed against;
- a rank's imports (what `gcc/train.py` loads before it can build anything);
- `python gcc/train.py` on a config error (`seed=-1`): what a typo costs;
- a tiny 2-rank launch (`composer -n 2 gcc/train.py yamls/tiny_cpu.yaml`, 2 steps on synthetic shards, no loader
  worker, no validation): from the command to its first logged step, and to its exit; with the CPU time of the
  whole launch (every process, user + sys).
`--compare` times the same on another checkout of gcc (e.g. a `git worktree` of the previous commit) in the same
run, taking turns, and prints this checkout's figures as ratios of that one's.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "max_duration=2",
    "global_train_batch_size=2",
    "device_train_microbatch_size=1",
    "save_interval=2",
    "export_every=0",
    "eval_interval=0",
    "sample_every=0",
    "data.num_workers=0",
    "progress_bar=false",
    "loggers={}",
]


def _env(root: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str], root: Path) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall s, CPU s of the process and everything it waited for, its result)."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    r = subprocess.run(cmd, env=_env(root), cwd=root, capture_output=True, text=True)
    took, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    return took, cpu, r


def first_step(run_dir: Path) -> bool:
    f = run_dir / "train_log.csv"
    if not f.is_file():
        return False
    with open(f, newline="") as fh:
        return any(row.get("step") == "1" for row in csv.DictReader(fh))


def launch(root: Path, shards: Path, run_dir: Path) -> tuple[float, float, float]:
    """(s to the first logged step, s to the exit, CPU s of the launch)."""
    cmd = [
        str(Path(sys.executable).with_name("composer")),
        "-n",
        "2",
        str(root / "gcc" / "train.py"),
        str(root / "yamls" / "tiny_cpu.yaml"),
        f"run_dir={run_dir}",
        f"data.path={shards}",
        *TINY,
    ]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    p = subprocess.Popen(cmd, env=_env(root), cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    step1 = None
    while p.poll() is None:
        if step1 is None and first_step(run_dir):
            step1 = time.perf_counter() - t0
        time.sleep(0.02)
    end = time.perf_counter() - t0
    err = p.stderr.read()
    if p.returncode != 0:
        raise SystemExit(f"the launch failed ({p.returncode}):\n{err[-3000:]}")
    return step1 if step1 is not None else end, end, _children_cpu() - cpu0


def measure(root: Path, shards: Path, scratch: Path, tag: str) -> dict[str, tuple[float, float]]:
    """One round on the checkout `root`: {what: (wall s, CPU s)}."""
    py = sys.executable
    got = {}
    wall, cpu, _ = timed([py, "-c", "import torch, os; os._exit(0)"], root)
    got["import torch (baseline)"] = (wall, cpu)
    # what a rank loads before it can build anything (gcc/train.py's order; os._exit: its exit is not timed)
    code = "import gcc.compat.composer, gcc.training.trainer, gcc.data.dataset, os; os._exit(0)"
    if not (root / "gcc" / "training" / "entry.py").exists():  # a checkout from before that order
        code = "import gcc.training.trainer, gcc.data.dataset, os; os._exit(0)"
    wall, cpu, _ = timed([py, "-c", code], root)
    got["a rank's imports"] = (wall, cpu)
    wall, cpu, r = timed([py, str(root / "gcc" / "train.py"), str(root / "yamls" / "tiny_cpu.yaml"), "seed=-1"], root)
    assert r.returncode == 2 and "config error: seed" in r.stderr, r.stderr[-2000:]
    got["config error (python gcc/train.py)"] = (wall, cpu)
    step1, end, cpu = launch(root, shards, Path(tempfile.mkdtemp(dir=scratch, prefix=f"{tag}-run-")))
    got["2-rank launch: to step 1"] = (step1, float("nan"))
    got["2-rank launch: to its exit"] = (end, cpu)
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds (the median is printed)")
    ap.add_argument("--compare", type=Path, help="another checkout of gcc, timed in the same run (in turns)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from gcc.data.convert import convert
    from gcc.synth.world import make_prepared

    roots = {"this": ROOT} | ({"other": args.compare.resolve()} if args.compare else {})
    with tempfile.TemporaryDirectory(prefix="gcc-launch-cost-") as tmp:
        scratch = Path(tmp)
        shards = scratch / "shards"
        convert(make_prepared(scratch, clips=16, seed=0), str(shards), chunk_clips=8, progress=False)
        rounds: dict[str, list[dict]] = {k: [] for k in roots}
        for i in range(args.rounds):
            for tag, root in roots.items():
                rounds[tag].append(measure(root, shards, scratch, f"{tag}{i}"))
    med = {
        tag: {k: tuple(statistics.median(r[k][j] for r in rs) for j in (0, 1)) for k in rs[0]}
        for tag, rs in rounds.items()
    }
    base = med["this"]["import torch (baseline)"][0]
    print(f"median of {args.rounds} round(s); x: the wall time as a multiple of a bare `import torch` ({base:.2f} s)")
    for k, (wall, cpu) in med["this"].items():
        line = f"  {k:36s} {wall:6.2f} s {wall / base:5.2f} x" + (f"  CPU {cpu:6.2f} s" if cpu == cpu else " " * 16)
        if "other" in med:
            ow, oc = med["other"][k]
            line += f"  | other checkout {ow:6.2f} s" + (f", CPU {oc:6.2f} s" if oc == oc else " " * 14)
            line += f"  this/other: wall {wall / ow:4.2f}" + (f", CPU {cpu / oc:4.2f}" if cpu == cpu else "")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
