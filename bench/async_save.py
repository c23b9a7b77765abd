"""What a periodic checkpoint costs the training around it: synchronous saves (`save_async=false`) against
background writes (`save_async=true`, gcc/training/checkpoint/background.py), against a run without saves measured in
the same bench.

    .venv/bin/python bench/async_save.py [--steps 8] [--every 3] [--layers 1] [--shards DIR]

Three one-process launches (`python gcc/train.py`, DDP, fp32 on CPU) of the `wide` model preset (the real TI2V-5B
layer shapes; `--layers` of its blocks, a checkpoint of ~2 GB per block with AdamW's moments) on synthetic `wide`
shards, the same steps each: no periodic save (the baseline), a save every `--every` steps synchronous, and the
same asynchronous. The figure is the period of a step (wall time between the ends of consecutive steps: train_log's
`time`), so a save's time counts in the period of the step after it, and a background write's in those it
overlaps; the first `--every` steps (warm-up) and the end-of-training save (after the last row) are left out.
Printed: each run's mean period, the window-with-saves / without-saves ratio for sync and async (the baseline run's
mean), and async / sync. The runs are taken one after the other: on a shared machine run it where nothing else
runs, and repeat it.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_shards(folder: Path) -> Path:
    """Synthetic clips of the `wide` geometry (gcc/synth/world.py), converted to MDS."""
    from gcc.data.convert import convert
    from gcc.synth.world import write_prepared

    shards = folder / "shards"
    convert(write_prepared(folder / "prepared", clips=16, geometry="wide", seed=3), str(shards), progress=False)
    return shards


def run(shards: Path, run_dir: Path, steps: int, every: int, layers: int, save: str) -> list[float]:
    """One launch; the periods of its steps after the first `every` (seconds)."""
    from gcc.launch_command import train_command

    saves = {"none": [f"save_interval={10 * steps}"], "sync": [f"save_interval={every}", "save_async=false"]}
    saves["async"] = [f"save_interval={every}", "save_async=true"]
    cmd = train_command(
        ROOT / "yamls" / "tiny_cpu.yaml",
        f"run_dir={run_dir}",
        f"data.path={shards}",
        "model.preset=wide",
        f"model.overrides={{num_layers: {layers}}}",
        "parallelism=ddp",
        "global_train_batch_size=1",
        "device_train_microbatch_size=1",
        f"max_duration={steps}",
        "save_num_checkpoints_to_keep=1",
        "export_every=0",
        "eval_interval=0",
        "eval_first=false",
        "sample_every=0",
        "data.num_workers=0",
        "progress_bar=false",
        "loggers={}",
        *saves[save],
        n=None,
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"the {save} launch failed ({r.returncode}):\n{r.stderr[-3000:]}")
    with open(run_dir / "train_log.csv", newline="") as f:
        ends = [float(row["time"]) for row in csv.DictReader(f)]
    return [b - a for a, b in zip(ends[every - 1 :], ends[every:])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="steps of each launch")
    ap.add_argument("--every", type=int, default=3, help="a save every this many steps (and the warm-up left out)")
    ap.add_argument("--layers", type=int, default=1, help="blocks of the wide preset")
    ap.add_argument("--shards", type=Path, default=None, help="wide shards to reuse (default: made in a temp folder)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="async_save.") as tmp:
        shards = a.shards or make_shards(Path(tmp))
        periods = {s: run(shards, Path(tmp) / s, a.steps, a.every, a.layers, s) for s in ("none", "sync", "async")}
    mean = {s: statistics.mean(p) for s, p in periods.items()}
    print(f"wide preset, {a.layers} block(s), {a.steps} steps, a save every {a.every} (steps {a.every + 1}..):")
    for s, p in periods.items():
        print(f"  {s:5s}: mean step period {mean[s]:.3f} s (max {max(p):.3f} s over {len(p)} steps)")
    print(f"  with saves / without: sync {mean['sync'] / mean['none']:.3f}, async {mean['async'] / mean['none']:.3f}")
    print(f"  async / sync: {mean['async'] / mean['sync']:.3f}   (bench wall {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
