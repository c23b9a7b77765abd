"""GcDiT (docs/design.md §7): DiffSynth's Wan2.2 `WanModel` plus the `gc_sem_cond` semantic condition.

`GcDiT` subclasses `WanModel` so that its state dict is exactly the Wan keys plus `gc_sem_cond.*`: base weights
published for Wan load without renaming, and an export is the state dict as is (831 keys for TI2V-5B).
Wan's parameters and modules are DiffSynth's; `gc_forward` orchestrates them (patch embedding, time
embedding/projection, text embedding, blocks, head) the way DiffSynth's TI2V `model_fn_wan_video` does, with three
changes: per-token timesteps (latent frame 0 at t = 0), one text cell per latent frame, and the cond addition. Its
attention, blocks and head run in gcc's forms of DiffSynth's modules (gcc/model/blocks.py: the same parameters,
the same results, less memory traffic and no complex numbers), checked against DiffSynth's own.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange
from safetensors import safe_open
from safetensors.torch import save as safetensors_bytes

from gcc import inputs, storage
from gcc.compat.diffsynth import DiTBlock, Head, RMSNorm, WanModel, sinusoidal_embedding_1d, use_class
from gcc.compat.torch import bare_copy
from gcc.errors import BadInput
from gcc.geometry import VAE_STRIDE_S, VAE_STRIDE_T, latent_frame_spans, pixel_frames
from gcc.model.block_wrap import wrap_blocks
from gcc.model.blocks import BLOCK_CLASSES, FrameContext, rope_tables
from gcc.model.fsdp import fill_local
from gcc.model.seeds import stable_seed
from gcc.names import UnsafeName, check_component
from gcc.vocab import CHANNEL_LUT, check_vocab, num_classes

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
        return dict(
            dim=self.dim,
            in_dim=self.in_dim,
            ffn_dim=self.ffn_dim,
            out_dim=self.out_dim,
            text_dim=self.text_dim,
            freq_dim=self.freq_dim,
            eps=self.eps,
            patch_size=tuple(self.patch_size),
            num_heads=self.num_heads,
            num_layers=self.num_layers,
            has_image_input=False,
            seperated_timestep=True,
            require_vae_embedding=False,
            require_clip_embedding=False,
            fuse_vae_embedding_in_latents=True,
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["patch_size"] = list(self.patch_size)
        return d


PRESETS: dict[str, DiTConfig] = {
    "ti2v-5b": DiTConfig(dim=3072, ffn_dim=14336, num_heads=24, num_layers=30),
    # the real TI2V-5B layer shapes with 2 blocks: the sharded path on CPU at full width (synth geometry `wide`)
    "wide": DiTConfig(dim=3072, ffn_dim=14336, num_heads=24, num_layers=2),
    # CPU-sized; text_dim matches the tiny synthetic data (D=64). head_dim 32 keeps Wan's 3D RoPE split even.
    "tiny": DiTConfig(dim=64, ffn_dim=128, num_heads=2, num_layers=2, text_dim=64, freq_dim=32, cond_hidden=32),
    # `make demo`'s model: tiny with a 1x1 spatial patch, one token per latent cell. The condition is a token's class
    # fractions, so tiny's 2x2 patch mixes four cells' classes; on the tiny world's 4x6 latent frames that caps what
    # the condition can say about a cell below what repeating frame 0 scores (docs/sample.md, "Reading the numbers")
    "tiny-p1": DiTConfig(
        dim=64, ffn_dim=128, num_heads=2, num_layers=2, text_dim=64, freq_dim=32, cond_hidden=32, patch_size=(1, 1, 1)
    ),
}


def model_config(name: str, **overrides) -> DiTConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    cfg = replace(PRESETS[name], **overrides)
    check_vocab(cfg.vocab)
    return cfg


# ---- the semantic condition ------------------------------------------------------------------------------


_LUTS: dict[tuple[str, torch.device], torch.Tensor] = {}


def _channel_lut(vocab: str, device: torch.device) -> torch.Tensor:
    """raw value -> channel (int64 [256]) on `device`, invalid values to channel V; copied to a device once per
    process, not at every forward (a copy from host memory waits for the device)."""
    key = (vocab, device)
    if key not in _LUTS:
        lut = torch.as_tensor(CHANNEL_LUT[vocab])
        _LUTS[key] = torch.where(lut < 0, num_classes(vocab), lut).to(device)
    return _LUTS[key]


def class_fractions(sem_ids: torch.Tensor, vocab: str, patch_size=(1, 2, 2)) -> torch.Tensor:
    """sem ids uint8 [B, F, H, W] -> float32 [B, T*gh*gw, V]: each token's class fractions over its footprint.

    Tokens are ordered (f h w) like Wan's patch tokens. Counts are added per latent frame into one preallocated
    tensor (`scatter_add_`), so the peak memory is a few frames of indices, not a one-hot of the whole clip
    (81x480x832xV), and nothing is read back to the host (`bincount` reads its input's range on CUDA). A value
    outside the vocabulary counts for no class; the loader refuses such ids when it decodes them
    (gcc.data.shards.decode_sem), and a token's fractions then sum to less than 1.
    """
    if sem_ids.dtype != torch.uint8 or sem_ids.dim() != 4:
        raise ValueError(f"sem_ids must be uint8 [B, F, H, W], got {sem_ids.dtype} {tuple(sem_ids.shape)}")
    B, Fr, H, W = sem_ids.shape
    T = (Fr - 1) // VAE_STRIDE_T + 1
    ph, pw = VAE_STRIDE_S * patch_size[1], VAE_STRIDE_S * patch_size[2]
    if pixel_frames(T) != Fr or H % ph or W % pw or patch_size[0] != 1:
        raise ValueError(f"sem_ids {tuple(sem_ids.shape)}: need F = 4(T-1)+1 and H, W multiples of {ph}, {pw}")
    gh, gw = H // ph, W // pw
    n, V = gh * gw, num_classes(vocab)
    dev = sem_ids.device
    lut = _channel_lut(vocab, dev)
    tok = (torch.arange(H, device=dev) // ph)[:, None] * gw + (torch.arange(W, device=dev) // pw)[None, :]
    base = (torch.arange(B, device=dev) * (T * n))[:, None, None, None]
    counts = torch.zeros(B * T * n * (V + 1), dtype=torch.float32, device=dev)
    spans = latent_frame_spans(T)
    per_pixel = torch.ones((), dtype=torch.float32, device=dev)
    for k, (lo, hi) in enumerate(spans):
        ch = lut[sem_ids[:, lo:hi].long()]  # [B, nf, H, W]
        idx = (base + k * n + tok) * (V + 1) + ch
        counts.scatter_add_(0, idx.reshape(-1), per_pixel.expand(idx.numel()))
    # each latent frame's pixels per token (exact integers): frame 0 alone, then 4 pixel frames each
    area = torch.full((T,), float(VAE_STRIDE_T * ph * pw), device=dev)
    area[0] = float(ph * pw)
    frac = counts.view(B, T, n, V + 1) / area.view(1, T, 1, 1)
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


class GcDiT(WanModel):
    """Wan2.2 TI2V DiT + gc_sem_cond.

    Call `gc_forward` (timesteps in scheduler units). It computes the per-frame sinusoidal timestep features from
    the exact float32 timesteps and then calls the module itself, so that FSDP's hooks run; `forward` takes those
    features. The split is on purpose: FSDP casts every floating-point input of a unit's forward to the compute
    dtype, and in bf16 a timestep would be rounded (201.3 -> 201; the 1000 training timesteps to ~294 values).

    The text context comes as each sample's distinct prompts [B, P, L, D] and, per latent frame, the index of its
    prompt among them [B, T] (`gcc.data.text_table.stack_prompts`): a clip carries 1-2 prompts, not 21 copies.

    DiffSynth's attention, block and head modules are swapped in place for gcc's forms of them (gcc/model/blocks.py:
    the same parameters and keys). `wrap_blocks` adds activation checkpointing and compilation per block.

    Initial values are a pure function of (`init_seed`, the module's name) (`param_init_fn`), so an unsharded
    model and FSDP shards on any number of ranks start from the same weights.
    """

    def __init__(self, cfg: DiTConfig, init_seed: int = 0):
        super().__init__(**cfg.wan_kwargs())
        self.config = cfg
        self.vocab = check_vocab(cfg.vocab)
        self.init_seed = int(init_seed)
        for m in self.modules():
            if type(m) in BLOCK_CLASSES:
                use_class(m, BLOCK_CLASSES[type(m)])
        del self.freqs  # WanModel's complex RoPE tables: gcc makes real ones on the device (blocks.rope_tables)
        self.gc_sem_cond = GcSemCond(num_classes(cfg.vocab), cfg.cond_hidden, cfg.dim)
        # module names as built (wrappers added later, activation checkpointing's, do not rename them)
        self._init_names = {id(m): n for n, m in self.named_modules()}

    # -- Composer FSDP hook: each DiT block (with its wrappers, `wrap_blocks`) is one FSDP unit; the rest
    #    (embeddings, head, cond: small) stays in the root unit.
    def fsdp_wrap_fn(self, module: nn.Module) -> bool:
        return any(module is b for b in self.blocks)

    def wrap_blocks(self, checkpointing: str = "none", compile: bool = False) -> None:
        """Activation checkpointing (`none`, `block`: the whole block recomputed in backward, `selective`: its
        attention outputs kept) and then torch.compile on each block, torchtitan's order; FSDP2 then makes each
        wrapped block a unit (`fsdp_wrap_fn`). Call it once, before sharding."""
        wrap_blocks(self.blocks, checkpointing, compile)

    @torch.no_grad()
    def param_init_fn(self, module: nn.Module) -> None:
        """Initialise `module`'s own parameters (not its children's) as WanModel.__init__ does, from a generator
        seeded by (init_seed, the module's name). The full values are made on the CPU one module at a time and
        each rank keeps its part (all of it, unsharded). Composer calls this for every module of a meta-device
        model after sharding it; `materialize` does for an unsharded one."""
        own = dict(module.named_parameters(recurse=False))
        if not own:
            return
        name = self._init_names[id(module)]
        twin = _full_size_twin(module)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(stable_seed("gcc.init", self.init_seed, name))
            if name == COND_PREFIX + "proj_out":  # the cond must start at zero output
                for p in twin.parameters():
                    p.zero_()
            elif isinstance(twin, RMSNorm):
                twin.weight.fill_(1.0)
            elif isinstance(twin, (DiTBlock, Head)):
                twin.modulation.normal_().div_(twin.dim**0.5)
            elif hasattr(twin, "reset_parameters"):
                twin.reset_parameters()  # type: ignore[operator]  # torch types Module.__getattr__ as Tensor | Module
            else:
                raise ValueError(f"{name} ({type(twin).__name__}): no initialisation known for its parameters")
        for n, p in own.items():
            full = dict(twin.named_parameters(recurse=False))[n]
            fill_local(p, full.__getitem__)

    def reset_cond(self) -> None:
        """gc_sem_cond back to its initial values (zero output), as after construction."""
        for m in self.gc_sem_cond.modules():
            self.param_init_fn(m)

    def embed_context(self, context: torch.Tensor, context_index: torch.Tensor) -> FrameContext:
        """context [B, P, L, D] (each sample's distinct prompts), context_index [B, T] (each latent frame's prompt
        among them) -> FrameContext: text_embedding runs once per prompt, and so do the cross-attention's key and
        value projections (FramewiseCrossAttention). Nothing depends on the values of the index: no host read."""
        B, P, L, D = context.shape
        index = context_index + torch.arange(B, device=context_index.device)[:, None] * P
        return FrameContext(self.text_embedding(context.reshape(B * P, L, D)), index.reshape(-1))

    def time_features(
        self, timestep: torch.Tensor, batch: int, frames: int, first_frame_cond: bool = True
    ) -> torch.Tensor:
        """float32 [batch, frames, freq_dim]: the sinusoidal features of each latent frame's timestep, from the
        exact float32 timesteps ([batch] or one value for all, scheduler units). With first_frame_cond the
        clean first frame (latent frame 0) gets timestep 0 (TI2V separated timestep)."""
        t_frame = timestep.float().reshape(-1, 1).expand(batch, frames).clone()
        if first_frame_cond:
            t_frame[:, 0] = 0
        return sinusoidal_embedding_1d(self.freq_dim, t_frame.reshape(-1)).view(batch, frames, self.freq_dim)

    def gc_forward(
        self,
        x_t: torch.Tensor,
        timestep: torch.Tensor,
        context: torch.Tensor,
        context_index: torch.Tensor,
        sem_ids: torch.Tensor,
        first_frame_cond: bool = True,
        aux: bool = False,
    ):
        """x_t [B, C, T, h, w]; timestep [B] or a scalar (scheduler units, float32, on x_t's device); context
        [B, P, L, D] (each sample's distinct prompts); context_index [B, T] (each latent frame's prompt among
        them); sem_ids uint8 [B, 4(T-1)+1, 16h, 16w]. Returns the prediction [B, C, T, h, w] (and aux stats).

        first_frame_cond: latent frame 0 is the clean first frame (TI2V) and gets timestep 0.
        """
        t_freq = self.time_features(timestep, x_t.shape[0], x_t.shape[2], first_frame_cond)
        return self(x_t, t_freq, context, context_index, sem_ids, aux=aux)

    def forward(
        self,
        x_t: torch.Tensor,
        t_freq: torch.Tensor,
        context: torch.Tensor,
        context_index: torch.Tensor,
        sem_ids: torch.Tensor,
        aux: bool = False,
    ):
        """`gc_forward` after the timestep features (t_freq [B, T, freq_dim]); see the class docstring."""
        B, _, T = x_t.shape[:3]
        if tuple(t_freq.shape) != (B, T, self.freq_dim):
            raise ValueError(
                f"timestep features {tuple(t_freq.shape)}, expected {(B, T, self.freq_dim)}: call "
                f"gc_forward(x_t, timestep, ...), which makes them from the timesteps"
            )
        if context.dim() != 4 or context.shape[0] != B or tuple(context_index.shape) != (B, T):
            raise ValueError(
                f"context {tuple(context.shape)} / index {tuple(context_index.shape)}: need each sample's prompts "
                f"[{B}, P, L, D] and one prompt index per latent frame ({B}, {T})"
            )
        dtype = x_t.dtype
        x = self.patch_embedding(x_t)
        f, gh, gw = x.shape[2:]
        x = rearrange(x, "b c f h w -> b (f h w) c")
        want = (B, pixel_frames(T), gh * VAE_STRIDE_S * self.patch_size[1], gw * VAE_STRIDE_S * self.patch_size[2])
        if tuple(sem_ids.shape) != want:
            raise ValueError(f"sem_ids {tuple(sem_ids.shape)} do not cover latents {tuple(x_t.shape)}: need {want}")
        cond = self.gc_sem_cond(class_fractions(sem_ids, self.vocab, self.patch_size).to(dtype))
        stats = {
            "x_rms": x.detach().float().pow(2).mean().sqrt(),
            "sem_rms": cond.detach().float().pow(2).mean().sqrt(),
        }
        x = x + cond

        # separated timestep: embedded per latent frame (2 distinct values per sample) and kept per frame; the
        # blocks and the head broadcast it over each frame's tokens (gcc/model/blocks.py)
        t = self.time_embedding(t_freq.reshape(B * f, self.freq_dim).to(dtype))
        t_mod = self.time_projection(t).view(B, f, 6, self.dim)
        ctx = self.embed_context(context.to(dtype), context_index)
        freqs = rope_tables(self.dim // self.config.num_heads, (f, gh, gw), x.device)
        for block in self.blocks:
            x = block(x, ctx, t_mod, freqs)
        x = self.head(x, t.view(B, f, self.dim))
        out = self.unpatchify(x, (f, gh, gw))
        return (out, stats) if aux else out


def _full_size_twin(module: nn.Module) -> nn.Module:
    """A bare copy of `module` (its class without FSDP, its attributes) that owns full-size CPU tensors for its
    own parameters and has no children: what the module's init code runs on, whatever its parameters are now
    (meta, a DTensor shard, a device tensor)."""
    return bare_copy(
        module,
        {
            n: nn.Parameter(torch.empty(tuple(p.shape), dtype=p.dtype), requires_grad=False)
            for n, p in module.named_parameters(recurse=False)
        },
    )


def materialize(model: GcDiT, device: str | torch.device = "cpu") -> GcDiT:
    """A meta-device model, unsharded, on `device`, initialised module by module (`GcDiT.param_init_fn`)."""
    model.to_empty(device=device)
    for m in model.modules():
        model.param_init_fn(m)
    return model


def build_gc_dit(
    cfg: DiTConfig | str,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    init_seed: int = 0,
    **overrides,
) -> GcDiT:
    """Build from a preset name or config, initialised from `init_seed`. device="meta" allocates nothing (shapes,
    parameter counts, or a model that FSDP shards and initialises rank by rank)."""
    if isinstance(cfg, str):
        cfg = model_config(cfg, **overrides)
    with torch.device("meta"):
        model = GcDiT(cfg, init_seed=init_seed)
    if str(device) != "meta":
        materialize(model, device or "cpu")
    return model.to(dtype) if dtype is not None else model


def wan_keys(model: nn.Module) -> list[str]:
    return [k for k in model.state_dict() if not k.startswith(COND_PREFIX)]


def cond_keys(model: nn.Module) -> list[str]:
    return [k for k in model.state_dict() if k.startswith(COND_PREFIX)]


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---- base weights ----------------------------------------------------------------------------------------


def _wan_weight_map(model_dir: Path) -> dict[str, str]:
    """key -> shard file name, from the index of the published layout (or a single unsharded file); read through
    `gcc.inputs` (a bounded regular file; a safetensors header alone), each file name one path component inside
    `model_dir` (gcc.names). ValueError naming the file otherwise."""
    index = model_dir / WAN_INDEX
    try:
        if index.exists():  # whatever it is: gcc.inputs says what is wrong with it
            data = inputs.load_json_object(index, "the Wan weights' index")
            weight_map = data.get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{index}: no weight_map")
            for k, fname in weight_map.items():
                check_component(fname, f"{index}: weight_map[{inputs.shown(repr(k), 80)}]")
            return weight_map
        single = model_dir / WAN_SINGLE
        if single.exists():
            return {k: WAN_SINGLE for k in inputs.safetensors_header(single)[0]}
    except (BadInput, UnsafeName) as e:
        raise ValueError(str(e)) from None
    raise FileNotFoundError(
        f"{model_dir}: neither {WAN_INDEX} nor {WAN_SINGLE} found (expected the published Wan2.2-TI2V-5B layout)"
    )


def write_wan_layout(state_dict: dict[str, torch.Tensor], folder: str | os.PathLike, n_shards: int = 1) -> None:
    """Write Wan weights as Wan2.2 is published (what `load_wan_base` reads): `n_shards` files
    diffusion_pytorch_model-0000i-of-0000n.safetensors and the index that maps each key to its file. Each file goes
    through gcc's one writer (gcc.storage: never through a link, never half written, the user's umask)."""
    keys = sorted(state_dict)
    weight_map = {}
    for s in range(n_shards):
        name = f"diffusion_pytorch_model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        part = keys[s::n_shards]
        shard = safetensors_bytes({k: state_dict[k].contiguous() for k in part})
        storage.atomic_write(Path(folder) / name, shard, root=folder)
        weight_map.update({k: name for k in part})
    index = json.dumps({"metadata": {}, "weight_map": weight_map})
    storage.atomic_write(Path(folder) / WAN_INDEX, index, root=folder)


def read_slice(fh, key: str, slices: tuple[slice, ...]) -> torch.Tensor:
    """Only `slices` of `key` from an open safetensors file (a rank reads just the rows it holds)."""
    return fh.get_slice(key)[slices] if slices else fh.get_tensor(key)


@torch.no_grad()
def load_wan_base(model: GcDiT, model_dir: str | os.PathLike, check_only: bool = False) -> GcDiT:
    """Load Wan weights from a local Wan2.2 directory as published (sharded diffusion_pytorch_model*.safetensors
    + index). Every Wan key of the model must come from the files with the same shape; the cond is left as is.
    An FSDP-sharded model reads only the rows each rank holds. With `check_only` only the index and the files'
    headers are read and checked against `model` (which may be on the meta device); nothing is copied."""
    model_dir = Path(model_dir)
    weight_map = _wan_weight_map(model_dir)
    params = model.state_dict()
    expected = set(wan_keys(model))
    unexpected = sorted(set(weight_map) - expected)
    missing = sorted(expected - set(weight_map))
    if unexpected or missing:
        raise ValueError(
            f"{model_dir}: index does not match the model: missing {missing[:5]}"
            f"{'...' if len(missing) > 5 else ''} ({len(missing)}), unexpected {unexpected[:5]}"
            f"{'...' if len(unexpected) > 5 else ''} ({len(unexpected)})"
        )
    by_file: dict[str, list[str]] = {}
    for k, fname in weight_map.items():
        by_file.setdefault(fname, []).append(k)
    for fname in sorted(by_file):
        path = model_dir / fname
        if not path.is_file():
            raise FileNotFoundError(f"missing weight file {path} (listed in {WAN_INDEX})")
        try:  # the header alone first: every key's shape (and its bytes inside the file) before any is read
            header, _ = inputs.safetensors_header(path)
        except BadInput as e:
            raise ValueError(str(e)) from None
        for k in by_file[fname]:
            if k not in header:
                raise ValueError(f"{path}: key {k} listed in the index is not in the file")
            if header[k].shape != tuple(params[k].shape):
                raise ValueError(f"{path}: {k} has shape {header[k].shape}, model expects {tuple(params[k].shape)}")
        if check_only:
            continue
        with safe_open(str(path), "pt") as fh:
            for k in by_file[fname]:
                fill_local(params[k], partial(read_slice, fh, k))
    return model
