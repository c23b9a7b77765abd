"""A random Wan2.2 model folder in the published layout: DiT shards + index + `Wan2.2_VAE.pth` (README.md, "Real
data end to end", followed on synthetic data; the tests' base weights).

    gcc-synth --wan_model tiny|wide --out DIR [--seed 11]

The DiT is DiffSynth's plain `WanModel` with a gcc preset's shapes (gcc/model/dit.py), written as Wan2.2-TI2V-5B
is published: `diffusion_pytorch_model-0000i-of-0000n.safetensors` + `diffusion_pytorch_model.safetensors.index.json`
(what `model.model_dir` and `gcc-sample --model_dir` read). The VAE is DiffSynth's `VideoVAE38_` with the real
latent width (z_dim 48) but narrow layers, saved as the published `.pth` (the bare network's state dict); gcc reads
its widths from the file (gcc/sampling/vae.py). Weights are random, a pure function of the seed: the folder proves
the path from a published model folder to a run and its samples, not a model.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING

from gcc.errors import BadInput
from gcc.storage import atomic_write

if TYPE_CHECKING:  # torch is imported where weights are made: `gcc-synth --help` starts without it
    import torch

TINY_VAE = dict(dim=8, z_dim=48, dec_dim=8)  # VideoVAE38_ widths: the published z_dim, CPU-sized layers
VAE_FILE = "Wan2.2_VAE.pth"  # as published (gcc/sampling/vae.py VAE_FILES[0])
PRESETS = ("tiny", "wide")  # gcc/model/dit.py presets a CPU can hold; tiny fits `gcc-synth --geometry tiny`


def write_wan_dit(
    folder: str | os.PathLike,
    n_shards: int = 2,
    preset: str = "tiny",
    seed: int = 11,
    dtype: torch.dtype | None = None,
    **overrides,
) -> dict[str, torch.Tensor]:
    """A plain DiffSynth WanModel (random, seeded) with `preset`'s shapes (+ `overrides`) written as Wan2.2 is
    published: `n_shards` safetensors files and the index. Returns its state dict (in `dtype`)."""
    import torch

    from gcc.compat.diffsynth import WanModel
    from gcc.model.dit import model_config, write_wan_layout

    cfg = model_config(preset, **overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        wan = WanModel(**cfg.wan_kwargs())
    sd = {k: (v.to(dtype) if dtype is not None else v) for k, v in wan.state_dict().items()}
    del wan
    write_wan_layout(sd, folder, n_shards)
    return sd


def write_wan_vae(folder: str | os.PathLike, seed: int = 5) -> dict[str, torch.Tensor]:
    """A narrow Wan2.2 VAE (TINY_VAE widths, random, seeded) saved as published: `<folder>/Wan2.2_VAE.pth`, the
    bare network's state dict. Returns it."""
    import torch

    from gcc.compat.diffsynth import VideoVAE38_

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = VideoVAE38_(**TINY_VAE)
    sd = net.state_dict()
    buf = io.BytesIO()
    torch.save(sd, buf)
    atomic_write(Path(folder) / VAE_FILE, buf.getvalue(), root=folder)  # gcc's one writer (gcc/storage.py)
    return sd


def write_model_folder(out: str | os.PathLike, preset: str = "tiny", n_shards: int = 2, seed: int = 11) -> int:
    """`gcc-synth --wan_model PRESET --out DIR`: the DiT (in bf16; the readers cast to the model's dtype) and the VAE into the new or empty
    folder `out`. Returns the DiT's parameter count. BadInput when `out` is not empty (nothing is overwritten)."""
    import torch

    folder = Path(out)
    if folder.exists() and any(folder.iterdir()):
        raise BadInput(f"--out {out}: not empty (a model folder is written into a new or empty folder)")
    folder.mkdir(parents=True, exist_ok=True)
    sd = write_wan_dit(folder, n_shards, preset, seed, dtype=torch.bfloat16)
    write_wan_vae(folder)
    return sum(v.numel() for v in sd.values())
