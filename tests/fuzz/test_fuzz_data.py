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

HOSTILE_JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.sampled_from([0, -1, 2**31, 2**63, 10**12]),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=12),
        st.sampled_from(["../x", "/etc/passwd", "shard.00000.mds", "chunk_00000/shard.00000.mds.zstd", "\x1b[2J"]),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6,
)


@st.composite
def mutated(draw, doc):
    """`doc` (a JSON tree) with 1-3 generated values put at paths that exist in it (or one level below)."""
    doc = json.loads(json.dumps(doc))
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
    """A fresh conversion of 4 tiny clips (train and val), uncompressed, in shards of one clip."""
    from gcc.data.convert import convert
    from gcc.synth.world import make_prepared

    root = tmp_path_factory.mktemp("fuzz_data")
    convert(make_prepared(root, clips=4, seed=7), str(root / "shards"), chunk_clips=1, progress=False)
    return root


def test_the_fuzzed_dataset_reads_back_unchanged(dataset, tmp_path):
    """The control for the cases below: the unmutated documents and shard pass every check."""
    from gcc.data.shards import check_index, read_manifest

    m = read_manifest(str(dataset / "shards"))
    for split in splits(dataset):
        check_index((dataset / "shards" / split / "index.json").read_bytes(), m, split, split)
    assert read_sample(dataset, real_sample(dataset), tmp_path)["clip_id"] == m["splits"]["train"]["clip_ids"][0]


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
    (case / "manifest.json").write_text(json.dumps(data.draw(mutated(doc))))
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
    got = read_or_refuse(check_index, json.dumps(data.draw(mutated(doc))).encode(), manifest, split, "INDEX")
    if isinstance(got, BadInput):
        assert "INDEX" in str(got), got


# ---- a shard's columns -------------------------------------------------------------------------------------------


def real_sample(root: Path) -> dict:
    """Train sample 0 as Streaming decodes it from the converted shard."""
    from streaming.base.format import reader_from_json

    split = root / "shards" / "train"
    index = json.loads((split / "index.json").read_text())
    reader = reader_from_json(str(split), None, index["shards"][0])
    return dict(reader.get_item(0))


def read_sample(root: Path, sample: dict, scratch: Path):
    """`sample` written as the train split's first shard (Streaming's MDSWriter, the converter's columns and hash)
    of a copy of the conversion, then read back through a GcStreamingDataset with every dropout on."""
    from streaming import MDSWriter

    from gcc.data.dataset import Dropouts, GcStreamingDataset
    from gcc.data.shards import COLUMNS, SHARD_HASH

    data = scratch / "shards"
    shutil.copytree(root / "shards", data, symlinks=True)
    split = data / "train"
    index = json.loads((split / "index.json").read_text())
    first = index["shards"][0]
    with MDSWriter(out=str(scratch / "w"), columns=COLUMNS, hashes=[SHARD_HASH], size_limit=1 << 30) as w:
        w.write(sample)
    written = json.loads((scratch / "w" / "index.json").read_text())["shards"][0]
    os.replace(scratch / "w" / written["raw_data"]["basename"], split / first["raw_data"]["basename"])
    written["raw_data"]["basename"] = first["raw_data"]["basename"]
    index["shards"][0] = written
    (split / "index.json").write_text(json.dumps(index))
    mask_everything = Dropouts(text=1.0, cond=0.0, mask=1.0)
    ds = GcStreamingDataset(
        str(data), "train", scratch / f"cache-{uuid.uuid4().hex}", batch_size=1, dropouts=mask_everything, shuffle=False
    )
    return ds.get_item(0)


COLUMN_VALUES = {
    "meta": st.one_of(
        st.just("{}"),
        st.sampled_from(['{"cameras": {}}', '{"cameras": null, "ground_z": "x"}', "[]", "null", "{", '{"a": 1e999}']),
        HOSTILE_JSON.map(json.dumps),
        st.text(max_size=40),
    ),
    "clip_id": st.one_of(st.text(max_size=12), st.sampled_from(["../x", "\x1b[2J", ""])),
    "sem_zst": st.binary(max_size=64),
    "drop": st.integers(-3, 3),
}


@examples(25)
@given(data=st.data())
def test_a_shard_sample_is_read_or_refused_naming_the_shard(dataset, data):
    sample = real_sample(dataset)
    fields = data.draw(
        st.lists(st.sampled_from(["meta", "sem_zst", "clip_id", "drop", "arrays"]), min_size=1, max_size=2, unique=True)
    )
    for f in fields:
        if f == "arrays":
            name = data.draw(st.sampled_from(["input_latents", "sem_shape", "context_ids"]))
            shape = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=3))
            sample[name] = np.zeros(shape, dtype=sample[name].dtype)
        elif f == "meta" and data.draw(st.booleans()):
            meta = json.loads(sample["meta"])
            sample["meta"] = json.dumps(data.draw(mutated(meta)))
        else:
            sample[f] = data.draw(COLUMN_VALUES[f])
    try:
        sample_dir = Path(tempfile.mkdtemp(dir=dataset))
        read_sample(dataset, sample, sample_dir)
    except (ValueError, OverflowError) as e:  # MDSWriter refused to write it: not a case for the reader
        assume(not isinstance(e, BadInput))
        raise
    except BadInput as e:
        assert "shard" in str(e) and "sample 0" in str(e), e


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
                st.one_of(st.text(max_size=8), st.integers()),
                max_size=3,
            )
        )
    raw = json.dumps(header).encode()
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
    out = [json.dumps(draw(mutated(r))) if draw(st.booleans()) else json.dumps(r) for r in rows]
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
    o = run_entry("convert_data", ["--src", str(src), "--out", str(case / "out"), "--no_progress"])
    assert_clean(o)
    assert digest_tree(case, skip=case / "out") == before, o
