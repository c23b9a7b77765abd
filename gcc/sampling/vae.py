"""The Wan2.2 VAE: finding and loading the file, pixels to/from the VAE's range, encode and decode."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from gcc.errors import BadInput
from gcc.inputs import check_pickled_weights


class VaeError(BadInput):
    """A VAE file or folder that cannot be used; the message names it and what was expected."""


VAE_FILES = ("Wan2.2_VAE.pth", "Wan2.2_VAE.safetensors")  # as published / DiffSynth's converted copy


def find_vae_file(model_dir: str | os.PathLike) -> Path:
    d = Path(model_dir)
    if not d.is_dir():
        raise VaeError(f"{d}: not a directory (expected the Wan2.2-TI2V-5B folder as published)")
    for name in VAE_FILES:
        if (d / name).is_file():
            return d / name
    raise VaeError(
        f"{d}: no VAE file ({' or '.join(VAE_FILES)}); the Wan2.2-TI2V-5B folder as published holds Wan2.2_VAE.pth"
    )


def load_vae(path: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """DiffSynth's `WanVideoVAE38` with the weights of `path` (a `.pth` state dict as published, or safetensors).

    Loaded the way DiffSynth's model loader does it: `diffsynth.core.loader.file.load_state_dict` + the
    registered `WanVideoVAEStateDictConverter` (adds `model.`), modules built under `skip_model_initialization`,
    `load_state_dict(strict, assign)`. The network's widths are read from the file: z_dim = conv2's channels,
    dim = encoder.conv1's, dec_dim = decoder.conv1's / 4. The published file is (z 48, dim 160, dec 256), which
    `WanVideoVAE38(z_dim, dim)` builds; another decoder width (tiny test VAEs) swaps in DiffSynth's
    `VideoVAE38_(dim, z_dim, dec_dim)` as `.model`.
    """
    # heavy (diffsynth, ~4 s): gcc-sample imports this module; keeps --help and argument errors fast
    from gcc.compat.diffsynth import (
        VideoVAE38_,
        WanVideoVAE38,
        WanVideoVAEStateDictConverter,
        load_state_dict,
        skip_model_initialization,
    )

    path = str(path)
    try:
        if not path.endswith(".safetensors"):  # pickled weights: the records' sizes checked before torch reads them
            check_pickled_weights(path)
        sd = WanVideoVAEStateDictConverter(load_state_dict(path))
        z_dim = int(sd["model.conv2.weight"].shape[0])
        dim = int(sd["model.encoder.conv1.weight"].shape[0])
        dec_dim = int(sd["model.decoder.conv1.weight"].shape[0]) // 4
    except KeyError as e:
        raise VaeError(f"{path}: not a Wan2.2 VAE state dict (no {e})") from None
    except BadInput as e:
        raise VaeError(str(e)) from None
    except Exception as e:
        raise VaeError(f"{path}: cannot be read as a VAE state dict: {e}") from None
    with skip_model_initialization():
        vae = WanVideoVAE38(z_dim=z_dim, dim=dim)
        if dec_dim != 256:  # VideoVAE38_'s default decoder width, the published one
            vae.model = VideoVAE38_(dim=dim, z_dim=z_dim, dec_dim=dec_dim).eval().requires_grad_(False)
    try:
        vae.load_state_dict(sd, assign=True, strict=True)
    except RuntimeError as e:
        raise VaeError(
            f"{path}: does not fit WanVideoVAE38(z_dim={z_dim}, dim={dim}, dec_dim={dec_dim}): {e}"
        ) from None
    return vae.to(device=device, dtype=dtype).eval()


def to_vae_range(frames: np.ndarray, dtype=torch.float32) -> torch.Tensor:
    """uint8 [F, H, W, 3] -> [3, F, H, W] in [-1, 1] (DiffSynth's preprocess_video)."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).to(torch.float32)
    return (x * (2.0 / 255.0) - 1.0).permute(3, 0, 1, 2).to(dtype)


def from_vae_range(video: torch.Tensor) -> np.ndarray:
    """[3, F, H, W] in [-1, 1] -> uint8 [F, H, W, 3] (rounded; DiffSynth's vae_output_to_video truncates)."""
    x = ((video.float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return x.permute(1, 2, 3, 0).cpu().numpy()


@torch.no_grad()
def vae_decode(vae, latents: torch.Tensor, device, tiled: bool = False) -> np.ndarray:
    """latents [C, T, h, w] -> uint8 [F, H, W, 3]."""
    p = next(vae.parameters())
    return from_vae_range(vae.decode([latents.to(p.dtype)], device=device, tiled=tiled)[0])


@torch.no_grad()
def vae_encode(vae, frames: np.ndarray, device, tiled: bool = False) -> torch.Tensor:
    p = next(vae.parameters())
    return vae.encode([to_vae_range(frames, p.dtype)], device=device, tiled=tiled)[0]
