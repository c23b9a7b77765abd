"""Hostile data at every layer it enters (docs/training.md, "Trust and safety"):

- `manifest.json` and a split's `index.json`: the converter's own documents with generated values put anywhere
  in them, read by the checks every reader calls (`read_manifest`, `check_index`);
- a shard's columns: a real MDS shard, written by Streaming's MDSWriter with a generated sample in place of a
  real one, read through a real `GcStreamingDataset` with every dropout on (the mask path reads the meta);
- safetensors headers: generated files read as the text table (`TextTable`) and as an export (`gcc-inspect`);
- the prepared layout: `clips.jsonl` rows and the sem `.npz` of a clip replaced by generated ones, converted by
  `convert_data`.

A reader either returns what it was asked for or raises `BadInput` (its subclass `DamagedData` for shards and
indexes) naming the file; an entry point answers with the invariant of tests/hostile.py; nothing outside the
output folder changes."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pytest
from hostile import assert_clean, digest_tree, examples, run_entry
from hypothesis import assume, given
from hypothesis import strategies as st

from gcc.errors import BadInput


class Huge:
    """An integer of `digits` digits, written by `dumps` (Python's json cannot write one past 4300 digits)."""

    def __init__(self, digits: int):
        self.digits = digits


def dumps(doc) -> str:
    """`doc` as JSON, each `Huge` written as its digits."""
    text = json.dumps(doc, default=lambda o: f"\0huge:{o.digits}")
    return re.sub(r'"\\u0000huge:([0-9]+)"', lambda m: "9" * int(m[1]), text)


HOSTILE_JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.sampled_from([0, -1, 2**31, 2**63, 10**12]),
        st.integers(39, 6000).map(Huge),  # past gcc's 40 digits, and past Python's 4300
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=12),
        st.sampled_from(["../x", "/etc/passwd", "shard.00000.mds", "chunk_00000/shard.00000.mds.zstd", "\x1b[2J"]),
        st.sampled_from(["²", "٣", "१२", "٣٤"]),  # digits of other scripts (str.isdigit() takes ²; int() takes ٣)
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6,
)


@st.composite
def mutated(draw, doc):
    """`doc` (a JSON tree) with 1-3 generated values put at paths that exist in it (or one level below)."""
    doc = json.loads(dumps(doc))
    for _ in range(draw(st.integers(1, 3))):
        node, key = None, None
        cur = doc
        while isinstance(cur, (dict, list)) and cur and draw(st.integers(0, 3)) > 0:
            keys = list(cur) if isinstance(cur, dict) else list(range(len(cur)))
            node, key = cur, draw(st.sampled_from(keys))
            cur = cur[key]
        if node is None:
            if isinstance(doc, dict):
                doc[draw(st.sampled_from([*doc, "extra"]))] = draw(HOSTILE_JSON)
            continue
        if isinstance(node, dict) and draw(st.integers(0, 5)) == 0:
            del node[key]
        else:
            node[key] = draw(HOSTILE_JSON)
    return doc


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """A fresh conversion of 4 tiny clips (all train: one run), uncompressed, in one shard."""
    from gcc.data.convert import convert
    from gcc.synth.world import make_prepared

    root = tmp_path_factory.mktemp("fuzz_data")
    convert(make_prepared(root, clips=4, seed=7), str(root / "shards"), chunk_clips=4, progress=False)
    return root


def test_the_fuzzed_dataset_reads_back_unchanged(dataset, tmp_path):
    """The control for the cases below: the unmutated documents and shard pass every check."""
    from gcc.data.shards import check_index, read_manifest

    m = read_manifest(str(dataset / "shards"))
    for split in splits(dataset):
        check_index((dataset / "shards" / split / "index.json").read_bytes(), m, split, split)
    ds = open_train(write_shard(dataset, real_samples(dataset), tmp_path), tmp_path)
    assert [ds.get_item(i)["clip_id"] for i in range(ds.num_samples)] == m["splits"]["train"]["clip_ids"]


# ---- manifest.json and index.json --------------------------------------------------------------------------------


def splits(root: Path) -> list[str]:
    """The splits of the conversion that hold clips (an empty split has no index)."""
    return sorted(p.parent.name for p in (root / "shards").glob("*/index.json"))


def read_or_refuse(fn, *args):
    try:
        return fn(*args)
    except BadInput as e:
        lines = str(e).splitlines()
        assert lines and lines[0].isprintable(), repr(str(e))
        return e


@examples(100)
@given(data=st.data())
def test_a_manifest_is_read_or_refused(dataset, data):
    from gcc.data.shards import read_manifest

    doc = json.loads((dataset / "shards" / "manifest.json").read_text())
    case = Path(tempfile.mkdtemp(dir=dataset))
    (case / "manifest.json").write_text(dumps(data.draw(mutated(doc))))
    got = read_or_refuse(read_manifest, str(case))
    if isinstance(got, BadInput):
        assert str(case / "manifest.json") in str(got), got


