"""Loader benchmark at full v10 geometry (81×480×832). Not a test.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python bench/loader.py [--clips 6] [--epochs 8] [--prepared DIR]
                                                             [--mask-reps 6] [--ref-frames 1] [--tmp DIR]

Writes `--clips` full-geometry clips with `gcc.synth.world.write_prepared` (or reuses `--prepared`), converts them,
then prints, all measured in this run:
1. one loader worker's samples/s with the default probabilities (decode + text gather + mask + collate):
   `build_dataloader(GcStreamingDataset(DataConfig(...)), batch_size=1, num_workers=1)` (its persistent worker) over
   `--epochs` epochs, timed from the first batch's arrival (startup and the first sample excluded) to the
   last; against a baseline: the same clips read from the prepared layout (np.load of the sem npz +
   safetensors load of the latents + the text rows from the table with safetensors), in this process, and
   the ratio. Target: >= 8 samples/s.
2. the fast mask's CPU ms per masked sample on these clips vs the per-pixel reference (tests/mask_reference.py,
   timed on a few frames and extrapolated; code shared with bench/mask.py), and the ratio.
3. peak RSS of the loader worker (VmHWM, read inside the worker) and its RSS when it started.
4. the bytes each micro-batch sends to the device (`gcc.data.batch.device_bytes`: its tensors, one clip), against
   the same batches with the context expanded to one [L, D] row block per latent frame (the layout before each
   clip carried its distinct prompts once), and the ratio. Target: <= 45 MB at the v10 geometry.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np


def _vm(field: str) -> float:
    """A /proc/self/status field (VmRSS, VmHWM) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


class _MemCollate:
    """gc_collate plus the calling worker's RSS / peak RSS (read in the worker)."""

    def __init__(self):
        from gcc.data.batch import gc_collate

        self.collate = gc_collate
        self.start_rss = None

    def __call__(self, samples):
        if self.start_rss is None:
            self.start_rss = _vm("VmRSS")  # after the first sample (worker forked, dataset iterating)
        b = self.collate(samples)
        ru = resource.getrusage(resource.RUSAGE_SELF)  # the worker process, all its threads
        b["_mem"] = (self.start_rss, _vm("VmRSS"), _vm("VmHWM"), os.getpid(), ru.ru_utime + ru.ru_stime)
        return b


def loader_rate(shards: Path, cache: Path, epochs: int, workers: int = 1, seed: int = 0):
    from gcc.data.batch import device_bytes
    from gcc.data.config import DataConfig
    from gcc.data.dataset import GcStreamingDataset, build_dataloader

    ds = GcStreamingDataset(DataConfig(str(shards)), "train", cache / uuid.uuid4().hex, batch_size=1, seed=seed)
    # the training's DataLoader (persistent workers from the forkserver: only the first start is excluded),
    # with a collate that also reports the worker's memory
    dl = build_dataloader(ds, batch_size=1, num_workers=workers, collate_fn=_MemCollate())
    main_rss = _vm("VmRSS")
    t_first, n, masked, cond, text, mem, sent, expanded = None, 0, 0, 0, 0, [], [], []
    t_start = time.perf_counter()
    for _ in range(epochs):
        for b in dl:
            now = time.perf_counter()
            if t_first is None:
                t_first, startup = now, now - t_start
            else:
                n += 1
            mem_fields = b.pop("_mem")
            sent.append(device_bytes(b))
            T, L, D = b["context_index"].shape[1], *b["context"].shape[2:]
            expanded.append(sent[-1] - b["context"].nbytes - b["context_index"].nbytes + T * L * D * 2)
            b["_mem"] = mem_fields
            masked += int(b["mask_frac"][0] > 0)
            cond += int(b["drop_cond"][0])
            text += int(b["drop_text"][0])
            mem.append(b["_mem"])
    secs = time.perf_counter() - t_first
    cpu = mem[-1][4] - mem[0][4]  # worker CPU between the first and the last batch's collate
    total = n + 1
    del dl
    return {
        "rate": n / secs,
        "cpu_rate": n / cpu,
        "cpu": cpu,
        "n": n,
        "secs": secs,
        "startup": startup,
        "samples": total,
        "masked": masked,
        "cond": cond,
        "text": text,
        "worker_start_rss": mem[0][0],
        "worker_peak_rss": max(m[2] for m in mem),
        "worker_last_rss": mem[-1][1],
        "main_rss": main_rss,
        "bytes": sent,
        "expanded_bytes": expanded,
    }


