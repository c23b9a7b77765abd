"""`gcc-synth --wan_model` (gcc/synth/wan_layout.py): a random Wan2.2 model folder in the published layout, which
gcc's readers of a model folder take as they take Wan2.2-TI2V-5B (README.md, "Real data end to end")."""

from __future__ import annotations

import json

import torch
from safetensors import safe_open

from gcc.model.dit import WAN_INDEX, build_gc_dit, load_wan_base, wan_keys
from gcc.sampling.vae import find_vae_file, load_vae
from gcc.storage import umask
from gcc.synth import world
from gcc.synth.wan_layout import TINY_VAE, write_wan_dit


def test_the_model_folder_is_the_published_layout_and_loads_as_base_weights(tmp_path, capsys):
    out = tmp_path / "models" / "Wan2.2-TI2V-tiny"
    assert world.main(["--wan_model", "tiny", "--out", str(out), "--seed", "3"]) == 0
    assert f"to {out}" in capsys.readouterr().out
    shards = [
        "diffusion_pytorch_model-00001-of-00002.safetensors",
        "diffusion_pytorch_model-00002-of-00002.safetensors",
    ]
    assert sorted(p.name for p in out.iterdir()) == sorted([*shards, WAN_INDEX, "Wan2.2_VAE.pth"])
    for f in out.iterdir():  # written by gcc's one writer: the user's umask, as every file gcc writes
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask(), f
    weight_map = json.loads((out / WAN_INDEX).read_text())["weight_map"]
    assert set(weight_map.values()) == set(shards)
    with safe_open(str(out / shards[0]), "pt") as f:  # bf16: the readers cast to the model's dtype
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}

    dit = build_gc_dit("tiny", init_seed=0)
    assert set(weight_map) == set(wan_keys(dit))
    load_wan_base(dit, out)  # what model.model_dir and gcc-sample --model_dir do
    (tmp_path / "same").mkdir()
    expected = write_wan_dit(tmp_path / "same", preset="tiny", seed=3, dtype=torch.bfloat16)  # the one writer
    for k in wan_keys(dit):  # the seed's weights
        torch.testing.assert_close(dit.state_dict()[k], expected[k].float(), msg=k)

    vae = load_vae(find_vae_file(out))  # widths read from the file
    assert vae.z_dim == 48 and vae.model.decoder.conv1.weight.shape[0] == 4 * TINY_VAE["dec_dim"]


def test_a_folder_that_is_not_empty_is_refused_and_left_alone(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert world.main(["--wan_model", "tiny", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gcc-synth: error: --out") and "not empty" in err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
