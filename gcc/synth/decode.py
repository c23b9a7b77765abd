"""The synthetic world's own decoder (docs/sample.md): latents -> class per latent cell -> palette pixels.

`gcc.synth.world.make_latents` writes latent cell (k, i, j) as
`fractions @ class_projection() + TEXT_SCALE * text_vector(context_key[k]) + NOISE_SCALE * noise`, with the cell's
class fractions over the `parts` vocabulary (+ UNKNOWN). This module inverts that map by least squares: subtract
the text term of latent frame k's key, multiply by the pseudo-inverse of the projection ([V, 48] with V = 20 rows:
full row rank, so the fractions come back up to the noise), and take the largest fraction as the cell's class.
On the synth's own latents that recovers the majority class of (nearly) every cell; the only misses are cells
whose two largest fractions are almost tied (tests/synth/test_synth.py).

A cell covers the 16x16 pixels of its footprint in the pixel frames of its latent frame (frame 0 = pixel frame 0,
frame k >= 1 = pixel frames 4k-3..4k, `gcc.geometry.latent_frame_spans`); `cells_to_pixels` paints it there.
Data made by `gcc.synth.world` carries `synth.MARKER` in its prepared root (`gcc.synth.world.is_synthetic`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from gcc import vocab
from gcc.geometry import VAE_STRIDE_S, latent_frame_spans, pixel_frames
from gcc.synth import world as synth


@lru_cache(maxsize=1)
def _unprojection() -> np.ndarray:
    """float64 [48, V]: the least-squares inverse of `synth.class_projection()` (parts vocabulary)."""
    return np.linalg.pinv(synth.class_projection().astype(np.float64))


def _parts_to(vocab_name: str) -> np.ndarray:
    """[V_parts, V_vocab] 0/1: which class of `vocab_name` each parts channel falls into (its collapse)."""
    parts = np.array(vocab.VOCAB_VALUES["parts"], dtype=np.uint8)
    target = parts if vocab_name == "parts" else vocab.collapse_parts(parts)
    lut = vocab.CHANNEL_LUT[vocab.check_vocab(vocab_name)]
    m = np.zeros((len(parts), vocab.num_classes(vocab_name)))
    m[np.arange(len(parts)), lut[target]] = 1.0
    return m


def decode_fractions(latents, context_keys: Sequence[str]) -> np.ndarray:
    """latents [48, T, h, w] (numpy or torch, any float dtype) and the clip's T context keys -> the least-squares
    class fractions float64 [T, h, w, V] over the parts vocabulary (+ UNKNOWN); not clipped to [0, 1]."""
    lat = latents.detach().float().cpu().numpy() if hasattr(latents, "detach") else np.asarray(latents)
    lat = lat.astype(np.float64).transpose(1, 2, 3, 0)  # [T, h, w, C]
    if len(context_keys) != lat.shape[0]:
        raise ValueError(f"{len(context_keys)} context keys for {lat.shape[0]} latent frames")
    text = np.stack([synth.text_vector(k) for k in context_keys]).astype(np.float64)  # [T, C]
    return (lat - synth.TEXT_SCALE * text[:, None, None, :]) @ _unprojection()


def fractions_to_classes(fractions: np.ndarray, vocab_name: str = "parts") -> np.ndarray:
    """Parts fractions [..., V_parts] -> the largest class of `vocab_name` (its raw value, uint8 [...]); for `ids`
    the parts of one character are summed first, as `collapse_parts` merges them."""
    frac = fractions @ _parts_to(vocab_name) if vocab_name != "parts" else fractions
    values = np.array(vocab.VOCAB_VALUES[vocab_name], dtype=np.uint8)
    return values[np.argmax(frac, axis=-1)]


def decode_classes(latents, context_keys: Sequence[str], vocab_name: str = "parts") -> np.ndarray:
    """latents [48, T, h, w] -> class per latent cell, uint8 [T, h, w] (raw values of `vocab_name`)."""
    return fractions_to_classes(decode_fractions(latents, context_keys), vocab_name)


def gt_cell_classes(ids: np.ndarray, T: int, h: int, w: int, vocab_name: str = "parts") -> np.ndarray:
    """Sem ids uint8 [F, H, W] (parts values) -> the majority class of every latent cell, uint8 [T, h, w] (raw
    values of `vocab_name`; ties go to the lower channel)."""
    ids = ids if vocab_name == "parts" else vocab.collapse_parts(ids)
    frac = synth.latent_cell_fractions(ids, T, h, w, vocab_name)
    return np.array(vocab.VOCAB_VALUES[vocab_name], dtype=np.uint8)[np.argmax(frac, axis=-1)]


def cells_to_pixels(cells: np.ndarray) -> np.ndarray:
    """Class per latent cell [T, h, w] -> per pixel [F, 16h, 16w]: each cell fills its 16x16 footprint in the
    pixel frames of its latent frame. Trailing axes are kept ([T, h, w, 3] colours -> [F, 16h, 16w, 3])."""
    T = cells.shape[0]
    up = np.repeat(np.repeat(cells, VAE_STRIDE_S, axis=1), VAE_STRIDE_S, axis=2)
    frame_of = np.concatenate([np.full(hi - lo, k) for k, (lo, hi) in enumerate(latent_frame_spans(T))])
    assert len(frame_of) == pixel_frames(T)
    return up[frame_of]


def agreement(generated: np.ndarray, reference: np.ndarray, first: int = 1) -> float | None:
    """Fraction of latent cells [T, h, w] whose class is the same in both, over latent frames `first`.. (frame 0 is
    given to the model, so it is left out by default); None when there is no such frame."""
    if generated.shape != reference.shape:
        raise ValueError(f"class maps differ in shape: {generated.shape} vs {reference.shape}")
    if generated.shape[0] <= first:
        return None
    return float(np.mean(generated[first:] == reference[first:]))
