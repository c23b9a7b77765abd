"""One training step of gcc's objective vs DiffSynth's own Wan training step, same weights, same batch. Not a test.

    OMP_NUM_THREADS=1 .venv/bin/python bench/peer_step.py --preset tiny --steps 4           # smoke, seconds
    OMP_NUM_THREADS=1 .venv/bin/python bench/peer_step.py --preset wide --blocks 1 --frames 3 --steps 2
    .venv/bin/python bench/peer_step.py --preset wide --blocks 1 --geometry full --steps 5     # 8,190 tokens
    .venv/bin/python bench/peer_step.py --preset wide --geometry full --steps 10 --device cuda  # on a GPU

The second line is real width (dim 3072, ffn 14336, 24 heads, text 4096 x 512 rows) at 3 latent frames of 30x52
cells (1,170 tokens per clip): about a minute per step on one CPU core. The third is the v10 geometry (21 latent
frames, 8,190 tokens per clip): minutes per step on a CPU. Neither command is part of the test suite.

The two sides (fp32, batch 2, no gradient checkpointing, one process, `--device`, CPU by default):

* gcc: `GcTrainModel` (gcc/model/objective.py) around a `GcDiT`: `loss(forward(batch), batch).backward()`. The
  batch is built as the loader's `gc_collate` makes it (bf16 latents, each clip's distinct prompts and each latent
  frame's index among them, uint8 sem ids, sample ids and epochs as host lists, ...): one prompt per clip as on
  DiffSynth's side (`--prompts 2`: two, over the first and the second half of its frames) and an active
  condition (random sem ids over the whole vocabulary, `gc_sem_cond.proj_out` given random weights).
* DiffSynth: its own training path for the same model. A `WanVideoPipeline(device, float32)` whose `dit` is a
  plain DiffSynth `WanModel` with the GcDiT's Wan weights (its state dict less the `gc_sem_cond.*` keys),
  scheduler `FlowMatchScheduler("Wan")` set for training (1000 steps, shift 5); the step is
  `FlowMatchSFTLoss(pipe, **inputs).backward()`, which calls `pipe.model_fn` = `model_fn_wan_video` with
  `fuse_vae_embedding_in_latents=True` and `first_frame_latents` (TI2V-5B: latent frame 0 clean, left out of the
  loss). Inputs: the same latents, one prompt per clip ([B, L, D], the clip's first prompt), converted to fp32
  inside the step as DiffSynth's training module does (`transfer_data_to_device(..., torch_float_dtype)`).
  Like DiffSynth's trainer, the pipeline units (text encoder, VAE) are not run: latents and text are given.

Equivalence check (printed first): fresh `gc_sem_cond` (proj_out is zero-initialised, so the condition adds an
exact 0 although its path runs on random sem ids), one prompt for every frame of a clip, and the same timestep
and noise on both sides, each through its full training path:
* timestep: gcc draws (t, eps) per sample from (seed, sample_id, epoch), DiffSynth one t per batch from the
  global RNG. The two sample ids are chosen so that gcc draws the same t for both, and DiffSynth's draw is
  pinned to that index with its own `min/max_timestep_boundary` inputs (a window of one index);
* noise: gcc's eps (its two per-sample draws) is what DiffSynth's `torch.randn_like` returns during the call
  (`torch.randn_like` is swapped for the duration of that one call, checked to be asked for the latents' shape).
Everything else (add_noise, clean frame 0, target, the per-token timesteps with frame 0 at t = 0, the text
embedding, attention, loss reduction and weight) is each side's own code. The losses should agree to float
rounding and so should the gradients of every Wan parameter (max over tensors of max|dg| / max|g|). Expected
differences, all reorderings of the same sums: DiffSynth embeds the timestep per token ([1, T*n] rows) where gcc
embeds it per latent frame ([B*T] rows) and broadcasts; gcc's cross-attention runs per frame
(queries reshaped to [B*T, n, dim]), DiffSynth's per clip; the loss is a mean of per-sample means vs one mean.

Timing: after `--warmup` steps per side, `--steps` steps per side interleaved (gcc, DiffSynth, gcc, ...), each
timed alone (gradients set to None before it, outside the timing); median s/step per side and the ratio
gcc / DiffSynth. Target: gcc <= 0.90x DiffSynth's step (one prompt per clip on both sides), from less memory-bound
work per block (gcc/model/blocks.py: the modulation per latent frame, fused multiply-adds, real-valued RoPE).

Where the time goes (`--share-steps` extra, instrumented steps per side, after the timed ones, so the hooks cost
nothing in the timed figures): forward = between a module's forward pre-hook and forward hook (`class_fractions`,
a function, is wrapped); backward = from the moment the autograd engine starts the module's output node (a hook
on the output tensor) to the last accumulation of one of the module's parameter gradients
(`register_post_accumulate_grad_hook`). On the CPU (and on one CUDA stream) the engine runs a module's backward
nodes one after another (their sequence numbers are above everything still pending), so the window is the
module's backward. On CUDA each hook synchronises. Reported: (a) the condition path, `class_fractions` +
`gc_sem_cond` forward and backward; (b) `text_embedding`; and, to read the ratio, (c) `time_embedding` +
`time_projection`, which DiffSynth runs on T*n token rows (a [T*n, 6*dim] projection) where gcc runs B*T frame
rows, and (d) the DiT blocks. Target: the condition < 3% of gcc's step at full geometry (`--geometry full`, 21
latent frames × 30×52 cells = 8,190 tokens).

Reading the ratio with few blocks. Apart from the condition, the two steps differ in work by design: with
`--prompts 2` the gcc batch has 2 prompts per clip, so `text_embedding` and each block's cross-attention key/value
projections run on 4 prompts' rows where DiffSynth's run on 2; gcc keeps the modulation per latent frame
([B, T, 6, dim]) where DiffSynth's is per token ([1, T*n, 6, dim]); and DiffSynth's per-token time projection
above. These do not grow with depth the same way the blocks do, so for a model of the real
width with fewer than TI2V-5B's 30 blocks the script also prints each side's step extrapolated to 30 blocks (its
timed median plus the missing blocks at its measured mean block time) and the condition's share of that.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
B = 2
SEED = 0
FULL = dict(T=21, h=30, w=52, L=512)  # v10 (gcc/synth/world.py GEOMETRIES["full"])


def pick_geometry(args, cfg) -> dict:
    from gcc.synth.world import GEOMETRIES

    name = args.geometry or ("tiny" if args.preset == "tiny" else "full")
    g = GEOMETRIES[name]
    geo = dict(T=g.T, h=g.h, w=g.w, L=g.text_L, D=cfg.text_dim, name=name)
    for key, val in (("T", args.frames), ("h", args.height), ("w", args.width), ("L", args.text_len)):
        if val is not None:
            geo[key] = val
    if geo["h"] % cfg.patch_size[1] or geo["w"] % cfg.patch_size[2]:
        raise SystemExit(f"latent {geo['h']}x{geo['w']} is not a multiple of the patch {cfg.patch_size[1:]}")
    geo["n"] = (geo["h"] // cfg.patch_size[1]) * (geo["w"] // cfg.patch_size[2])
    geo["tokens"] = geo["T"] * geo["n"]
    return geo


def make_batch(geo: dict, vocab: str, prompts_per_clip: int, seed: int = SEED):
    """A batch as gc_collate makes it, plus DiffSynth's context (each clip's first prompt, [B, L, D])."""
    import torch

    from gcc.data.batch import gc_collate
    from gcc.geometry import Geometry
    from gcc.vocab import VOCAB_VALUES

    T, L, D = geo["T"], geo["L"], geo["D"]
    P = min(prompts_per_clip, T)
    g = torch.Generator().manual_seed(seed)
    F, H, W = Geometry(T=T, h=geo["h"], w=geo["w"], text_L=L, text_D=D).sem_shape
    table = torch.randn(B * P, L, D, generator=g).to(torch.bfloat16)  # the text table's rows (bf16, as stored)
    values = torch.tensor(VOCAB_VALUES[vocab], dtype=torch.uint8)
    latents = torch.randn(B, 48, T, geo["h"], geo["w"], generator=g).to(torch.bfloat16)
    sem = values[torch.randint(0, len(values), (B, F, H, W), generator=g)]
    index = (torch.arange(T) * P) // T  # clip b: its first prompt over the first frames, its next over the rest
    samples = [
        {
            "input_latents": latents[b],
            "context": table[b * P : (b + 1) * P],  # the clip's distinct prompts, as the loader sends them
            "context_index": index,
            "context_ids": b * P + index,
            "sem_ids": sem[b],
            "clip_id": f"peer{b}",
            "sample_id": b,
            "epoch": 0,
            "dropped": {"text": False, "cond": False, "mask": 0.0},
        }
        for b in range(B)
    ]
    return gc_collate(samples), table[torch.arange(B) * P]


def to_device(batch: dict, device) -> dict:
    return {k: (v.to(device) if hasattr(v, "to") else v) for k, v in batch.items()}  # lists stay on the host


def build_pipe(dit, device):
    """DiffSynth's WanVideoPipeline for training, its dit a plain WanModel holding the GcDiT's Wan weights."""
    import torch
    from diffsynth.pipelines.wan_video import WanVideoPipeline

    from gcc.compat.diffsynth import FlowMatchScheduler, WanModel, precompute_freqs_cis_3d
    from gcc.model.dit import COND_PREFIX

    with torch.device("meta"):
        wan = WanModel(**dit.config.wan_kwargs())
    sd = {k: v.detach().clone() for k, v in dit.state_dict().items() if not k.startswith(COND_PREFIX)}
    wan.load_state_dict(sd, strict=True, assign=True)
    wan.freqs = precompute_freqs_cis_3d(dit.config.dim // dit.config.num_heads)  # built on meta above, as WanModel does
    for p in wan.parameters():
        p.requires_grad_(True)
    pipe = WanVideoPipeline(device=device, torch_dtype=torch.float32)
    pipe.dit = wan.to(device).train()
    pipe.scheduler = FlowMatchScheduler("Wan")
    pipe.scheduler.set_timesteps(1000, training=True, shift=5.0)
    return pipe


@contextlib.contextmanager
def pinned_noise(eps):
    """DiffSynth's FlowMatchSFTLoss draws its noise with torch.randn_like: return `eps` for that one call."""
    import torch

    orig, calls = torch.randn_like, []

    def fixed(t, *a, **k):
        if tuple(t.shape) != tuple(eps.shape):
            raise RuntimeError(f"randn_like asked for {tuple(t.shape)}, pinned noise is {tuple(eps.shape)}")
        calls.append(1)
        return eps.to(t.device, t.dtype).clone()

    torch.randn_like = fixed
    try:
        yield
    finally:
        torch.randn_like = orig
    if len(calls) != 1:
        raise RuntimeError(f"expected one randn_like call in FlowMatchSFTLoss, got {len(calls)}")


