"""The cost of the samples logged during training (docs/sample.md), as a share of the training time between two
sampling rounds, for sft_v10's settings. Not a test.

    OMP_NUM_THREADS=2 .venv/bin/python bench/sample_cost.py     # wide preset, 3 x 16 x 32 latents, CPU: ~5 min

Measured here, in one process, all at one geometry (`--frames/--height/--width`, full text rows):
* `train`: one micro-batch of training as a rank runs it in production: `GcTrainModel.loss(forward(batch))`,
  backward, with per-block activation checkpointing, 1 clip;
* `sample`: one denoising step of the sampler (`gcc.sampling.sampler.sample_latents`, one clip, no guidance: one
  forward under no_grad);
* `decode`: one `WanVideoVAE38` decode of the clip's latents (the published architecture, z 48, dim 160;
  random weights: the time does not depend on them).
The DiT sides are measured with the `wide` preset (the real TI2V-5B block: dim 3072, ffn 14336, 24 heads) at 1
and 2 blocks and extrapolated to the 5B's 30 blocks (t = t1 + 29 (t2 - t1)); the baseline (the training) is
measured in the same run. Then, for `--gpus`, `--global_batch`, `--micro_batch`, `--val_every`, `--sample_every`,
`--sample_n`, `--sample_steps` (sft_v10's by default):

    round   = ceil(sample_n / gpus) x 2 variants x (sample_steps x sample + decode)   (the GT's decode is kept
              from the first round: one more decode a clip, once per launch)
    between = val_every x sample_every x (global_batch / (gpus x micro_batch)) x train
    share   = round / (round + between)

The geometry is small so that it runs on a CPU: at the v10 geometry (8,190 tokens) attention weighs more in both
DiT sides alike, and the VAE's share (convolutions, linear in the pixels) is smaller than measured here.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_step import make_batch, pick_geometry  # bench/: the same batch as the peer bench

from gcc.data.batch import split_batch
from gcc.model.dit import build_gc_dit, model_config
from gcc.model.objective import GcTrainModel
from gcc.sampling.sampler import clip_noise, sample_latents


def timed(fn, reps: int) -> float:
    """The median of `reps` timed calls, after one untimed call."""
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def dit_times(blocks: int, geo: dict, reps: int) -> tuple[float, float]:
    """(train micro-batch s, one sampling step s) of the `wide` preset with `blocks` blocks."""
    dit = build_gc_dit("wide", num_layers=blocks, init_seed=0)
    with torch.no_grad():
        for p in dit.gc_sem_cond.proj_out.parameters():  # an active condition path, as after training starts
            p.normal_(0, 0.5)
    batch, _ = make_batch(geo, "parts", 2)
    one = split_batch(batch, 1)[0]  # micro_batch 1
    dit.wrap_blocks("block")
    model = GcTrainModel(dit, seed=0, null_context=batch["context"][0, 0]).train()

    def train():
        model.loss(model(one), one).backward()
        model.zero_grad(set_to_none=True)

    t_train = timed(train, reps)
    model.eval()
    lat = one["input_latents"][0]

    def sample():
        sample_latents(
            dit,
            lat[:, 0:1].float(),
            one["context"][0, : one["prompts"][0]],
            one["context_index"][0],
            one["context"][0, 0],
            one["sem_ids"][0],
            clip_noise(0, "bench", tuple(lat.shape)),
            steps=1,
        )

    t_sample = timed(sample, reps)
    return t_train, t_sample


def vae_decode_time(geo: dict, reps: int) -> float:
    from gcc.compat.diffsynth import WanVideoVAE38
    from gcc.sampling.vae import vae_decode

    torch.manual_seed(0)
    vae = WanVideoVAE38(z_dim=48, dim=160).eval()
    lat = torch.randn(48, geo["T"], geo["h"], geo["w"])
    return timed(lambda: vae_decode(vae, lat, "cpu"), reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=3)
    ap.add_argument("--height", type=int, default=16)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3, help="timed calls of each DiT side (after one untimed)")
    ap.add_argument("--decode_reps", type=int, default=1, help="timed VAE decodes (after one untimed; ~1.5 min each)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--global_batch", type=int, default=16)
    ap.add_argument("--micro_batch", type=int, default=1)
    ap.add_argument("--val_every", type=int, default=500)
    ap.add_argument("--sample_every", type=int, default=2)
    ap.add_argument("--sample_n", type=int, default=2)
    ap.add_argument("--sample_steps", type=int, default=20)
    ap.add_argument("--blocks", type=int, default=30, help="the blocks to extrapolate to (TI2V-5B: 30)")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = model_config("wide")
    geo = pick_geometry(
        argparse.Namespace(
            preset="wide", geometry="full", frames=args.frames, height=args.height, width=args.width, text_len=None
        ),
        cfg,
    )
    t1 = dit_times(1, geo, args.reps)
    t2 = dit_times(2, geo, args.reps)
    train, sample = (a + (args.blocks - 1) * (b - a) for a, b in zip(t1, t2))
    decode = vae_decode_time(geo, args.decode_reps)
    slots = math.ceil(args.sample_n / args.gpus)
    accum = args.global_batch // (args.gpus * args.micro_batch)
    round_s = slots * 2 * (args.sample_steps * sample + decode)
    between = args.val_every * args.sample_every * accum * train
    print(
        f"geometry: {geo['T']} latent frames x {geo['h']}x{geo['w']} ({geo['tokens']} tokens), text {geo['L']} rows; "
        f"wide preset, 1 and 2 blocks measured, extrapolated to {args.blocks}; CPU, {torch.get_num_threads()} threads"
    )
    print(
        f"  wide x1: train {t1[0]:.3f} s, sampling step {t1[1]:.3f} s; x2: train {t2[0]:.3f} s, sampling step "
        f"{t2[1]:.3f} s"
    )
    print(
        f"  x{args.blocks}: train micro-batch {train:.2f} s, sampling step {sample:.2f} s (ratio {sample / train:.3f}); "
        f"VAE decode {decode:.2f} s ({decode / train:.3f} x train)"
    )
    print(
        f"  round: {slots} clip(s) a rank x 2 variants x ({args.sample_steps} steps + a decode) = "
        f"{round_s:.1f} s; between rounds: {args.val_every} x {args.sample_every} steps x {accum} micro-batches = "
        f"{between:.0f} s"
    )
    share = round_s / (round_s + between)
    print(f"share of training time: {100 * share:.2f} % (target < 2 %)")


if __name__ == "__main__":
    main()
