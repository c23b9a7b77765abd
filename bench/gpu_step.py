"""The training step on one GPU, measured as the 8-GPU run takes it (docs/performance.md, "GPU"). Not a test.

    python bench/gpu_step.py [--out DIR]     # a GPU: the v10 geometry, `wide` at 1 and 2 blocks, eager and compiled
    python bench/gpu_step.py --cpu           # the tiny preset and geometry on the CPU, fp32 (tests/test_bench.py)

It needs PyTorch, NumPy, einops, safetensors, Pillow and DiffSynth's package, not Composer, Streaming or gcc's
pinned stack: it runs on a bare PyTorch image with gcc's source and DiffSynth's wheel beside it (a newer torch than
gcc's pinned one is let through gcc's version gate for this process, and said so). The step is the trainer's:
gcc's model (gcc/model/dit.py) and flow-matching objective (gcc/model/flow.py), its blocks wrapped as the yaml says
(activation checkpointing, torch.compile), FSDP2 over one rank with the run's mixed precision (bf16 compute, fp32
master weights and reduction) and resharding after forward, under autocast, AdamW, gradient clipping, and the batch
sent from pinned memory each step as the loader's batches are. A clip at the v10 geometry: 21 latent frames of
30×52 (8,190 tokens), one prompt of 512 rows, per-pixel ids of 81×480×832.

Printed (and written to DIR/gpu_step.json with --out):
* the attention kernel gcc chose (gcc/model/attention.py) and, at the self-attention's shapes, each SDPA backend's
  forward + backward time and its output's error against an fp32 reference (FlashAttention 3 too when installed);
* per configuration (blocks × eager/compiled): s per micro-batch (median), peak reserved GPU memory, the host's
  reads of device values in forward + backward and over the whole step (CUDA's sync debug mode), and the bytes sent
  to the device per micro-batch;
* per mode, the step extrapolated to TI2V-5B's 30 blocks (t1 + 29·(t2 − t1)) and its MFU: the model FLOPs of a
  30-block step (gcc/model/flops.py) over that time and the GPU's peak bf16 rate;
* a checkpoint-sized device-to-host copy (7.5 GB: one rank's share of sft_v10's state on 8 GPUs) into pinned and
  into pageable host memory, as the background save makes it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "A100": 312.0}  # dense bf16, SXM
LEGACY_S_PER_MICRO = 1.2  # the trainer gcc replaces: 4×H200, ZeRO-2, v10 geometry (docs/performance.md)
FULL_BLOCKS = 30  # TI2V-5B


def peak_tflops(name: str, given: float | None) -> float | None:
    if given:
        return given
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


class Timer:
    """Seconds of device work (CUDA events) or wall time (CPU)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def __call__(self, fn, reps: int) -> list[float]:
        times = []
        for _ in range(reps):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return times


def host_reads(fn, cuda: bool) -> int:
    """How many times `fn` makes the host read device values: CUDA's synchronising operations (sync debug mode).
    On a CPU, where every tensor is the host's, the reads gcc.compat.torch.HostReads sees in gcc's own code (the
    optimizer's own scalars, on the host on a GPU too, are not device reads)."""
    if not cuda:
        import gcc
        from gcc.compat.torch import HostReads

        with HostReads() as counter:
            fn()
        return sum(where.startswith(os.path.dirname(gcc.__file__)) for _, where in counter.reads)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return sum("synchroniz" in str(w.message) for w in caught)


def synthetic_batch(geo, vocab: str, pin: bool, seed: int = 0) -> dict:
    """One clip as the loader batches it (gcc.data.dataset.gc_collate): bf16 latents, its one prompt [1, L, D] and
    each latent frame's index into it, uint8 ids over the vocabulary, identities as host lists."""
    from gcc.data.batch import gc_collate
    from gcc.vocab import VOCAB_VALUES

    g = torch.Generator().manual_seed(seed)
    values = torch.tensor(VOCAB_VALUES[vocab], dtype=torch.uint8)
    sample = {
        "input_latents": torch.randn(48, geo.T, geo.h, geo.w, generator=g).to(torch.bfloat16),
        "context": torch.randn(1, geo.text_L, geo.text_D, generator=g).to(torch.bfloat16),
        "context_index": torch.zeros(geo.T, dtype=torch.int64),
        "context_ids": torch.zeros(geo.T, dtype=torch.int64),
        "sem_ids": values[torch.randint(0, len(values), geo.sem_shape, generator=g)],
        "clip_id": "bench",
        "sample_id": 0,
        "epoch": 0,
        "dropped": {"text": False, "cond": False, "mask": 0.0},
    }
    batch = gc_collate([sample])
    if pin:
        batch = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return batch


