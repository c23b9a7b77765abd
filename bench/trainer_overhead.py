"""What Composer + our callbacks + logging cost per step: gcc/train.py vs a bare PyTorch loop, same run.

    .venv/bin/python bench/trainer_overhead.py [--steps 60] [--shards DIR]

Both sides use the same tiny model, the same shards, the same loader (GcStreamingDataset, 1 worker), the same
batch split (global 8 = micro 2 × accumulation 4, one process) and the same optimizer; validation, exports and
checkpoints are off so only the per-step machinery differs. s/step is measured the same way on both sides
(from asking the loader for a batch to the end of the optimizer step), over the steps after the first 10.
Target: gcc/train.py / bare <= 1.10.
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


def bare_loop(cfg, steps: int) -> tuple[list[float], list[float]]:
    import torch

    from gcc.builders import build_model, build_train_loader
    from gcc.data import fetch_text_table
    from gcc.optim import build_optimizer, warmup_scheduler
    from gcc.builders import cache_dir
    from gcc.text_table import TextTable

    torch.set_num_threads(os.cpu_count() or 1)
    text = TextTable(fetch_text_table(cfg.data.path, cache_dir(cfg)))
    model = build_model(cfg, text, load_weights=False, fsdp=False, log=lambda *a: None)
    opt = build_optimizer(model, cfg.optim.lr, cfg.optim.cond_lr, cfg.optim.weight_decay)
    sched = warmup_scheduler(opt, cfg.optim.warmup_steps)
    loader = build_train_loader(cfg, cfg.per_rank_batch(1))
    step_t, data_t = [], []
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
    return step_t, data_t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--shards", default="", help="a converted dataset (default: synthesize 48 tiny clips)")
    args = ap.parse_args()

    from gcc.config import load_config

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shards = args.shards
        if not shards:
            from gcc import synth
            from gcc.convert import convert

            src = synth.write_prepared(tmp / "prepared", clips=48, geometry="tiny", seed=0)
            shards = str(tmp / "shards")
            convert(src, shards, progress=False, log=lambda *a: None)
        common = [f"data.path={shards}", f"max_steps={args.steps}", *OVERRIDES]

        run_dir = tmp / "train"
        r = subprocess.run([sys.executable, str(ROOT / "gcc" / "train.py"), str(ROOT / "yamls" / "tiny_cpu.yaml"),
                            f"run_dir={run_dir}", *common], capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"gcc/train.py failed:\n{r.stderr[-3000:]}")
        with open(run_dir / "train_log.csv", newline="") as f:
            log = list(csv.DictReader(f))[WARM:]
        ours = statistics.mean(float(x["step_time"]) for x in log)
        ours_data = statistics.mean(float(x["data_time"]) for x in log)

        cfg = load_config(ROOT / "yamls" / "tiny_cpu.yaml", [f"run_dir={tmp / 'bare'}", *common])
        step_t, data_t = bare_loop(cfg, args.steps)
        bare = statistics.mean(step_t[WARM:])
        bare_data = statistics.mean(data_t[WARM:])

    print(f"tiny model, global batch 8 (micro 2 × accumulation 4), 1 process, steps {WARM + 1}..{args.steps}")
    print(f"{'':16}{'s/step':>10}{'steps/s':>10}{'data_time/step_time':>22}")
    print(f"{'bare PyTorch':16}{bare:>10.4f}{1 / bare:>10.2f}{bare_data / bare:>22.3f}")
    print(f"{'gcc/train.py':16}{ours:>10.4f}{1 / ours:>10.2f}{ours_data / ours:>22.3f}")
    print(f"ratio gcc/train.py / bare: {ours / bare:.3f} (target <= 1.10)")


if __name__ == "__main__":
    main()
