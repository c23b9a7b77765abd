"""The synthetic world (gcc.synth.world) writes exactly the prepared layout of docs/data_format.md."""

from __future__ import annotations

import io
import json
import math
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from gcc import vocab
from gcc.geometry import Cameras, ground_points, pixel_grid
from gcc.synth import decode as synth_decode
from gcc.synth import scene as synth_scene
from gcc.synth import world as synth
from gcc.synth.render import render_frame

TINY = synth.GEOMETRIES["tiny"]
ROW_FIELDS = ["clip_id", "run", "subset", "scene", "split", "drop", "context_keys"]


def rows_of(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "index" / "clips.jsonl").read_text().splitlines()]


def load_ids(root: Path, cid: str) -> np.ndarray:
    with np.load(root / "sem" / f"{cid}.npz") as z:
        assert list(z.keys()) == ["ids"]
        return z["ids"]


def load_meta(root: Path, cid: str) -> dict:
    return json.loads((root / "meta" / f"{cid}.json").read_text())


def all_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---- layout, fields, dtypes, shapes --------------------------------------------------------------------
def test_geometry_presets():
    full = synth.GEOMETRIES["full"]
    assert full.latent_shape == (48, 21, 30, 52)
    assert full.sem_shape == (81, 480, 832) and full.dst_hw == (480, 832)
    assert full.text_shape == (512, 4096)
    assert full.src_hw[0] / full.dst_hw[0] == full.src_hw[1] / full.dst_hw[1]  # same scale both ways
    assert TINY.latent_shape == (48, 3, 4, 6) and TINY.sem_shape == (9, 64, 96) and TINY.text_shape == (16, 64)
    for g in synth.GEOMETRIES.values():
        assert g.F == 4 * (g.T - 1) + 1 and g.dst_hw == (16 * g.h, 16 * g.w)


def test_layout(prepared_tiny):
    root = prepared_tiny
    assert (root / "READY").is_file()
    rows = rows_of(root)
    assert len(rows) == 24
    ids = [r["clip_id"] for r in rows]
    assert len(set(ids)) == len(ids)
    expected = {"index/clips.jsonl", "text/table.safetensors", synth.MARKER, "READY"}
    for r in rows:
        expected |= {
            f"latents/{r['clip_id']}.safetensors",
            f"sem/{r['clip_id']}.npz",
            f"meta/{r['clip_id']}.json",
            f"raw/{r['subset']}/{r['scene']}/{r['run']}.tar",
        }
    assert set(all_files(root)) == expected  # nothing else (no leftover .tmp files)


def test_index_rows(prepared_tiny):
    table = load_file(prepared_tiny / "text" / "table.safetensors")
    for r in rows_of(prepared_tiny):
        assert list(r) == ROW_FIELDS
        assert all(isinstance(r[k], str) for k in ("clip_id", "run", "subset", "scene"))
        assert r["split"] in ("train", "val") and isinstance(r["drop"], bool)
        assert isinstance(r["context_keys"], list) and len(r["context_keys"]) == TINY.T
        assert all(k in table for k in r["context_keys"])
    # context keys vary across latent frames in some clips
    assert any(len(set(r["context_keys"])) > 1 for r in rows_of(prepared_tiny))


def test_text_table(prepared_tiny):
    table = load_file(prepared_tiny / "text" / "table.safetensors")
    assert vocab.NULL_PROMPT in table and len(table) >= 4
    for k, v in table.items():
        assert v.dtype == torch.bfloat16 and tuple(v.shape) == TINY.text_shape, k
        assert torch.isfinite(v.float()).all()
    assert list(vocab.key_to_id(table)) == sorted(table)


