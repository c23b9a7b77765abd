"""`make demo`: the whole chain on built-in synthetic data, on any machine.

    synth (prepared layout) -> convert_data (MDS shards) -> one batch through the loader
    -> composer -n 2 gcc/train.py yamls/tiny_cpu.yaml (training, validation, exports) -> gcc-plot (curves.png)

Rerunning reuses what is there: the converter is idempotent and the training resumes (or, finished, stops).
"""
from __future__ import annotations

import argparse
import csv
import logging
import os
import subprocess
import sys
import time
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gcc.tools.demo", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/demo", help="folder for everything the demo writes")
    p.add_argument("--clips", type=int, default=48, help="synthetic clips to make")
    p.add_argument("--seed", type=int, default=0, help="the synthetic world's seed")
    p.add_argument("--workers", type=int, default=2, help="convert_data's processes")
    p.add_argument("--gpus", type=int, default=2, help="processes for the training (composer -n)")
    p.add_argument("--no_train", "--no-train", action="store_true", help="stop after the data part")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="  %(message)s", stream=sys.stdout)  # the converter's lines
    out = Path(args.out)
    prepared, shards = out / "prepared", out / "shards"

    from gcc.data import synth
    from gcc.data.convert import convert

    t0 = time.time()
    if (prepared / "READY").exists():
        print(f"[1/4] synthetic prepared data: reusing {prepared}")
    else:
        print(f"[1/4] synthetic prepared data: {args.clips} tiny clips -> {prepared}")
        synth.write_prepared(prepared, clips=args.clips, geometry="tiny", seed=args.seed, overwrite=True)
    print(f"[2/4] convert_data --src {prepared} --out {shards} --workers {args.workers}")
    manifest = convert(prepared, str(shards), workers=args.workers, chunk_clips=8)

    print("[3/4] reading the shards back through the training loader (StreamingDataset)")
    from gcc.data.dataset import GcStreamingDataset, build_dataloader, release_stale_shm

    release_stale_shm([out / "cache" / "train"])  # left by an earlier demo killed mid-read
    ds = GcStreamingDataset(str(shards), "train", out / "cache", batch_size=4, seed=args.seed)
    batch = next(iter(build_dataloader(ds, batch_size=4, num_workers=0)))
    geo = manifest["geometry"]
    print(f"  train {manifest['counts']['train']} clips, val {manifest['counts']['val']} clips; "
          f"latents {geo['latents']}, sem ids {geo['sem']}, text {geo['text']}")
    print(f"  first batch: clips {batch['clip_id']}")
    print(f"    input_latents {list(batch['input_latents'].shape)} {batch['input_latents'].dtype}, "
          f"context {list(batch['context'].shape)}, sem_ids {list(batch['sem_ids'].shape)}")
    print(f"    text drop {batch['drop_text'].tolist()}, cond drop {batch['drop_cond'].tolist()}, "
          f"mask fraction {[round(v, 3) for v in batch['mask_frac'].tolist()]}")
    if args.no_train:
        print(f"done in {time.time() - t0:.0f} s. Prepared data: {prepared}  Shards: {shards}")
        return 0
    run_dir = out / "train"
    root = Path(__file__).resolve().parents[2]  # the repository: gcc/tools/demo.py -> .
    cmd = [str(Path(sys.executable).with_name("composer")), "-n", str(args.gpus), str(root / "gcc" / "train.py"),
           str(root / "yamls" / "tiny_cpu.yaml"), f"run_dir={run_dir}", f"data.path={shards}", "progress_bar=false"]
    print(f"[4/4] training: {' '.join(cmd[:1] + cmd[1:])}")
    del ds, batch  # release the loader's shared memory before the training's ranks start
    r = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        print(f"training exited with {r.returncode}", file=sys.stderr)
        return r.returncode
    with open(run_dir / "val_log.csv", newline="") as f:
        val = list(csv.DictReader(f))
    last = [v for v in val if v["step"] == val[-1]["step"]]
    print(f"\nvalidation at step {last[0]['step']} (the condition helps when gap_uncond > 0; the text when gap_nulltext > 0):")
    for v in last:
        print(f"  t={float(v['timestep']):6.1f}  mse {float(v['mse']):.4f}  gap_uncond {float(v['gap_uncond']):+.4f}  "
              f"gap_nulltext {float(v['gap_nulltext']):+.4f}")
    from gcc.tools.plot import plot_run

    curves = plot_run(run_dir, run_dir / "curves.png")
    print(f"\ndone in {time.time() - t0:.0f} s.")
    print(f"  curves:      {curves}   (gcc-plot {run_dir})")
    print(f"  logs:        {run_dir / 'train_log.csv'}, {run_dir / 'val_log.csv'}")
    print(f"  tensorboard: {run_dir / 'tensorboard'}   (tensorboard --logdir {run_dir / 'tensorboard'})")
    print(f"  exports:     {', '.join(sorted(p.name for p in run_dir.glob('step-*.safetensors')))} in {run_dir}")
    print("  resume:      rerun `make demo` (or the [4/4] command) with a larger max_steps=..., it continues")
    return 0


if __name__ == "__main__":
    sys.exit(main())
