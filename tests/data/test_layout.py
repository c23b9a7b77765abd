"""The prepared layout read and validated (gcc/data/layout.py, docs/data_format.md): what gcc.synth.world writes
reads back as the same rows, text table, geometry and clip bytes (through the MDS sample `shards.encode_clip` makes
and `ClipRecord` decodes), and each kind of damage is a BadInput naming the file, the clip and the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from gcc import storage
from gcc.data.layout import (
    check_splits,
    clip_files,
    geometry_of,
    latents_shape,
    load_clip,
    read_index,
    read_text_table,
)
from gcc.data.shards import ClipRecord
from gcc.errors import BadInput
from gcc.synth import world
from gcc.vocab import NULL_PROMPT, key_to_id

CLIPS = 3


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A tiny prepared dataset of 3 clips, written by the synthetic world (read-only: copy it to damage it)."""
    return world.write_prepared(tmp_path_factory.mktemp("layout") / "prepared", clips=CLIPS, seed=4)


@pytest.fixture
def copy(prepared, tmp_path) -> Path:
    return Path(shutil.copytree(prepared, tmp_path / "prepared"))


def opened(src: Path):
    """(rows, ids_of, geometry) as the converter opens a layout."""
    rows = read_index(src)
    keys, text_shape, _ = read_text_table(src)
    return rows, key_to_id(keys), geometry_of(src, rows[0]["clip_id"], text_shape)


# ---- what the writer wrote reads back ----------------------------------------------------------------------------
def test_the_writers_layout_reads_back_as_written(prepared):
    rows, _ids_of, geo = opened(prepared)
    assert [r["clip_id"] for r in rows] == [world.clip_id(i) for i in range(CLIPS)]
    for i, row in enumerate(rows):
        assert row == world.index_row(i, row["context_keys"])
    check_splits(rows)
    keys, text_shape, sha = read_text_table(prepared)
    assert keys == sorted(world.make_text_table(geo, 4)) and NULL_PROMPT in keys
    assert tuple(text_shape) == world.get_geometry("tiny").text_shape
    assert sha == storage.sha256_file(prepared / "text" / "table.safetensors")
    tiny = world.get_geometry("tiny")  # the clip shapes (the source frame size is not in the layout's files)
    assert (geo.latent_shape, geo.sem_shape, geo.text_shape) == (tiny.latent_shape, tiny.sem_shape, tiny.text_shape)
    assert tuple(latents_shape(prepared, rows[0]["clip_id"])) == tiny.latent_shape


@pytest.mark.parametrize("i", range(CLIPS))
def test_a_clip_loads_as_the_mds_sample_of_its_files(prepared, i):
    rows, ids_of, geo = opened(prepared)
    row = rows[i]
    files = clip_files(prepared, row["clip_id"])
    rec = ClipRecord.from_sample(load_clip(prepared, row, geo, ids_of))
    assert (rec.clip_id, rec.run, rec.subset, rec.scene, rec.drop) == tuple(
        row[k] for k in ("clip_id", "run", "subset", "scene", "drop")
    )
    assert rec.context_ids.tolist() == [ids_of[k] for k in row["context_keys"]]
    assert torch.equal(rec.input_latents, load_file(str(files["latents"]))["input_latents"])
    with np.load(files["sem"]) as z:
        assert np.array_equal(rec.sem_ids(), z["ids"])
    assert rec.meta_text == files["meta"].read_text() and rec.meta() == json.loads(files["meta"].read_text())


# ---- the index ----------------------------------------------------------------------------------------------------
def write_index(src: Path, lines: list[str]) -> Path:
    path = src / "index" / "clips.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_every_bad_row_of_the_index_is_named_with_its_line_and_field(copy):
    good = json.loads((copy / "index" / "clips.jsonl").read_text().splitlines()[0])
    path = write_index(
        copy,
        [
            json.dumps(good),
            "",  # blank lines are skipped
            json.dumps({k: v for k, v in good.items() if k != "run"}),
            json.dumps({**good, "drop": "no"}),
            json.dumps({**good, "split": "test"}),
            json.dumps({**good, "context_keys": ["a", 3]}),
            json.dumps({**good, "subset": "../elsewhere"}),
            "[1, 2]",
            "{not json",
        ],
    )
    with pytest.raises(BadInput) as e:
        read_index(copy)
    msg = str(e.value).splitlines()
    assert len(msg) == 7, msg  # every error at once, one a line
    cid = good["clip_id"]
    assert msg[0] == f"{path}:3 (clip {cid}): field 'run' missing"
    assert msg[1] == f"{path}:4 (clip {cid}): field 'drop' must be bool, got str"
    assert msg[2].startswith(f"{path}:5 (clip {cid}): field 'split' must be one of")
    assert msg[3] == f"{path}:6 (clip {cid}): field 'context_keys' must be a list of at most 1024 str"
    assert msg[4].startswith(f"{path}:7: ") and "field 'subset'" in msg[4]
    assert msg[5] == f"{path}:8: expected a JSON object, got list"
    assert msg[6].startswith(f"{path}:9")