def test_clip_arrays_and_meta(prepared_tiny):
    for r in rows_of(prepared_tiny):
        cid = r["clip_id"]
        lat = load_file(prepared_tiny / "latents" / f"{cid}.safetensors")
        assert list(lat) == ["input_latents"]
        x = lat["input_latents"]
        assert x.dtype == torch.bfloat16 and tuple(x.shape) == TINY.latent_shape
        assert torch.isfinite(x.float()).all()
        assert 0.3 < x.float().std().item() < 3.0  # ~unit scale
        ids = load_ids(prepared_tiny, cid)
        assert ids.dtype == np.uint8 and ids.shape == TINY.sem_shape
        assert vocab.invalid_values(ids) == []
        meta = load_meta(prepared_tiny, cid)
        assert meta["clip_id"] == cid
        assert meta["dst_hw"] == list(ids.shape[1:]) and meta["src_hw"] == list(TINY.src_hw)
        assert len(meta["ground_z"]) == TINY.F and len(meta["cameras"]) == TINY.F
        for cam in meta["cameras"]:
            assert len(cam["location"]) == 3 and len(cam["rotation"]) == 3
            if cam["projection"] == "perspective":
                assert 0 < cam["fov_deg"] < 180 and "ortho_width" not in cam
            else:
                assert cam["projection"] == "orthographic" and cam["ortho_width"] > 0 and "fov_deg" not in cam
        cams = Cameras.from_meta(meta)
        assert len(cams) == TINY.F and cams.dst_hw == TINY.dst_hw


def test_raw_tars(prepared_tiny):
    rows = rows_of(prepared_tiny)
    by_tar: dict[Path, list[str]] = {}
    for r in rows:
        by_tar.setdefault(prepared_tiny / "raw" / r["subset"] / r["scene"] / f"{r['run']}.tar", []).append(r["clip_id"])
    for path, cids in by_tar.items():
        with tarfile.open(path) as tf:
            members = tf.getmembers()
            names = [m.name for m in members]
            assert names == [f"{c}/{f:03d}.jpg" for c in sorted(cids) for f in range(TINY.F)]
            assert all(m.isfile() and m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in members)
            img = Image.open(io.BytesIO(tf.extractfile(names[-1]).read()))
            assert img.format == "JPEG" and img.mode == "RGB" and img.size == (TINY.src_hw[1], TINY.src_hw[0])


# ---- determinism ---------------------------------------------------------------------------------------
def test_same_seed_identical_bytes(prepared_tiny, tmp_path):
    again = synth.make_prepared(tmp_path, clips=24, seed=0)
    a, b = all_files(prepared_tiny), all_files(again)
    assert list(a) == list(b)
    for name in a:
        assert a[name] == b[name], name


def test_different_seed_differs(prepared_tiny, tmp_path):
    other = synth.make_prepared(tmp_path, clips=2, seed=1)
    for sub in ("latents/clip00000.safetensors", "sem/clip00000.npz", "meta/clip00000.json", "text/table.safetensors"):
        assert (other / sub).read_bytes() != (prepared_tiny / sub).read_bytes(), sub


def test_clips_do_not_depend_on_count(prepared_tiny, tmp_path):
    few = synth.make_prepared(tmp_path, clips=3, seed=0)
    for sub in ("latents/clip00002.safetensors", "sem/clip00002.npz", "meta/clip00002.json"):
        assert (few / sub).read_bytes() == (prepared_tiny / sub).read_bytes()
    assert rows_of(few) == rows_of(prepared_tiny)[:3]


def test_refuses_non_empty_out(prepared_tiny, tmp_path):
    root = synth.make_prepared(tmp_path, clips=1, seed=0)
    with pytest.raises(FileExistsError):
        synth.write_prepared(root, clips=1)
    assert synth.main(["--out", str(root), "--n", "2", "--geometry", "tiny", "--seed", "3"]) == 2
    assert synth.main(["--out", str(root), "--n", "2", "--geometry", "tiny", "--seed", "3", "--overwrite"]) == 0
    assert (root / "READY").exists() and len(rows_of(root)) == 2


def test_overwrite_never_replaces_real_prepared_data(tmp_path, capsys):
    """--overwrite replaces gcc-synth's own output only: a prepared root without its marker (real clips) is refused
    and left byte for byte as it was."""
    root = synth.make_prepared(tmp_path, clips=3, seed=0)
    (root / synth.MARKER).unlink()  # what real prepared data looks like: the same layout, no synth.json
    before = all_files(root)
    code = synth.main(["--out", str(root), "--n", "2", "--geometry", "tiny", "--overwrite"])
    err = capsys.readouterr().err
    assert code == 2 and f"--out {root}: not empty and not gcc-synth's output" in err and "Traceback" not in err, err
    assert all_files(root) == before


