"""The loader's copy-avoiding paths give the same values as the plain ones: sem decoded into a given buffer
(libzstd through ctypes, and the zstd-module fallback), text gathered straight into its result (one prompt:
an expanded view), batches of one sample as views, latents into an allocator's storage."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors import safe_open

from gcc.data import shards as S
from gcc.data.dataset import gc_collate
from gcc.data.text_table import TextTable
from gcc.errors import BadInput


@pytest.mark.parametrize("lib", ["libzstd", "module"])
def test_decode_sem_into_buffer(lib, monkeypatch):
    if lib == "module":
        monkeypatch.setattr(S, "_LIBZSTD", [None])
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 7, (9, 64, 96), dtype=np.uint8)
    ids[:, :5] = 255
    blob = S.encode_sem(ids)
    out = np.full(ids.shape, 7, np.uint8)
    assert S.decode_sem(blob, ids.shape, out) is out and np.array_equal(out, ids)
    assert np.array_equal(S.decode_sem(blob, ids.shape), ids)
    with pytest.raises(BadInput, match=r"sem_zst: inflates to more than 49152 bytes"):  # F·H·W bounds it
        S.decode_sem(blob, (8, 64, 96), np.empty((8, 64, 96), np.uint8))
    with pytest.raises(ValueError, match="out must be"):
        S.decode_sem(blob, ids.shape, np.empty((9, 64, 95), np.uint8))
    with pytest.raises(BadInput, match=r"sem_zst: (holds \d+ bytes, expected|not a zstd frame)"):  # a cut blob
        S.decode_sem(blob[:-4], ids.shape, np.empty(ids.shape, np.uint8))


def test_gather_matches_rows(prepared_tiny):
    path = prepared_tiny / "text" / "table.safetensors"
    table = TextTable(path)
    with safe_open(str(path), "pt") as f:
        rows = [f.get_tensor(k) for k in table.keys]
    calls = []

    def empty(shape, dtype):
        calls.append(tuple(shape))
        return torch.empty(shape, dtype=dtype)

    for ids in ([2] * 5, [0, 0, 3, 3, 1], [table.null_id] * 3, [4]):
        got = table.gather(ids, empty=empty)
        assert got.dtype == torch.bfloat16 and got.shape == (len(ids), *table.shape)
        assert torch.equal(got, torch.stack([rows[i] for i in ids]))
        assert torch.equal(table.gather(ids), got)
    assert calls[0] == tuple(table.shape)  # one row for a single prompt: an expanded view
    assert table.gather([2] * 5).stride()[0] == 0
    assert calls[1] == (5, *table.shape)


def test_collate_one_and_two(prepared_tiny):
    g = torch.Generator().manual_seed(0)
    row = torch.randn(16, 64, generator=g).to(torch.bfloat16)

    def sample(k):
        return {
            "input_latents": torch.randn(48, 3, 4, 6, generator=g).to(torch.bfloat16),
            "context": row.unsqueeze(0).expand(3, 16, 64) if k == 0 else torch.randn(3, 16, 64).to(torch.bfloat16),
            "context_ids": torch.tensor([k, k, k]),
            "sem_ids": torch.randint(0, 7, (9, 64, 96), dtype=torch.uint8),
            "clip_id": f"c{k}",
            "sample_id": k,
            "epoch": 0,
            "dropped": {"text": False, "cond": False, "mask": 0.1},
        }

    s = [sample(0), sample(1)]
    for batch in ([s[0]], s, [s[1], s[0]]):
        b = gc_collate(batch)
        for key in ("input_latents", "context", "context_ids", "sem_ids"):
            assert torch.equal(b[key], torch.stack([x[key] for x in batch])), key


def test_latents_into_allocator():
    a = (np.arange(48 * 3 * 4 * 6, dtype=np.uint16) * 7).reshape(48, 3, 4, 6)
    seen = []

    def empty(shape, dtype):
        seen.append((tuple(shape), dtype))
        return torch.empty(shape, dtype=dtype)

    got = S.bits_to_bf16(a, empty)
    assert seen == [((48, 3, 4, 6), torch.bfloat16)]
    assert torch.equal(got.view(torch.uint16), S.bits_to_bf16(a).view(torch.uint16))
