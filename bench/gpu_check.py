"""The production path on the GPUs that are present, in one command. Not a test.

    .venv/bin/python bench/gpu_check.py [--steps 8] [--model-dir models/Wan2.2-TI2V-5B] [--work DIR]
    .venv/bin/python bench/gpu_check.py --cpu      # the same plumbing on 2 CPU ranks, tiny preset (a dry run)
    .venv/bin/python bench/gpu_check.py --cpu --preset wide --steps 4   # real layer shapes: checkpoint size

It synthesizes full-geometry clips (81×480×832, v10 text), converts them to shards, then launches
`composer -n <GPUs> gcc/train.py yamls/sft_v10.yaml` as a user does: the 5B preset (random weights unless
--model-dir), FSDP2 resharding after forward, amp_bf16, activation checkpointing per block, micro-batch 1 ×
accumulation 2,
a sharded checkpoint at the end of the first launch, then a relaunch that resumes from it. It prints:
* s per micro-batch (median step_time / accumulation over the steps after the first two),
* peak GPU memory (train_log mem_gb: torch.cuda.max_memory_allocated),
* MFU: model FLOPs (gcc/model/flops.py, one prompt per clip) per micro-batch / time / the GPU's bf16 peak,
* the sharded save's seconds and size, and the relaunch's seconds to a trainer with the checkpoint loaded,
next to the legacy trainer's 1.2 s per micro-batch and 35.2 GB per GPU (4×H200, DeepSpeed ZeRO-2).
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_step import LEGACY_S_PER_MICRO, peak_tflops  # noqa: E402

from gcc.launch_command import train_command  # noqa: E402

LEGACY_GB = 35.2


def launch(n: int, run_dir: Path, shards: Path, overrides: list[str], log: Path) -> tuple[float, str]:
    cmd = train_command(ROOT / "yamls" / "sft_v10.yaml", f"run_dir={run_dir}", f"data.path={shards}", *overrides, n=n)
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    log.write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise SystemExit(f"launch failed (exit {r.returncode}), see {log}:\n{(r.stdout + r.stderr)[-4000:]}")
    return time.time() - t0, r.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps of the first launch")
    ap.add_argument("--model-dir", default="", help="base Wan2.2-TI2V-5B weights (default: random weights)")
    ap.add_argument("--work", default=None, help="folder for data and runs (default: a temporary one)")
    ap.add_argument("--cpu", action="store_true", help="dry run on 2 CPU ranks: tiny preset and geometry, fp32")
    ap.add_argument("--preset", default=None, help="model preset (default: ti2v-5b on GPU, tiny with --cpu)")
    ap.add_argument("--keep-gathered", action="store_true", help="fsdp.reshard_after_forward=false (ZeRO-2-like)")
    ap.add_argument("--checkpointing", default="block", help="model.activation_checkpointing: block | selective")
    ap.add_argument("--compile", action="store_true", help="model.compile=true")
    args = ap.parse_args()

    from gcc.data.convert import convert
    from gcc.model.dit import build_gc_dit, count_params
    from gcc.model.flops import train_flops
    from gcc.synth.world import write_prepared

    n = 2 if args.cpu else torch.cuda.device_count()
    if n == 0:
        raise SystemExit("no GPU visible (use --cpu for a dry run)")
    accum, preset = 2, args.preset or ("tiny" if args.cpu else "ti2v-5b")
    geometry = {"tiny": "tiny", "wide": "wide"}.get(preset, "full")  # synth's geometry for the preset's text width
    overrides = [
        f"model.preset={preset}",
        f"model.model_dir={args.model_dir or chr(34) * 2}",
        "parallelism=fsdp",
        f"fsdp.reshard_after_forward={str(not args.keep_gathered).lower()}",
        f"model.activation_checkpointing={args.checkpointing}",
        f"model.compile={str(args.compile).lower()}",
        f"global_train_batch_size={n * accum}",
        "device_train_microbatch_size=1",
        f"save_interval={args.steps}",
        "eval_interval=0",
        "export_every=0",
        "progress_bar=false",
        "loggers={}",
        "data.num_workers=2",
        "scheduler.t_warmup=2",
    ] + (["precision=fp32"] if args.cpu else [])
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        t = time.time()
        shards = work / "shards"
        convert(
            write_prepared(work / "prepared", clips=max(8, 2 * n * accum), geometry=geometry, seed=0),
            str(shards),
            progress=False,
        )
        print(f"data: {geometry} geometry synthesized and converted in {time.time() - t:.0f} s")
        run_dir = work / "run"
        wall1, out1 = launch(n, run_dir, shards, overrides + [f"max_duration={args.steps}"], work / "launch1.log")
        wall2, out2 = launch(n, run_dir, shards, overrides + [f"max_duration={args.steps + 2}"], work / "launch2.log")
        with open(run_dir / "train_log.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        saves = re.findall(r"checkpoint (ep\d+-ba\d+): ([\d.]+) s, ([\d.e+-]+) GB", out1)
        ready = re.search(r"checkpoint loaded: trainer ready in ([\d.]+) s", out2)

    steps = [float(r["step_time"]) for r in rows[2 : args.steps]] or [float(r["step_time"]) for r in rows]
    s_micro = statistics.median(steps) / accum
    mem = max(float(r["mem_gb"]) for r in rows)
    dit = build_gc_dit(preset, device="meta")
    geo = {"tiny": dict(T=3, h=4, w=6, L=16), "wide": dict(T=3, h=4, w=6, L=16), "full": dict(T=21, h=30, w=52, L=512)}[
        geometry
    ]
    flops = train_flops(
        dit.config, samples=1, frames=geo["T"], height=geo["h"], width=geo["w"], text_len=geo["L"], prompts=1
    )
    peak = None if args.cpu else peak_tflops(torch.cuda.get_device_name(0), None)
    zero = "ZeRO-2-like" if args.keep_gathered else "ZeRO-3-like"
    print(
        f"{n} {'CPU rank' if args.cpu else torch.cuda.get_device_name(0)}(s), {preset}, FSDP2 {zero}, "
        f"{'fp32' if args.cpu else 'amp_bf16'}, activation checkpointing {args.checkpointing}"
        f"{', compiled' if args.compile else ''}, micro-batch 1 × accumulation {accum}"
    )
    print(
        f"s per micro-batch: {s_micro:.3f} (median over steps 3..{args.steps}); legacy {LEGACY_S_PER_MICRO} -> "
        f"{LEGACY_S_PER_MICRO / s_micro:.2f}x"
    )
    print(f"peak memory per {'rank (RSS)' if args.cpu else 'GPU (max allocated)'}: {mem:.1f} GB; legacy {LEGACY_GB} GB")
    print(
        f"model FLOP per micro-batch {flops:.3e}, {flops / s_micro / 1e12:.1f} TFLOP/s per device"
        + (f", MFU {flops / s_micro / (peak * 1e12):.1%} of {peak:.0f}" if peak else "")
    )
    for name, secs, gb in saves:
        print(
            f"sharded save {name}: {float(secs):.1f} s, {float(gb):.3f} GB on disk "
            f"({float(gb) * 1e9 / count_params(dit):.1f} bytes per parameter)"
        )
    print(
        f"relaunch: trainer ready with the checkpoint loaded in {float(ready.group(1)) if ready else float('nan'):.1f} s"
        f" (whole launches: {wall1:.0f} s for {args.steps} steps, {wall2:.0f} s for 2 more)"
    )


if __name__ == "__main__":
    main()