def ds_inputs(latents, context, **extra) -> dict:
    x0 = latents.float()  # DiffSynth's training module converts float inputs to the pipeline's dtype
    return dict(
        input_latents=x0,
        context=context.float(),
        first_frame_latents=x0[:, :, 0:1],
        fuse_vae_embedding_in_latents=True,
        **extra,
    )


def equivalence(model, pipe, batch, ds_ctx) -> dict:
    """Same t, same noise, zero condition, one prompt per clip: both losses and the Wan gradients."""
    import torch
    from diffsynth.diffusion.loss import FlowMatchSFTLoss

    from gcc.model.dit import wan_keys
    from gcc.model.flow import train_draw

    x0 = batch["input_latents"]
    dev = x0.device
    # one prompt for every frame: each clip's first prompt
    one = dict(
        batch,
        context=batch["context"][:, :1],
        context_index=torch.zeros_like(batch["context_index"]),
        prompts=[1] * B,
    )
    first = {}  # the first two sample ids whose gcc draws share a timestep index (DiffSynth has one t per batch)
    sid = 0
    while True:
        tid = int(train_draw(model.seed, sid, 0, (1,), len(model.scheduler.timesteps), dev)[0])
        if tid in first:
            sids = [first[tid], sid]
            break
        first[tid] = sid
        sid += 1
    one["sample_id"] = sids
    one["epoch"] = [0] * B
    n_t = len(model.scheduler.timesteps)
    eps = torch.stack([train_draw(model.seed, s, 0, x0.shape[1:], n_t, dev)[1] for s in sids])

    model.zero_grad(set_to_none=True)
    pipe.dit.zero_grad(set_to_none=True)
    out = model(one)
    loss_gcc = model.loss(out, one)
    loss_gcc.backward()
    assert float(out["sem_rms"]) == 0.0, "the condition is not zero"
    n = len(pipe.scheduler.timesteps)
    with pinned_noise(eps):
        loss_ds = FlowMatchSFTLoss(
            pipe, **ds_inputs(x0, ds_ctx, min_timestep_boundary=(tid + 0.5) / n, max_timestep_boundary=(tid + 1.5) / n)
        )
    loss_ds.backward()

    gp = dict(model.dit.named_parameters())
    wp = dict(pipe.dit.named_parameters())
    worst, worst_name, d2, g2 = 0.0, "", 0.0, 0.0
    for k in wan_keys(model.dit):
        if k not in gp:  # a buffer
            continue
        a, b = gp[k].grad, wp[k].grad
        if a is None or b is None:
            raise RuntimeError(f"{k}: no gradient on the {'gcc' if a is None else 'DiffSynth'} side")
        a, b = a.double(), b.double()
        rel = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
        d2 += float((a - b).pow(2).sum())
        g2 += float(b.pow(2).sum())
        if rel > worst:
            worst, worst_name = rel, k
    lg, ld = float(loss_gcc), float(loss_ds)
    model.zero_grad(set_to_none=True)
    pipe.dit.zero_grad(set_to_none=True)
    return dict(
        sids=sids,
        tid=tid,
        t=float(model.scheduler.timesteps[tid]),
        loss_gcc=lg,
        loss_ds=ld,
        loss_rel=abs(lg - ld) / abs(ld),
        grad_rel=worst,
        grad_worst=worst_name,
        grad_rel_norm=(d2 / g2) ** 0.5,
        n_tensors=len([k for k in wan_keys(model.dit) if k in gp]),
    )


