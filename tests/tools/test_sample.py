"""gcc.tools.sample (docs/design.md §10) on CPU: a tiny GcDiT and a tiny WanVideoVAE38 (random weights) on the synthetic world."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import pytest
import torch
from _gc_helpers import export_metadata, randomize_cond, tiny_dit
from safetensors import safe_open
from safetensors.torch import save_file

from gcc import exit_codes
from gcc.model.dit import wan_keys
from gcc.model.export import save_gc
from gcc.sampling import metrics as M
from gcc.sampling import sampler as SA
from gcc.sampling import vae as V
from gcc.synth.wan_layout import write_wan_vae
from gcc.tools.sample import cli
from gcc.tools.sample import dit as D
from gcc.tools.sample import sources as SRC
from gcc.tools.sample.errors import SampleError
from gcc.vocab import UNKNOWN, colorize

REPO = Path(__file__).resolve().parents[2]
VAL_RR = ["clip00008", "clip00020", "clip00010", "clip00021"]  # prepared_tiny: val runs 2 and 5, 9 is dropped


def _meta(vocab: str, model_dir: str) -> dict:
    return export_metadata(vocab=vocab, model_dir=model_dir)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A tiny Wan2.2 model dir as published (sharded DiT + index + Wan2.2_VAE.pth) and gc25d exports."""
    root = tmp_path_factory.mktemp("sample_assets")
    md = root / "Wan2.2-TI2V-tiny"
    md.mkdir()
    dit = tiny_dit(seed=3)
    sd = dit.state_dict()
    keys, weight_map = sorted(wan_keys(dit)), {}
    for s in range(2):
        name = f"diffusion_pytorch_model-{s + 1:05d}-of-00002.safetensors"
        save_file({k: sd[k].contiguous() for k in keys[s::2]}, str(md / name))
        weight_map.update({k: name for k in keys[s::2]})
    (md / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    write_wan_vae(md)  # the published format: the bare network's state dict

    randomize_cond(dit, scale=2.0)  # a trained-looking cond, so the ids matter
    ck = save_gc(dit.state_dict(), root / "step-1.safetensors", _meta("parts", str(md)))
    # what a run with algorithms.ema writes beside it (here the same tensors: sampling with it must give the same)
    ema = save_gc(dit.state_dict(), root / "step-1.ema.safetensors", {**_meta("parts", str(md)), "weights": "ema"})
    dit_ids = tiny_dit(vocab="ids", seed=3)
    ck_ids = save_gc(dit_ids.state_dict(), root / "ids-step-1.safetensors", _meta("ids", str(md)))
    return {"model_dir": md, "ckpt": ck, "ckpt_ema": ema, "ckpt_ids": ck_ids, "root": root}


def _args(assets, data_root, out, *extra, weights=None):
    weights = weights if weights is not None else ["--ckpt", str(assets["ckpt"])]
    return [
        *weights,
        "--model",
        "tiny",
        "--model_dir",
        str(assets["model_dir"]),
        "--data",
        str(data_root),
        "--out",
        str(out),
        "--steps",
        "2",
        "--device",
        "cpu",
        *extra,
    ]


def _frames(mp4: Path) -> np.ndarray:
    r = imageio.get_reader(str(mp4))
    try:
        return np.stack([f for f in r])
    finally:
        r.close()


@pytest.mark.slow  # over 5 s: make test, not the edit loop's test-fast
def test_outputs_shapes_frames_and_metrics(assets, prepared_tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(_args(assets, prepared_tiny, out, "--n", "2")) == 0
    err = capsys.readouterr().err  # the per-step bar of each clip, with the time left for the whole set
    assert f"[1/2] {VAL_RR[0]}" in err and f"[2/2] {VAL_RR[1]}" in err and "1 clip(s) after this one" in err
    m = json.loads((out / "metrics.json").read_text())
    assert m["clip_ids"] == VAL_RR[:2] and m["vocab"] == "parts" and m["weights"] == "gc25d"
    assert m["data_kind"] == "prepared" and m["raw_root"] == str(prepared_tiny / "raw")
    for k in ("load", "sampling", "decode", "total"):
        assert m["timings"][k] >= 0
    assert m["timings"]["total"] >= m["timings"]["load"] + m["timings"]["sampling"]
    for k in ("psnr", "ssim", "psnr_frame0", "recon_psnr", "recon_ssim"):
        assert isinstance(m["mean"][k], float) and math.isfinite(m["mean"][k]), k
    for cid in VAL_RR[:2]:
        row = m["clips"][cid]
        assert row["num_frames"] == 9 and row["hw"] == [64, 96]
        frames = json.loads((out / f"{cid}.frames.json").read_text())["frames"]
        assert [f["frame"] for f in frames] == list(range(9))
        assert all(isinstance(f[k], float) for f in frames for k in ("psnr", "ssim", "recon_psnr", "recon_ssim"))
        assert row["psnr_frame0"] == frames[0]["psnr"]
        assert row["ssim"] == pytest.approx(np.mean([f["ssim"] for f in frames[1:]]))
        video = _frames(out / f"{cid}.mp4")
        assert video.shape == (9, 64, 3 * 96, 3)  # GT | generated | cond
        # the GT panel is the raw tar resampled to dst; the cond panel is the palette of the ids the model got
        src = SRC.PreparedSource(prepared_tiny)
        clip = src.load(cid)
        gt = SRC.resample_rgb(SRC.read_gt(prepared_tiny / "raw", clip, 9), (64, 96))
        assert np.abs(video[:, :, :96].astype(int) - gt).mean() < 6
        assert np.abs(video[:, :, 192:].astype(int) - colorize(clip.sem_ids())).mean() < 12
        assert np.abs(video[:, :, 192:].astype(int) - colorize(np.full_like(clip.sem_ids(), UNKNOWN))).mean() > 30


def test_val_selection_round_robin_and_clip_id_files(prepared_tiny, tmp_path):
    rows = SRC.PreparedSource(prepared_tiny).rows
    assert SRC.select_clips(rows, val_n=4) == VAL_RR
    everything = SRC.select_clips(rows, val_n=100)  # fewer available: all of them, with a note
    assert sorted(everything) == [
        "clip00008",
        "clip00010",
        "clip00011",
        "clip00020",
        "clip00021",
        "clip00022",
        "clip00023",
    ]
    f = tmp_path / "ids.txt"
    f.write_text("clip00003  # a train clip\n\nclip00009,clip00001\n")
    assert SRC.parse_clip_ids(f"@{f}") == ["clip00003", "clip00009", "clip00001"]
    assert SRC.select_clips(rows, SRC.parse_clip_ids(f"@{f}")) == ["clip00003", "clip00009", "clip00001"]
    with pytest.raises(SampleError, match="nope"):
        SRC.select_clips(rows, ["clip00001", "nope"])


def test_psnr_identical_is_null_and_known_perturbation_matches_hand_computation():
    rng = np.random.default_rng(0)
    gt = rng.integers(20, 200, size=(3, 8, 8, 3), dtype=np.uint8)
    m = M.video_metrics(gt, gt.copy())
    assert m["psnr"] is None and m["psnr_frame0"] is None and all(f["psnr"] is None for f in m["frames"])
    assert m["ssim"] == pytest.approx(1.0)
    json.dumps(m, allow_nan=False)  # null, never Infinity, in the json files
    gen = gt.copy()
    gen[1, 0:2, 0:4, 0] += 10  # 8 values off by 10
    gen[2, 3, 3, :] -= 6  # 3 values off by 6
    m = M.video_metrics(gen, gt)
    n = 8 * 8 * 3
    mse_rest = (8 * 10**2 + 3 * 6**2) / (2 * n) / 255**2  # frames 1.., pooled
    assert m["psnr"] == pytest.approx(10 * math.log10(1 / mse_rest), abs=1e-4)  # torchmetrics works in float32
    assert m["frames"][1]["psnr"] == pytest.approx(10 * math.log10(1 / (800 / n / 255**2)), abs=1e-4)
    assert m["frames"][2]["psnr"] == pytest.approx(10 * math.log10(1 / (108 / n / 255**2)), abs=1e-4)
    assert m["psnr_frame0"] is None  # frame 0 untouched
    assert m["ssim"] < 1.0 and M.video_metrics(gen, gt, ssim=False)["ssim"] is None


def test_same_seed_identical_and_unknown_differs(assets, prepared_tiny, tmp_path):
    """b: the same weights as a, from the EMA export of a run with algorithms.ema (step-N.ema.safetensors)."""
    runs = {
        "a": ["--seed", "0"],
        "b": ["--seed", "0"],
        "unk": ["--seed", "0", "--sem_mode", "unknown"],
        "seed1": ["--seed", "1"],
    }
    vids = {}
    for name, extra in runs.items():
        out = tmp_path / name
        weights = ["--ckpt", str(assets["ckpt_ema" if name == "b" else "ckpt"])]
        flags = ["--clip_ids", "clip00008", "--no_ssim", "--no_recon_ceiling", *extra]
        assert cli.main(_args(assets, prepared_tiny, out, *flags, weights=weights)) == 0
        vids[name] = _frames(out / "clip00008.mp4")
    assert (tmp_path / "a" / "clip00008.mp4").read_bytes() == (tmp_path / "b" / "clip00008.mp4").read_bytes()
    assert (tmp_path / "a" / "clip00008.frames.json").read_bytes() == (
        tmp_path / "b" / "clip00008.frames.json"
    ).read_bytes()
    got = {k: json.loads((tmp_path / k / "metrics.json").read_text()) for k in ("a", "b")}
    assert (got["a"]["ckpt_weights"], got["b"]["ckpt_weights"]) == ("raw", "ema")
    assert got["b"]["ckpt"] == str(assets["ckpt_ema"])
    gen = {k: v[:, :, 96:192].astype(int) for k, v in vids.items()}
    assert np.abs(gen["a"] - gen["unk"]).mean() > 1.0  # the semantic condition reaches the video
    assert np.abs(gen["a"] - gen["seed1"]).mean() > 1.0
    # unknown: the model (and the cond panel) got ids all 255
    hatched = colorize(np.full((9, 64, 96), UNKNOWN, np.uint8))
    assert np.abs(vids["unk"][:, :, 192:].astype(int) - hatched).mean() < 12
    m = json.loads((tmp_path / "unk" / "metrics.json").read_text())
    assert m["settings"]["sem_mode"] == "unknown" and m["clips"]["clip00008"]["ssim"] is None


def test_guidance_skips_unit_scales_and_is_deterministic(assets, prepared_tiny):
    dit = D.load_dit("tiny", "parts", "cpu", torch.float32, ckpt=str(assets["ckpt"]))
    src = SRC.PreparedSource(prepared_tiny)
    clip = src.load("clip00010")
    C, T, h, w = clip.input_latents.shape
    calls = []
    hook = dit.register_forward_hook(lambda mod, inp, out: calls.append(inp[0].shape[0]))
    null = src.table.row(src.table.null_id)
    context, index = src.table.prompts(clip.context_ids)
    kw = dict(
        first=clip.input_latents[:, :1].float(),
        context=context,
        context_index=index,
        null_context=null,
        sem=torch.from_numpy(clip.sem_ids()),
        noise=SA.clip_noise(0, "clip00010", (C, T, h, w)),
        steps=3,
    )
    x1 = SA.sample_latents(dit, **kw)
    x2 = SA.sample_latents(dit, **kw)
    assert torch.equal(x1, x2) and calls == [1] * 6  # cfg = sem_cfg = 1: one forward per step, batch 1
    torch.testing.assert_close(x1[:, :1], clip.input_latents[:, :1].float())  # frame 0 stays the clean latent
    calls.clear()
    xg = SA.sample_latents(dit, **kw, cfg=3.0, sem_cfg=2.0)
    assert calls == [3] * 3 and not torch.equal(xg, x1)
    calls.clear()
    SA.sample_latents(dit, **{**kw, "sem": torch.full_like(kw["sem"], UNKNOWN)}, sem_cfg=2.0)
    assert calls == [1] * 3  # ids already all 255: the sem guidance term is zero, its forward skipped
    hook.remove()
    # one step (sigma 1 -> 0): x = noise - e, e = e_c + (cfg-1)(e_c - e_nulltext) + (sem_cfg-1)(e_c - e_unknown)
    x1 = SA.sample_latents(dit, **{**kw, "steps": 1}, cfg=3.0, sem_cfg=2.0)
    x0 = kw["noise"].clone()
    x0[:, :1] = kw["first"]
    t = SA.make_sampling_scheduler(1, 5.0).timesteps[:1]
    sem = kw["sem"][None]

    def e(ctx, ids, sem_ids):
        return dit.gc_forward(x0[None], t, ctx[None], ids[None], sem_ids, first_frame_cond=True)[0]

    e_c = e(kw["context"], kw["context_index"], sem)
    e_n = e(null[None], torch.zeros_like(index), sem)
    e_u = e(kw["context"], kw["context_index"], torch.full_like(sem, UNKNOWN))
    want = x0 - (e_c + 2.0 * (e_c - e_n) + 1.0 * (e_c - e_u))
    torch.testing.assert_close(x1[:, 1:], want[:, 1:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x1[:, :1], kw["first"])


def test_base_weights_and_shards_match_prepared(assets, prepared_tiny, tmp_path):
    from gcc.data.convert import convert

    shards = tmp_path / "shards"
    convert(str(prepared_tiny), str(shards), progress=False)
    ids_file = tmp_path / "clips.txt"
    ids_file.write_text("clip00011\n")
    base = ["--base", "--vocab", "ids"]
    assert (
        cli.main(
            _args(
                assets,
                shards,
                tmp_path / "sh",
                "--clip_ids",
                f"@{ids_file}",
                "--no_ssim",
                "--no_recon_ceiling",
                weights=base,
            )
        )
        == 0
    )
    assert (
        cli.main(
            _args(
                assets,
                prepared_tiny,
                tmp_path / "pr",
                "--clip_ids",
                "clip00011",
                "--no_ssim",
                "--no_recon_ceiling",
                weights=base,
            )
        )
        == 0
    )
    m = json.loads((tmp_path / "sh" / "metrics.json").read_text())
    assert m["weights"] == "base" and m["vocab"] == "ids" and m["data_kind"] == "shards"
    assert m["raw_root"] == str(Path(prepared_tiny).resolve() / "raw")  # from the manifest's source
    assert (tmp_path / "sh" / "clip00011.mp4").read_bytes() == (tmp_path / "pr" / "clip00011.mp4").read_bytes()
    # a plain Wan export as --ckpt: the same weights as --base, cond at zero
    wan = tmp_path / "wan.safetensors"
    with (
        safe_open(str(next(assets["model_dir"].glob("*00001-of-00002.safetensors"))), "pt") as f1,
        safe_open(str(next(assets["model_dir"].glob("*00002-of-00002.safetensors"))), "pt") as f2,
    ):
        save_file({k: f.get_tensor(k) for f in (f1, f2) for k in f.keys()}, str(wan))
    assert (
        cli.main(
            _args(
                assets,
                prepared_tiny,
                tmp_path / "wan",
                "--clip_ids",
                "clip00011",
                "--no_ssim",
                "--no_recon_ceiling",
                "--vocab",
                "ids",
                weights=["--ckpt", str(wan)],
            )
        )
        == 0
    )
    assert json.loads((tmp_path / "wan" / "metrics.json").read_text())["weights"] == "wan"
    assert (tmp_path / "wan" / "clip00011.mp4").read_bytes() == (tmp_path / "pr" / "clip00011.mp4").read_bytes()


def test_clear_errors(assets, prepared_tiny, tmp_path, capsys):
    out = tmp_path / "out"
    # a checkpoint of another vocab than requested
    assert cli.main(_args(assets, prepared_tiny, out, "--n", "1", "--vocab", "ids")) == exit_codes.CONFIG
    err = capsys.readouterr().err
    assert str(assets["ckpt"]) in err and "'parts'" in err and "'ids'" in err
    assert (
        cli.main(
            _args(
                assets,
                prepared_tiny,
                out,
                "--n",
                "1",
                "--vocab",
                "parts",
                weights=["--ckpt", str(assets["ckpt_ids"])],
            )
        )
        == exit_codes.CONFIG
    )
    assert "ids-step-1.safetensors has vocab 'ids'" in capsys.readouterr().err
    # a missing clip id
    assert cli.main(_args(assets, prepared_tiny, out, "--clip_ids", "clip00001,clip_missing")) == exit_codes.CONFIG
    assert "clip_missing" in capsys.readouterr().err
    # a model dir without the VAE
    empty = tmp_path / "no_vae"
    empty.mkdir()
    assert (
        cli.main(
            _args(assets, prepared_tiny, out, "--n", "1")[:4]
            + ["--model_dir", str(empty)]
            + _args(assets, prepared_tiny, out, "--n", "1")[6:]
        )
        == exit_codes.CONFIG
    )
    assert "Wan2.2_VAE.pth" in capsys.readouterr().err
    assert not (out / "metrics.json").exists()
    # as a program: non-zero exit, one line naming the problem, no traceback
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    argv = _args(assets, prepared_tiny, out, "--n", "1", weights=["--base"])
    argv[argv.index("--model_dir") + 1] = str(empty)  # fails before the heavy imports: a fast subprocess
    p = subprocess.run(
        [sys.executable, "-m", "gcc.tools.sample", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert p.returncode == exit_codes.CONFIG
    assert p.stderr.startswith("gcc-sample: error: --model_dir") and str(empty) in p.stderr
    assert "Wan2.2_VAE.pth" in p.stderr and "Traceback" not in p.stderr


def test_tiny_vae_roundtrip_shapes(assets):
    vae = V.load_vae(assets["model_dir"] / "Wan2.2_VAE.pth")
    assert type(vae).__name__ == "WanVideoVAE38" and vae.z_dim == 48 and vae.upsampling_factor == 16
    frames = np.random.default_rng(1).integers(0, 255, size=(9, 64, 96, 3), dtype=np.uint8)
    z = V.vae_encode(vae, frames, "cpu")
    assert tuple(z.shape) == (48, 3, 4, 6)
    assert V.vae_decode(vae, z, "cpu").shape == (9, 64, 96, 3)
    bad = assets["root"] / "bad_vae.pth"
    torch.save({"foo": torch.zeros(1)}, bad)
    with pytest.raises(V.VaeError, match="not a Wan2.2 VAE"):
        V.load_vae(bad)


# ---- no --model_dir: the synthetic world's own decoder (docs/sample.md) -----------------------------------
def _synth_args(assets, data_root, out, *extra):
    return [
        "--ckpt",
        str(assets["ckpt"]),
        "--model",
        "tiny",
        "--data",
        str(data_root),
        "--out",
        str(out),
        "--steps",
        "2",
        "--device",
        "cpu",
        *extra,
    ]


def test_synthetic_data_without_model_dir(assets, prepared_tiny, tmp_path, capsys):
    from PIL import Image

    from gcc.data.convert import convert
    from gcc.synth.decode import cells_to_pixels, gt_cell_classes

    out = tmp_path / "out"
    assert cli.main(_synth_args(assets, prepared_tiny, out, "--n", "2")) == 0
    stdout = capsys.readouterr().out
    m = json.loads((out / "metrics.json").read_text())
    assert m["decoder"] == "synth" and m["model_dir"] == "" and m["vae"] == "" and m["clip_ids"] == VAL_RR[:2]
    mean = m["mean"]["class_agreement"]
    assert 0.0 <= mean <= 1.0
    assert f"class agreement, generated vs GT class per latent cell (latent frames 1..): mean {mean:.3f}" in stdout
    for cid in VAL_RR[:2]:
        row = m["clips"][cid]
        assert 0.0 <= row["class_agreement"] <= 1.0 and row["cells"] == 2 * 4 * 6
        assert row["class_agreement_frame0"] >= 0.75  # frame 0 is the clip's own clean latent: the decoder's accuracy
        assert 0.0 <= row["class_agreement_copy_frame0"] <= 1.0
        frames = json.loads((out / f"{cid}.frames.json").read_text())["latent_frames"]
        assert [f["pixel_frames"] for f in frames] == [[0, 0], [1, 4], [5, 8]]
        assert row["class_agreement"] == pytest.approx(np.mean([f["class_agreement"] for f in frames[1:]]))
        video = _frames(out / f"{cid}.mp4")
        assert video.shape == (9, 64, 3 * 96, 3)  # GT classes | generated classes | cond
        sem = SRC.PreparedSource(prepared_tiny).load(cid).sem_ids()
        gt = colorize(cells_to_pixels(gt_cell_classes(sem, 3, 4, 6)))
        assert np.abs(video[:, :, :96].astype(int) - gt).mean() < 12
        assert np.abs(video[:, :, 192:].astype(int) - colorize(sem)).mean() < 12
        with Image.open(out / f"{cid}.png") as sheet:  # 3 rows (latent frames 0..2) of 3 panels at 2x
            assert sheet.format == "PNG" and sheet.width >= 3 * 192 and sheet.height >= 3 * 128
    assert not list(out.glob("*.tmp*"))
    # the same clips from a conversion: the manifest's source is the marked prepared root
    shards = tmp_path / "shards"
    convert(str(prepared_tiny), str(shards), progress=False)
    assert cli.main(_synth_args(assets, shards, tmp_path / "sh", "--clip_ids", VAL_RR[0], "--no_progress")) == 0
    sh = json.loads((tmp_path / "sh" / "metrics.json").read_text())
    assert (
        sh["data_kind"] == "shards"
        and sh["clips"][VAL_RR[0]]["class_agreement"] == m["clips"][VAL_RR[0]]["class_agreement"]
    )


def test_no_model_dir_needs_synthetic_data(assets, tmp_path, capsys):
    from gcc.synth.world import MARKER, make_prepared

    root = make_prepared(tmp_path, clips=12)
    (root / MARKER).unlink()  # data of unknown origin: no decoder without the VAE
    out = tmp_path / "out"
    assert cli.main(_synth_args(assets, root, out, "--n", "1")) == exit_codes.CONFIG
    err = capsys.readouterr().err
    assert err.startswith("gcc-sample: error: --data") and "--model_dir" in err and MARKER in err
    assert not (out / "metrics.json").exists()
    # --base loads the Wan weights of --model_dir, synthetic data or not
    assert (
        cli.main(
            [
                "--base",
                "--model",
                "tiny",
                "--data",
                str(root),
                "--out",
                str(out),
                "--n",
                "1",
                "--device",
                "cpu",
            ]
        )
        == exit_codes.CONFIG
    )
    assert "--model_dir" in capsys.readouterr().err


def test_demo_initial_weights_are_the_trainers_init(assets, tmp_path):
    """make demo's step-0 line samples the weights the run started from: the preset built from run.json's seed,
    as the trainer builds it (it writes no step-0 export)."""
    from gcc.model.dit import build_gc_dit
    from gcc.model.export import check_gc_ckpt
    from gcc.tools.demo import initial_weights

    sig = {
        "model.preset": "tiny",
        "model.overrides": "{}",
        "model.vocab": "parts",
        "model.base_weights": "",
        "model.init_ckpt": "",
        "model.legacy_zero_ckpt": "",
        "seed": 7,
    }
    (tmp_path / "run.json").write_text(json.dumps({"signature": sig, "lineage": {}}))
    out = tmp_path / "initial.safetensors"
    assert "seed 7" in initial_weights(tmp_path, assets["ckpt"], out)
    assert check_gc_ckpt(out)["vocab"] == "parts"
    with safe_open(str(out), "pt") as f:
        assert f.metadata()["step"] == "0"
        want = build_gc_dit("tiny", vocab="parts", init_seed=7).state_dict()
        for k in f.keys():
            torch.testing.assert_close(f.get_tensor(k), want[k].to(torch.bfloat16), rtol=0, atol=0)
        assert not f.get_tensor("gc_sem_cond.proj_out.weight").any()  # the condition starts at zero
    (tmp_path / "run.json").write_text(json.dumps({"signature": {**sig, "model.init_ckpt": "x"}, "lineage": {}}))
    assert initial_weights(tmp_path, assets["ckpt"], tmp_path / "none.safetensors") is None


def test_the_demos_model_reads_the_condition_per_latent_cell():
    """make demo trains yamls/tiny_cpu.yaml with its TRAIN_SETTINGS: a model whose condition input is each latent
    cell's own class fractions (one token per cell), the fractions the synthetic world wrote that cell's latent from;
    `tiny`'s 2x2 patch would mix four cells (docs/sample.md, "Reading the numbers")."""
    from gcc.model.dit import build_gc_dit, class_fractions
    from gcc.synth import world as synth
    from gcc.tools.demo import TRAIN_SETTINGS
    from gcc.training.config import load_config

    cfg = load_config(REPO / "yamls" / "tiny_cpu.yaml", TRAIN_SETTINGS)
    dit = build_gc_dit(cfg.model.preset, device="meta", vocab=cfg.model.vocab, **cfg.model.overrides)
    g = synth.get_geometry("tiny")
    ids, _ = synth.render_clip(synth.make_scene(0, 8, g))
    got = class_fractions(torch.from_numpy(ids)[None], cfg.model.vocab, dit.patch_size)
    want = synth.latent_cell_fractions(ids, g.T, g.h, g.w, cfg.model.vocab).reshape(1, g.T * g.h * g.w, -1)
    assert tuple(got.shape) == want.shape
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=0, atol=1e-6)


def test_clip_ids_that_leave_out_dir_are_refused(assets, tmp_path, capsys, monkeypatch):
    """Shards whose clips are named `../../escape/x` (converted with the name check switched off, as a hostile or
    older converter would): gcc-sample refuses them and writes nothing, inside --out or beside it."""
    from gcc.data import layout
    from gcc.data.convert import convert
    from gcc.synth.world import make_prepared

    src = make_prepared(tmp_path / "p", clips=24, seed=0)
    rows = [json.loads(line) for line in (src / "index" / "clips.jsonl").read_text().splitlines()]
    val = next(r for r in rows if r["split"] == "val" and not r["drop"])
    bad = "../../escape/x"
    for sub, ext in (("latents", ".safetensors"), ("sem", ".npz"), ("meta", ".json")):
        dest = Path(os.path.normpath(src / sub / f"{bad}{ext}"))
        dest.parent.mkdir(parents=True, exist_ok=True)
        (src / sub / f"{val['clip_id']}{ext}").rename(dest)
        if sub == "meta":
            dest.write_text(json.dumps({**json.loads(dest.read_text()), "clip_id": bad}))
    val["clip_id"] = bad
    (src / "index" / "clips.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with monkeypatch.context() as m:
        m.setattr(layout, "check_component", lambda v, what: v, raising=False)
        convert(str(src), str(tmp_path / "shards"), progress=False)
    out = tmp_path / "a" / "b" / "out"
    assert (
        cli.main(_synth_args(assets, tmp_path / "shards", out, "--clip_ids", bad, "--no_progress")) == exit_codes.CONFIG
    )
    assert "splits.val.clip_ids" in capsys.readouterr().err
    assert not (tmp_path / "a" / "escape").exists() and not out.exists()


def _legacy(path: Path, out: Path, drop: tuple[str, ...]) -> Path:
    """A copy of the export `path` without the metadata keys `drop` (an export of the legacy trainer, or of an earlier
    gcc)."""
    with safe_open(str(path), "pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    save_file(tensors, str(out), metadata={k: v for k, v in meta.items() if k not in drop})
    return out


def test_the_export_names_its_model_a_failing_clip_is_reported_and_the_others_go_on(
    assets, prepared_tiny, tmp_path, capsys, caplog
):
    """docs/sample.md: without --model the export's own preset (its metadata) is built; the console gets rounded
    numbers and a one-screen summary; a clip that cannot be read is reported with its reason in metrics.json while
    the others are judged (exit 6 at the end); an export of the legacy trainer, without preset and lineage keys, is
    read with one warning (its layout names the preset)."""
    import logging
    import shutil

    ckpt = save_gc(
        tiny_dit(seed=3).state_dict(), tmp_path / "step-1.safetensors", {**_meta("parts", ""), "preset": "tiny"}
    )
    args = ["--ckpt", str(ckpt), "--data", str(prepared_tiny), "--steps", "2", "--device", "cpu", "--no_progress"]
    with caplog.at_level(logging.INFO):
        assert cli.main([*args, "--out", str(tmp_path / "a"), "--n", "2"]) == 0
    assert "model: tiny (the export's metadata; --model overrides it)" in caplog.text
    out = capsys.readouterr().out
    m = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert m["model"] == "tiny" and m["failed"] == {}
    mean = m["mean"]["class_agreement"]
    [row] = [ln.split() for ln in out.splitlines() if ln.startswith("mean ")]  # the summary's table
    assert row[1] == f"{mean:.3f}", out
    assert "{" not in out and str(mean) not in out  # no raw json line, no unrounded number
    assert f"metrics: {tmp_path / 'a' / 'metrics.json'}" in out

    data = tmp_path / "data"
    shutil.copytree(prepared_tiny, data)
    (data / "latents" / f"{VAL_RR[0]}.safetensors").write_bytes(b"not a safetensors file")
    caplog.clear()
    legacy = _legacy(ckpt, tmp_path / "legacy.safetensors", ("preset", "resumed_from", "resumed_step"))
    argv = [*args, "--ckpt", str(legacy), "--data", str(data), "--out", str(tmp_path / "b"), "--n", "2"]
    with caplog.at_level(logging.INFO):
        assert cli.main(argv) == exit_codes.DATA
    m = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert list(m["clips"]) == [VAL_RR[1]] and list(m["failed"]) == [VAL_RR[0]], m["failed"]
    assert f"{VAL_RR[0]}.safetensors" in m["failed"][VAL_RR[0]]
    assert m["mean"]["class_agreement"] == m["clips"][VAL_RR[1]]["class_agreement"]
    err = capsys.readouterr().err
    assert f"gcc-sample: error: 1 of 2 clip(s) failed: {VAL_RR[0]}: " in err and "Traceback" not in err
    lineage = [r for r in caplog.records if "lineage fix" in r.getMessage()]
    assert len(lineage) == 1 and "no resumed_from or resumed_step" in lineage[0].getMessage()
    assert "model: tiny (the export's layout" in caplog.text
