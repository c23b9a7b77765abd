"""Per-GPU memory of the v10 run (yamls/sft_v10.yaml: TI2V-5B, 8 GPUs, micro-batch 1, bf16 compute with fp32
master weights) under FSDP2, for each choice the yaml offers: weights resharded after forward or kept gathered
(`fsdp.reshard_after_forward`), and activation checkpointing per block, selective or none
(`model.activation_checkpointing`). Not a test.

    OMP_NUM_THREADS=2 .venv/bin/python bench/memory_plan.py [--gpus 8] [--frames 21 --grid 15 26]

Parameters, gradients and AdamW state are counted from the meta-device 5B model (per FSDP unit: the 30 blocks and
the root). Activations are measured: one DiT block of the `wide` preset (the real block shapes) runs its forward in
bf16 on the CPU at the real token count (21 latent frames × 15 × 26 patches = 8,190 tokens, one prompt of 512
rows), and every tensor autograd saves for the backward is counted (`saved_tensors_hooks`, parameters excluded,
each storage once), and so are the outputs of the attention kernels, which `selective` keeps
(gcc/model/block_wrap.py SAVED_OPS). A checkpointed block keeps its input (and under `selective` those outputs)
until the backward recomputes it; the recomputed block holds the measured amount while its backward runs.

Printed beside the legacy trainer's measured 35.2 GB per GPU (accelerate + DeepSpeed ZeRO-2, 4×H200).
Not counted: the CUDA context and allocator slack (typically 1-3 GB), the loss/head tail, NCCL buffers.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GB = 1e9
LEGACY_GB_PER_GPU = 35.2  # legacy smoke: 4×H200, DeepSpeed ZeRO-2, v10 geometry
LEGACY_GPUS = 4


class OutputBytes(TorchDispatchMode):
    """The bytes of the tensors `ops` return while active."""

    def __init__(self, ops):
        super().__init__()
        self.ops, self.bytes = ops, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.ops:
            self.bytes += sum(t.nbytes for t in (out if isinstance(out, tuple) else (out,)) if hasattr(t, "nbytes"))
        return out


def block_activations(frames: int, gh: int, gw: int, text_len: int) -> tuple[int, int, int, float]:
    """One `wide` DiT block's bf16 forward at this geometry: the bytes autograd saves (parameters excluded), those
    of its attention kernels' outputs, of its input, and the seconds it took."""
    from gcc.model.block_wrap import SAVED_OPS
    from gcc.model.blocks import FrameContext, rope_tables
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
    ctx = FrameContext(torch.randn(1, text_len, dim, dtype=torch.bfloat16), torch.zeros(frames, dtype=torch.long))
    t_mod = torch.randn(1, frames, 6, dim, dtype=torch.bfloat16)
    freqs = rope_tables(dim // dit.config.num_heads, (frames, gh, gw), "cpu")
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), OutputBytes(SAVED_OPS) as attention:
        block(x, ctx, t_mod, freqs)
    return sum(seen.values()), attention.bytes, x.numel() * x.element_size(), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--frames", type=int, default=21, help="latent frames")
    ap.add_argument("--grid", type=int, nargs=2, default=(15, 26), help="patch grid (latent h/2, w/2)")
    ap.add_argument("--text-len", type=int, default=512)
    ap.add_argument("--prompts", type=int, default=2, help="distinct prompts of a clip (their embeddings are kept)")
    args = ap.parse_args()

    from gcc.model.dit import build_gc_dit, count_params

    dit = build_gc_dit("ti2v-5b", device="meta")
    P = count_params(dit)
    P_block = count_params(dit.blocks[0])
    P_root = P - len(dit.blocks) * P_block
    L, W = len(dit.blocks), args.gpus
    tokens = args.frames * args.grid[0] * args.grid[1]
    saved, attention, x_in, secs = block_activations(args.frames, *args.grid, args.text_len)
    head_dim = dit.dim // dit.config.num_heads
    # shared by every block and kept until the backward: the embedded prompts, the modulation per latent frame, the
    # RoPE tables (float32 cos and sin)
    shared = args.prompts * args.text_len * dit.dim * 2 + args.frames * 6 * dit.dim * 2 + tokens * head_dim * 4

    def sharded(w: int) -> dict[str, float]:
        return {
            f"fp32 master weights (1/{w})": 4 * P / w,
            f"fp32 gradients (1/{w})": 4 * P / w,
            f"AdamW moments, fp32 (1/{w})": 8 * P / w,
        }

    gathered = {
        "kept gathered (reshard_after_forward: false)": {
            "bf16 weights gathered from forward to backward (all units)": 2 * P
        },
        "resharded (reshard_after_forward: true)": {
            "bf16 weights gathered: root + 2 blocks (current, prefetched)": 2 * (P_root + 2 * P_block)
        },
    }
    common = {"prompts / modulation / RoPE tables (shared)": shared, "one block's bf16 + fp32 gradients": 6 * P_block}
    activations = {
        "none": {"every block's saved activations (measured)": L * saved},
        "block": {
            "block inputs kept by checkpointing": L * x_in,
            "one block recomputed in its backward (measured)": saved,
        },
        "selective": {
            "block inputs and attention outputs kept": L * (x_in + attention),
            "one block recomputed in its backward (measured)": saved,
        },
    }
    print(
        f"TI2V-5B: {P / 1e9:.3f} B parameters ({L} blocks of {P_block / 1e6:.1f} M, root {P_root / 1e6:.1f} M); "
        f"{W} GPUs; micro-batch 1 = {tokens} tokens, {args.prompts} prompt(s) of {args.text_len} rows"
    )
    print(
        f"one block measured on CPU (bf16 forward, wide preset, {secs:.0f} s): saved activations {saved / GB:.2f} GB, "
        f"of which attention outputs {attention / GB:.3f} GB; block input {x_in / GB:.3f} GB"
    )
    summary = []
    for weights, gathered_parts in gathered.items():
        for ckpt, act in activations.items():
            parts = {**sharded(W), **gathered_parts, **act, **common}
            total = sum(parts.values())
            legacy_w = sum({**sharded(LEGACY_GPUS), **gathered_parts, **act, **common}.values())
            summary.append((weights, ckpt, total, legacy_w))
            print(f"\nweights {weights}, activation checkpointing {ckpt}: {total / GB:.1f} GB per GPU on {W} GPUs")
            for k, v in parts.items():
                print(f"  {v / GB:7.2f} GB  {k}")
    print(f"\n{'weights':44} {'checkpointing':>13} {f'GB/GPU ({W})':>13} {f'GB/GPU ({LEGACY_GPUS})':>13}")
    for weights, ckpt, total, legacy_w in summary:
        print(f"{weights:44} {ckpt:>13} {total / GB:>13.1f} {legacy_w / GB:>13.1f}")
    print(
        f"the legacy trainer measured {LEGACY_GB_PER_GPU} GB per GPU on {LEGACY_GPUS} GPUs (DeepSpeed ZeRO-2, "
        f"block checkpointing): compare the kept-gathered / block row's {LEGACY_GPUS}-GPU figure"
    )


if __name__ == "__main__":
    main()