@examples(100)
@given(data=st.data())
def test_an_index_is_read_or_refused(dataset, data):
    from gcc.data.shards import check_index, read_manifest

    manifest = read_manifest(str(dataset / "shards"))
    split = data.draw(st.sampled_from(splits(dataset)))
    doc = json.loads((dataset / "shards" / split / "index.json").read_text())
    got = read_or_refuse(check_index, dumps(data.draw(mutated(doc))).encode(), manifest, split, "INDEX")
    if isinstance(got, BadInput):
        assert "INDEX" in str(got), got


# ---- a shard's columns -------------------------------------------------------------------------------------------


def real_samples(root: Path) -> list[dict]:
    """The train split's samples as Streaming decodes them from the converted shard (one shard holds them all)."""
    from streaming.base.format import reader_from_json

    split = root / "shards" / "train"
    index = json.loads((split / "index.json").read_text())
    (shard,) = index["shards"]
    reader = reader_from_json(str(split), None, shard)
    return [dict(reader.get_item(i)) for i in range(shard["samples"])]


def write_shard(root: Path, samples: list[dict], scratch: Path) -> Path:
    """A copy of the conversion whose train shard holds `samples` (Streaming's MDSWriter, the converter's columns
    and hash, the index entry the writer made): the copy's root. MDSWriter's own refusal (a value its encodings
    cannot hold) propagates."""
    from streaming import MDSWriter

    from gcc.data.shards import COLUMNS, SHARD_HASH

    data = scratch / "shards"
    shutil.copytree(root / "shards", data, symlinks=True)
    split = data / "train"
    index = json.loads((split / "index.json").read_text())
    basename = index["shards"][0]["raw_data"]["basename"]
    with MDSWriter(out=str(scratch / "w"), columns=COLUMNS, hashes=[SHARD_HASH], size_limit=1 << 30) as w:
        for sample in samples:
            w.write(sample)
    written = json.loads((scratch / "w" / "index.json").read_text())["shards"][0]
    os.replace(scratch / "w" / written["raw_data"]["basename"], split / basename)
    written["raw_data"]["basename"] = basename
    index["shards"][0] = written
    (split / "index.json").write_text(json.dumps(index))
    return data


def open_train(data: Path, scratch: Path):
    """The train split through a GcStreamingDataset with every dropout that reads the data on (the mask reads the
    meta's cameras), in a cache of its own."""
    from gcc.data.config import DataConfig
    from gcc.data.dataset import GcStreamingDataset

    mask_everything = DataConfig(str(data), text_dropout=1.0, cond_dropout=0.0, mask_p=1.0)
    return GcStreamingDataset(
        mask_everything, "train", scratch / f"cache-{uuid.uuid4().hex}", batch_size=1, shuffle=False
    )


COLUMN_VALUES = {
    "meta": st.one_of(
        st.just("{}"),
        st.sampled_from(['{"cameras": {}}', '{"cameras": null, "ground_z": "x"}', "[]", "null", "{", '{"a": 1e999}']),
        HOSTILE_JSON.map(dumps),
        st.text(max_size=40),
    ),
    "clip_id": st.one_of(st.text(max_size=12), st.sampled_from(["../x", "\x1b[2J", ""])),
    "sem_zst": st.binary(max_size=64),
    "drop": st.integers(-3, 3),
}


@st.composite
def hostile_sample(draw, sample: dict) -> dict:
    """`sample` with one or two of its columns replaced by generated values."""
    sample = dict(sample)
    fields = draw(
        st.lists(st.sampled_from(["meta", "sem_zst", "clip_id", "drop", "arrays"]), min_size=1, max_size=2, unique=True)
    )
    for f in fields:
        if f == "arrays":
            name = draw(st.sampled_from(["input_latents", "sem_shape", "context_ids"]))
            shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
            sample[name] = np.zeros(shape, dtype=sample[name].dtype)
        elif f == "meta" and draw(st.booleans()):
            sample["meta"] = dumps(draw(mutated(json.loads(sample["meta"]))))
        else:
            sample[f] = draw(COLUMN_VALUES[f])
    return sample


@examples(15)
@given(data=st.data())
def test_a_shard_sample_is_read_or_refused_naming_the_shard_and_sample(dataset, data):
    """Each of the shard's samples replaced by a generated one (one dataset built per case: Streaming's set-up
    is the cost); every sample reads back or is damaged data naming the shard and the sample."""
    samples = [data.draw(hostile_sample(s)) for s in real_samples(dataset)]
    scratch = Path(tempfile.mkdtemp(dir=dataset))
    try:
        shards = write_shard(dataset, samples, scratch)
    except (ValueError, OverflowError, TypeError):  # MDSWriter cannot encode it: no shard, no case for a reader
        assume(False)
    ds = open_train(shards, scratch)
    for i in range(len(samples)):
        try:
            ds.get_item(i)
        except BadInput as e:
            assert "shard" in str(e) and f"sample {i}" in str(e), e


