"""`make demo`: the whole data chain on built-in synthetic data, on any machine.

    synth (prepared layout) -> convert_data (MDS shards) -> read back through the training loader

Rerunning reuses what is already there (the converter is idempotent), so the demo is cheap to repeat.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gcc.demo", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/demo", help="folder for everything the demo writes")
    p.add_argument("--clips", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    out = Path(args.out)
    prepared, shards = out / "prepared", out / "shards"

    from gcc import synth
    from gcc.convert import convert

    t0 = time.time()
    if (prepared / "READY").exists():
        print(f"[1/3] synthetic prepared data: reusing {prepared}")
    else:
        print(f"[1/3] synthetic prepared data: {args.clips} tiny clips -> {prepared}")
        synth.write_prepared(prepared, clips=args.clips, geometry="tiny", seed=args.seed, overwrite=True)
    print(f"[2/3] convert_data --src {prepared} --out {shards} --workers {args.workers}")
    manifest = convert(prepared, str(shards), workers=args.workers, chunk_clips=8)

    print("[3/3] reading the shards back through the training loader (StreamingDataset)")
    from gcc.data import GcStreamingDataset, build_dataloader, release_stale_shm

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
    print(f"done in {time.time() - t0:.0f} s. Prepared data: {prepared}  Shards: {shards} "
          f"(manifest {shards / 'manifest.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
