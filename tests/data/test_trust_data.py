"""A dataset from outside can neither write, delete nor run anything (docs/training.md, "Trust and safety"): crafted
index.json shard names, pickled columns, unsafe clip ids, and declared counts and shapes beyond the manifest's, each
through every reader (the loader, gcc-maskstats, gcc-sample's shard source) and the converter."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from streaming import LocalDataset, MDSWriter

from gcc.data.convert import convert
from gcc.data.dataset import GcStreamingDataset
from gcc.data.shards import COLUMNS
from gcc.errors import BadInput, DamagedData
from gcc.tools.sample import sources as SRC
from gcc.tools.sample.errors import SampleError

BIN = Path(sys.executable).parent


class RunsCode:
    """Unpickling this creates `marker`: what a pickled column could do to the machine that decodes it."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def copy_of(shards: Path, tmp_path: Path, name: str = "data") -> Path:
    out = tmp_path / name
    shutil.copytree(shards, out)
    return out


def zstd_copy(shards: Path, tmp_path: Path) -> Path:
    out = tmp_path / "zdata"
    convert(shards.parent / "prepared", str(out), chunk_clips=4, compression="zstd", progress=False)
    return out


def edit_index(root: Path, split: str, edit) -> None:
    path = root / split / "index.json"
    index = json.loads(path.read_text())
    edit(index)
    path.write_text(json.dumps(index))


def rewrite_split(root: Path, split: str, change, columns: dict | None = None) -> None:
    """Rewrite a split of an uncompressed conversion as one shard (`<split>/shard.00000.mds`, a converter's name)
    whose samples are `change(i, sample)` of the stored ones, with `columns` (default: the shard format's)."""
    src = LocalDataset(local=str(root / split))
    samples = [change(i, dict(src[i])) for i in range(len(src))]
    shutil.rmtree(root / split)
    with MDSWriter(out=str(root / split), columns=columns or COLUMNS, hashes=["sha1", "xxh64"]) as w:
        for s in samples:
            w.write(s)


def loader(root: Path, tmp_path: Path, split: str = "val") -> GcStreamingDataset:
    return GcStreamingDataset(str(root), split, tmp_path / "cache" / uuid.uuid4().hex, batch_size=1)


