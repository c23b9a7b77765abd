"""The decoders of the training samples (gcc/sampling/decoders.py): the synthetic world's decoder recovers a
clip's classes from its own latents and scores a sample against them; the latent preview is one fixed map for the
GT and the samples."""

from __future__ import annotations

import numpy as np
import torch

from gcc.compat.diffsynth import VideoVAE38_
from gcc.geometry import VAE_STRIDE_S, pixel_frames
from gcc.sampling.decoders import LatentPreview, SynthDecoder, VaeDecoder, pick_decoder, preview_map
from gcc.synth import world as synth
from gcc.synth.decode import gt_cell_classes
from gcc.vocab import colorize


def synth_clip(i: int = 2, vocab: str = "parts"):
    """A synthetic clip's latents [48, T, h, w], its context keys and its sem ids, as gcc.synth.world makes them."""
    g = synth.get_geometry("tiny")
    scene = synth.make_scene(0, i, g)
    ids, _shade = synth.render_clip(scene)
    keys = sorted(set(synth.PROMPT_KEYS))
    context = [keys[k % len(keys)] for k in range(g.T)]
    lat = synth.make_latents(ids, context, g, np.random.default_rng(0))
    return torch.from_numpy(lat), keys, [keys.index(k) for k in context], ids, g


def test_the_synthetic_decoder_recovers_the_clips_classes_and_scores_them():
    lat, keys, ids, sem, g = synth_clip()
    dec = SynthDecoder(keys, "parts")
    gt = dec.decode(lat, ids, lat)
    truth = gt_cell_classes(sem, g.T, g.h, g.w, "parts")
    assert gt.cells.shape == (g.T, g.h, g.w)
    assert np.mean(gt.cells == truth) > 0.95  # the synth's own latents decode to (nearly) its majority classes
    assert gt.frames.shape == (pixel_frames(g.T), g.h * VAE_STRIDE_S, g.w * VAE_STRIDE_S, 3)
    assert gt.frames.dtype == np.uint8
    # the frames are the cells in the vocabulary's palette
    assert np.array_equal(
        gt.frames[-1, :VAE_STRIDE_S, :VAE_STRIDE_S], colorize(np.full((16, 16), gt.cells[-1, 0, 0]), "parts")
    )
    assert dec.score(gt, gt) == 1.0
    noise = dec.decode(torch.randn_like(lat), ids, lat)
    assert dec.score(noise, gt) < 0.6  # random latents agree with the GT on few cells


def test_the_latent_preview_is_one_fixed_map_for_the_gt_and_a_sample():
    lat, _keys, ids, _sem, g = synth_clip()
    prev = LatentPreview()
    a, b = prev.decode(lat, ids, lat), prev.decode(lat.clone(), ids, lat)
    assert np.array_equal(a.frames, b.frames) and a.frames.shape == (pixel_frames(g.T), 16 * g.h, 16 * g.w, 3)
    assert a.frames.std() > 10  # not a flat picture
    other = prev.decode(lat + torch.randn_like(lat), ids, lat)
    assert not np.array_equal(other.frames, a.frames)
    # the map is that of the reference latents, whatever is being shown
    mean, basis, scale = preview_map(lat)
    m2, b2, s2 = preview_map(lat.clone())
    assert np.array_equal(basis, b2) and np.array_equal(scale, s2) and np.array_equal(mean, m2)
    assert prev.score(other, a) is None and prev.score_name is None


def test_the_vae_decoder_scores_psnr_against_the_clips_own_latents_decoded(tmp_path):
    """A tiny WanVideoVAE38 saved as published (the bare network's state dict), picked for real data with a
    vae_path; frame 0 is left out of the score."""
    torch.manual_seed(5)
    torch.save(VideoVAE38_(dim=8, z_dim=48, dec_dim=8).state_dict(), tmp_path / "Wan2.2_VAE.pth")
    lat, keys, ids, _sem, g = synth_clip()
    dec = pick_decoder(False, str(tmp_path / "Wan2.2_VAE.pth"), keys, "parts")
    assert isinstance(dec, VaeDecoder) and dec.score_name == "psnr"
    gt = dec.decode(lat, ids, lat)
    assert gt.frames.shape == (pixel_frames(g.T), 16 * g.h, 16 * g.w, 3) and gt.cells is None
    assert dec.score(dec.decode(lat.clone(), ids, lat), gt) is None  # identical: PSNR infinite
    other = lat.clone()
    other[:, 1:] += torch.randn_like(other[:, 1:])
    psnr = dec.score(dec.decode(other, ids, lat), gt)
    assert psnr is not None and 0 < psnr < 100
    # gcc-synth data is decoded by its own decoder even with a VAE; without either, the latent preview
    assert isinstance(pick_decoder(True, str(tmp_path / "Wan2.2_VAE.pth"), keys, "parts"), SynthDecoder)
    assert isinstance(pick_decoder(False, "", keys, "parts"), LatentPreview)
