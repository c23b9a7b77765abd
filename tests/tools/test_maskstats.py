"""`python -m gcc.tools.maskstats`: the frame0-vs-cap coverage table, its JSON, hand-checked numbers, the cap bound
and the PNG contact sheet."""

from __future__ import annotations

import json
import math
import uuid

import numpy as np
import pytest
from PIL import Image
from streaming import StreamingDataset

from gcc.data import convert as C
from gcc.data.config import DataConfig
from gcc.data.dataset import GcStreamingDataset
from gcc.data.mask import apply_unknown_mask
from gcc.data.sample_rng import draw_sample
from gcc.data.shards import ClipRecord, read_manifest
from gcc.geometry import Cameras
from gcc.synth.world import make_prepared
from gcc.tools import maskstats as MS

N = 10  # first 10 train clips of prepared_tiny: clip00000..07, 12, 13; clip00005 has no finite ground_z
CAP = 0.2  # a tight cap so the bound bites


@pytest.fixture(scope="module")
def stats(prepared_tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("maskstats")
    out = root / "shards"
    C.convert(prepared_tiny, str(out), chunk_clips=8, progress=False)
    js, png = root / "stats.json", root / "sheet.png"
    rc = MS.main(
        [
            "--data",
            str(out),
            "--split",
            "train",
            "--n",
            str(N),
            "--seed",
            "3",
            "--max_frame_coverage",
            str(CAP),
            "--out",
            str(js),
            "--preview",
            str(png),
        ]
    )
    assert rc == 0
    return {"src": prepared_tiny, "out": out, "json": json.loads(js.read_text()), "png": png, "root": root}


def test_json_has_both_calibrations_and_all_measures(stats):
    res = stats["json"]
    assert res["mask_forced"] is True and "forced" in res["note"] and res["epoch"] == 0 and res["seed"] == 3
    assert res["clips"] == N and res["clips_without_ground"] == 1 and res["clips_measured"] == N - 1
    assert res["max_frame_coverage"] == CAP
    assert set(res["table"]) == {"frame0", "cap"}
    for cal in ("frame0", "cap"):
        assert set(res["table"][cal]) == set(MS.MEASURES)
        for m in MS.MEASURES:
            st = res["table"][cal][m]
            assert set(st) == {"mean", "median", "p90", "max"}
            assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in st.values()), (cal, m, st)
            vals = [r[cal][m] for r in res["per_clip"] if r["ground"]]
            assert st["mean"] == pytest.approx(np.mean(vals)) and st["max"] == pytest.approx(max(vals))
            assert st["median"] <= st["p90"] <= st["max"]
    # the stored order: sample id i = the i-th clip of the split in the manifest
    manifest = read_manifest(str(stats["out"]))
    assert [r["clip_id"] for r in res["per_clip"]] == manifest["splits"]["train"]["clip_ids"][:N]
    assert [r["clip_id"] for r in res["per_clip"] if not r["ground"]] == ["clip00005"]
    # frame0 and cap share τ: frame 0 is the same (the cap only ever raises τ_f), and cap never covers more
    for r in res["per_clip"]:
        if r["ground"]:
            assert r["cap"]["clip_pixels"] <= r["frame0"]["clip_pixels"] + 1e-12


def test_printed_table(stats, capsys, tmp_path):
    MS.main(["--data", str(stats["out"]), "--n", "3"])
    text = capsys.readouterr().out
    assert "mask forced on" in text and "frame0" in text and "cap 0.4" in text
    for desc in MS.MEASURES.values():
        assert desc in text


def _hand(src, clip_id, seed, sample_id, calibration):
    """Recompute one clip from the prepared files with apply_unknown_mask and plain per-frame loops."""
    ids = np.load(src / "sem" / f"{clip_id}.npz")["ids"]
    meta = json.loads((src / "meta" / f"{clip_id}.json").read_text())
    rng_draw = draw_sample(seed, 0, sample_id, 0.0, 0.0, 1.0)
    out, frac = apply_unknown_mask(ids, Cameras.from_meta(meta), meta["ground_z"], rng_draw.mask, calibration, CAP)
    per_frame = []
    for f in range(ids.shape[0]):
        static = ids[f] <= 6
        per_frame.append(float((out[f][static] == 255).sum()) / static.sum() if static.any() else math.nan)
    valid = [p for p in per_frame if not math.isnan(p)]
    return {
        "frame0_static": per_frame[0],
        "clip_pixels": float((out != ids).sum()) / ids.size,
        "frac": frac,
        "last_static": per_frame[-1],
        "frames_over_90": sum(p > 0.9 for p in valid) / len(valid),
        "frames_under_1": sum(p < 0.01 for p in valid) / len(valid),
    }, rng_draw.mask


