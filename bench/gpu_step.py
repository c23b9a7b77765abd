"""One training-step loop of a model preset at a chosen geometry: s/micro-batch, peak memory, MFU.

    .venv/bin/python bench/gpu_step.py --preset tiny                       # CPU smoke (tested)
    .venv/bin/python bench/gpu_step.py --preset ti2v-5b --geometry full    # one H200: 81×480×832, bf16

The step is the real objective (GcTrainModel: flow-matching loss, clean frame 0, per-sample draws) with AdamW,
gradient clipping and (optionally) per-block activation checkpointing, on one device with synthetic inputs
of the geometry's shapes. MFU = model FLOPs per step / step time / peak bf16 FLOP/s, with the model FLOPs the
trainer's SpeedMonitor uses (gcc/model/flops.py; activation recomputation is not counted, as usual). Baseline in the same run: the legacy trainer's published 1.2 s per micro-batch at full
geometry on H200 (ZeRO-2, 4 GPUs) is printed next to the measured number for the 5B preset.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GEOMETRIES = {"tiny": dict(T=3, h=4, w=6, L=16), "full": dict(T=21, h=30, w=52, L=512)}
LEGACY_S_PER_MICRO = 1.2  # legacy smoke, 4×H200, ZeRO-2, 81×480×832 (design doc)
PEAK_TFLOPS = {"cuda": 989.0}  # H100/H200 SXM dense bf16


def model_flops(dit_cfg, T: int, h: int, w: int, L: int, batch: int) -> float:
    """The model FLOPs of a training step of `batch` clips with a prompt per latent frame (`synthetic_batch`)."""
    from gcc.model.flops import train_flops

    return float(train_flops(dit_cfg, samples=batch, frames=T, height=h, width=w, text_len=L, prompts=batch * T))


def synthetic_batch(B: int, T: int, h: int, w: int, L: int, D: int, device, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    from gcc.geometry import Geometry

    F, H, W = Geometry(T=T, h=h, w=w, text_L=L, text_D=D).sem_shape
    ids = torch.randint(0, 7, (B, F, H, W), generator=g, dtype=torch.uint8)
    return {
        "input_latents": torch.randn(B, 48, T, h, w, generator=g).to(device, torch.bfloat16),
        "context": torch.randn(B, T, L, D, generator=g).to(device, torch.bfloat16),
        "context_ids": torch.arange(T).repeat(B, 1).to(device),
        "sem_ids": ids.to(device),
        "clip_id": [f"bench{i}" for i in range(B)],
        "sample_id": torch.arange(B),
        "epoch": torch.zeros(B, dtype=torch.int64),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--geometry", default=None, help="tiny | full (default: tiny for the tiny preset, else full)")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--grad-ckpt", action="store_true", default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--peak-tflops", type=float, default=None, help="peak bf16 TFLOP/s of the device for MFU")
    args = ap.parse_args()

    from gcc.model.dit import build_gc_dit
    from gcc.model.objective import GcTrainModel
    from gcc.model.optim import build_optimizer

    geo = GEOMETRIES[args.geometry or ("tiny" if args.preset == "tiny" else "full")]
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    grad_ckpt = args.grad_ckpt if args.grad_ckpt is not None else args.preset != "tiny"
    dit = build_gc_dit(args.preset, device=device)  # built on meta, initialised module by module on the device
    D = dit.config.text_dim
    model = GcTrainModel(dit, seed=0, null_context=torch.zeros(geo["L"], D), null_id=0, grad_ckpt=grad_ckpt).to(device)
    model.train()
    opt = build_optimizer(model, 1e-5, 1e-4)
    batch = synthetic_batch(args.micro_batch, geo["T"], geo["h"], geo["w"], geo["L"], D, device)
    flops = model_flops(dit.config, geo["T"], geo["h"], geo["w"], geo["L"], args.micro_batch)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = model.loss(model(batch), batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(args.warmup + args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
    s = statistics.median(times)
    if device.type == "cuda":
        mem = f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB (GPU peak allocated)"
    else:
        import psutil

        mem = f"{psutil.Process().memory_info().rss / 2**30:.2f} GiB (process RSS)"
    peak = args.peak_tflops or PEAK_TFLOPS.get(device.type)
    print(
        f"preset {args.preset}, geometry T={geo['T']} h={geo['h']} w={geo['w']} L={geo['L']}, micro-batch "
        f"{args.micro_batch}, {device.type}, {'bf16 autocast' if dtype != torch.float32 else 'fp32'}, "
        f"grad ckpt {grad_ckpt}, single device (no FSDP: the optimizer state is not sharded)"
    )
    print(f"s/micro-batch: {s:.4f} (median of {len(times)})")
    print(f"peak memory: {mem}")
    print(
        f"model FLOP per micro-batch: {flops:.3e}; achieved {flops / s / 1e12:.4g} TFLOP/s; "
        + (f"MFU {flops / s / (peak * 1e12):.1%} of {peak:.0f} TFLOP/s" if peak else "MFU n/a (pass --peak-tflops)")
    )
    if args.preset == "ti2v-5b":
        print(
            f"legacy (accelerate + DeepSpeed ZeRO-2, 4×H200): {LEGACY_S_PER_MICRO} s/micro-batch -> "
            f"ratio legacy/ours {LEGACY_S_PER_MICRO / s:.2f}x"
        )


if __name__ == "__main__":
    main()
