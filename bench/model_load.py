"""Peak host RSS per rank while the model is built and its base weights are loaded. Not a test.

    .venv/bin/python bench/model_load.py [--ranks 2] [--tmp DIR]

The `wide` preset (the real TI2V-5B layer shapes, 2 blocks, ~0.43 B parameters) with base weights in the
published layout (3 bf16 files + index), launched as a user does (`composer -n 2 gcc/train.py ...`, CPU):
* `parallelism: fsdp`: a meta-device model that Composer shards; each rank initialises its shard and reads
  only its rows of each weight;
* baseline, measured in the same run: `parallelism: ddp`, which loads the way every rank did before FSDP2
  (the whole fp32 model built and every weight read on every rank).
Each rank prints `peak host RSS so far` once the model is ready (before the first step); the launch is then
stopped. The ratio is baseline / FSDP2.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from gcc.launch_command import train_command  # noqa: E402

READY = re.compile(r"rank (\d+): model ready, ([\d.]+) M parameters, (.*); peak host RSS so far ([\d.]+) GB")


def peak_rss_when_ready(work: Path, shards: Path, model_dir: Path, parallelism: str, ranks: int) -> dict[int, float]:
    run_dir = work / f"run_{parallelism}"
    out = work / f"{parallelism}_rank{{rank}}.txt"
    cmd = train_command(
        ROOT / "yamls" / "tiny_cpu.yaml",
        f"run_dir={run_dir}",
        f"data.path={shards}",
        "model.preset=wide",
        f"model.model_dir={model_dir}",
        f"parallelism={parallelism}",
        "global_train_batch_size=2",
        "device_train_microbatch_size=1",
        "max_duration=1",
        "eval_interval=0",
        "export_every=0",
        "progress_bar=false",
        "loggers={}",
        "data.num_workers=0",
        n=ranks,
        flags=["--stdout", str(out)],
    )
    log = work / f"{parallelism}_rank0.txt"
    with open(log, "w") as f:  # rank 0's stdout is the launcher's
        p = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True
        )
    found: dict[int, float] = {}
    try:
        while len(found) < ranks:
            if p.poll() is not None:
                raise SystemExit(f"{parallelism} launch ended first:\n{log.read_text()[-3000:]}")
            for r in range(ranks):
                path = Path(str(out).format(rank=r))
                m = READY.search(path.read_text()) if path.exists() else None
                if m:
                    found[int(m.group(1))] = float(m.group(4))
            time.sleep(0.5)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tmp", default=None, help="scratch folder (default: system temp)")
    args = ap.parse_args()

    import torch

    from gcc.compat.diffsynth import WanModel
    from gcc.data.convert import convert
    from gcc.model.dit import count_params, model_config, write_wan_layout
    from gcc.synth.world import write_prepared

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        work = Path(tmp)
        model_dir = work / "wan"
        model_dir.mkdir()
        wan = WanModel(**model_config("wide").wan_kwargs())
        n = count_params(wan)
        write_wan_layout({k: v.to(torch.bfloat16) for k, v in wan.state_dict().items()}, model_dir, n_shards=3)
        del wan
        shards = work / "shards"
        convert(write_prepared(work / "prepared", clips=4, geometry="wide", seed=0), str(shards), progress=False)
        print(
            f"wide preset: {n / 1e6:.0f} M Wan parameters ({4 * n / 1e9:.2f} GB in fp32), base weights bf16 in "
            f"3 files; {args.ranks} CPU ranks"
        )
        base = peak_rss_when_ready(work, shards, model_dir, "ddp", args.ranks)
        fsdp = peak_rss_when_ready(work, shards, model_dir, "fsdp", args.ranks)
    for r in range(args.ranks):
        print(
            f"rank {r}: peak host RSS with the model ready: FSDP2 {fsdp[r]:.2f} GB; baseline (whole model on every "
            f"rank, as before) {base[r]:.2f} GB -> {base[r] / fsdp[r]:.2f}x"
        )


if __name__ == "__main__":
    main()