def test_overwrite_replaces_a_dataset_cut_short(tmp_path, monkeypatch):
    """gcc-synth killed mid-write (no READY yet) left its mark first: --overwrite replaces what it wrote."""
    calls = []

    def dies(*a, **k):
        calls.append(1)
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(synth, "write_clip", dies)
        with pytest.raises(KeyboardInterrupt):
            synth.make_prepared(tmp_path, clips=2)
    root = tmp_path / "prepared"
    assert calls and not (root / "READY").exists()
    assert synth.main(["--out", str(root), "--n", "2", "--geometry", "tiny", "--overwrite"]) == 0
    assert (root / "READY").exists() and len(rows_of(root)) == 2


def test_overwrite_removes_a_link_in_the_layout_never_what_it_points_to(tmp_path, capsys):
    root = synth.make_prepared(tmp_path, clips=1, seed=0)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "clips.jsonl").write_text("someone else's file")
    shutil.rmtree(root / "index")
    (root / "index").symlink_to(outside)
    code = synth.main(["--out", str(root), "--n", "2", "--geometry", "tiny", "--overwrite"])
    assert code == 0, capsys.readouterr().err
    assert not (root / "index").is_symlink() and len(rows_of(root)) == 2
    assert [p.read_text() for p in outside.iterdir()] == ["someone else's file"]


# ---- runs, splits, drops, ground_z ---------------------------------------------------------------------
def test_runs_splits_drops(prepared_tiny):
    rows = rows_of(prepared_tiny)
    split_of_run: dict[str, set] = {}
    for r in rows:
        split_of_run.setdefault(r["run"], set()).add(r["split"])
    assert all(len(s) == 1 for s in split_of_run.values()), split_of_run
    assert max(sum(r["run"] == run for r in rows) for run in split_of_run) > 1  # several clips per run
    val = [int(r["clip_id"][4:]) for r in rows if r["split"] == "val"]
    assert val == [8, 9, 10, 11, 20, 21, 22, 23]  # runs 2 and 5 (documented in gcc/synth/world.py)
    dropped = [int(r["clip_id"][4:]) for r in rows if r["drop"]]
    assert dropped == [9, 19]
    assert {r["subset"] for r in rows} == {"synth_desert", "synth_forest"}


def test_ground_z_nan_clips(prepared_tiny):
    partial, none = [], []
    for r in rows_of(prepared_tiny):
        gz = np.array(load_meta(prepared_tiny, r["clip_id"])["ground_z"], dtype=np.float64)
        i = int(r["clip_id"][4:])
        if not np.isfinite(gz).any():
            none.append(i)
        elif not np.isfinite(gz).all():
            partial.append(i)
            assert math.isnan(gz[0]) and np.isfinite(gz[1:]).any()
            assert np.nanmax(gz) == np.nanmin(gz)  # one plane per clip
        else:
            assert np.all(gz == gz[0])
    assert partial == [2, 8, 14, 20] and none == [5, 17]


# ---- the world -----------------------------------------------------------------------------------------
def test_sem_values_cover_vocabulary(prepared_tiny):
    present = np.zeros(256, dtype=bool)
    for r in rows_of(prepared_tiny):
        present |= np.bincount(load_ids(prepared_tiny, r["clip_id"]).ravel(), minlength=256) > 0
    values = set(np.flatnonzero(present).tolist())
    assert vocab.UNKNOWN not in values
    assert set(range(7)) <= values  # statics and sky
    assert len(values & set(vocab.PLAYER_NAMES)) >= 5 and len(values & set(vocab.BOSS_NAMES)) >= 5


def test_projections_and_cameras_vary(prepared_tiny):
    kinds, rolls, travel = set(), set(), []
    for r in rows_of(prepared_tiny):
        meta = load_meta(prepared_tiny, r["clip_id"])
        cams = Cameras.from_meta(meta)
        kinds.add(bool(cams.orthographic[0]))
        rolls.add(bool(np.any(cams.rotation[:, 2] != 0)))
        travel.append(np.linalg.norm(cams.location[-1, :2] - cams.location[0, :2]))
        assert np.all(cams.rotation[:, 0] < -10)  # looking down
    assert kinds == {True, False} and rolls == {True, False}
    assert min(travel) > 200 and max(travel) > 500  # several metres


