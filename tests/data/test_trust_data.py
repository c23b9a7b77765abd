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

from gcc.data.config import DataConfig
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
    return GcStreamingDataset(DataConfig(str(root)), split, tmp_path / "cache" / uuid.uuid4().hex, batch_size=1)


def maskstats(root: Path, split: str = "train") -> subprocess.CompletedProcess:
    """gcc-maskstats on `root`, with a temp folder of its own that it must leave empty, however the data fails."""
    tmp = root.parent / f"tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    r = subprocess.run(
        [str(BIN / "gcc-maskstats"), "--data", str(root), "--split", split, "--n", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert not any(tmp.iterdir()), f"gcc-maskstats left {sorted(p.name for p in tmp.iterdir())} behind"
    return r


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
    assert r.returncode == 6 and "shard 0 basename" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
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
    assert r.returncode == 6 and "basename" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
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
    assert r.returncode == 6 and "columns must be exactly" in r.stderr, r.stderr[-2000:]
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
    assert r.returncode == 6 and "the manifest" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


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
        [str(BIN / "convert_data"), "--data", str(src), "--out", str(tmp_path / "out"), "--no_progress"],
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


# ---- sizes declared inside the data are bounded by the manifest's geometry (docs/training.md, "Trust and
# safety"): nothing is allocated, inflated or written to the cache beyond what the geometry allows ------------
BOMB = 64 << 20  # what each bomb below inflates to; the real shards and samples are a few hundred KB


def zstd_bomb(size: int = BOMB) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=3).compress(b"\0" * size)


def plant_shard_bomb(data: Path, split: str) -> Path:
    """The first shard of `split` (a compressed conversion) replaced by a zstd frame of 64 MB of zeros; its
    index entry updated as someone who can write the data would (its size and hashes, so that the hash check
    passes), its declared raw size left as convert_data wrote it. Returns the shard's path."""
    from streaming.base.hashing import get_hash

    blob = zstd_bomb()
    index = json.loads((data / split / "index.json").read_text())
    zipped = index["shards"][0]["zip_data"]
    shard = data / split / zipped["basename"]
    shard.write_bytes(blob)
    zipped["bytes"] = len(blob)
    zipped["hashes"] = {h: get_hash(h, blob) for h in ("sha1", "xxh64")}
    (data / split / "index.json").write_text(json.dumps(index))
    return shard


def cache_files(cache: Path) -> dict[str, int]:
    return {str(p): p.stat().st_size for p in cache.rglob("*") if p.is_file() and not p.is_symlink()}


