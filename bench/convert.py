"""Conversion speed and size at full v10 geometry, against a baseline measured in the same run.

    .venv/bin/python bench/convert.py [--clips 4] [--workers 1]

Baseline: what a plain per-clip repack costs — `np.savez_compressed` of the clip's latents and sem ids into
one file per clip. Printed: clips/s and MB/s (of prepared input) for both, the output/input size ratio for
both, and the ratios between them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def dir_bytes(p: Path, pattern: str = "*") -> int:
    return sum(f.stat().st_size for f in p.rglob(pattern) if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clips", type=int, default=4)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--tmp", default=None, help="scratch folder (default: system temp)")
    args = ap.parse_args()

    from safetensors import safe_open

    t = time.time()
    import streaming  # noqa: F401  (a one-time ~8 s import; kept out of the conversion timing)

    from gcc.data.convert import convert
    from gcc.synth import world as synth

    print(f"imports: {time.time() - t:.1f} s (once per process, not counted below)")

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        tmp = Path(tmp)
        t = time.time()
        # clips of both splits are needed; clip i's split is a function of i, so write enough clips
        src = synth.write_prepared(tmp / "prepared", clips=args.clips, geometry="full", seed=0)
        print(f"synth: {args.clips} full-geometry clips in {time.time() - t:.1f} s")
        rows = [line for line in (src / "index" / "clips.jsonl").read_text().splitlines()]
        import json

        clip_ids = [json.loads(r)["clip_id"] for r in rows if not json.loads(r)["drop"]]
        inputs = sum(dir_bytes(src / d) for d in ("latents", "sem", "meta"))
        n = len(clip_ids)

        # baseline: one np.savez_compressed per clip
        base = tmp / "baseline"
        base.mkdir()
        t = time.time()
        for cid in clip_ids:
            with safe_open(str(src / "latents" / f"{cid}.safetensors"), "pt") as f:
                lat = f.get_tensor("input_latents").view(__import__("torch").uint16).numpy()
            with np.load(src / "sem" / f"{cid}.npz") as z:
                ids = z["ids"]
            np.savez_compressed(
                base / f"{cid}.npz",
                input_latents=lat,
                ids=ids,
                meta=np.frombuffer((src / "meta" / f"{cid}.json").read_bytes(), np.uint8),
            )
        base_s = time.time() - t
        base_bytes = dir_bytes(base)

        out = tmp / "shards"
        t = time.time()
        convert(src, str(out), workers=args.workers, progress=False)
        conv_s = time.time() - t
        conv_bytes = dir_bytes(out / "train", "*.zstd") + dir_bytes(out / "val", "*.zstd")

    mb = inputs / 1e6
    print(f"input: {n} clips, {mb:.1f} MB of prepared latents+sem+meta ({mb / n:.1f} MB/clip)")
    print(f"{'':24}{'clips/s':>10}{'MB/s':>10}{'out/in size':>14}")
    print(f"{'baseline savez_compressed':24}{n / base_s:>10.2f}{mb / base_s:>10.1f}{base_bytes / inputs:>14.3f}")
    print(f"{'convert_data':24}{n / conv_s:>10.2f}{mb / conv_s:>10.1f}{conv_bytes / inputs:>14.3f}")
    print(f"ratio convert/baseline: speed {base_s / conv_s:.2f}x, size {conv_bytes / base_bytes:.3f}x")


if __name__ == "__main__":
    main()