class ModuleClock:
    """Forward and backward seconds of some modules in one step (see the module docstring for the method)."""

    def __init__(self, modules, sync):
        self.sync, self.handles, self.states, self.fwd = sync, [], [], 0.0
        for m in modules:
            s: dict = {}
            self.handles.append(m.register_forward_pre_hook(lambda mod, a, s=s: s.update(t0=self.now())))
            self.handles.append(m.register_forward_hook(lambda mod, a, out, s=s: self._post(s, out)))
            for p in m.parameters():
                if p.requires_grad:
                    self.handles.append(p.register_post_accumulate_grad_hook(lambda p, s=s: s.update(b1=self.now())))
            self.states.append(s)

    def now(self) -> float:
        self.sync()
        return time.perf_counter()

    def _post(self, s: dict, out) -> None:
        self.fwd += self.now() - s["t0"]
        if out.requires_grad:
            out.register_hook(lambda grad, s=s: self._bwd_start(s))

    def _bwd_start(self, s: dict) -> None:
        if "b0" not in s:
            s["b0"] = self.now()

    def reset(self) -> None:
        self.fwd = 0.0
        for s in self.states:
            s.clear()

    def bwd(self) -> float:
        return sum(s["b1"] - s["b0"] for s in self.states if "b0" in s and "b1" in s)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