# ---- safetensors headers -----------------------------------------------------------------------------------------

DTYPES = ["F32", "BF16", "F16", "I64", "U8", "BOOL", "F64", "X9", ""]


@st.composite
def safetensors_files(draw, names: list[str]) -> bytes:
    """A safetensors file: tensors named from `names` (or made up), of generated dtypes and shapes, whose
    offsets are right or (sometimes) lie; the header itself sometimes cut or not JSON."""
    sizes = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "U8": 1, "BOOL": 1, "F64": 8}
    header, offset = {}, 0
    for name in draw(
        st.lists(st.one_of(st.sampled_from(names), st.text(max_size=12)), min_size=1, max_size=6, unique=True)
    ):
        dtype = draw(st.sampled_from(DTYPES))
        shape = draw(st.lists(st.one_of(st.integers(0, 4), st.sampled_from([65536, 2**40, -1])), max_size=3))
        n = sizes.get(dtype, 1) * int(np.prod([max(d, 0) for d in shape])) if all(0 <= d <= 4 for d in shape) else 8
        end = offset + n if draw(st.integers(0, 4)) else draw(st.integers(-5, 2**40))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}
        offset = max(offset, end) if isinstance(end, int) and 0 <= end < 1 << 20 else offset
    if draw(st.booleans()):
        header["__metadata__"] = draw(
            st.dictionaries(
                st.sampled_from(["format", "preset", "vocab", "x"]),
                st.one_of(st.text(max_size=8), st.integers(), st.integers(39, 6000).map(Huge)),
                max_size=3,
            )
        )
    raw = dumps(header).encode()
    if draw(st.integers(0, 9)) == 0:
        raw = raw[: draw(st.integers(0, len(raw)))]
    declared = len(raw) if draw(st.integers(0, 9)) else draw(st.sampled_from([0, 2**63, len(raw) + 7, 2**30]))
    return struct.pack("<Q", declared) + raw + bytes(min(offset, 1 << 16))


@examples(60)
@given(blob=safetensors_files(["input_ids", "embeddings", "keys"]))
def test_a_text_table_is_read_or_refused(dataset, blob):
    from gcc.data.text_table import TextTable

    path = Path(tempfile.mkdtemp(dir=dataset)) / "table.safetensors"
    path.write_bytes(blob)
    try:
        table = TextTable(path)
        len(table)
    except BadInput as e:
        assert str(path) in str(e), e


@examples(40)
@given(
    blob=safetensors_files(
        [
            "blocks.0.self_attn.q.weight",
            "blocks.100000000.x",
            "gc_sem_cond.proj_in.weight",
            "head.head.weight",
            "patch_embedding.weight",
        ]
    )
)
def test_gcc_inspect_answers_any_export(dataset, blob):
    case = Path(tempfile.mkdtemp(dir=dataset))
    (case / "export.safetensors").write_bytes(blob)
    before = digest_tree(case)
    o = run_entry("gcc-inspect", [str(case / "export.safetensors")])
    assert_clean(o)
    assert digest_tree(case) == before, o


# ---- the prepared layout -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prepared(dataset) -> Path:
    return dataset / "prepared"


@st.composite
def clip_rows(draw, rows: list[dict]) -> str:
    out = [dumps(draw(mutated(r))) if draw(st.booleans()) else json.dumps(r) for r in rows]
    if draw(st.integers(0, 4)) == 0:
        out.append(draw(st.text(max_size=30)))
    return "\n".join(out) + "\n"


@st.composite
def npz_files(draw) -> bytes:
    import io

    arrays = {}
    for name in draw(st.lists(st.sampled_from(["ids", "sem", "x", "arr_0"]), min_size=0, max_size=3, unique=True)):
        shape = draw(st.lists(st.integers(0, 6), max_size=4))
        dtype = draw(st.sampled_from([np.uint8, np.int64, np.float32, np.bool_]))
        arrays[name] = np.zeros(shape, dtype)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    data = buf.getvalue()
    return data[: draw(st.integers(0, len(data)))] if draw(st.integers(0, 5)) == 0 else data


@examples(25)
@given(data=st.data())
def test_convert_data_answers_any_prepared_layout(prepared, data):
    case = Path(tempfile.mkdtemp(dir=prepared.parent))
    src = case / "src"
    shutil.copytree(prepared, src, symlinks=True)
    if data.draw(st.booleans()):
        rows = [json.loads(x) for x in (src / "index" / "clips.jsonl").read_text().splitlines()]
        (src / "index" / "clips.jsonl").write_text(data.draw(clip_rows(rows)))
    else:
        victim = data.draw(st.sampled_from(sorted((src / "sem").glob("*.npz"))))
        victim.write_bytes(data.draw(npz_files()))
    before = digest_tree(case, skip=case / "out")
    o = run_entry("convert_data", ["--data", str(src), "--out", str(case / "out"), "--no_progress"])
    assert_clean(o)
    assert digest_tree(case, skip=case / "out") == before, o
