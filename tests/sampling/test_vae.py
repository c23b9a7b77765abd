"""The Wan2.2 VAE (gcc/sampling/vae.py): finding its file in a model folder, loading a real DiffSynth VAE (a tiny
one: the published widths but a narrow decoder) from the published `.pth` format, and the pixel <-> VAE range
mapping that encode and decode go through. The tiny VAE's encode/decode shapes are in tests/tools/test_sample.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gcc.sampling.vae import VAE_FILES, VaeError, find_vae_file, from_vae_range, load_vae, to_vae_range
from gcc.synth.wan_layout import TINY_VAE, write_wan_vae


def test_the_vae_file_is_found_as_published_and_its_absence_named(tmp_path):
    with pytest.raises(VaeError, match="not a directory"):
        find_vae_file(tmp_path / "none")
    with pytest.raises(VaeError, match=r"no VAE file \(Wan2\.2_VAE\.pth or Wan2\.2_VAE\.safetensors\)"):
        find_vae_file(tmp_path)
    (tmp_path / VAE_FILES[1]).write_bytes(b"")
    assert find_vae_file(tmp_path) == tmp_path / "Wan2.2_VAE.safetensors"
    (tmp_path / VAE_FILES[0]).write_bytes(b"")
    assert find_vae_file(tmp_path) == tmp_path / "Wan2.2_VAE.pth"  # the published file first


def test_every_pixel_value_survives_the_vae_range_and_back():
    px = np.arange(256, dtype=np.uint8)
    frames = np.stack([px.reshape(16, 16)] * 3, -1)[None].repeat(2, 0)  # [F=2, 16, 16, 3]
    x = to_vae_range(frames)
    assert x.shape == (3, 2, 16, 16) and x.dtype == torch.float32
    assert float(x.min()) == -1.0 and float(x.max()) == 1.0
    assert np.array_equal(from_vae_range(x), frames)
    # out of range (a decoder's overshoot) is clamped, not wrapped
    over = from_vae_range(torch.stack([torch.full((1, 2, 2), 1.7), torch.full((1, 2, 2), -3.0), torch.zeros(1, 2, 2)]))
    assert over.shape == (1, 2, 2, 3) and over[0, 0, 0].tolist() == [255, 0, 128]


@pytest.fixture(scope="module")
def vae_pth(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vae")
    sd = write_wan_vae(folder)  # the published format: the bare network's state dict
    return folder / "Wan2.2_VAE.pth", sd


def test_a_published_format_vae_loads_with_its_widths_read_from_the_file(vae_pth):
    path, sd = vae_pth
    vae = load_vae(path, dtype=torch.bfloat16)
    assert type(vae).__name__ == "WanVideoVAE38" and vae.z_dim == 48
    assert not vae.training and next(vae.parameters()).dtype == torch.bfloat16
    assert vae.model.decoder.conv1.weight.shape[0] == 4 * TINY_VAE["dec_dim"]
    for k in ("conv2.weight", "encoder.conv1.weight", "decoder.conv1.weight"):  # the file's weights, not new ones
        assert torch.equal(vae.model.state_dict()[k].float(), sd[k].to(torch.bfloat16).float())


def test_a_file_that_is_not_a_wan_vae_is_named(vae_pth, tmp_path):
    _path, sd = vae_pth
    torch.save({"foo": torch.zeros(1)}, tmp_path / "other.pth")
    with pytest.raises(VaeError, match="other.pth: not a Wan2.2 VAE state dict"):
        load_vae(tmp_path / "other.pth")
    (tmp_path / "junk.pth").write_bytes(b"not a pickle")
    with pytest.raises(VaeError, match=r"junk.pth: not a torch.save file \(File is not a zip file\)"):
        load_vae(tmp_path / "junk.pth")
    torch.save({k: v for k, v in sd.items() if "decoder.head" not in k}, tmp_path / "cut.pth")
    with pytest.raises(VaeError, match=r"cut.pth: does not fit WanVideoVAE38\(z_dim=48, dim=8, dec_dim=8\)"):
        load_vae(tmp_path / "cut.pth")
