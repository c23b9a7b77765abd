"""Per-GPU memory of the v10 run (yamls/sft_v10.yaml: TI2V-5B, 8 GPUs, micro-batch 1, bf16 compute with fp32
master weights, per-block activation checkpointing) under FSDP2, ZeRO-2-like and ZeRO-3-like. Not a test.

    OMP_NUM_THREADS=2 .venv/bin/python bench/memory_plan.py [--gpus 8] [--tokens-frames 21 --grid 15 26]

Parameters, gradients and AdamW state are counted from the meta-device 5B model (per FSDP unit: the 30 blocks
and the root). Activations are measured: one DiT block of the `wide` preset (the real block shapes) runs its
forward in bf16 on the CPU at the real token count (21 latent frames × 15 × 26 patches = 8,190 tokens, text
512 × 21 cells), and every tensor autograd saves for the backward is counted (`saved_tensors_hooks`, parameters
excluded, each storage once). Under per-block checkpointing a block keeps only its input until the backward
recomputes it; the recomputed block holds the measured amount while its backward runs.

Printed beside the legacy trainer's measured 35.2 GB per GPU (accelerate + DeepSpeed ZeRO-2, 4×H200).
Not counted: the CUDA context and allocator slack (typically 1-3 GB), the loss/head tail, NCCL buffers.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GB = 1e9
LEGACY_GB_PER_GPU = 35.2  # legacy smoke: 4×H200, DeepSpeed ZeRO-2, v10 geometry
LEGACY_GPUS = 4


def saved_activation_bytes(frames: int, gh: int, gw: int, text_len: int) -> tuple[int, int, float]:
    """Bytes autograd saves in one `wide` DiT block's bf16 forward at this geometry (parameters excluded), the
    block input's bytes, and the seconds it took."""
    from gcc.model.dit import build_gc_dit

    dit = build_gc_dit("wide", num_layers=1).to(torch.bfloat16)
    block = dit.blocks[0]
    dim, n = dit.dim, frames * gh * gw
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(1, n, dim, dtype=torch.bfloat16, requires_grad=True)
    ctx = torch.randn(frames, text_len, dim, dtype=torch.bfloat16)
    t_mod = torch.randn(1, n, 6, dim, dtype=torch.bfloat16)
    fr = [tab[:size] for tab, size in zip(dit.freqs, (frames, gh, gw))]
    freqs = torch.cat(
        [
            fr[0].view(frames, 1, 1, -1).expand(frames, gh, gw, -1),
            fr[1].view(1, gh, 1, -1).expand(frames, gh, gw, -1),
            fr[2].view(1, 1, gw, -1).expand(frames, gh, gw, -1),
        ],
        dim=-1,
    ).reshape(n, 1, -1)
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, ctx, t_mod, freqs)
    return sum(seen.values()), x.numel() * x.element_size(), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--frames", type=int, default=21, help="latent frames")
    ap.add_argument("--grid", type=int, nargs=2, default=(15, 26), help="patch grid (latent h/2, w/2)")
    ap.add_argument("--text-len", type=int, default=512)
    args = ap.parse_args()

    from gcc.model.dit import build_gc_dit, count_params

    dit = build_gc_dit("ti2v-5b", device="meta")
    P = count_params(dit)
    P_block = count_params(dit.blocks[0])
    P_root = P - len(dit.blocks) * P_block
    L, W = len(dit.blocks), args.gpus
    tokens = args.frames * args.grid[0] * args.grid[1]
    saved, x_in, secs = saved_activation_bytes(args.frames, *args.grid, args.text_len)
    # shared by every block and kept until the backward: text cells, per-token modulation, RoPE table
    head_dim = dit.dim // dit.blocks[0].num_heads
    shared = (
        args.frames * args.text_len * dit.dim * 2
        + tokens * 6 * dit.dim * 2  # bf16 text cells, modulation
        + tokens * (head_dim // 2) * 8
    )  # complex64 RoPE table

    def sharded(w: int) -> dict[str, float]:
        return {
            f"fp32 master weights (1/{w})": 4 * P / w,
            f"fp32 gradients (1/{w})": 4 * P / w,
            f"AdamW moments, fp32 (1/{w})": 8 * P / w,
        }

    act = {
        "block inputs kept by checkpointing": L * x_in,
        "text / modulation / RoPE (shared)": shared,
        "one block recomputed in its backward (measured)": saved,
        "that block's bf16 + fp32 gradient buffers": 6 * P_block,
    }
    plans = {
        "ZeRO-2-like (reshard_after_forward: false)": {
            "bf16 weights gathered from forward to backward (all units)": 2 * P
        },
        "ZeRO-3-like (reshard_after_forward: true)": {
            "bf16 weights gathered: root + 2 blocks (current, prefetched)": 2 * (P_root + 2 * P_block)
        },
    }
    print(
        f"TI2V-5B: {P / 1e9:.3f} B parameters ({L} blocks of {P_block / 1e6:.1f} M, root {P_root / 1e6:.1f} M); "
        f"{W} GPUs; micro-batch 1 = {tokens} tokens, text {args.frames} × {args.text_len}"
    )
    print(
        f"one block's saved activations measured on CPU (bf16 forward, wide preset): {saved / GB:.2f} GB "
        f"({secs:.0f} s); block input {x_in / GB:.3f} GB"
    )
    for name, gathered in plans.items():
        parts = {**sharded(W), **gathered, **act}
        total = sum(parts.values())
        print(f"\n{name}: {total / GB:.1f} GB per GPU on {W} GPUs")
        for k, v in parts.items():
            print(f"  {v / GB:7.2f} GB  {k}")
        legacy_w = sum({**sharded(LEGACY_GPUS), **gathered, **act}.values())
        print(
            f"  on {LEGACY_GPUS} GPUs: {legacy_w / GB:.1f} GB; the legacy trainer measured {LEGACY_GB_PER_GPU} GB "
            f"there (DeepSpeed ZeRO-2): plan / legacy = {legacy_w / GB / LEGACY_GB_PER_GPU:.2f}"
        )


if __name__ == "__main__":
    main()