def test_world_anchored_statics(prepared_tiny):
    """A static ground pixel's class equals the world's class at its ground point (`ground_points`); sky
    exactly where the ray misses the plane."""
    pix = pixel_grid(TINY.dst_hw)
    checked = 0
    for i in (0, 1, 2, 4, 15):  # perspective, orthographic, partial-NaN, roll, sky
        cid = synth.clip_id(i)
        ids, meta = load_ids(prepared_tiny, cid), load_meta(prepared_tiny, cid)
        world = synth.make_scene(0, i, "tiny").world
        cams = Cameras.from_meta(meta)
        for f, gz in enumerate(meta["ground_z"]):
            if not np.isfinite(gz):
                continue
            xy = ground_points(cams[f], pix, gz)[0]
            sem = ids[f].ravel()
            static = sem <= vocab.STATIC_MAX
            expect = synth_scene.world_class(world, xy)
            agree = np.mean(sem[static] == expect[static])
            assert agree > 0.999, (cid, f, agree)
            assert np.array_equal(sem[static] == 6, np.isnan(xy[static, 0])), (cid, f)
            checked += int(static.sum())
    assert checked > 10000


def test_world_class_is_world_anchored():
    """The same world point keeps its class whatever the camera: classes come from world XY only."""
    world = synth.make_scene(0, 0, "tiny").world
    rng = np.random.default_rng(0)
    xy = rng.uniform(-5000, 5000, size=(1000, 2))
    c = synth_scene.world_class(world, xy)
    assert np.array_equal(c, synth_scene.world_class(world, xy.copy()))
    assert set(np.unique(c).tolist()) == set(range(6))
    assert synth_scene.world_class(world, np.array([[np.nan, np.nan]]))[0] == 6


def test_characters_move(prepared_tiny):
    ids = load_ids(prepared_tiny, synth.clip_id(0))
    first = np.argwhere(ids[0] >= 10).mean(0)
    last = np.argwhere(ids[-1] >= 10).mean(0)
    scene = synth.make_scene(0, 0, "tiny")
    moved = np.linalg.norm(scene.capsules[-1][:, :2] - scene.capsules[0][:, :2], axis=-1)
    assert moved.min() > 50  # every capsule moves in the world (cm)
    assert np.isfinite(first).all() and np.isfinite(last).all()
    drawn, shade = render_frame(scene, len(ids) - 1)  # the stored ids are the scene's, drawn again
    assert np.array_equal(drawn, ids[-1]) and drawn.shape == shade.shape


# ---- latents carry the semantic signal -----------------------------------------------------------------
def _cells(root: Path):
    table = sorted(load_file(root / "text" / "table.safetensors"))
    feats, text, lat = [], [], []
    for r in rows_of(root):
        ids = load_ids(root, r["clip_id"])
        frac = synth.latent_cell_fractions(ids, TINY.T, TINY.h, TINY.w)  # [T, h, w, V]
        x = load_file(root / "latents" / f"{r['clip_id']}.safetensors")["input_latents"].float().numpy()
        onehot = np.zeros((TINY.T, len(table)), dtype=np.float32)
        onehot[np.arange(TINY.T), [table.index(k) for k in r["context_keys"]]] = 1
        feats.append(frac.reshape(-1, frac.shape[-1]))
        text.append(
            np.broadcast_to(onehot[:, None, None], (TINY.T, TINY.h, TINY.w, len(table))).reshape(-1, len(table))
        )
        lat.append(x.transpose(1, 2, 3, 0).reshape(-1, x.shape[0]))
    return np.concatenate(feats), np.concatenate(text), np.concatenate(lat)