def test_a_missing_index_is_named(copy):
    (copy / "index" / "clips.jsonl").unlink()
    with pytest.raises(BadInput, match=r"index/clips.jsonl: missing \(expected one JSON row per clip\)"):
        read_index(copy)


def row(cid: str, run: str, split: str) -> dict:
    return {"clip_id": cid, "run": run, "split": split}


@pytest.mark.parametrize(
    "rows, message",
    [
        ([row("a", "r1", "train"), row("a", "r2", "val")], r"train/val overlap: clip\(s\) \['a'\] are in both splits"),
        ([row("a", "r1", "train"), row("a", "r1", "train")], r"clip_id\(s\) \['a'\] appear more than once in split"),
        ([row("a", "r1", "train"), row("b", "r1", "val")], r"run\(s\) \['r1'\] have clips in both splits"),
    ],
)
def test_splits_that_would_leak_validation_data_are_refused(rows, message):
    with pytest.raises(BadInput, match=message):
        check_splits(rows)
    check_splits([r for r in rows[:1]])  # either row alone is fine


# ---- the text table -------------------------------------------------------------------------------------------------
def rewrite_table(src: Path, change) -> Path:
    path = src / "text" / "table.safetensors"
    table = load_file(str(path))
    change(table)
    save_file(table, str(path))
    return path


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.pop(NULL_PROMPT), f"key '{NULL_PROMPT}' missing"),
        (lambda t: t.update(extra=t[NULL_PROMPT].float()), "key 'extra' has dtype F32, expected BF16"),
        (
            lambda t: t.update(extra=t[NULL_PROMPT][:-1].clone()),
            r"key 'extra' has shape \[15, 64\], expected \[16, 64\]",
        ),
        (lambda t: t.update({"a\nb": t[NULL_PROMPT].clone()}), "must be 1-512 printable characters"),
    ],
)
def test_a_bad_text_table_is_named(copy, change, message):
    path = rewrite_table(copy, change)
    with pytest.raises(BadInput, match=message) as e:
        read_text_table(copy)
    assert str(e.value).startswith(f"{path}: ")


# ---- a clip ---------------------------------------------------------------------------------------------------------
def test_each_damage_to_a_clip_is_named_with_its_clip_file_and_field(copy):
    rows, ids_of, geo = opened(copy)
    row, cid = rows[0], rows[0]["clip_id"]
    files = clip_files(copy, cid)
    lat = load_file(str(files["latents"]))["input_latents"]
    with np.load(files["sem"]) as z:
        sem = z["ids"]

    def refused(message: str, r=row):
        with pytest.raises(BadInput, match=message) as e:
            load_clip(copy, r, geo, ids_of)
        assert str(e.value).startswith(f"clip {cid}: ")

    refused("index field 'context_keys' must hold 3 keys", {**row, "context_keys": row["context_keys"][:2]})
    refused("has keys not in the text table: \\['nope'\\]", {**row, "context_keys": ["nope"] * geo.T})
    save_file({"input_latents": lat.float()}, str(files["latents"]))
    refused("'input_latents' dtype must be bfloat16, got torch.float32")
    save_file({"input_latents": lat[:, :2].contiguous()}, str(files["latents"]))
    refused(r"'input_latents' shape must be \[48, 3, 4, 6\] \(the dataset geometry\)")
    bad = lat.clone()
    bad[0, 0, 0, 0] = float("nan")
    save_file({"input_latents": bad}, str(files["latents"]))
    refused("'input_latents' must be finite, has 1 NaN/inf values")
    save_file({"other": lat}, str(files["latents"]))
    refused("key 'input_latents' missing")
    save_file({"input_latents": lat}, str(files["latents"]))
    load_clip(copy, row, geo, ids_of)  # repaired: loads again
    wrong = sem.copy()
    wrong[0, 0, 0] = 9
    np.savez(files["sem"], ids=wrong)
    refused(r"'ids' holds values \[9\] outside the vocabulary")
    np.savez(files["sem"], ids=sem.astype(np.int16))
    refused("'ids' dtype must be uint8, got int16")
    np.savez(files["sem"], ids=sem)
    files["meta"].write_text("{}")
    refused(str(files["meta"]))
    files["meta"].unlink()
    refused(f"meta file {files['meta']} is missing")
