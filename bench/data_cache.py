"""A local dataset in the run's cache: read in place (gcc: the cache holds links) against copied into the cache
(Streaming's own LocalDownloader, the code before). Not a test.

    .venv/bin/python bench/data_cache.py --clips 200                 # synthesize full-geometry clips, convert, measure
    .venv/bin/python bench/data_cache.py --shards DIR [--reps 3]     # an existing convert_data output

For each mode, `--reps` times, alternating: a fresh cache folder, `GcStreamingDataset(DataConfig(shards), "train", cache)` and
`build_dataloader(batch_size=1, num_workers=0)` as a rank builds them; prints the time from the dataset's
construction to the first batch (what a run's start waits for), the bytes written into the cache by then and after
one whole epoch (regular files only: a link costs no data), and the ratios in-place / copy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def written_bytes(folder: Path) -> int:
    """Bytes of the regular files under `folder` (a symbolic link is not followed: it holds no data)."""
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            st = os.lstat(os.path.join(root, f))
            if not os.path.islink(os.path.join(root, f)):
                total += st.st_size
    return total


def measure(shards: str, cache: Path, downloader) -> dict:
    from streaming.base.storage import download as streaming_download

    from gcc.data.config import DataConfig
    from gcc.data.dataset import GcStreamingDataset, build_dataloader

    streaming_download.DOWNLOADER_MAPPINGS[""] = downloader
    t0 = time.perf_counter()
    ds = GcStreamingDataset(DataConfig(shards), "train", cache, batch_size=1, seed=0)
    it = iter(build_dataloader(ds, batch_size=1, num_workers=0))
    next(it)
    first = time.perf_counter() - t0
    at_first = written_bytes(cache)
    n = 1 + sum(1 for _ in it)
    epoch = time.perf_counter() - t0
    out = {
        "first_batch_s": first,
        "written_first": at_first,
        "written_epoch": written_bytes(cache),
        "epoch_s": epoch,
        "samples": n,
    }
    del it, ds
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", help="a local convert_data output (default: synthesize --clips and convert)")
    ap.add_argument("--clips", type=int, default=200, help="full-geometry clips to synthesize without --shards")
    ap.add_argument("--reps", type=int, default=3, help="measurements per mode (alternating)")
    ap.add_argument("--tmp", default=None, help="scratch folder (default: system temp)")
    a = ap.parse_args()

    from streaming.base.storage.download import LocalDownloader

    from gcc.compat.streaming import LinkingLocalDownloader

    tmp = Path(tempfile.mkdtemp(prefix="gcc-data-cache-", dir=a.tmp))
    shards = a.shards
    if shards is None:
        from gcc.data.convert import convert
        from gcc.synth import world as synth

        t0 = time.perf_counter()
        synth.write_prepared(tmp / "prepared", clips=a.clips, geometry="full", seed=0)
        convert(tmp / "prepared", str(tmp / "shards"), workers=1, progress=False)
        shards = str(tmp / "shards")
        print(f"synthesized and converted {a.clips} full-geometry clips in {time.perf_counter() - t0:.0f} s")
    size = written_bytes(Path(shards) / "train")
    print(f"train split: {size / 1e6:.0f} MB of shards in {shards}")
    modes = {"copy (Streaming's LocalDownloader)": LocalDownloader, "in place (gcc)": LinkingLocalDownloader}
    got: dict[str, list[dict]] = {m: [] for m in modes}
    for rep in range(a.reps):
        for mode, cls in modes.items():
            cache = tmp / f"cache-{uuid.uuid4().hex[:8]}"
            r = measure(shards, cache, cls)
            shutil.rmtree(cache)  # a copy is as large as the split
            got[mode].append(r)
            print(
                f"  rep {rep + 1} {mode:36s} first batch {r['first_batch_s']:6.2f} s, written by then "
                f"{r['written_first'] / 1e6:7.1f} MB; epoch ({r['samples']} samples) {r['epoch_s']:6.1f} s, "
                f"written {r['written_epoch'] / 1e6:7.1f} MB"
            )
    print("\nper mode (min..max over reps):")
    for mode in modes:
        rs = got[mode]
        first = [r["first_batch_s"] for r in rs]
        print(
            f"  {mode:36s} first batch {min(first):.2f}..{max(first):.2f} s; written after one epoch "
            f"{rs[-1]['written_epoch'] / 1e6:.1f} MB"
        )
    copy, link = got["copy (Streaming's LocalDownloader)"], got["in place (gcc)"]
    ratios = [b["first_batch_s"] / c["first_batch_s"] for b, c in zip(link, copy)]
    print(
        f"ratio in place / copy: time to the first batch {min(ratios):.2f}..{max(ratios):.2f}; bytes written "
        f"after one epoch {link[-1]['written_epoch'] / max(copy[-1]['written_epoch'], 1):.4f}"
    )
    print(f"(scratch folder {tmp}: delete it when done)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