def maskstats(root: Path, split: str = "train") -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "gcc-maskstats"), "--data", str(root), "--split", split, "--n", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_absolute_zip_basename_with_a_wrong_hash_deletes_nothing_outside_the_cache(shards, tmp_path):
    data = zstd_copy(shards, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("not the dataset's")

    def point_at_victim(index):
        index["shards"][0]["zip_data"]["basename"] = str(victim)
        index["shards"][0]["zip_data"]["hashes"]["xxh64"] = "0" * 16

    edit_index(data, "train", point_at_victim)
    with pytest.raises(DamagedData, match="shard 0 basename") as e:
        ds = loader(data, tmp_path, "train")
        ds[0]  # old code: the failed hash check removed `victim` and asked to "restore or reconvert it"
    assert str(data / "train" / "index.json") in str(e.value)
    r = maskstats(data)
    assert r.returncode == 2 and "shard 0 basename" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert victim.read_text() == "not the dataset's"


def test_an_absolute_raw_basename_never_receives_the_decompressed_shard(shards, tmp_path):
    data = zstd_copy(shards, tmp_path)
    landing = tmp_path / "landed.mds"
    edit_index(data, "val", lambda index: index["shards"][0]["raw_data"].__setitem__("basename", str(landing)))
    with pytest.raises(DamagedData, match="basename"):
        ds = loader(data, tmp_path)
        ds[0]
    with pytest.raises(SampleError, match="basename"):
        SRC.open_source(data).rows_for(None)
    r = maskstats(data, "val")
    assert r.returncode == 2 and "basename" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert not landing.exists()


def test_a_pickled_column_is_never_decoded_by_any_reader(shards, tmp_path):
    data = copy_of(shards, tmp_path)
    marker = tmp_path / "code-ran"
    rewrite_split(data, "val", lambda i, s: {**s, "meta": RunsCode(marker)}, {**COLUMNS, "meta": "pkl"})
    with pytest.raises(SampleError, match="columns must be exactly"):  # old code: LocalDataset unpickled it
        SRC.open_source(data).rows_for(None)
    with pytest.raises(DamagedData, match="columns must be exactly"):
        loader(data, tmp_path)[0]
    r = maskstats(data, "val")
    assert r.returncode == 2 and "columns must be exactly" in r.stderr, r.stderr[-2000:]
    assert not marker.exists()


def test_a_column_of_another_encoding_is_refused(shards, tmp_path):
    data = copy_of(shards, tmp_path)
    rewrite_split(data, "val", lambda i, s: {**s, "meta": json.loads(s["meta"])}, {**COLUMNS, "meta": "json"})
    with pytest.raises(DamagedData, match="'meta': 'json'"):
        loader(data, tmp_path)
    with pytest.raises(SampleError, match="columns must be exactly"):
        SRC.open_source(data).rows_for(None)


def test_declared_counts_beyond_the_manifest_are_refused_before_anything_is_allocated(shards, tmp_path):
    data = copy_of(shards, tmp_path)
    edit_index(data, "train", lambda index: index["shards"][0].__setitem__("samples", 10**12))
    with pytest.raises(DamagedData, match=r"more than \d+ samples, the manifest \d+"):
        loader(data, tmp_path, "train")  # old code: Streaming allocated arrays of 10**12 samples first
    r = maskstats(data)
    assert r.returncode == 2 and "the manifest" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_a_declared_sem_shape_beyond_the_manifest_is_refused_before_it_is_allocated(shards, tmp_path):
    data = copy_of(shards, tmp_path)
    huge = np.array([10**4, 10**4, 10**4], np.int64)  # 1 TB of uint8 if allocated
    rewrite_split(data, "val", lambda i, s: {**s, "sem_shape": huge})
    with pytest.raises(DamagedData, match=r"sem_shape is \[10000, 10000, 10000\], the manifest's geometry says"):
        loader(data, tmp_path)[0]
    with pytest.raises(SampleError, match="sem_shape"):
        SRC.open_source(data).rows_for(None)


def test_a_sample_that_is_not_the_manifests_clip_is_refused(shards, tmp_path):
    data = copy_of(shards, tmp_path)
    rewrite_split(data, "val", lambda i, s: {**s, "clip_id": "clip99999"})
    with pytest.raises(DamagedData, match="holds clip 'clip99999', the manifest says"):
        loader(data, tmp_path)[0]


@pytest.mark.parametrize(
    "field, value",
    [("clip_id", "../../escape/x"), ("clip_id", "/abs/x"), ("run", "../run"), ("subset", "a/b"), ("scene", "..")],
)
def test_the_converter_refuses_unsafe_names(tmp_path, field, value):
    from gcc.synth.world import make_prepared

    src = make_prepared(tmp_path, clips=4, seed=0)
    index = src / "index" / "clips.jsonl"
    rows = [json.loads(line) for line in index.read_text().splitlines()]
    if field == "clip_id":  # the clip's files where the name points, so that reading them would succeed
        for sub, ext in (("latents", ".safetensors"), ("sem", ".npz"), ("meta", ".json")):
            dest = Path(os.path.normpath(src / sub / f"{value}{ext}")) if not value.startswith("/") else None
            if dest is not None and dest.is_relative_to(tmp_path):
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src / sub / f"{rows[0]['clip_id']}{ext}", dest)
                if sub == "meta":
                    dest.write_text(json.dumps({**json.loads(dest.read_text()), "clip_id": value}))
    rows[0][field] = value
    index.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = subprocess.run(
        [str(BIN / "convert_data"), "--src", str(src), "--out", str(tmp_path / "out"), "--no_progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"field '{field}' {value!r}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_manifest_with_an_unsafe_clip_id_is_refused_by_every_reader(shards, tmp_path):
    data = copy_of(shards, tmp_path)
    m = json.loads((data / "manifest.json").read_text())
    m["splits"]["val"]["clip_ids"][0] = "../../escape/x"
    (data / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BadInput, match=r"splits.val.clip_ids\[0\] '../../escape/x'"):
        loader(data, tmp_path)
    with pytest.raises(SampleError, match="clip_ids"):
        SRC.open_source(data)
    r = maskstats(data, "val")
    assert r.returncode == 2 and "clip_ids[0]" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.pop("geometry"), "field 'geometry'"),
        (lambda m: m["geometry"].__setitem__("sem", [10**6, 10**6, 10**6]), "field 'geometry.sem'"),
        (lambda m: m["counts"].__setitem__("train", 10**12), "field 'counts.train'"),
        (lambda m: m.__setitem__("splits", []), "field 'splits'"),
        (lambda m: m.__setitem__("name", "../v10"), "name '../v10': must be"),  # copied into every export's metadata
    ],
)
def test_a_manifest_that_is_not_the_converters_is_refused(shards, tmp_path, edit, message):
    data = copy_of(shards, tmp_path)
    m = json.loads((data / "manifest.json").read_text())
    edit(m)
    (data / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BadInput, match=message):
        loader(data, tmp_path, "train")
