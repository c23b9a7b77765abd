"""convert_data: round trip through a real StreamingDataset, every kind of bad input, kill + resume,
parallel == serial, idempotent rerun, and a real S3 server (moto) on loopback."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from gcc import exit_codes
from gcc.data import convert as C
from gcc.data.shards import MANIFEST, TEXT_TABLE, ClipRecord, bf16_to_bits, read_manifest
from gcc.errors import BadInput
from gcc.synth.world import make_prepared
from gcc.vocab import key_to_id

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def src(tmp_path):
    return make_prepared(tmp_path, clips=12)


def read_split(out: str, split: str, cache: Path) -> dict[str, ClipRecord]:
    """Every sample of a split through a real StreamingDataset (remote = the conversion, local = a cache)."""
    from streaming import StreamingDataset

    import gcc.compat.streaming  # noqa: F401  (its registration, race-free beside other jobs)

    ds = StreamingDataset(
        remote=f"{out}/{split}", local=str(cache / f"{split}-{uuid.uuid4().hex[:8]}"), batch_size=1, shuffle=False
    )
    return {r.clip_id: r for r in (ClipRecord.from_sample(ds[i]) for i in range(len(ds)))}


def rows_of(src: Path) -> list[dict]:
    return [json.loads(line) for line in (src / "index" / "clips.jsonl").read_text().splitlines() if line.strip()]


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def assert_matches_source(src: Path, out: str, cache: Path, include_dropped: bool = False) -> None:
    with safe_open(str(src / "text" / "table.safetensors"), "pt") as f:
        keys = sorted(f.keys())
    id_to_key = {i: k for k, i in key_to_id(keys).items()}
    for split in ("train", "val"):
        got = read_split(out, split, cache)
        want = [r for r in rows_of(src) if r["split"] == split and (include_dropped or not r["drop"])]
        assert sorted(got) == sorted(r["clip_id"] for r in want)
        for row in want:
            rec = got[row["clip_id"]]
            cid = row["clip_id"]
            with safe_open(str(src / "latents" / f"{cid}.safetensors"), "pt") as f:
                lat = f.get_tensor("input_latents")
            assert rec.input_latents.dtype == torch.bfloat16
            assert np.array_equal(bf16_to_bits(rec.input_latents), bf16_to_bits(lat)), cid
            with np.load(src / "sem" / f"{cid}.npz") as z:
                assert np.array_equal(rec.sem_ids(), z["ids"]), cid
            assert rec.meta_text == (src / "meta" / f"{cid}.json").read_text()
            assert [id_to_key[int(i)] for i in rec.context_ids] == row["context_keys"]
            assert (rec.run, rec.subset, rec.scene, rec.drop) == (row["run"], row["subset"], row["scene"], row["drop"])


def test_round_trip_every_field(src, tmp_path):
    out = tmp_path / "out"
    manifest = C.convert(src, str(out), chunk_clips=3, progress=False)
    assert_matches_source(src, str(out), tmp_path / "cache")
    assert (out / TEXT_TABLE).read_bytes() == (src / "text" / "table.safetensors").read_bytes()
    rows = [r for r in rows_of(src) if not r["drop"]]
    assert manifest["counts"] == {s: sum(r["split"] == s for r in rows) for s in ("train", "val")}
    assert manifest == json.loads((out / MANIFEST).read_text())
    assert manifest["name"] == "synth"  # no --name: gcc-synth's data (its root holds the synth marker)
    with safe_open(str(src / "latents" / f"{rows[0]['clip_id']}.safetensors"), "pt") as f:
        c, t, h, w = f.get_slice("input_latents").get_shape()
    assert manifest["geometry"]["latents"] == [c, t, h, w]
    assert manifest["geometry"]["sem"] == [4 * (t - 1) + 1, 16 * h, 16 * w]
    assert manifest["source_index_sha256"] == hashlib.sha256((src / "index" / "clips.jsonl").read_bytes()).hexdigest()
    # shards are uncompressed by default (a local dataset is read in place) and carry hashes
    idx = json.loads((out / "train" / "index.json").read_text())
    assert all(s["compression"] is None and s["hashes"] for s in idx["shards"])


def test_include_dropped(src, tmp_path):
    assert any(r["drop"] for r in rows_of(src))
    out = tmp_path / "out"
    C.convert(src, str(out), include_dropped=True, progress=False)
    assert_matches_source(src, str(out), tmp_path / "cache", include_dropped=True)


# ---- bad input: one case per kind; each must name the clip (or file) and the field --------------------
def _first(src: Path, split: str = "train") -> str:
    return sorted(r["clip_id"] for r in rows_of(src) if r["split"] == split and not r["drop"])[0]


def _last(src: Path) -> str:
    return sorted(r["clip_id"] for r in rows_of(src) if r["split"] == "train" and not r["drop"])[-1]


def _edit_latents(src, cid, fn):
    p = src / "latents" / f"{cid}.safetensors"
    with safe_open(str(p), "pt") as f:
        lat = f.get_tensor("input_latents")
    save_file({"input_latents": fn(lat)}, str(p))


def _edit_sem(src, cid, fn):
    p = src / "sem" / f"{cid}.npz"
    with np.load(p) as z:
        ids = z["ids"]
    np.savez_compressed(p, ids=fn(ids))


def _edit_meta(src, cid, fn):
    p = src / "meta" / f"{cid}.json"
    meta = json.loads(p.read_text())
    p.write_text(json.dumps(fn(meta)))


def _edit_rows(src, fn):
    p = src / "index" / "clips.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in fn(rows_of(src))))


def _set(d, k, v):
    d[k] = v
    return d


def _nonfinite(lat):
    lat = lat.clone()
    lat[0, 1, 0, 0] = float("nan")
    return lat


def _invalid_sem(ids):
    ids = ids.copy()
    ids[0, 0, 0] = 7
    return ids


def _run_leak(rows):
    val_run = next(r["run"] for r in rows if r["split"] == "val")
    tr = next(r for r in rows if r["split"] == "train" and not r["drop"])
    tr["run"] = val_run
    return rows


def _clip_leak(rows):
    tr = next(r for r in rows if r["split"] == "train" and not r["drop"])
    return rows + [dict(tr, split="val", run="another_run")]


def _bad_proj(m):
    m["cameras"][2]["projection"] = "fisheye"
    return m


BAD_INPUTS = {
    # kind: (mutate(src) -> clip named in the message or None, expected substrings)
    "latents_shape": (
        lambda s: _edit_latents(s, _last(s), lambda x: x[:, :-1].contiguous()) or _last(s),
        ["input_latents", "shape"],
    ),
    "latents_dtype": (
        lambda s: _edit_latents(s, _last(s), lambda x: x.float()) or _last(s),
        ["input_latents", "bfloat16"],
    ),
    "latents_nonfinite": (lambda s: _edit_latents(s, _last(s), _nonfinite) or _last(s), ["input_latents", "finite"]),
    "latents_missing": (
        lambda s: (s / "latents" / f"{_last(s)}.safetensors").unlink() or _last(s),
        ["latents", "missing"],
    ),
    "sem_shape": (lambda s: _edit_sem(s, _last(s), lambda i: i[:, :-16]) or _last(s), ["'ids'", "shape"]),
    "sem_dtype": (lambda s: _edit_sem(s, _last(s), lambda i: i.astype(np.int16)) or _last(s), ["'ids'", "uint8"]),
    "sem_values": (lambda s: _edit_sem(s, _last(s), _invalid_sem) or _last(s), ["'ids'", "[7]", "vocabulary"]),
    "sem_missing": (lambda s: (s / "sem" / f"{_last(s)}.npz").unlink() or _last(s), ["sem", "missing"]),
    "meta_dst_hw": (lambda s: _edit_meta(s, _last(s), lambda m: _set(m, "dst_hw", [8, 8])) or _last(s), ["dst_hw"]),
    "meta_cameras": (
        lambda s: _edit_meta(s, _last(s), lambda m: _set(m, "cameras", m["cameras"][:-1])) or _last(s),
        ["cameras"],
    ),
    "meta_projection": (lambda s: _edit_meta(s, _last(s), _bad_proj) or _last(s), ["cameras[2].projection"]),
    "meta_ground_z": (
        lambda s: _edit_meta(s, _last(s), lambda m: _set(m, "ground_z", m["ground_z"][:2])) or _last(s),
        ["ground_z"],
    ),
    "meta_json": (lambda s: (s / "meta" / f"{_last(s)}.json").write_text("{not json") and _last(s), ["not valid JSON"]),
    "context_key": (
        lambda s: (
            _edit_rows(
                s,
                lambda rows: [
                    _set(r, "context_keys", ["nope"] * len(r["context_keys"])) if r["clip_id"] == _last(s) else r
                    for r in rows
                ],
            )
            or _last(s)
        ),
        ["context_keys", "nope"],
    ),
    "index_missing_field": (
        lambda s: (
            _edit_rows(
                s,
                lambda rows: [
                    {k: v for k, v in r.items() if k != "run"} if r["clip_id"] == _last(s) else r for r in rows
                ],
            )
            or _last(s)
        ),
        ["clips.jsonl", "'run' missing"],
    ),
    "index_bad_json": (
        lambda s: (s / "index" / "clips.jsonl").open("a").write("{oops\n") and None,
        ["clips.jsonl:", "not valid JSON"],
    ),
    "train_val_run_overlap": (lambda s: _edit_rows(s, _run_leak) or None, ["train/val overlap", "run"]),
    "train_val_clip_overlap": (lambda s: _edit_rows(s, _clip_leak) or None, ["train/val overlap", "clip"]),
    "no_ready": (lambda s: (s / "READY").unlink() or None, ["READY"]),
}


@pytest.mark.parametrize("kind", sorted(BAD_INPUTS))
def test_bad_input_is_refused_with_a_clear_message(kind, src, tmp_path, capsys):
    mutate, expected = BAD_INPUTS[kind]
    clip = mutate(src)
    out = tmp_path / "out"
    code = C.main(["--data", str(src), "--out", str(out), "--chunk-clips", "3", "--no-progress"])
    err = capsys.readouterr().err
    assert code == exit_codes.CONFIG
    assert "Traceback" not in err
    for s in expected + ([clip] if clip else []):
        assert s in err, f"{s!r} not in message:\n{err}"
    assert not (out / MANIFEST).exists()


def test_failed_chunk_keeps_finished_ones_and_rerun_completes_identically(src, tmp_path, capsys, caplog):
    clean = tmp_path / "clean"
    C.convert(src, str(clean), chunk_clips=3, progress=False)
    broken = tmp_path / "broken_src"
    shutil.copytree(src, broken)
    bad = _last(broken)
    _edit_latents(broken, bad, _nonfinite)
    out = tmp_path / "out"
    with pytest.raises(BadInput, match=bad):
        C.convert(broken, str(out), chunk_clips=3, progress=False)
    assert not (out / MANIFEST).exists()
    done_before = sorted(p.parent.name for p in out.rglob("DONE.json"))
    assert done_before  # other chunks survived
    shutil.copy(src / "latents" / f"{bad}.safetensors", broken / "latents" / f"{bad}.safetensors")
    caplog.set_level(logging.INFO, logger="gcc.data.convert")
    caplog.clear()
    C.convert(broken, str(out), chunk_clips=3, progress=False)
    logs = caplog.messages
    assert f"({len(done_before)} already done)" in logs[0]
    assert _shards_digest(out) == _shards_digest(clean)


def _shards_digest(out: Path) -> dict[str, str]:
    d = tree_digest(out)
    d.pop(MANIFEST)
    return d


KILL_SCRIPT = """
import os, sys
from streaming import MDSWriter
n = 0
orig = MDSWriter.write
def write(self, sample):
    global n
    n += 1
    if n == int(os.environ["KILL_AFTER"]):
        os._exit(137)  # die like SIGKILL: no cleanup, no finally, no atexit
    return orig(self, sample)
