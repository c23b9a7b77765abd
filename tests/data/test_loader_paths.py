"""The loader's copy-avoiding paths give the same values as the plain ones: sem decoded into a given buffer
(libzstd through ctypes, and the zstd-module fallback), text gathered straight into its result (one prompt:
an expanded view), batches of one sample as views, latents into an allocator's storage."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors import safe_open

from gcc.data import shards as S
from gcc.data.batch import gc_collate
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


def test_prompts_match_rows(prepared_tiny):
    path = prepared_tiny / "text" / "table.safetensors"
    table = TextTable(path)
    with safe_open(str(path), "pt") as f:
        rows = [f.get_tensor(k) for k in table.keys]
    calls = []

    def empty(shape, dtype):
        calls.append(tuple(shape))
        return torch.empty(shape, dtype=dtype)

    for ids in ([2] * 5, [0, 0, 3, 3, 1], [table.null_id] * 3, [4]):
        got, index = table.prompts(ids, empty=empty)
        assert got.dtype == torch.bfloat16 and got.shape == (len(set(ids)), *table.shape)
        assert torch.equal(got[index], torch.stack([rows[i] for i in ids]))  # every cell's prompt
        assert torch.equal(table.prompts(ids)[0], got)
    assert calls == [(1, *table.shape), (3, *table.shape), (1, *table.shape), (1, *table.shape)]


def test_collate_one_and_two(prepared_tiny):
    g = torch.Generator().manual_seed(0)
    row = torch.randn(16, 64, generator=g).to(torch.bfloat16)

    def sample(k):
        return {
            "input_latents": torch.randn(48, 3, 4, 6, generator=g).to(torch.bfloat16),
            "context": row.unsqueeze(0) if k == 0 else torch.randn(2, 16, 64).to(torch.bfloat16),
            "context_index": torch.tensor([0, 0, 0] if k == 0 else [0, 1, 1]),
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
        for key in ("input_latents", "context_index", "context_ids", "sem_ids"):
            assert torch.equal(b[key], torch.stack([x[key] for x in batch])), key
        # every cell's prompt is the sample's own, whatever padding the batch added
        for i, x in enumerate(batch):
            assert torch.equal(b["context"][i][b["context_index"][i]], x["context"][x["context_index"]])
    one = gc_collate([s[0]])
    assert one["context"].data_ptr() == s[0]["context"].data_ptr()  # a batch of one: views, no copy


def test_latents_into_allocator():
    a = (np.arange(48 * 3 * 4 * 6, dtype=np.uint16) * 7).reshape(48, 3, 4, 6)
    seen = []

    def empty(shape, dtype):
        seen.append((tuple(shape), dtype))
        return torch.empty(shape, dtype=dtype)

    got = S.bits_to_bf16(a, empty)
    assert seen == [((48, 3, 4, 6), torch.bfloat16)]
    assert torch.equal(got.view(torch.uint16), S.bits_to_bf16(a).view(torch.uint16))


def test_micro_batches_carry_only_their_own_prompts_as_views():
    """Composer's micro-batches of a batch (gcc.data.dataset.split_batch): every value cut along the samples, each
    micro-batch's context cut to its own most prompts (the padding of another clip is not sent to the device)."""
    from _gc_helpers import make_samples

    from gcc.data.batch import split_batch

    samples = make_samples(B=3, T=4, seed=6)
    batch = gc_collate(samples)
    assert batch["prompts"] != [max(batch["prompts"])] * 3  # clips with other prompt counts
    for size in (1, 2, 3):
        micro = split_batch(batch, size)
        assert [m["clip_id"] for m in micro] == [batch["clip_id"][i : i + size] for i in range(0, 3, size)]
        for m, lo in zip(micro, range(0, 3, size)):
            assert m["context"].shape[1] == max(m["prompts"])
            assert m["context"].data_ptr() == batch["context"][lo].data_ptr()  # a view of the batch
            for k in ("input_latents", "context_index", "sem_ids", "drop_text", "mask_frac"):
                assert torch.equal(m[k], batch[k][lo : lo + size]), k
            assert m["sample_id"] == batch["sample_id"][lo : lo + size]
