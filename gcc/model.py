"""GcDiT (SPEC §7): DiffSynth's Wan2.2 `WanModel` plus the `gc_sem_cond` semantic condition.

`GcDiT` subclasses `WanModel` so that its state dict is exactly the Wan keys plus `gc_sem_cond.*`: base weights
published for Wan load without renaming, and an export is the state dict as is (831 keys for TI2V-5B).
Nothing of Wan is re-implemented; `gc_forward` only orchestrates Wan's own modules (patch embedding, time
embedding/projection, text embedding, blocks, head) the way DiffSynth's TI2V `model_fn_wan_video` does, with three
changes: per-token timesteps (latent frame 0 at t = 0), one text cell per latent frame, and the cond addition.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange
from safetensors import safe_open

from gcc.diffsynth_parts import (CrossAttention, DiTBlock, Head, RMSNorm, WanModel, precompute_freqs_cis_3d,
                                 sinusoidal_embedding_1d)
from gcc.vocab import CHANNEL_LUT, check_vocab, num_classes

# Wan2.2 VAE (WanVideoVAE38): one latent frame per 4 pixel frames (the first alone), 16x16 pixels per latent cell.
VAE_STRIDE_T, VAE_STRIDE_S = 4, 16
COND_PREFIX = "gc_sem_cond."
WAN_INDEX = "diffusion_pytorch_model.safetensors.index.json"
WAN_SINGLE = "diffusion_pytorch_model.safetensors"


@dataclass(frozen=True)
class DiTConfig:
    """Everything that shapes the network. `vocab` fixes V, the width of the cond input."""
    dim: int
    ffn_dim: int
    num_heads: int
    num_layers: int
    in_dim: int = 48
    out_dim: int = 48
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_dim: int = 4096
    freq_dim: int = 256
    eps: float = 1e-6
    cond_hidden: int = 256
    vocab: str = "parts"

    def wan_kwargs(self) -> dict:
        # The TI2V-5B flags of DiffSynth's model_configs.py (hash 1f5ab770...): separated timestep, first-frame
        # latents fused into the noisy latents (no VAE/CLIP embedding inputs).
        return dict(dim=self.dim, in_dim=self.in_dim, ffn_dim=self.ffn_dim, out_dim=self.out_dim,
                    text_dim=self.text_dim, freq_dim=self.freq_dim, eps=self.eps, patch_size=tuple(self.patch_size),
                    num_heads=self.num_heads, num_layers=self.num_layers, has_image_input=False,
                    seperated_timestep=True, require_vae_embedding=False, require_clip_embedding=False,
                    fuse_vae_embedding_in_latents=True)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["patch_size"] = list(self.patch_size)
        return d


PRESETS: dict[str, DiTConfig] = {
    "ti2v-5b": DiTConfig(dim=3072, ffn_dim=14336, num_heads=24, num_layers=30),
    # CPU-sized; text_dim matches the tiny synthetic data (D=64). head_dim 32 keeps Wan's 3D RoPE split even.
    "tiny": DiTConfig(dim=64, ffn_dim=128, num_heads=2, num_layers=2, text_dim=64, freq_dim=32, cond_hidden=32),
}


def model_config(name: str, **overrides) -> DiTConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    cfg = replace(PRESETS[name], **overrides)
    check_vocab(cfg.vocab)
    return cfg


# ---- the semantic condition ------------------------------------------------------------------------------

def latent_frame_of_pixel_frames(num_latent_frames: int) -> list[tuple[int, int]]:
    """[lo, hi) pixel frames of each latent frame: frame 0 alone, then 4k-3..4k (the VAE's causal grouping)."""
    return [(0, 1)] + [(VAE_STRIDE_T * k - 3, VAE_STRIDE_T * k + 1) for k in range(1, num_latent_frames)]


def class_fractions(sem_ids: torch.Tensor, vocab: str, patch_size=(1, 2, 2)) -> torch.Tensor:
    """sem ids uint8 [B, F, H, W] -> float32 [B, T*gh*gw, V]: each token's class fractions over its footprint.

    Tokens are ordered (f h w) like Wan's patch tokens. Counting uses bincount per latent frame so the peak
    memory is a few int64 frames, not a one-hot of the whole clip (81x480x832xV).
    """
    if sem_ids.dtype != torch.uint8 or sem_ids.dim() != 4:
        raise ValueError(f"sem_ids must be uint8 [B, F, H, W], got {sem_ids.dtype} {tuple(sem_ids.shape)}")
    B, Fr, H, W = sem_ids.shape
    T = (Fr - 1) // VAE_STRIDE_T + 1
    ph, pw = VAE_STRIDE_S * patch_size[1], VAE_STRIDE_S * patch_size[2]
    if VAE_STRIDE_T * (T - 1) + 1 != Fr or H % ph or W % pw or patch_size[0] != 1:
        raise ValueError(f"sem_ids {tuple(sem_ids.shape)}: need F = 4(T-1)+1 and H, W multiples of {ph}, {pw}")
    gh, gw = H // ph, W // pw
    n, V = gh * gw, num_classes(vocab)
    dev = sem_ids.device
    # invalid values go to an extra channel V, checked once at the end (one host sync instead of T)
    lut = torch.as_tensor(CHANNEL_LUT[vocab], device=dev).clone()
    lut[lut < 0] = V
    tok = ((torch.arange(H, device=dev) // ph)[:, None] * gw + (torch.arange(W, device=dev) // pw)[None, :])
    base = (torch.arange(B, device=dev) * n)[:, None, None, None]
    out = []
    for lo, hi in latent_frame_of_pixel_frames(T):
        ch = lut[sem_ids[:, lo:hi].long()]  # [B, nf, H, W]
        idx = (base + tok) * (V + 1) + ch
        counts = torch.bincount(idx.reshape(-1), minlength=B * n * (V + 1)).view(B, n, V + 1)
        out.append(counts.float() / ((hi - lo) * ph * pw))
    frac = torch.stack(out, dim=1)  # [B, T, n, V+1]
    if bool(frac[..., V].any()):
        bad = torch.unique(sem_ids[(lut[sem_ids.long()] == V)]).tolist()
        raise ValueError(f"sem_ids hold values outside vocab {vocab!r}: {bad}")
    return frac[..., :V].reshape(B, T * n, V)


class GcSemCond(nn.Module):
    """Class fractions -> proj_in -> SiLU -> proj_mid -> SiLU -> proj_out (zero-init), added to patch tokens.

    proj_out starts at zero so that a fresh cond leaves the pretrained Wan exactly unchanged (sem_rms = 0).
    """

    def __init__(self, num_classes: int, hidden: int, dim: int):
        super().__init__()
        self.proj_in = nn.Linear(num_classes, hidden)
        self.proj_mid = nn.Linear(hidden, dim)
        self.proj_out = nn.Linear(dim, dim)
        self.reset_parameters()

    def reset_parameters(self):
        for m in (self.proj_in, self.proj_mid):
            m.reset_parameters()
        nn.init.zeros_(self.proj_out.weight)
        nn.init.zeros_(self.proj_out.bias)

    def forward(self, frac: torch.Tensor) -> torch.Tensor:
        return self.proj_out(F.silu(self.proj_mid(F.silu(self.proj_in(frac)))))


class FramewiseCrossAttention(CrossAttention):
    """Wan's CrossAttention (same parameters, same keys); given one context row per latent frame
    ([B*T, L, dim] against tokens [B, T*n, dim]) each frame's n tokens attend only to their own row.

    Reshaping the tokens to [B*T, n, dim] is exact and cheaper than a block-diagonal attention mask, and it
    lets DiffSynth's DiTBlock stay untouched (it calls `self.cross_attn(norm3(x), context)`).
    """

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        B, S, D = x.shape
        if y.shape[0] == B:
            return super().forward(x, y)
        T = y.shape[0] // B
        if T * B != y.shape[0] or S % T:
            raise ValueError(f"context rows {y.shape[0]} do not split tokens {tuple(x.shape)} into frames")
        return super().forward(x.reshape(B * T, S // T, D), y).reshape(B, S, D)


class GcDiT(WanModel):
    """Wan2.2 TI2V DiT + gc_sem_cond. Call the module itself (forward == gc_forward) under FSDP, so that the
    root unit's parameters are gathered."""

    def __init__(self, cfg: DiTConfig):
        super().__init__(**cfg.wan_kwargs())
        self.config = cfg
        self.vocab = check_vocab(cfg.vocab)
        for blk in self.blocks:
            blk.cross_attn.__class__ = FramewiseCrossAttention  # same parameters, framewise routing
        # RoPE tables are a plain attribute (not a buffer); keep them on CPU even when built on meta
        with torch.device("cpu"):
            self.freqs = precompute_freqs_cis_3d(cfg.dim // cfg.num_heads)
        self.gc_sem_cond = GcSemCond(num_classes(cfg.vocab), cfg.cond_hidden, cfg.dim)

    # -- Composer FSDP hooks: each DiT block is one FSDP unit and one activation-checkpointing unit; the rest
    #    (embeddings, head, cond: small) stays in the root unit.
    def fsdp_wrap_fn(self, module: nn.Module) -> bool:
        return isinstance(module, DiTBlock)

    def activation_checkpointing_fn(self, module: nn.Module) -> bool:
        return isinstance(module, DiTBlock)

    @torch.no_grad()
    def param_init_fn(self, module: nn.Module) -> None:
        """Composer calls this for each module whose own parameters were on the meta device (meta init under
        FSDP). Wan's RMSNorm and the `modulation` parameters have no reset_parameters; this initialises them as
        WanModel.__init__ does. Base weights are loaded afterwards (or broadcast with sync_module_states)."""
        if module is self.gc_sem_cond.proj_out:  # the cond must start at zero output
            nn.init.zeros_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, RMSNorm):
            module.weight.fill_(1.0)
        elif isinstance(module, (DiTBlock, Head)):
            module.modulation.normal_().div_(module.dim ** 0.5)
        elif hasattr(module, "reset_parameters"):
            module.reset_parameters()

    def embed_context(self, context: torch.Tensor, context_ids: torch.Tensor) -> torch.Tensor:
        """context [B, T, L, D], ids [B, T] -> [B*T, L, dim]; text_embedding runs once per unique id
        (a clip repeats few prompts across its 21 cells; rows with the same id are the same embedding)."""
        B, T, L, D = context.shape
        flat_ids = context_ids.reshape(-1)
        uniq, inv = torch.unique(flat_ids, return_inverse=True)
        pos = torch.arange(flat_ids.numel(), device=flat_ids.device)
        first = torch.full((uniq.numel(),), flat_ids.numel(), device=flat_ids.device, dtype=pos.dtype)
        first = first.scatter_reduce(0, inv, pos, reduce="amin")
        emb = self.text_embedding(context.reshape(B * T, L, D)[first])
        return emb[inv]

    def forward(self, x_t, timestep, context, context_ids, sem_ids, first_frame_cond: bool = True,
                grad_ckpt: bool = False, aux: bool = False):
        return self.gc_forward(x_t, timestep, context, context_ids, sem_ids, first_frame_cond, grad_ckpt, aux)

    def gc_forward(self, x_t: torch.Tensor, timestep: torch.Tensor, context: torch.Tensor,
                   context_ids: torch.Tensor, sem_ids: torch.Tensor, first_frame_cond: bool = True,
                   grad_ckpt: bool = False, aux: bool = False):
        """x_t [B, C, T, h, w]; timestep [B] or a scalar (scheduler units); context [B, T, L, D]; context_ids [B, T];
        sem_ids uint8 [B, 4(T-1)+1, 16h, 16w]. Returns the prediction [B, C, T, h, w] (and aux stats).

        first_frame_cond: latent frame 0 is the clean first frame (TI2V) and gets timestep 0.
        grad_ckpt: torch checkpoint per block; leave it off when Composer/FSDP already wraps the blocks.
        """
        B, _, T = x_t.shape[:3]
        if context.shape[:2] != (B, T) or context_ids.shape != (B, T):
            raise ValueError(f"context {tuple(context.shape)} / ids {tuple(context_ids.shape)} need one cell per "
                             f"latent frame ({B}, {T})")
        dtype = x_t.dtype
        x = self.patch_embedding(x_t)
        f, gh, gw = x.shape[2:]
        n = gh * gw
        x = rearrange(x, "b c f h w -> b (f h w) c")
        want = (B, VAE_STRIDE_T * (T - 1) + 1, gh * VAE_STRIDE_S * self.patch_size[1],
                gw * VAE_STRIDE_S * self.patch_size[2])
        if tuple(sem_ids.shape) != want:
            raise ValueError(f"sem_ids {tuple(sem_ids.shape)} do not cover latents {tuple(x_t.shape)}: need {want}")
        cond = self.gc_sem_cond(class_fractions(sem_ids, self.vocab, self.patch_size).to(dtype))
        stats = {"x_rms": x.detach().float().pow(2).mean().sqrt(),
                 "sem_rms": cond.detach().float().pow(2).mean().sqrt()}
        x = x + cond

        # separated timestep: embed per latent frame (only 2 distinct values per sample) and broadcast to tokens
        t_frame = timestep.float().reshape(-1, 1).expand(B, f).clone()  # [B] or one value for all
        if first_frame_cond:
            t_frame[:, 0] = 0
        t = self.time_embedding(sinusoidal_embedding_1d(self.freq_dim, t_frame.reshape(-1)).to(dtype))
        t_mod = self.time_projection(t).unflatten(1, (6, self.dim))
        t = t.view(B, f, 1, self.dim).expand(B, f, n, self.dim).reshape(B, f * n, self.dim)
        t_mod = t_mod.view(B, f, 1, 6, self.dim).expand(B, f, n, 6, self.dim).reshape(B, f * n, 6, self.dim)

        ctx = self.embed_context(context.to(dtype), context_ids)
        # move the small per-axis RoPE tables, then expand on the device (not the [f*n] table)
        fr = [tab[:size].to(x.device) for tab, size in zip(self.freqs, (f, gh, gw))]
        freqs = torch.cat([
            fr[0].view(f, 1, 1, -1).expand(f, gh, gw, -1),
            fr[1].view(1, gh, 1, -1).expand(f, gh, gw, -1),
            fr[2].view(1, 1, gw, -1).expand(f, gh, gw, -1),
        ], dim=-1).reshape(f * n, 1, -1)
        for block in self.blocks:
            if grad_ckpt and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, ctx, t_mod, freqs, use_reentrant=False)
            else:
                x = block(x, ctx, t_mod, freqs)
        x = self.head(x, t)
        out = self.unpatchify(x, (f, gh, gw))
        return (out, stats) if aux else out


def build_gc_dit(cfg: DiTConfig | str, device: str | torch.device | None = None,
                 dtype: torch.dtype | None = None, **overrides) -> GcDiT:
    """Build from a preset name or config. device="meta" allocates nothing (shape/param-count checks)."""
    if isinstance(cfg, str):
        cfg = model_config(cfg, **overrides)
    with torch.device(device or "cpu"):
        model = GcDiT(cfg)
    return model.to(dtype) if dtype is not None else model


def wan_keys(model: nn.Module) -> list[str]:
    return [k for k in model.state_dict() if not k.startswith(COND_PREFIX)]


def cond_keys(model: nn.Module) -> list[str]:
    return [k for k in model.state_dict() if k.startswith(COND_PREFIX)]


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---- base weights ----------------------------------------------------------------------------------------

def _wan_weight_map(model_dir: Path) -> dict[str, str]:
    """key -> shard file name, from the index of the published layout (or a single unsharded file)."""
    index = model_dir / WAN_INDEX
    if index.is_file():
        with open(index) as fh:
            weight_map = json.load(fh).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: no weight_map")
        return weight_map
    single = model_dir / WAN_SINGLE
    if single.is_file():
        with safe_open(str(single), "pt") as fh:
            return {k: WAN_SINGLE for k in fh.keys()}
    raise FileNotFoundError(f"{model_dir}: neither {WAN_INDEX} nor {WAN_SINGLE} found (expected the published "
                            f"Wan2.2-TI2V-5B layout)")


@torch.no_grad()
def load_wan_base(model: GcDiT, model_dir: str | os.PathLike) -> GcDiT:
    """Load Wan weights from a local Wan2.2 directory as published (sharded diffusion_pytorch_model*.safetensors
    + index). Every Wan key of the model must come from the files with the same shape; the cond is left as is."""
    model_dir = Path(model_dir)
    weight_map = _wan_weight_map(model_dir)
    params = model.state_dict()
    expected = set(wan_keys(model))
    unexpected = sorted(set(weight_map) - expected)
    missing = sorted(expected - set(weight_map))
    if unexpected or missing:
        raise ValueError(f"{model_dir}: index does not match the model: missing {missing[:5]}"
                         f"{'...' if len(missing) > 5 else ''} ({len(missing)}), unexpected {unexpected[:5]}"
                         f"{'...' if len(unexpected) > 5 else ''} ({len(unexpected)})")
    by_file: dict[str, list[str]] = {}
    for k, fname in weight_map.items():
        by_file.setdefault(fname, []).append(k)
    for fname in sorted(by_file):
        path = model_dir / fname
        if not path.is_file():
            raise FileNotFoundError(f"missing weight file {path} (listed in {WAN_INDEX})")
        with safe_open(str(path), "pt") as fh:
            present = set(fh.keys())
            for k in by_file[fname]:
                if k not in present:
                    raise ValueError(f"{path}: key {k} listed in the index is not in the file")
                shape = tuple(fh.get_slice(k).get_shape())
                if shape != tuple(params[k].shape):
                    raise ValueError(f"{path}: {k} has shape {shape}, model expects {tuple(params[k].shape)}")
                params[k].copy_(fh.get_tensor(k))
    return model