@contextlib.contextmanager
def timed_function(module, name: str, sync, acc: list):
    """Wrap module.<name> (a plain function called by global name) to add its seconds to acc[0]."""
    orig = getattr(module, name)

    def wrapped(*a, **k):
        sync()
        t0 = time.perf_counter()
        r = orig(*a, **k)
        sync()
        acc[0] += time.perf_counter() - t0
        return r

    setattr(module, name, wrapped)
    try:
        yield
    finally:
        setattr(module, name, orig)


def load_diffsynth_whole() -> None:
    """DiffSynth's own training path (its pipeline and loss), loaded before gcc's adapter: gcc.compat.diffsynth
    keeps the parts gcc never uses out of its processes (stand-ins), and a module loaded first is left as it is."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # its flex-attention wrapper: no compile pool
    import diffsynth.diffusion.loss
    import diffsynth.pipelines.wan_video  # noqa: F401


def main() -> None:
    load_diffsynth_whole()
    from gcc.model.dit import PRESETS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--blocks", type=int, default=None, help="number of DiT blocks (default: the preset's)")
    ap.add_argument(
        "--geometry",
        default=None,
        choices=("tiny", "wide", "full"),
        help="shapes from gcc/synth/world.py (default: tiny for the tiny preset, else full = v10: "
        "21 latent frames of 30x52 cells, 8,190 tokens, text 512 rows)",
    )
    ap.add_argument("--frames", type=int, default=None, help="latent frames T (overrides the geometry)")
    ap.add_argument("--height", type=int, default=None, help="latent height h (overrides the geometry)")
    ap.add_argument("--width", type=int, default=None, help="latent width w (overrides the geometry)")
    ap.add_argument("--text-len", type=int, default=None, help="text rows L (default: the geometry's; 512 for full)")
    ap.add_argument(
        "--prompts", type=int, default=1, help="distinct prompts per clip in the timed gcc batch (DiffSynth: 1)"
    )
    ap.add_argument("--steps", type=int, default=5, help="timed steps per side")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per side first")
    ap.add_argument(
        "--share-steps",
        type=int,
        default=None,
        help="instrumented steps per side for the breakdown (default: 5 for tiny, else 1)",
    )
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.share_steps is None:
        args.share_steps = 5 if args.preset == "tiny" else 1

    import torch
    from diffsynth.diffusion.loss import FlowMatchSFTLoss

    import gcc.model.dit as dit_mod
    from gcc.model.dit import build_gc_dit, model_config
    from gcc.model.objective import GcTrainModel

    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    cfg = model_config(args.preset, **({"num_layers": args.blocks} if args.blocks else {}))
    geo = pick_geometry(args, cfg)
    dit = build_gc_dit(cfg, device=device)
    model = GcTrainModel(dit, seed=SEED, null_context=torch.zeros(geo["L"], geo["D"])).to(device).train()
    pipe = build_pipe(dit, device)
    batch, ds_ctx = make_batch(geo, cfg.vocab, args.prompts)
    batch, ds_ctx = to_device(batch, device), ds_ctx.to(device)
    full = (geo["T"], geo["h"], geo["w"]) == (FULL["T"], FULL["h"], FULL["w"])

    print(
        f"preset {args.preset}: {cfg.num_layers} block(s), dim {cfg.dim}, ffn {cfg.ffn_dim}, {cfg.num_heads} heads, "
        f"text dim {cfg.text_dim}; batch {B}, fp32, {device.type} ({torch.get_num_threads()} threads), no grad ckpt"
    )
    print(
        f"geometry {geo['name']}{'' if full else ' (modified)' if geo['name'] == 'full' else ''}: T={geo['T']} "
        f"latent frames x {geo['h']}x{geo['w']} -> {geo['tokens']} tokens per clip (patch 1x2x2); text "
        f"L={geo['L']}; sem ids {tuple(batch['sem_ids'].shape)}"
    )

    # -- equivalence
    t0 = time.perf_counter()
    eq = equivalence(model, pipe, batch, ds_ctx)
    ok = eq["loss_rel"] < 1e-5 and eq["grad_rel"] < 1e-4
    print(f"equivalence (zero condition, one prompt per clip, same t and noise; {time.perf_counter() - t0:.1f} s):")
    print(f"  t = {eq['t']:.3f} (index {eq['tid']}) for both samples (gcc sample ids {eq['sids']})")
    print(f"  loss: gcc {eq['loss_gcc']:.8g}  DiffSynth {eq['loss_ds']:.8g}  rel diff {eq['loss_rel']:.2e}")
    print(
        f"  grads of {eq['n_tensors']} Wan tensors: max rel diff {eq['grad_rel']:.2e} ({eq['grad_worst']}); "
        f"all together |dg|/|g| {eq['grad_rel_norm']:.2e}"
    )
    print(f"  -> {'agree to float rounding' if ok else 'MISMATCH (loss rel >= 1e-5 or grad rel >= 1e-4)'}")

    # -- the timed steps: an active condition, two prompts per clip
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in dit.gc_sem_cond.proj_out.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    counter = {"gcc": 0}

    def gcc_step():
        i = counter["gcc"] = counter["gcc"] + 1
        b = dict(batch, sample_id=[B * i + k for k in range(B)])
        model.loss(model(b), b).backward()

    def ds_step():
        FlowMatchSFTLoss(pipe, **ds_inputs(batch["input_latents"], ds_ctx)).backward()

    sides = {"gcc": (model, gcc_step), "DiffSynth": (pipe.dit, ds_step)}

    def run(side: str) -> float:
        mod, fn = sides[side]
        mod.zero_grad(set_to_none=True)
        sync()
        t = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t

    times = {s: [] for s in sides}
    for i in range(args.warmup + args.steps):
        for side in sides:
            dt = run(side)
            if i >= args.warmup:
                times[side].append(dt)
            print(f"  {'warm-up' if i < args.warmup else 'step'} {i + 1}: {side:9} {dt:.3f} s", flush=True)

    # -- instrumented steps: the breakdown
    cf = [0.0]
    clocks = {
        "gcc": {
            "condition": ModuleClock([dit.gc_sem_cond], sync),
            "text": ModuleClock([dit.text_embedding], sync),
            "time": ModuleClock([dit.time_embedding, dit.time_projection], sync),
            "blocks": ModuleClock(list(dit.blocks), sync),
        },
        "DiffSynth": {
            "text": ModuleClock([pipe.dit.text_embedding], sync),
            "time": ModuleClock([pipe.dit.time_embedding, pipe.dit.time_projection], sync),
            "blocks": ModuleClock(list(pipe.dit.blocks), sync),
        },
    }
    share = {s: {k: [] for k in ("step", "condition", "text", "time", "blocks")} for s in sides}
    with timed_function(dit_mod, "class_fractions", sync, cf):
        for _ in range(args.share_steps):
            for side in sides:
                cf[0] = 0.0
                for c in clocks[side].values():
                    c.reset()
                share[side]["step"].append(run(side))
                for k, c in clocks[side].items():
                    share[side][k].append(c.fwd + c.bwd() + (cf[0] if k == "condition" else 0.0))
    for cs in clocks.values():
        for c in cs.values():
            c.remove()
    sh = {s: {k: statistics.median(v) if v else None for k, v in d.items()} for s, d in share.items()}

    med = {s: statistics.median(v) for s, v in times.items()}
    print(f"\ntiming: {args.steps} step(s) per side after {args.warmup} warm-up, interleaved")
    print(f"{'':12}{'median s/step':>15}{'min':>10}{'max':>10}")
    for s in sides:
        print(f"{s:12}{med[s]:>15.4f}{min(times[s]):>10.4f}{max(times[s]):>10.4f}")
    print(f"ratio gcc / DiffSynth (median): {med['gcc'] / med['DiffSynth']:.3f} (target <= 0.90)")

    print(
        f"\nbreakdown (hooks, fwd + bwd, median of {args.share_steps} instrumented step(s) per side, "
        f"% of that side's instrumented step):"
    )
    print(f"{'':42}{'gcc ms':>10}{'%':>7}{'DiffSynth ms':>14}{'%':>7}")
    rows = (
        ("condition: class_fractions + gc_sem_cond", "condition"),
        ("text_embedding", "text"),
        ("time_embedding + time_projection", "time"),
        (f"DiT blocks ({cfg.num_layers})", "blocks"),
        ("instrumented step", "step"),
    )
    for label, k in rows:
        cells = ""
        for s, wd in (("gcc", 10), ("DiffSynth", 14)):
            v = sh[s][k]
            cells += f"{'-':>{wd}}{'':>7}" if v is None else f"{v * 1e3:>{wd}.1f}{v / sh[s]['step']:>7.1%}"
        print(f"{label:42}{cells}")
    print(
        f"condition target: < 3% of gcc's step at full geometry ({FULL['T']}x{FULL['h']}x{FULL['w']}, 8,190 "
        f"tokens){'' if full else '; this run is not at full geometry'}"
    )

    # -- the same step with the real depth: each side's timed median plus its measured per-block time
    real = PRESETS["ti2v-5b"]
    K = real.num_layers
    if (cfg.dim, cfg.ffn_dim, cfg.num_heads) == (real.dim, real.ffn_dim, real.num_heads) and cfg.num_layers < K:
        ext = {s: med[s] + (K - cfg.num_layers) * sh[s]["blocks"] / cfg.num_layers for s in sides}
        print(
            f"extrapolated to {K} blocks (TI2V-5B; timed median + {K - cfg.num_layers} x the side's mean block "
            f"time): gcc {ext['gcc']:.2f} s, DiffSynth {ext['DiffSynth']:.2f} s, ratio "
            f"{ext['gcc'] / ext['DiffSynth']:.3f}; condition {sh['gcc']['condition'] / ext['gcc']:.2%} of "
            f"gcc's step"
        )


if __name__ == "__main__":
    main()