def test_latents_depend_on_sem_layout(prepared_tiny):
    frac, text, lat = _cells(prepared_tiny)

    def r2(x):
        coef, *_ = np.linalg.lstsq(x, lat, rcond=None)
        return 1 - np.sum((lat - x @ coef) ** 2) / np.sum((lat - lat.mean(0)) ** 2)

    full = r2(np.concatenate([frac, text], 1))
    shuffled = r2(np.concatenate([frac[np.random.default_rng(0).permutation(len(frac))], text], 1))
    assert full > 0.95 and full - shuffled > 0.3, (full, shuffled)
    # cells dominated by the same class are closer to each other than cells of different classes
    dom, purity = frac.argmax(1), frac.max(1)
    pure = purity > 0.9
    classes = [c for c in np.unique(dom[pure]) if np.sum(pure & (dom == c)) >= 5]
    assert len(classes) >= 3
    means = {c: lat[pure & (dom == c)] for c in classes}
    same = np.mean([np.linalg.norm(v[:, None] - v[None], axis=-1).mean() for v in means.values()])
    diff = np.mean(
        [np.linalg.norm(means[a][:, None] - means[b][None], axis=-1).mean() for a in classes for b in classes if a != b]
    )
    assert same < 0.7 * diff, (same, diff)


def test_latent_cell_fractions_footprint():
    ids = np.zeros((9, 32, 48), dtype=np.uint8)
    ids[0, :16, :16] = 6  # latent frame 0 = pixel frame 0
    ids[1:5, 16:, 16:32] = 10  # latent frame 1 = pixel frames 1..4
    ids[5, :16, 32:] = 16  # one of latent frame 2's four frames
    frac = synth.latent_cell_fractions(ids, 3, 2, 3)
    ch = vocab.CHANNEL_LUT["parts"]
    assert frac.shape == (3, 2, 3, vocab.num_classes("parts"))
    np.testing.assert_allclose(frac.sum(-1), 1.0, rtol=1e-6)
    assert frac[0, 0, 0, ch[6]] == 1 and frac[0, 0, 1, ch[0]] == 1
    assert frac[1, 1, 1, ch[10]] == 1 and frac[1, 0, 0, ch[0]] == 1
    assert frac[2, 0, 2, ch[16]] == 0.25


# ---- the synthetic decoder (gcc.synth.decode, docs/sample.md) ------------------------------------
def _stored_clips(root: Path):
    """(row, stored bf16 latents [48, T, h, w], sem ids) of every clip of a prepared root."""
    for r in rows_of(root):
        lat = load_file(root / "latents" / f"{r['clip_id']}.safetensors")["input_latents"]
        yield r, lat, load_ids(root, r["clip_id"])


def test_marker_names_the_generator(prepared_tiny, tmp_path):
    marker = json.loads((prepared_tiny / synth.MARKER).read_text())
    assert marker == {"generator": "gcc.synth.world", "seed": 0, "clips": 24, "geometry": TINY.as_dict()}
    assert synth.is_synthetic(prepared_tiny)
    assert not synth.is_synthetic(tmp_path) and not synth.is_synthetic(None)
    (tmp_path / synth.MARKER).write_text('{"generator": "someone else"}\n')
    assert not synth.is_synthetic(tmp_path)