def test_a_compressed_shard_that_inflates_past_its_declared_size_is_refused_before_memory_or_cache_hold_it(
    shards, tmp_path, in_process, capsys
):
    from hostile import peak_allocated

    from gcc.tools.maskstats import main as maskstats_main

    data = zstd_copy(shards, tmp_path)
    shard = plant_shard_bomb(data, "val")
    assert shard.stat().st_size < BOMB // 1000
    cache = tmp_path / "cache" / uuid.uuid4().hex
    ds = GcStreamingDataset(DataConfig(str(data)), "val", cache, batch_size=1)
    peak, error = peak_allocated(lambda: ds[0])  # old code: 64 MB inflated in memory, then written to the cache
    assert isinstance(error, DamagedData), repr(error)
    assert str(shard) in str(error) and "inflates to more than" in str(error), str(error)
    assert peak < BOMB // 4, f"{peak} bytes allocated"
    assert all(size < BOMB // 4 for size in cache_files(cache).values()), cache_files(cache)
    with pytest.raises(SampleError, match=r"shard\.00000\.mds\.zstd: inflates to more than"):
        SRC.open_source(data).rows_for(None)
    assert maskstats_main(["--data", str(data), "--split", "val", "--n", "2"]) == 6  # damaged data, as in a run
    err = capsys.readouterr().err
    assert "shard.00000.mds.zstd" in err and "inflates to more than" in err and "Traceback" not in err, err


def test_a_sem_column_that_inflates_past_the_geometry_is_refused_at_its_size(shards, tmp_path, in_process, capsys):
    from hostile import peak_allocated

    from gcc.tools.maskstats import main as maskstats_main

    data = copy_of(shards, tmp_path)
    blob = zstd_bomb()
    rewrite_split(data, "train", lambda i, s: {**s, "sem_zst": blob})
    ds = loader(data, tmp_path, "train")
    peak, error = peak_allocated(lambda: ds[0])  # old code: each sample inflated 64 MB before its size was seen
    assert isinstance(error, DamagedData), repr(error)
    assert "shard.00000.mds (sample 0)" in str(error) and "sem_zst: inflates to more than" in str(error), error
    assert peak < BOMB // 4, f"{peak} bytes allocated"
    # the tools: old code, exit 1 with a traceback
    assert maskstats_main(["--data", str(data), "--split", "train", "--n", "2"]) == 2
    err = capsys.readouterr().err
    assert "sem_zst: inflates to more than" in err and "Traceback" not in err, err


def test_shard_sizes_declared_beyond_the_geometry_are_refused_before_anything_is_read(shards, tmp_path):
    data = copy_of(shards, tmp_path)
    edit_index(data, "val", lambda index: index["shards"][0]["raw_data"].__setitem__("bytes", 1 << 40))
    message = r"shard 0 \(chunk_00000/shard\.00000\.mds\): 'bytes' must be an integer from 0 to \d+ \(what 4 samples"
    with pytest.raises(DamagedData, match=message):
        loader(data, tmp_path)
    with pytest.raises(SampleError, match=message):
        SRC.open_source(data).rows_for(None)


def test_a_shard_file_larger_than_its_index_declares_is_refused_before_it_is_hashed(shards, tmp_path):
    data = copy_of(shards, tmp_path)
    index = json.loads((data / "val" / "index.json").read_text())
    shard = data / "val" / index["shards"][0]["raw_data"]["basename"]
    with open(shard, "ab") as f:
        f.truncate(shard.stat().st_size + BOMB)  # sparse: Streaming's hash check would read it whole
    with pytest.raises(DamagedData, match=rf"{shard}: .*larger than a shard file may be"):
        loader(data, tmp_path)[0]
    with pytest.raises(SampleError, match="larger than a shard file may be"):
        SRC.open_source(data).rows_for(None)


def sparse_text_table(table: Path) -> Path:
    """A safetensors text table declaring one [65536, 65536] BF16 row, as a sparse file of that size (8 GB that
    take a few KB on disk)."""
    entry = {"dtype": "BF16", "shape": [65536, 65536], "data_offsets": [0, 2 * 65536 * 65536]}
    raw = json.dumps({"NULL_PROMPT": entry}).encode()
    table.unlink(missing_ok=True)
    with open(table, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + 2 * 65536 * 65536)
    assert table.stat().st_blocks * 512 < 64 << 10
    return table


def test_a_text_table_declaring_rows_beyond_the_geometry_is_refused_before_a_row_is_read(shards, tmp_path):
    """A 4 KB safetensors header declaring a [65536, 65536] row in a sparse file of that size: old code took it
    (and the first sample allocated 8 GB); the row must be the manifest's geometry.text."""
    from gcc.data.layout import read_text_table
    from gcc.data.text_table import TextTable

    data = copy_of(shards, tmp_path)
    m = json.loads((data / "manifest.json").read_text())
    m["text_keys"] = 1
    (data / "manifest.json").write_text(json.dumps(m))
    table = sparse_text_table(data / "text" / "table.safetensors")
    with pytest.raises(DamagedData, match=r"rows are \[65536, 65536\], the manifest's geometry says \[16, 64\]"):
        loader(data, tmp_path)
    with pytest.raises(SampleError, match=r"rows are \[65536, 65536\]"):
        SRC.open_source(data)
    with pytest.raises(DamagedData, match="larger than a text cell may be"):
        TextTable(table)  # no manifest: the bound on any text cell
    prepared = tmp_path / "prepared"
    shutil.copytree(shards.parent / "prepared", prepared)
    sparse_text_table(prepared / "text" / "table.safetensors")  # written, not copied: a copy may fill 8 GB
    with pytest.raises(BadInput, match=r"has shape \[65536, 65536\], expected \[L, D\] of at most"):
        read_text_table(prepared)


@pytest.mark.parametrize("name", ["manifest.json", "val/index.json", "text/table.safetensors"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_data_file_that_is_not_a_regular_file_is_refused_without_reading_it(shards, tmp_path, name, kind):
    from hostile import refused_quickly

    data = copy_of(shards, tmp_path)
    path = data / name
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)  # old code: waited for a writer for ever
    else:
        path.symlink_to("/dev/zero")  # old code: read until MemoryError
    what = "a FIFO" if kind == "fifo" else "a character device"
    refused_quickly(lambda: loader(data, tmp_path), BadInput, str(path), what)
    refused_quickly(lambda: SRC.open_source(data).rows_for(None), SampleError, str(path), what)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_prepared_files_that_are_not_regular_files_are_refused_without_reading_them(prepared_tiny, tmp_path, kind):
    from hostile import quickly, refused_quickly

    from gcc.data.layout import read_index
    from gcc.synth.world import MARKER, is_synthetic

    src = tmp_path / "prepared"
    shutil.copytree(prepared_tiny, src)
    for path in (src / "index" / "clips.jsonl", src / MARKER):
        path.unlink()
        os.mkfifo(path) if kind == "fifo" else path.symlink_to("/dev/zero")
    what = "a FIFO" if kind == "fifo" else "a character device"
    refused_quickly(lambda: read_index(src), BadInput, "clips.jsonl", what)
    assert quickly(lambda: is_synthetic(src)) == {"value": False}


def test_a_prepared_npz_that_inflates_beyond_its_header_is_refused_before_it_is_loaded(prepared_tiny, tmp_path):
    import io
    import zipfile

    from gcc.data.layout import geometry_of, load_clip, read_index, read_text_table
    from gcc.vocab import key_to_id

    src = tmp_path / "prepared"
    shutil.copytree(prepared_tiny, src)
    row = read_index(src)[0]
    keys, text_shape, _ = read_text_table(src)
    geo = geometry_of(src, row["clip_id"], text_shape)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": geo.sem_shape})
    npz = src / "sem" / f"{row['clip_id']}.npz"
    with zipfile.ZipFile(npz, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("ids.npy", header.getvalue() + b"\0" * BOMB)  # declares the geometry, inflates to 64 MB
    with pytest.raises(BadInput, match=rf"clip {row['clip_id']}: {npz}: member 'ids.npy'.*inflates to"):
        load_clip(src, row, geo, key_to_id(keys))  # old code: np.load inflated the whole member


def test_a_shards_meta_without_its_fields_is_damaged_data_naming_the_shard_and_sample(shards, tmp_path):
    """`meta` {} with the mask drawn for every sample: old code, a KeyError ('cameras') in the loader (exit 241
    from a worker); now damaged data (exit 6 in a run) naming the shard, the sample and the field, in the main
    process as in a loader worker."""
    from gcc.data.dataset import build_dataloader
    from gcc.errors import fault_message

    data = copy_of(shards, tmp_path)
    rewrite_split(data, "train", lambda i, s: {**s, "meta": "{}"})
    cache = tmp_path / "cache"
    ds = GcStreamingDataset(DataConfig(str(data), mask_p=1.0), "train", cache / "main", batch_size=1, shuffle=False)
    where = f"{data}/train/shard.00000.mds (sample 0)"
    with pytest.raises(DamagedData, match=r"field 'src_hw' must be") as e:
        ds[0]
    assert where in str(e.value)
    ds = GcStreamingDataset(DataConfig(str(data), mask_p=1.0), "train", cache / "worker", batch_size=1, shuffle=False)
    with pytest.raises(DamagedData) as e:
        next(iter(build_dataloader(ds, 1, num_workers=1)))
    assert where in fault_message(e.value) and "field 'src_hw' must be" in fault_message(e.value), str(e.value)


def test_a_shards_meta_that_is_not_json_is_damaged_data_naming_the_shard_and_sample(shards, tmp_path):
    """Read where the sample is made (its meta, for the mask), before any draw: the message names where."""
    data = copy_of(shards, tmp_path)
    rewrite_split(data, "train", lambda i, s: {**s, "meta": "{not json"})
    ds = GcStreamingDataset(DataConfig(str(data)), "train", tmp_path / "cache", batch_size=1, shuffle=False)
    with pytest.raises(DamagedData, match="not valid JSON for a clip's meta") as e:
        ds[0]
    assert f"{data}/train/shard.00000.mds (sample 0)" in str(e.value), str(e.value)


@pytest.mark.slow
def test_a_run_on_shards_whose_meta_lacks_its_fields_stops_with_exit_6_naming_shard_and_sample(shards, tmp_path):
    """The launch of the case above (data.mask_p=1, the meta met in a loader worker): old code, exit 241 with a
    KeyError's traceback."""
    from _launch import WORKER, launch

    data = copy_of(shards, tmp_path)
    rewrite_split(data, "train", lambda i, s: {**s, "meta": "{}"})
    r = launch(tmp_path / "run", data, WORKER, "data.mask_p=1", timeout=300, direct=True)
    out = r.stdout + r.stderr
    assert r.returncode == 6, out[-3000:]
    assert "damaged data" in out and "train/shard.00000.mds (sample " in out, out[-3000:]
    assert "field 'src_hw' must be" in out and "Traceback" not in out, out[-3000:]


@pytest.mark.parametrize("value", [7, 9, 22, 254])
def test_sem_ids_outside_the_vocabulary_are_refused_where_they_are_decoded(shards, tmp_path, value):
    """The model counts an id outside the vocabulary as no class (it does not read its input back to look): the
    loader refuses it when it decodes the sample, naming the shard, the sample and the values."""
    from gcc.data.shards import decode_sem, encode_sem

    data = copy_of(shards, tmp_path)

    def spoil(i, s):
        ids = decode_sem(s["sem_zst"], s["sem_shape"])
        ids = ids.copy()
        ids[-1, -1, -1] = value  # one pixel of the last frame
        return {**s, "sem_zst": encode_sem(ids)}

    rewrite_split(data, "val", spoil)
    ds = loader(data, tmp_path)
    with pytest.raises(DamagedData, match=rf"shard.00000.mds \(sample 0\).*outside the vocabulary: \[{value}\]"):
        ds[0]
