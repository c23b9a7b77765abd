"""What Composer + our callbacks + logging cost per step: gcc/train.py vs a bare PyTorch loop, same run.

    .venv/bin/python bench/trainer_overhead.py [--steps 100] [--rounds 2] [--shards DIR]

Both sides use the same tiny model, the same shards, the same loader (GcStreamingDataset, 1 worker), the same
batch split (global 8 = micro 2 × accumulation 4, one process) and the same optimizer; validation, exports and
checkpoints are off so only the per-step machinery differs. Two figures, measured the same way on both sides over
the steps after the first 10: the period (wall time between the ends of consecutive steps: everything Composer
does between steps included; the ratio of these is the target) and the in-step time (from asking the loader for
a batch to the end of the optimizer step), with its data-wait share. The two sides alternate `--rounds` times.
Target: period gcc/train.py / bare <= 1.10.
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
WARM = 10
OVERRIDES = ["global_batch=8", "micro_batch=2", "val_every=0", "export_every=0", "checkpoint_every=100000",
             "progress_bar=false", "data.num_workers=1"]


def bare_loop(cfg, steps: int) -> tuple[list[float], list[float], list[float]]:
    import torch

    from gcc.data.dataset import fetch_text_table
    from gcc.data.text_table import TextTable
    from gcc.model.optim import build_optimizer, warmup_scheduler
    from gcc.train.builders import build_model, build_train_loader, cache_dir

    torch.set_num_threads(os.cpu_count() or 1)
    text = TextTable(fetch_text_table(cfg.data.path, cache_dir(cfg)))
    model = build_model(cfg, text, fsdp=False)
    opt = build_optimizer(model, cfg.optim.lr, cfg.optim.cond_lr, cfg.optim.weight_decay)
    sched = warmup_scheduler(opt, cfg.optim.warmup_steps)
    loader = build_train_loader(cfg, cfg.per_rank_batch(1))
    step_t, data_t, end_t = [], [], []
    while len(step_t) < steps:
        it = iter(loader)
        while len(step_t) < steps:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            t_data = time.perf_counter() - t0
            n = len(batch["clip_id"])
            for i in range(0, n, cfg.micro_batch):
                mb = {k: v[i:i + cfg.micro_batch] for k, v in batch.items()}
                out = model(mb)
                (model.loss(out, mb) * (len(mb["clip_id"]) / n)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step_t.append(time.perf_counter() - t0)
            data_t.append(t_data)
            end_t.append(time.time())
    return step_t, data_t, end_t


def ours_run(run_dir: Path, common: list[str]) -> tuple[list[float], list[float], list[float]]:
    r = subprocess.run([sys.executable, str(ROOT / "gcc" / "train.py"), str(ROOT / "yamls" / "tiny_cpu.yaml"),
                        f"run_dir={run_dir}", *common], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"gcc/train.py failed:\n{r.stderr[-3000:]}")
    with open(run_dir / "train_log.csv", newline="") as f:
        log = list(csv.DictReader(f))
    return ([float(x["step_time"]) for x in log], [float(x["data_time"]) for x in log],
            [float(x["time"]) for x in log])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2,
                    help="bare and gcc/train.py alternate this many times, so drift in machine load hits both")
    ap.add_argument("--shards", default="", help="a converted dataset (default: synthesize 48 tiny clips)")
    args = ap.parse_args()

    from gcc.train.config import load_config

    times = {side: {"period": [], "step": [], "data": []} for side in ("bare PyTorch", "gcc/train.py")}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shards = args.shards
        if not shards:
            from gcc.data import synth
            from gcc.data.convert import convert

            src = synth.write_prepared(tmp / "prepared", clips=48, geometry="tiny", seed=0)
            shards = str(tmp / "shards")
            convert(src, shards, progress=False)
        common = [f"data.path={shards}", f"max_steps={args.steps}", *OVERRIDES]
        for r in range(args.rounds):
            cfg = load_config(ROOT / "yamls" / "tiny_cpu.yaml", [f"run_dir={tmp / f'bare{r}'}", *common])
            for side, (step_t, data_t, end_t) in (("bare PyTorch", bare_loop(cfg, args.steps)),
                                                  ("gcc/train.py", ours_run(tmp / f"train{r}", common))):
                period = [b - a for a, b in zip(end_t[WARM - 1:], end_t[WARM:])]
                times[side]["period"] += period
                times[side]["step"] += step_t[WARM:]
                times[side]["data"] += data_t[WARM:]
                print(f"round {r + 1}: {side:14} period {statistics.mean(period):.4f} s/step", flush=True)

    print(f"tiny model, global batch 8 (micro 2 × accumulation 4), 1 process, steps {WARM + 1}..{args.steps}, "
          f"{args.rounds} round(s)")
    print(f"{'':16}{'period s/step':>15}{'steps/s':>10}{'in-step s':>12}{'data_time/step_time':>22}")
    mean = {}
    for side, t in times.items():
        mean[side] = statistics.mean(t["period"])
        step = statistics.mean(t["step"])
        print(f"{side:16}{mean[side]:>15.4f}{1 / mean[side]:>10.2f}{step:>12.4f}"
              f"{statistics.mean(t['data']) / step:>22.3f}")
    print(f"ratio gcc/train.py / bare (period): {mean['gcc/train.py'] / mean['bare PyTorch']:.3f} (target <= 1.10)")


if __name__ == "__main__":
    main()