def build(cfg, device, checkpointing: str, compiled: bool, bf16: bool):
    """The DiT as the trainer builds it under `parallelism: fsdp`: on the meta device, its blocks wrapped, each block
    and then the root made an FSDP2 unit (resharded after forward; bf16 parameters, fp32 reduction), then each
    module initialised on `device` (GcDiT.param_init_fn); and its AdamW."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from gcc.model.config import OptimizerConfig
    from gcc.model.dit import build_gc_dit
    from gcc.model.optim import build_optimizer

    dit = build_gc_dit(cfg, device="meta")
    dit.wrap_blocks(checkpointing, compiled)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    kw = {"reshard_after_forward": True, **({"mp_policy": mp} if mp else {})}
    for block in dit.blocks:
        fully_shard(block, **kw)
    fully_shard(dit, **kw)
    dit.to_empty(device=device)
    for m in dit.modules():
        dit.param_init_fn(m)
    return dit, build_optimizer(dit, OptimizerConfig(lr=1e-5, cond_lr=1e-4))


def measure_step(cfg, geo, device, args, compiled: bool) -> dict:
    from gcc.data.batch import device_bytes
    from gcc.model.flops import train_flops
    from gcc.model.flow import FlowMatching, training_loss, training_outputs
    from gcc.model.fsdp import clip_grad_norm

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    dit, opt = build(cfg, device, args.checkpointing, compiled, bf16=cuda)
    flow = FlowMatching()
    host = synthetic_batch(geo, cfg.vocab, pin=cuda)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else nullcontext()
    counter = {"step": 0}

    def send() -> dict:
        counter["step"] += 1  # each step its own sample: its own draws, as in training
        return {
            **{k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in host.items()},
            "sample_id": [counter["step"]],
        }

    def forward_backward(batch: dict) -> None:
        with autocast:
            loss, _ = training_loss(training_outputs(flow, dit, batch, 0, True), True)
        loss.backward()

    def step() -> None:
        forward_backward(send())
        clip_grad_norm(dit.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    timer = Timer(cuda)
    first = timer(step, 1)[0]  # compilation, cuDNN plans, the allocator's first blocks
    timer(step, max(args.warmup - 1, 0))
    times = timer(step, args.steps)
    reads_fb = host_reads(lambda: forward_backward(send()), cuda)
    opt.zero_grad(set_to_none=True)
    reads_step = host_reads(step, cuda)
    flops = train_flops(
        cfg, samples=1, frames=geo.T, height=geo.h, width=geo.w, text_len=geo.text_L, prompts=sum(host["prompts"])
    )
    if cuda:
        memory = torch.cuda.max_memory_reserved() / 2**30
    else:
        import resource

        memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {
        "blocks": cfg.num_layers,
        "mode": "compiled" if compiled else "eager",
        "s_per_micro_batch": statistics.median(times),
        "s_range": [min(times), max(times)],
        "first_step_s": first,
        "built_and_run_s": time.perf_counter() - t0,
        "peak_memory_gib": memory,
        "host_reads_forward_backward": reads_fb,
        "host_reads_step": reads_step,
        "bytes_to_device": device_bytes(host),
        "model_flops": flops,
    }


def attention_table(device, geo, heads: int, head_dim: int, reps: int) -> list[dict]:
    """Each SDPA backend (and FlashAttention 3 when installed) at the self-attention's shapes: forward + backward
    seconds, and the relative error of its output against the fp32 math result."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from gcc.compat.torch import SDPA_BACKENDS
    from gcc.model.attention import flash3_available

    cuda = device.type == "cuda"
    S = geo.T * (geo.h // 2) * (geo.w // 2)
    dtype = torch.bfloat16 if cuda else torch.float32
    g = torch.Generator(device).manual_seed(0)
    q, k, v = (torch.randn(1, heads, S, head_dim, generator=g, device=device, dtype=dtype) for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    timer, rows = Timer(cuda), []
    kernels = {name: lambda a, b, c, b_=b: _sdpa(a, b, c, b_) for name, b in SDPA_BACKENDS.items()}
    if flash3_available(device):
        import flash_attn_interface

        def fa3(a, b, c):
            out = flash_attn_interface.flash_attn_func(*(t.transpose(1, 2) for t in (a, b, c)))
            return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)

        kernels["flash3"] = fa3
    for name, kernel in kernels.items():
        row: dict = {"backend": name}
        try:
            qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
            out = kernel(qq, kk, vv)
            row["rel_error_vs_fp32"] = float((out.float() - ref).norm() / ref.norm())

            def fwd_bwd(qq=qq, kk=kk, vv=vv, kernel=kernel):
                kernel(qq, kk, vv).sum().backward()

            fwd_bwd()
            row["s_forward_backward"] = statistics.median(timer(fwd_bwd, reps))
        except RuntimeError as e:  # a backend that cannot take these inputs on this device: say so
            row["error"] = f"not available here ({str(e).splitlines()[0][:70]})"
        rows.append(row)
        if cuda:
            torch.cuda.empty_cache()
    return rows


def at_shapes(q_shape, kv_shape, dtype, device) -> str:
    from gcc.model.attention import backends_at

    try:
        return backends_at(q_shape, kv_shape, dtype, device)
    except Exception as e:  # torch's private choice function, on a torch gcc was not verified with
        return f"unknown ({type(e).__name__})"


def _sdpa(q, k, v, backend):
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v)