@pytest.mark.parametrize("sample_id", [0, 2])  # clip00002: ground_z[0] is NaN (nanmedian plane)
def test_numbers_match_a_hand_computation(stats, sample_id):
    row = stats["json"]["per_clip"][sample_id]
    for cal in ("frame0", "cap"):
        want, params = _hand(stats["src"], row["clip_id"], 3, sample_id, cal)
        assert row["thetas"] == list(params.thetas) and row["qs"] == list(params.qs)
        assert want["clip_pixels"] == pytest.approx(want["frac"], abs=1e-12)
        for m in ("frame0_static", "clip_pixels", "last_static", "frames_over_90", "frames_under_1"):
            assert row[cal][m] == pytest.approx(want[m], abs=1e-12), (cal, m)
        assert row[cal]["frame0_static"] > 0


def test_mask_params_are_the_loaders(stats):
    """Forced on, the loader itself (mask p=1) masks the same pixel fraction with the same draw."""
    res = stats["json"]
    for cal in ("frame0", "cap"):
        ds = GcStreamingDataset(
            DataConfig(
                str(stats["out"]),
                text_dropout=0.0,
                cond_dropout=0.0,
                mask_p=1.0,
                mask_calibration=cal,
                max_frame_coverage=CAP,
            ),
            "train",
            stats["root"] / "cache" / uuid.uuid4().hex,
            batch_size=1,
            seed=3,
            shuffle=False,
        )
        for i in (0, 1, 3):
            rec = ClipRecord.from_sample(StreamingDataset.get_item(ds, i))
            s = ds.make_sample(rec, i, 0)
            assert s["clip_id"] == res["per_clip"][i]["clip_id"]
            assert s["dropped"]["mask"] == pytest.approx(res["per_clip"][i][cal]["clip_pixels"], abs=1e-12)


def test_cap_bounds_per_frame_coverage(stats):
    res = stats["json"]
    rows = [r for r in res["per_clip"] if r["ground"]]
    assert any(r["n_planes"] == 2 for r in rows) and any(r["n_planes"] == 1 for r in rows)
    for r in rows:
        assert r["cap"]["frame_max_ground"] <= r["n_planes"] * CAP + 1e-12, r
    assert res["table"]["cap"]["frame_max_ground"]["max"] <= 2 * CAP + 1e-12
    # the bound is not vacuous here: frame0 exceeds it somewhere
    assert res["table"]["frame0"]["frame_max_ground"]["max"] > 2 * CAP


def test_preview_png(stats):
    png = stats["png"]
    assert png.exists()
    img = Image.open(png)
    f, h, w = read_manifest(str(stats["out"]))["geometry"]["sem"]
    assert (f, h, w) == (9, 64, 96)
    up = round(MS.CELL_TARGET_W / w)  # tiny frames are upsampled ×2
    n_clips = min(MS.PREVIEW_CLIPS, N - 1)
    cols = len(MS.preview_frames(f))
    assert cols == MS.PREVIEW_FRAMES
    assert img.size == (MS.LABEL_W + cols * (w * up + MS.GAP), MS.HEADER_H + 2 * n_clips * (h * up + MS.GAP))
    assert img.size == MS.preview_size(n_clips, f, (h, w))
    colours = {tuple(c) for _, c in img.convert("RGB").getcolors(1 << 20)}
    assert {(40, 40, 40), (210, 210, 210)} <= colours  # UNKNOWN hatching is drawn


def test_a_split_with_no_clips_is_named_as_such_not_as_damaged_data(tmp_path, capsys):
    out = tmp_path / "shards"
    C.convert(make_prepared(tmp_path, clips=8), str(out), progress=False)  # 2 train runs, no val run
    assert MS.main(["--data", str(out), "--split", "val", "--n", "1"]) == 2  # the input asked for: not damaged (6)
    err = capsys.readouterr().err
    assert f"{out}: no val split (its conversion has 0 val clips: manifest.json)" in err and "damaged" not in err
