"""Sampled latents to pictures, for the samples logged during training (docs/sample.md, "Samples during
training"). Which decoder a run gets follows from its data (`pick_decoder`):

* `SynthDecoder`: data that `gcc-synth` made. The synthetic world's own decoder (`gcc.synth.decode`) turns the
  latents into a class per latent cell, painted in the vocabulary's palette; the score is the class agreement
  with the classes decoded from the clip's own latents (latent frames 1..; frame 0 is given).
* `VaeDecoder`: real data with `model.vae_path`. DiffSynth's `WanVideoVAE38` decodes to RGB; the score is the
  PSNR against the clip's own latents decoded the same way (the training data holds latents, not the frames).
* `LatentPreview`: anything else. A fixed linear map of the 48 latent channels to RGB (the top three principal
  directions of the clip's own latents), each latent cell painted over its pixels; no score.

Every decoder is deterministic: the same latents give the same frames on any rank, launch or resume.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gcc.synth.decode import agreement, cells_to_pixels, decode_classes
from gcc.vocab import colorize


@dataclass
class Decoded:
    frames: np.ndarray  # uint8 [F, H, W, 3]
    cells: np.ndarray | None = None  # the synthetic decoder's class per latent cell [T, h, w]


class SynthDecoder:
    name = "synthetic decoder (gcc-synth data)"
    score_name = "agreement"  # the fraction of latent cells (frames 1..) whose class matches the GT's

    def __init__(self, prompt_keys: Sequence[str], vocab: str):
        self.keys, self.vocab = list(prompt_keys), vocab

    def decode(self, latents: torch.Tensor, context_ids: Sequence[int], gt_latents: torch.Tensor) -> Decoded:
        cells = decode_classes(latents, [self.keys[int(i)] for i in context_ids], self.vocab)
        return Decoded(colorize(cells_to_pixels(cells), self.vocab), cells)

    def score(self, gen: Decoded, gt: Decoded) -> float | None:
        assert gen.cells is not None and gt.cells is not None  # `decode` sets them
        return agreement(gen.cells, gt.cells)


class VaeDecoder:
    name = "Wan2.2 VAE"
    score_name = "psnr"  # dB, pixel frames 1.. (frame 0 is given)

    def __init__(self, vae, device):
        self.vae, self.device = vae, device

    def decode(self, latents: torch.Tensor, context_ids: Sequence[int], gt_latents: torch.Tensor) -> Decoded:
        from gcc.sampling.vae import vae_decode  # diffsynth's VAE: only a run with model.vae_path gets here

        return Decoded(vae_decode(self.vae, latents, self.device))

    def score(self, gen: Decoded, gt: Decoded) -> float | None:
        from gcc.sampling.metrics import psnr  # torchmetrics: seconds to import, only with a VAE

        return psnr(gen.frames[1:], gt.frames[1:], self.device)


class LatentPreview:
    name = "latent preview (no decoder: not gcc-synth data and no model.vae_path)"
    score_name = None

    def decode(self, latents: torch.Tensor, context_ids: Sequence[int], gt_latents: torch.Tensor) -> Decoded:
        return Decoded(preview_frames(latents, *preview_map(gt_latents)))  # one map for GT and samples

    def score(self, gen: Decoded, gt: Decoded) -> float | None:
        return None


def pick_decoder(synthetic: bool, vae_path: str, prompt_keys: Sequence[str], vocab: str):
    """The synthetic decoder for data gcc-synth made, else the Wan VAE of `vae_path` (on this rank's GPU in bf16,
    else the CPU in fp32), else the latent preview."""
    if synthetic:
        return SynthDecoder(prompt_keys, vocab)
    if vae_path:
        from gcc.sampling.vae import load_vae  # diffsynth's VAE: only a run with model.vae_path gets here

        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        return VaeDecoder(load_vae(vae_path, device, dtype), device)
    return LatentPreview()


def _cells(latents: torch.Tensor) -> np.ndarray:
    """[C, T, h, w] -> float64 [T*h*w, C]."""
    lat = latents.detach().float().cpu().numpy().astype(np.float64)
    return lat.reshape(lat.shape[0], -1).T


def preview_map(latents: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean [C], basis [C, 3], scale [3]) from `latents` [C, T, h, w]: the top three principal directions of its
    cells' channel vectors (each direction's largest entry made positive, so the same latents give the same map),
    and ±3 standard deviations of the projection as the colour range."""
    x = _cells(latents)
    mean = x.mean(axis=0)
    _, _, vt = np.linalg.svd(x - mean, full_matrices=False)
    basis = np.zeros((x.shape[1], 3))
    k = min(3, vt.shape[0])
    basis[:, :k] = vt[:k].T
    basis *= np.where(basis[np.abs(basis).argmax(axis=0), range(3)] < 0, -1.0, 1.0)
    scale = 3.0 * ((x - mean) @ basis).std(axis=0) + 1e-12
    return mean, basis, scale


def preview_frames(latents: torch.Tensor, mean: np.ndarray, basis: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """latents [C, T, h, w] -> uint8 [F, 16h, 16w, 3]: each cell's projection (`preview_map`) in [0, 255], painted
    over its 16x16 pixels in its latent frame's pixel frames."""
    _, T, h, w = latents.shape
    rgb = ((_cells(latents) - mean) @ basis / scale).reshape(T, h, w, 3)
    return cells_to_pixels(np.clip((rgb + 1.0) * 127.5, 0, 255).round().astype(np.uint8))  # [T, h, w, 3] too