def copy_table(gb: float, reps: int = 2) -> list[dict]:
    """A device-to-host copy of `gb` GB into pinned and into pageable host memory (first and second copy: the
    first into pageable memory also faults its pages in)."""
    n = int(gb * 1e9)
    src = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(7)
    rows = []
    for kind in ("pinned", "pageable"):
        dst = torch.empty(n, dtype=torch.uint8, pin_memory=kind == "pinned")
        for i in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=kind == "pinned")
            torch.cuda.synchronize()
            s = time.perf_counter() - t0
            rows.append({"host_memory": kind, "copy": i + 1, "s": s, "gb_per_s": n / s / 1e9})
        del dst
    return rows


def main() -> int:
    # before gcc is imported: a bare image's torch is newer than gcc's pinned one, and this bench runs on it (its
    # lines name the version); gcc keeps inductor to one compile thread in a run (gcc/compat/diffsynth.py), and here
    # compiling is much of the work
    os.environ.setdefault("GCC_UNVERIFIED_LIBS", "torch")
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(min(os.cpu_count() or 1, 16)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="the tiny preset and geometry on the CPU, fp32")
    ap.add_argument("--preset", default=None, help="model preset (default: wide on a GPU, tiny with --cpu)")
    ap.add_argument("--geometry", default=None, help="full | tiny | wide (default: full on a GPU, tiny with --cpu)")
    ap.add_argument("--blocks", default="1,2", help="block counts to run (the first two give the 30-block estimate)")
    ap.add_argument("--modes", default="eager,compiled", help="eager, compiled or both")
    ap.add_argument(
        "--checkpointing", default="block", help="block | selective | none (model.activation_checkpointing)"
    )
    ap.add_argument("--steps", type=int, default=5, help="timed steps per configuration")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (the first compiles)")
    ap.add_argument("--copy-gb", type=float, default=7.5, help="size of the device-to-host copy (GPU only)")
    ap.add_argument(
        "--no-sdpa-table",
        action="store_true",
        help="skip the table of attention kernels (on a CPU at the full geometry, SDPA's math backend would hold the "
        "whole [8190, 8190] attention matrices of 24 heads: more memory than a 24 GB host has)",
    )
    ap.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: by its name)")
    ap.add_argument("--out", default=None, help="folder for gpu_step.json")
    args = ap.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("no GPU visible: run with --cpu for the CPU form", file=sys.stderr)
        return 2

    from gcc.model.attention import current_kernel, select_attention
    from gcc.model.dit import model_config
    from gcc.model.flops import train_flops
    from gcc.synth.world import GEOMETRIES

    device = torch.device("cpu" if args.cpu else "cuda")
    cuda = device.type == "cuda"
    preset = args.preset or ("tiny" if args.cpu else "wide")
    geo = GEOMETRIES[args.geometry or ("tiny" if args.cpu else "full")]
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:  # gcc's private SDPA calls (gcc/compat/torch.py) were verified on its pinned torch, not this one
        kernel = select_attention("auto", device)
    except Exception as e:
        print(f"attention: gcc's kernel choice failed on torch {torch.__version__} ({e!r}); SDPA's own order")
        kernel = current_kernel()
    base = model_config(preset)
    heads, hd = base.num_heads, base.dim // base.num_heads
    n_tok = (geo.h // 2) * (geo.w // 2)
    name = torch.cuda.get_device_name() if cuda else "CPU"
    peak = peak_tflops(name, args.peak_tflops) if cuda else None
    dtype = torch.bfloat16 if cuda else torch.float32
    report: dict = {
        "device": name,
        "torch": torch.__version__,
        "preset": preset,
        "geometry": {"T": geo.T, "h": geo.h, "w": geo.w, "tokens": geo.T * n_tok, "text": [geo.text_L, geo.text_D]},
        "checkpointing": args.checkpointing,
        "attention": kernel.describe(),
        "attention_at_shapes": {
            "self": at_shapes((1, heads, geo.T * n_tok, hd), (1, heads, geo.T * n_tok, hd), dtype, device),
            "cross": at_shapes((geo.T, heads, n_tok, hd), (geo.T, heads, geo.text_L, hd), dtype, device),
        },
        "peak_tflops": peak,
    }
    print(
        f"{name}, torch {torch.__version__}; preset {preset}, {geo.T}x{geo.h}x{geo.w} latents = "
        f"{geo.T * n_tok} tokens, text {geo.text_L}x{geo.text_D}; checkpointing {args.checkpointing}; "
        f"{'FSDP2 on 1 rank, bf16 compute / fp32 master' if cuda else 'FSDP2 on 1 rank, fp32'}"
    )
    print(
        f"attention: {kernel.describe()}; at these shapes self-attention "
        f"{report['attention_at_shapes']['self']}, cross-attention {report['attention_at_shapes']['cross']}"
    )

    report["sdpa"] = [] if args.no_sdpa_table else attention_table(device, geo, heads, hd, reps=3 if cuda else 1)
    if report["sdpa"]:
        print("\nattention kernels at the self-attention's shapes (forward + backward; error of the output vs fp32):")
    for r in report["sdpa"]:
        line = r.get("error") or f"{r['s_forward_backward'] * 1e3:9.2f} ms   error {r['rel_error_vs_fp32']:.2e}"
        print(f"  {r['backend']:10} {line}")

    blocks = [int(b) for b in args.blocks.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]
    report["steps"] = []
    print(
        f"\n{'blocks':>6} {'mode':>9} {'s/micro-batch':>14} {'first step':>11} {'peak GiB':>9} "
        f"{'reads f+b':>9} {'reads step':>10} {'MB to device':>12}"
    )
    for mode in modes:
        for nb in blocks:
            r = measure_step(model_config(preset, num_layers=nb), geo, device, args, compiled=mode == "compiled")
            report["steps"].append(r)
            print(
                f"{nb:>6} {mode:>9} {r['s_per_micro_batch']:>14.4f} {r['first_step_s']:>10.1f}s "
                f"{r['peak_memory_gib']:>9.2f} {r['host_reads_forward_backward']:>9} {r['host_reads_step']:>10} "
                f"{r['bytes_to_device'] / 1e6:>12.1f}"
            )
    full = base.__class__(**{**base.to_dict(), "num_layers": FULL_BLOCKS, "patch_size": tuple(base.patch_size)})
    flops30 = train_flops(full, samples=1, frames=geo.T, height=geo.h, width=geo.w, text_len=geo.text_L, prompts=1)
    report["extrapolated"] = []
    if len(blocks) >= 2:
        print(f"\nextrapolated to {FULL_BLOCKS} blocks: t1 + {FULL_BLOCKS - 1} x (t2 - t1), model FLOPs {flops30:.3e}")
        for mode in modes:
            by = {r["blocks"]: r["s_per_micro_batch"] for r in report["steps"] if r["mode"] == mode}
            b1, b2 = blocks[0], blocks[1]
            per_block = (by[b2] - by[b1]) / (b2 - b1)
            t30 = by[b1] + (FULL_BLOCKS - b1) * per_block
            mfu = flops30 / t30 / (peak * 1e12) if peak else None
            report["extrapolated"].append(
                {"mode": mode, "s_per_micro_batch": t30, "s_per_block": per_block, "mfu": mfu}
            )
            print(
                f"  {mode:>9}: {t30:.3f} s per micro-batch ({per_block * 1e3:.1f} ms per block)"
                + (f", MFU {mfu:.1%} of {peak:.0f} TFLOP/s" if mfu else "")
                + (
                    f"; the legacy trainer's {LEGACY_S_PER_MICRO} s / this = {LEGACY_S_PER_MICRO / t30:.2f}x"
                    if cuda
                    else ""
                )
            )
    if cuda and args.copy_gb > 0:
        report["copy"] = copy_table(args.copy_gb)
        print(f"\n{args.copy_gb} GB device -> host (a background save's copy):")
        for r in report["copy"]:
            print(f"  {r['host_memory']:>8} copy {r['copy']}: {r['s']:.2f} s, {r['gb_per_s']:.1f} GB/s")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_step.json").write_text(json.dumps(report, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
