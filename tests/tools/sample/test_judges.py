"""How gcc-sample turns a sampled clip into pictures and numbers (gcc/tools/sample/judges.py, docs/sample.md): the
synthetic world's judge scores a clip's own latents as (nearly) its classes and random latents as few, and writes
the mp4, the contact sheet and one row per latent frame; the VAE judge decodes with a real (tiny) Wan2.2 VAE,
measures against the GT frames and the VAE's own ceiling, and refuses a decoded video of another shape."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from gcc.compat.diffsynth import VideoVAE38_
from gcc.data.shards import ClipRecord, encode_clip
from gcc.synth import world as synth
from gcc.tools.sample.errors import SampleError
from gcc.tools.sample.judges import SynthJudge, VaeJudge
from gcc.vocab import NULL_PROMPT

ARGS = dict(fps=8, data="prepared", vae_tiled=False, no_ssim=False, no_recon_ceiling=False, model_dir="m")


@pytest.fixture(scope="module")
def clip():
    """A synthetic clip as the sample tool reads it (an MDS sample decoded), its geometry and text keys."""
    g = synth.get_geometry("tiny")
    scene = synth.make_scene(0, 2, g)
    ids, _shade = synth.render_clip(scene)
    keys = sorted({*synth.PROMPT_KEYS, NULL_PROMPT})
    lat = synth.make_latents(ids, scene.context_keys, g, np.random.default_rng(0))
    sample = encode_clip(
        synth.index_row(2, scene.context_keys),
        np.array([keys.index(k) for k in scene.context_keys]),
        torch.from_numpy(lat).to(torch.bfloat16),
        ids,
        json.dumps(scene.meta),
    )
    return ClipRecord.from_sample(sample), g, keys


def test_the_synth_judge_scores_the_clips_own_latents_as_its_classes(clip, tmp_path):
    rec, g, keys = clip
    judge = SynthJudge(SimpleNamespace(**ARGS), SimpleNamespace(keys=keys), "parts")
    sem = rec.sem_ids()
    gt = judge.reference(rec, g, sem)
    assert gt.shape == (g.T, g.h, g.w)
    row, hw, timings = judge.compare(tmp_path, rec, g, rec.input_latents.float(), gt, sem)
    assert row["class_agreement"] > 0.95 and row["cells"] == gt[1:].size
    assert hw == [sem.shape[1], sem.shape[2]] and set(timings) == {"decode", "metrics"}
    frames = json.loads((tmp_path / f"{rec.clip_id}.frames.json").read_text())["latent_frames"]
    assert [f["latent_frame"] for f in frames] == list(range(g.T)) and frames[0]["pixel_frames"] == [0, 0]
    assert Image.open(tmp_path / f"{rec.clip_id}.png").format == "PNG"
    assert (tmp_path / f"{rec.clip_id}.mp4").stat().st_size > 0
    noise, _, _ = judge.compare(tmp_path, rec, g, torch.randn(rec.input_latents.shape), gt, sem)
    assert noise["class_agreement"] < 0.6
    assert noise["class_agreement_copy_frame0"] == row["class_agreement_copy_frame0"]  # the GT's, not the sample's
    assert "class agreement" in SynthJudge.describe(row)


def test_the_synth_judge_refuses_a_text_table_the_world_does_not_write(clip):
    _rec, _g, keys = clip
    with pytest.raises(SampleError, match=r"has keys that world does not write: \['walk_on_the_moon'\]"):
        SynthJudge(SimpleNamespace(**ARGS), SimpleNamespace(keys=[*keys, "walk_on_the_moon"]), "parts")


@pytest.fixture(scope="module")
def tiny_vae(tmp_path_factory):
    with torch.random.fork_rng():
        torch.manual_seed(5)
        net = VideoVAE38_(dim=8, z_dim=48, dec_dim=8)  # the published file's format, a narrow network
    path = tmp_path_factory.mktemp("vae") / "Wan2.2_VAE.pth"
    torch.save(net.state_dict(), path)
    return path


def test_the_vae_judge_measures_the_decoded_sample_and_the_vaes_ceiling(clip, tiny_vae, tmp_path):
    rec, g, _keys = clip
    judge = VaeJudge(SimpleNamespace(**ARGS), tiny_vae, tmp_path, "parts", "cpu")
    judge.load(torch.float32)
    # one latent frame of 2x2 cells (a 32x32 picture): the VAE on CPU costs seconds per full tiny clip
    lat = torch.from_numpy(np.random.default_rng(2).standard_normal((48, 1, 2, 2), dtype=np.float32))
    gt = np.random.default_rng(3).integers(0, 255, size=(1, 32, 32, 3), dtype=np.uint8)
    sem = np.zeros((1, 32, 32), dtype=np.uint8)
    row, hw, timings = judge.compare(tmp_path, rec, g, lat, gt, sem)
    assert hw == [32, 32] and set(timings) == {"decode", "recon", "metrics"}
    assert row["psnr"] is None and row["psnr_frame0"] is not None  # one frame: no frames 1.. to summarise
    assert row["recon_psnr_frame0"] is not None and row["recon_psnr_frame0"] != row["psnr_frame0"]
    frames = json.loads((tmp_path / f"{rec.clip_id}.frames.json").read_text())["frames"]
    assert len(frames) == 1 and frames[0]["recon_psnr"] == row["recon_psnr_frame0"]
    assert (tmp_path / f"{rec.clip_id}.mp4").stat().st_size > 0
    judge.a = SimpleNamespace(**{**ARGS, "no_recon_ceiling": True})
    row, _hw, _t = judge.compare(tmp_path, rec, g, lat, gt, sem)
    assert row["recon_psnr"] is None and row["recon_psnr_frame0"] is None
    with pytest.raises(SampleError, match=rf"clip {rec.clip_id}: decoded video .* differs from the ground truth"):
        judge.compare(tmp_path, rec, g, lat, gt[:, :16], sem[:, :16])


def test_the_vae_judge_needs_the_ground_truth_root(tiny_vae, tmp_path):
    with pytest.raises(SampleError, match="ground-truth root .* not found: pass --raw_root"):
        VaeJudge(SimpleNamespace(**ARGS), tiny_vae, tmp_path / "none", "parts", "cpu")