def baseline_rate(src: Path, clip_ids: list[str], epochs: int):
    """The same clips from the prepared layout: np.load(npz) + safetensors latents + text rows."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    rows = {
        json.loads(line)["clip_id"]: json.loads(line)
        for line in (src / "index" / "clips.jsonl").read_text().splitlines()
    }
    table = str(src / "text" / "table.safetensors")

    def one(cid):
        with np.load(src / "sem" / f"{cid}.npz") as z:
            ids = z["ids"]
        lat = load_file(str(src / "latents" / f"{cid}.safetensors"))["input_latents"]
        keys = rows[cid]["context_keys"]
        with safe_open(table, "pt") as f:
            cache = {k: f.get_tensor(k) for k in sorted(set(keys))}
        ctx = torch.stack([cache[k] for k in keys])
        meta = json.loads((src / "meta" / f"{cid}.json").read_text())
        return ids, lat, ctx, meta

    one(clip_ids[0])  # warm the page cache like the loader's first (excluded) sample
    t0, c0 = time.perf_counter(), time.thread_time()
    n = 0
    for _ in range(epochs):
        for cid in clip_ids:
            one(cid)
            n += 1
    secs, cpu = time.perf_counter() - t0, time.thread_time() - c0
    return {"rate": n / secs, "cpu_rate": n / cpu, "cpu": cpu, "n": n, "secs": secs}


def mask_timing(shards: Path, cache: Path, reps: int, ref_frames: int):
    """Fast mask CPU ms per masked sample on the converted clips (both calibrations) and the reference."""
    from mask import masked_draws, time_fast, time_reference  # bench/mask.py
    from streaming import StreamingDataset

    from gcc.data.config import DataConfig
    from gcc.data.dataset import GcStreamingDataset
    from gcc.data.mask import mask_ground_z
    from gcc.data.shards import ClipRecord
    from gcc.geometry import Cameras

    ds = GcStreamingDataset(
        DataConfig(str(shards)).without_dropouts(), "train", cache / uuid.uuid4().hex, batch_size=1, shuffle=False
    )
    draws = masked_draws(reps)
    res = {"frame0": [], "cap": []}
    first = None
    for i in range(len(ds)):
        rec = ClipRecord.from_sample(StreamingDataset.get_item(ds, i))
        meta = rec.meta()
        gz = np.asarray(meta["ground_z"], float)
        if mask_ground_z(gz) is None:
            continue
        ids, cams = rec.sem_ids(), Cameras.from_meta(meta)
        first = first or (ids, cams, gz, rec.clip_id)
        for cal in res:
            res[cal].append(time_fast(ids, cams, gz, draws, cal)["cpu_ms"])
    out = {cal: np.concatenate(v) for cal, v in res.items()}
    ids, cams, gz, cid = first
    ref_ms, per_frame, frames, agree = time_reference(ids, cams, gz, draws[0], ref_frames)
    return out, (ref_ms, per_frame, frames, agree, cid)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clips", type=int, default=6, help="full-geometry clips to synthesize (train: clips 0..7)")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--prepared", help="reuse a full-geometry prepared dataset instead of synthesizing")
    ap.add_argument("--mask-reps", type=int, default=6, help="masked draws per clip and calibration")
    ap.add_argument("--ref-frames", type=int, default=1, help="reference frames besides frame 0")
    ap.add_argument("--tmp", default=None, help="scratch folder (default: system temp)")
    ap.add_argument("--skip-mask", action="store_true")
    args = ap.parse_args()

    t = time.time()
    import streaming  # noqa: F401
    import torch

    from gcc.data.convert import convert
    from gcc.data.shards import read_manifest
    from gcc.synth import world as synth

    torch.set_num_threads(1)
    print(
        f"imports {time.time() - t:.1f} s; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
        f"{os.cpu_count()} CPUs visible"
    )
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        tmp = Path(tmp)
        if args.prepared:
            src = Path(args.prepared)
        else:
            t = time.time()
            src = synth.write_prepared(tmp / "prepared", clips=args.clips, geometry="full", seed=0)
            print(f"synth: {args.clips} full-geometry clips in {time.time() - t:.1f} s")
        shards = tmp / "shards"
        convert(src, str(shards), progress=False)
        man = read_manifest(str(shards))
        clip_ids = man["splits"]["train"]["clip_ids"]
        print(
            f"data: {len(clip_ids)} train clips, sem {man['geometry']['sem']}, latents "
            f"{man['geometry']['latents']}, text {man['geometry']['text']}"
        )

        lo = loader_rate(shards, tmp / "cache", args.epochs)
        base = baseline_rate(src, clip_ids, args.epochs)
        print(
            f"loader, 1 worker, default p (text .1 / cond .05 / mask .5, frame0): {lo['rate']:.2f} samples/s wall, "
            f"{lo['cpu_rate']:.2f} samples/s per worker CPU second ({lo['n']} samples in {lo['secs']:.2f} s wall / "
            f"{lo['cpu']:.2f} s worker CPU after the first; startup {lo['startup']:.1f} s; "
            f"{lo['masked']}/{lo['samples']} masked, {lo['cond']} cond-dropped, {lo['text']} text-dropped)  "
            f"target >= 8"
        )
        print(
            f"baseline (prepared npz + safetensors + text rows, in-process): {base['rate']:.2f} samples/s wall, "
            f"{base['cpu_rate']:.2f} per CPU second ({base['n']} samples in {base['secs']:.2f} s / {base['cpu']:.2f} s CPU)"
        )
        print(
            f"ratio loader / baseline: {lo['rate'] / base['rate']:.2f}x wall, {lo['cpu_rate'] / base['cpu_rate']:.2f}x CPU "
            f"(wall numbers depend on the load of this shared machine: load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; CPU-time numbers are what one dedicated core gives)"
        )
        print(
            f"worker memory: peak RSS (VmHWM) {lo['worker_peak_rss']:.0f} MiB, RSS after its first sample "
            f"{lo['worker_start_rss']:.0f} MiB, at the end {lo['worker_last_rss']:.0f} MiB (main process RSS "
            f"{lo['main_rss']:.0f} MiB; the worker is forked by the forkserver, not from it; RSS counts the page-cache-shared text table rows it touched)"
        )

        mb, old = np.array(lo["bytes"]) / 1e6, np.array(lo["expanded_bytes"]) / 1e6
        print(
            f"to the device per micro-batch (1 clip): mean {mb.mean():.1f} MB, max {mb.max():.1f} MB; with the context "
            f"expanded per latent frame: mean {old.mean():.1f} MB, max {old.max():.1f} MB; ratio {mb.mean() / old.mean():.3f} "
            f"(target <= 45 MB)"
        )

        if not args.skip_mask:
            ms, (ref_ms, per_frame, frames, agree, cid) = mask_timing(
                shards, tmp / "cache", args.mask_reps, args.ref_frames
            )
            for cal, v in ms.items():
                print(
                    f"fast mask {cal:6s} on these clips: CPU median {np.median(v):6.1f} ms per masked sample "
                    f"(mean {v.mean():.1f}, max {v.max():.1f}, {v.size} masked samples)"
                )
            f0 = float(np.median(ms["frame0"]))
            print(
                f"reference mask ({cid}, frame0): {per_frame:.2f} s/frame CPU on frames {frames} (+ frame 0 for "
                f"τ), EXTRAPOLATED to {man['geometry']['frames']} frames: {ref_ms / 1e3:.1f} s per sample; "
                f"agrees with fast on those frames: {agree}"
            )
            print(f"ratio reference / fast (frame0): {ref_ms / f0:.0f}x  (fast {f0:.1f} ms, target <= 40 ms)")
    print(f"bench process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