MDSWriter.write = write
from gcc.data.convert import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_killed_conversion_resumes_to_identical_output(src, tmp_path, caplog):
    clean = tmp_path / "clean"
    C.convert(src, str(clean), chunk_clips=2, progress=False)
    out = tmp_path / "out"
    args = ["--data", str(src), "--out", str(out), "--chunk_clips", "2", "--no_progress"]
    env = dict(os.environ, KILL_AFTER="6", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", KILL_SCRIPT, *args], env=env, capture_output=True, text=True)
    assert r.returncode == 137, r.stderr
    assert not (out / MANIFEST).exists()
    done = sorted(out.rglob("DONE.json"))
    assert len(done) == 2  # chunks 1-2 finished; the 3rd died mid-write and is not visible as a chunk
    assert list(out.glob("*/.chunk_*")), "the killed chunk's staging folder should be left behind"
    caplog.set_level(logging.INFO, logger="gcc.data.convert")
    caplog.clear()
    C.convert(src, str(out), chunk_clips=2, progress=False)
    logs = caplog.messages
    assert "(2 already done)" in logs[0]
    assert not list(out.glob("*/.chunk_*"))
    assert _shards_digest(out) == _shards_digest(clean)


def test_parallel_equals_serial(src, tmp_path):
    a, b = tmp_path / "serial", tmp_path / "parallel"
    C.convert(src, str(a), workers=1, chunk_clips=2, progress=False)
    C.convert(src, str(b), workers=2, chunk_clips=2, progress=False)
    assert tree_digest(a) == tree_digest(b)


def test_rerun_on_finished_output_does_nothing(src, tmp_path, caplog):
    out = tmp_path / "out"
    C.convert(src, str(out), chunk_clips=3, progress=False)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    caplog.set_level(logging.INFO, logger="gcc.data.convert")
    caplog.clear()
    C.convert(src, str(out), chunk_clips=3, progress=False)
    logs = caplog.messages
    assert "nothing to do" in logs[0]
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    # the same folder with other settings is refused, naming what differs
    with pytest.raises(BadInput, match="chunk_clips"):
        C.convert(src, str(out), chunk_clips=5, progress=False)


def test_the_default_name_comes_from_the_source_folder(src, tmp_path):
    assert C.default_name(src) == "synth"
    for folder, name in (
        ("gc25d_v10", "v10"),
        ("gc25d_v10_mds", "v10"),
        ("clips_2025", "clips_2025"),
        ("gc25d_", "gc25d_"),
    ):
        (tmp_path / folder).mkdir()
        assert C.default_name(tmp_path / folder) == name
    (tmp_path / "gc25d_v10" / "synth.json").write_text('{"generator": "another tool"}')  # only gcc-synth's marker
    assert C.default_name(tmp_path / "gc25d_v10") == "v10"


def test_the_name_is_recorded_once_and_checked(src, tmp_path, caplog):
    out = tmp_path / "out"
    assert C.convert(src, str(out), chunk_clips=4, progress=False, name="v10")["name"] == "v10"
    assert read_manifest(str(out))["name"] == "v10"
    caplog.set_level(logging.INFO, logger="gcc.data.convert")
    C.convert(src, str(out), chunk_clips=4, progress=False, name="v10")
    assert "nothing to do" in caplog.messages[-1]
    # a finished output keeps its name: runs on it depend on the manifest's bytes
    for other in ("v11", None):
        with pytest.raises(BadInput, match="already converted from this source as 'v10'.*--name v10"):
            C.convert(src, str(out), chunk_clips=4, progress=False, name=other)
    # a manifest of an earlier convert_data has no name: kept as it is
    m = json.loads((out / MANIFEST).read_text())
    del m["name"]
    (out / MANIFEST).write_text(json.dumps(m))
    assert "name" not in read_manifest(str(out))
    assert "name" not in C.convert(src, str(out), chunk_clips=4, progress=False, name="v10")
    assert "without a name" in caplog.messages[-1]
    # the one rule for names (gcc/names.py), before anything is written
    r = subprocess.run(
        [sys.executable, "-m", "convert_data", "--data", str(src), "--out", str(tmp_path / "o2"), "--name", "v10/../x"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 2 and "--name 'v10/../x': must be" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "o2").exists()


@pytest.mark.slow
def test_console_entry_points(src, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "convert_data",
            "--data",
            str(src),
            "--out",
            str(out),
            "--workers",
            "2",
            "--chunk-clips",
            "3",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert "done in" in r.stdout and (out / MANIFEST).exists()
    r = subprocess.run(
        [str(Path(sys.executable).with_name("convert_data")), "--data", str(src), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "chunk_clips" in r.stderr  # same folder, different settings


@pytest.mark.slow
def test_s3_round_trip(src, tmp_path, s3_bucket, caplog):
    out = f"{s3_bucket}/v1/shards"
    manifest = C.convert(src, out, workers=2, chunk_clips=3, progress=False)
    assert read_manifest(out) == manifest
    assert_matches_source(src, out, tmp_path / "cache")
    caplog.set_level(logging.INFO, logger="gcc.data.convert")
    caplog.clear()
    C.convert(src, out, chunk_clips=3, progress=False)
    logs = caplog.messages
    assert "nothing to do" in logs[0]


# ---- what convert_data writes over (docs/training.md, "Trust and safety") ------------------------------------
def _tree_bytes(root: Path) -> dict[str, bytes | str]:
    """Every entry under `root`: a file's bytes, a link's target."""
    return {
        str(p.relative_to(root)): os.readlink(p) if p.is_symlink() else p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_symlink() or p.is_file()
    }


def _convert(src: Path, out: Path, capsys) -> tuple[int, str]:
    code = C.main(["--data", str(src), "--out", str(out), "--chunk_clips", "6", "--no_progress"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("where", ["file", "folder"])
def test_the_text_table_is_never_written_through_a_link_inside_out(where, src, tmp_path, capsys):
    """convert_data's own output, its text table (or the text/ folder) replaced by a link to a file outside it: the
    rerun is refused naming the link, and the outside file is left as it was."""
    out = tmp_path / "out"
    assert _convert(src, out, capsys)[0] == 0
    (out / MANIFEST).unlink()  # a conversion to finish: the text table is written again
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "table.safetensors").write_bytes(b"someone else's file")
    if where == "file":
        link = out / TEXT_TABLE
        link.unlink()
        link.symlink_to(outside / "table.safetensors")
    else:
        link = out / "text"
        shutil.rmtree(link)
        link.symlink_to(outside)
    code, err = _convert(src, out, capsys)
    assert code == exit_codes.CONFIG and f"{link}: a symbolic link" in err and "Traceback" not in err, err
    assert (outside / "table.safetensors").read_bytes() == b"someone else's file"
    assert not (out / MANIFEST).exists()


@pytest.mark.parametrize("damage", ["link", "other bytes"])
def test_a_finished_output_whose_text_table_changed_is_not_called_done(damage, src, tmp_path, capsys):
    """A finished output whose text table became a link to a file elsewhere (or other bytes): the rerun says so
    (exit 2 naming it) instead of "nothing to do", which would leave a run to read the wrong table."""
    out = tmp_path / "out"
    assert _convert(src, out, capsys)[0] == 0
    table = out / TEXT_TABLE
    if damage == "link":
        (tmp_path / "elsewhere.safetensors").write_bytes(table.read_bytes())
        table.unlink()
        table.symlink_to(tmp_path / "elsewhere.safetensors")
    else:
        table.write_bytes(table.read_bytes()[:-1] + b"x")
    code, err = _convert(src, out, capsys)
    assert code == exit_codes.CONFIG and f"{table}: " in err and "not the text table" in err, err


def test_another_prepared_dataset_is_never_converted_over(src, tmp_path, capsys):
    other = make_prepared(tmp_path / "other", clips=2, seed=3)
    before = _tree_bytes(other)
    code, err = _convert(src, other, capsys)
    assert code == exit_codes.CONFIG and f"--out {other}: not empty and not convert_data's output" in err, err
    assert _tree_bytes(other) == before


def test_a_folder_of_another_tool_is_refused_and_an_empty_one_is_claimed(src, tmp_path, capsys):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    code, err = _convert(src, foreign, capsys)
    assert code == exit_codes.CONFIG and "not convert_data's output" in err, err
    assert _tree_bytes(foreign) == {"notes.txt": b"mine"}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _convert(src, empty, capsys)[0] == 0
    assert json.loads((empty / C.OWNER).read_text())["tool"] == "convert_data"
    # its own output: a rerun is answered by its manifest ("nothing to do"), not refused by the mark
    code, err = _convert(src, empty, capsys)
    assert code == 0, err


def test_a_missing_source_folder_is_named_as_missing(tmp_path, capsys):
    code, err = _convert(tmp_path / "nope", tmp_path / "out", capsys)
    assert code == exit_codes.CONFIG and f"{tmp_path / 'nope'}: no such folder" in err and "READY" not in err, err
    assert not (tmp_path / "out").exists()


def test_an_empty_split_is_converted_with_one_warning_naming_it(tmp_path, caplog):
    src = make_prepared(tmp_path, clips=8)  # runs 0 and 1 only: no val run (gcc.synth.world: every third run)
    with caplog.at_level(logging.INFO, logger="gcc.data.convert"):
        manifest = C.convert(src, str(tmp_path / "out"), progress=False)
    assert manifest["counts"] == {"train": 8, "val": 0}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        f"warning: the val split is empty (no kept clip of {src}/index/clips.jsonl has split 'val'): a run with "
        "validation on refuses this data; eval_interval: 0 turns validation off"
    ]