def test_decoder_recovers_the_majority_class_of_each_cell(prepared_tiny):
    """Decoding the synth's own (stored, bf16) latents gives the GT majority class of nearly every latent cell;
    the misses are near-ties. The text term of the right key and the cell order matter: wrong keys or shuffled
    cells fall far below."""
    rng = np.random.default_rng(0)
    hits, misses_margin, wrong_keys, shuffled, no_text, hits_ids = [], [], [], [], [], []
    for r, lat, ids in _stored_clips(prepared_tiny):
        keys = r["context_keys"]
        gt = synth_decode.gt_cell_classes(ids, TINY.T, TINY.h, TINY.w)
        frac = synth.latent_cell_fractions(ids, TINY.T, TINY.h, TINY.w)
        assert np.array_equal(gt, np.array(vocab.VOCAB_VALUES["parts"], np.uint8)[frac.argmax(-1)])
        dec = synth_decode.decode_classes(lat, keys)
        assert dec.shape == gt.shape == (TINY.T, TINY.h, TINY.w) and dec.dtype == np.uint8
        hits.append(dec == gt)
        top2 = np.sort(frac, -1)[..., -2:]
        misses_margin.extend((top2[..., 1] - top2[..., 0])[dec != gt].tolist())
        other = [synth.PROMPT_KEYS[(synth.PROMPT_KEYS.index(k) + 1) % len(synth.PROMPT_KEYS)] for k in keys]
        wrong_keys.append(synth_decode.decode_classes(lat, other) == gt)
        cells = lat.float().reshape(48, -1)[:, rng.permutation(TINY.T * TINY.h * TINY.w)].reshape(lat.shape)
        shuffled.append(synth_decode.decode_classes(cells, keys) == gt)
        text = np.stack([synth.text_vector(k) for k in keys]).T[:, :, None, None]
        no_text.append(synth_decode.decode_classes(lat.float().numpy() + synth.TEXT_SCALE * text, keys) == gt)
        hits_ids.append(
            synth_decode.decode_classes(lat, keys, "ids")
            == synth_decode.gt_cell_classes(ids, TINY.T, TINY.h, TINY.w, "ids")
        )
    agree = float(np.mean(hits))
    assert agree >= 0.95, agree
    assert float(np.mean(hits_ids)) >= 0.95, np.mean(hits_ids)  # an `ids` checkpoint: a character's parts summed
    assert max(misses_margin, default=0.0) < 0.05, misses_margin  # misses are cells with two classes almost tied
    assert float(np.mean(wrong_keys)) < agree - 0.15, (np.mean(wrong_keys), agree)
    assert float(np.mean(no_text)) < agree - 0.15, (np.mean(no_text), agree)  # the key's text added twice
    assert float(np.mean(shuffled)) < 0.5, np.mean(shuffled)
    # fractions, not just classes: the least-squares inverse is close to the true fractions everywhere
    r, lat, ids = next(_stored_clips(prepared_tiny))
    est = synth_decode.decode_fractions(lat, r["context_keys"])
    assert np.abs(est - synth.latent_cell_fractions(ids, TINY.T, TINY.h, TINY.w)).max() < 0.1


def test_cells_to_pixels_and_agreement():
    cells = np.arange(3 * 2 * 3, dtype=np.uint8).reshape(3, 2, 3)
    px = synth_decode.cells_to_pixels(cells)
    assert px.shape == (9, 32, 48)
    frame_of = [0, 1, 1, 1, 1, 2, 2, 2, 2]  # latent frame 0 = pixel frame 0, k >= 1 = pixel frames 4k-3..4k
    for f, k in enumerate(frame_of):
        assert np.array_equal(px[f, ::16, ::16], cells[k]) and len(np.unique(px[f, 16:32, 32:48])) == 1
    other = cells.copy()
    other[0] = 99  # frame 0 is left out by default
    other[1, 0, 0] = 99
    assert synth_decode.agreement(other, cells) == pytest.approx(11 / 12)
    assert synth_decode.agreement(other, cells, first=0) == pytest.approx(11 / 18)
    assert synth_decode.agreement(cells[:1], cells[:1]) is None


# ---- full geometry -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_full_geometry_one_clip(tmp_path):
    full = synth.GEOMETRIES["full"]
    root = synth.write_prepared(tmp_path / "full", clips=1, geometry="full", seed=0)
    r = rows_of(root)[0]
    x = load_file(root / "latents" / f"{r['clip_id']}.safetensors")["input_latents"]
    assert tuple(x.shape) == (48, 21, 30, 52) and x.dtype == torch.bfloat16
    ids = load_ids(root, r["clip_id"])
    assert ids.shape == (81, 480, 832) and vocab.invalid_values(ids) == []
    table = load_file(root / "text" / "table.safetensors")
    assert all(tuple(v.shape) == (512, 4096) and v.dtype == torch.bfloat16 for v in table.values())
    assert len(r["context_keys"]) == 21
    meta = load_meta(root, r["clip_id"])
    assert meta["dst_hw"] == [480, 832] and meta["src_hw"] == list(full.src_hw) and len(meta["ground_z"]) == 81
    with tarfile.open(root / "raw" / r["subset"] / r["scene"] / f"{r['run']}.tar") as tf:
        names = tf.getnames()
        assert len(names) == 81
        img = Image.open(io.BytesIO(tf.extractfile(names[0]).read()))
        assert img.size == (full.src_hw[1], full.src_hw[0])
