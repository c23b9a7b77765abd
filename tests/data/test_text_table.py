"""The text table (gcc/data/text_table.py, docs/design.md §2): rows read by id (the key's place in sorted order)
are the embeddings written, `gather` reads each distinct id once and gives the one-row view for a repeated id, the
table pickles into loader workers, and a file that is not a text table is DamagedData naming it."""

from __future__ import annotations

import pickle

import pytest
import torch
from safetensors.torch import save_file

from gcc.data.text_table import TextTable
from gcc.errors import DamagedData
from gcc.vocab import NULL_PROMPT

KEYS = ["walk", NULL_PROMPT, "cross_river", "boss"]


def table(tmp_path, keys=KEYS, shape=(3, 5), dtype=torch.bfloat16, **extra):
    g = torch.Generator().manual_seed(0)
    rows = {k: torch.randn(shape, generator=g).to(dtype) for k in keys} | extra
    path = tmp_path / "table.safetensors"
    save_file(rows, str(path))
    return path, rows


def test_rows_by_id_are_the_embeddings_written(tmp_path):
    path, rows = table(tmp_path)
    t = TextTable(path, (3, 5))
    assert t.keys == sorted(KEYS) and len(t) == 4 and t.null_id == sorted(KEYS).index(NULL_PROMPT)
    for i, k in enumerate(sorted(KEYS)):
        assert t.ids[k] == i and torch.equal(t.row(i), rows[k])


def test_prompts_reads_each_distinct_prompt_once_and_indexes_every_cell(tmp_path):
    path, rows = table(tmp_path)
    t = TextTable(path)
    ids = [t.ids["walk"], t.ids["boss"], t.ids["walk"], t.null_id]
    got, index = t.prompts(ids)
    assert torch.equal(got, torch.stack([rows["walk"], rows["boss"], rows[NULL_PROMPT]]))  # in order of first use
    assert index.tolist() == [0, 1, 0, 2] and index.dtype == torch.int64
    assert torch.equal(got[index], torch.stack([rows["walk"], rows["boss"], rows["walk"], rows[NULL_PROMPT]]))
    same, index = t.prompts([t.null_id] * 5)
    assert same.shape == (1, 3, 5) and torch.equal(same[0], rows[NULL_PROMPT]) and index.tolist() == [0] * 5
    made = []
    t.prompts(ids, empty=lambda shape, dtype: made.append(shape) or torch.empty(shape, dtype=dtype))
    assert made == [(3, 3, 5)]  # the loader's allocator holds the result


def test_the_table_pickles_without_its_mapping_and_reads_the_same(tmp_path):
    path, rows = table(tmp_path)
    t = TextTable(path)
    t.row(0)  # mapped now
    u = pickle.loads(pickle.dumps(t))
    assert u._mm is None and torch.equal(u.row(1), rows[sorted(KEYS)[1]])


@pytest.mark.parametrize(
    "keys, kw, shape, message",
    [
        (["walk"], {}, None, f"key '{NULL_PROMPT}' missing"),
        (KEYS, {"dtype": torch.float32}, None, "every key must be BF16 of one shape"),
        (KEYS, {"odd": torch.zeros(2, 5, dtype=torch.bfloat16)}, None, "every key must be BF16 of one shape"),
        (KEYS, {}, (4, 5), r"rows are \[3, 5\], the manifest's geometry says \[4, 5\]"),
    ],
)
def test_a_file_that_is_not_a_text_table_is_damaged_data_naming_it(tmp_path, keys, kw, shape, message):
    dtype = kw.pop("dtype", torch.bfloat16)
    path, _ = table(tmp_path, keys, dtype=dtype, **kw)
    with pytest.raises(DamagedData, match=message) as e:
        TextTable(path, shape)
    assert str(e.value).startswith(f"{path}: not a text table")
