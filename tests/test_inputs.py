"""gcc/inputs.py, the one layer every file from outside is read through (docs/training.md, "Trust and safety"):
a regular file only, opened without blocking, no larger than its kind's cap; declared sizes inside a format
(a safetensors header, an npz member, a zstd frame) checked before anything is allocated or inflated. Each test
hands it one kind of hostile input and proves the rule: a BadInput naming the file, quickly, without the memory
the input asks for."""

from __future__ import annotations

import io
import json
import os
import socket
import struct
import time
import zipfile

import numpy as np
import pytest
import zstandard
from hostile import peak_allocated, refused_quickly

from gcc import inputs
from gcc.errors import BadInput, DamagedData

MiB = 1 << 20


def _refused_quickly(call, *match: str) -> BaseException:
    return refused_quickly(call, BadInput, *match, within_s=5.0)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "manifest.json"
    os.mkfifo(fifo)
    _refused_quickly(lambda: inputs.load_json(fifo), str(fifo), "FIFO")
    _refused_quickly(lambda: inputs.open_text(fifo, "csv").__enter__(), str(fifo), "FIFO")


def test_a_link_to_dev_zero_is_refused_before_a_byte_is_read(tmp_path):
    link = tmp_path / "index.json"
    link.symlink_to("/dev/zero")
    _refused_quickly(lambda: inputs.read_bytes(link, "json"), str(link), "character device")


def test_a_socket_is_refused(tmp_path):
    path = tmp_path / "s"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        _refused_quickly(lambda: inputs.read_text(path), str(path))
    finally:
        sock.close()


def test_a_folder_is_refused(tmp_path):
    _refused_quickly(lambda: inputs.load_json(tmp_path), str(tmp_path), "folder")


def test_a_file_over_its_kinds_cap_is_refused_by_its_size_alone(tmp_path):
    big = tmp_path / "clips.txt"
    with open(big, "wb") as f:
        f.truncate(inputs.CAPS["text"] + 1)  # sparse: nothing is written, nothing must be read
    peak, error = peak_allocated(lambda: inputs.read_text(big))
    assert isinstance(error, BadInput) and "larger than a text file may be" in str(error), error
    assert peak < MiB
    small = tmp_path / "small.json"
    small.write_text("[1, 2]")
    with pytest.raises(BadInput, match="larger than a json file may be"):
        inputs.read_bytes(small, "json", cap=3)


def test_json_nested_deeper_than_the_limit_is_refused_before_parsing(tmp_path):
    deep = tmp_path / "run.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)  # Python's parser would recurse past its limit
    _refused_quickly(lambda: inputs.load_json(deep), str(deep), f"nested deeper than {inputs.MAX_DEPTH}")
    ok = "[" * inputs.MAX_DEPTH + "]" * inputs.MAX_DEPTH
    assert inputs.parse_json(ok, "ok") is not None
    assert inputs.parse_json('{"a": "[[[[" }' + " " * 100, "strings") == {"a": "[[[["}  # brackets in strings


def _safetensors(path, header: dict, data: bytes = b"", sparse_to: int | None = None) -> None:
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)
        if sparse_to is not None:
            f.truncate(sparse_to)


def test_a_safetensors_header_whose_shapes_lie_is_refused_before_any_allocation(tmp_path):
    lie = tmp_path / "table.safetensors"
    _safetensors(lie, {"x": {"dtype": "BF16", "shape": [65536, 65536], "data_offsets": [0, 8]}}, b"\0" * 8)
    _refused_quickly(lambda: inputs.safetensors_header(lie), str(lie), "'x'", "needs 8589934592 bytes")
    huge_len = tmp_path / "len.safetensors"
    huge_len.write_bytes(struct.pack("<Q", 1 << 60) + b"{}")
    _refused_quickly(lambda: inputs.safetensors_header(huge_len), "its header claims")
    overlap = tmp_path / "overlap.safetensors"
    entry = {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}
    _safetensors(overlap, {"a": entry, "b": entry}, b"\0" * 4)
    _refused_quickly(lambda: inputs.safetensors_header(overlap), "share bytes")
    bad_dtype = tmp_path / "dtype.safetensors"
    _safetensors(bad_dtype, {"a": {"dtype": "X9", "shape": [1], "data_offsets": [0, 1]}}, b"\0")
    _refused_quickly(lambda: inputs.safetensors_header(bad_dtype), "not a safetensors dtype")
    # a sparse file as large as the shape says is a well-formed header: the caller compares the shape with what
    # it expects (the manifest's geometry), before it reads a row
    sparse = tmp_path / "sparse.safetensors"
    _safetensors(sparse, {"x": {"dtype": "BF16", "shape": [65536, 65536], "data_offsets": [0, 1 << 33]}})
    raw_len = len(json.dumps({"x": {"dtype": "BF16", "shape": [65536, 65536], "data_offsets": [0, 1 << 33]}}))
    os.truncate(sparse, 8 + raw_len + (1 << 33))
    header, _ = inputs.safetensors_header(sparse)
    assert header["x"].shape == (65536, 65536)


def test_an_npz_member_that_inflates_beyond_its_header_is_refused_without_inflating(tmp_path):
    bomb = tmp_path / "sem.npz"
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": (4,)})
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("ids.npy", header.getvalue() + b"\0" * (256 * MiB))  # declares 4 bytes, inflates to 256 MB
    assert bomb.stat().st_size < MiB
    peak, error = peak_allocated(lambda: inputs.npy_members(bomb))
    assert isinstance(error, BadInput) and str(bomb) in str(error) and "'ids.npy'" in str(error), error
    assert "inflates to" in str(error) and peak < 16 * MiB
    declared_large = tmp_path / "large.npz"
    np.savez(declared_large, ids=np.zeros((64, 64), np.uint8))
    with pytest.raises(BadInput, match="add up to more than"):
        inputs.npy_members(declared_large, cap=1000)
    pickled = tmp_path / "objects.npz"
    np.savez(pickled, ids=np.array([{"a": 1}], dtype=object))
    with pytest.raises(BadInput, match="Python objects"):
        inputs.npy_members(pickled)
    good = tmp_path / "good.npz"
    np.savez(good, ids=np.zeros((3, 4), np.uint8))
    assert inputs.npy_members(good) == {"ids": ((3, 4), np.dtype(np.uint8))}


def test_a_zstd_frame_that_inflates_past_its_cap_costs_no_more_than_the_cap(tmp_path):
    bomb = zstandard.ZstdCompressor(level=3).compress(b"\0" * (64 * MiB))
    assert len(bomb) < 64 * 1024
    t0 = time.monotonic()
    peak, error = peak_allocated(lambda: inputs.decompress_zstd(bomb, MiB, "shard.00000.mds.zstd"))
    assert isinstance(error, BadInput) and "shard.00000.mds.zstd: inflates to more than 1.0 MB" in str(error), error
    assert peak < 8 * MiB and time.monotonic() - t0 < 5
    assert inputs.decompress_zstd(bomb, 64 * MiB, "fits") == b"\0" * (64 * MiB)
    with pytest.raises(BadInput, match="not a zstd frame"):
        inputs.decompress_zstd(b"not zstd at all", MiB, "garbage")


def test_shown_escapes_what_would_rewrite_a_line():
    assert inputs.shown("clip\x1b[2K\rok") == "clip\\x1b[2K\\rok"
    assert len(inputs.shown("x" * 1000, 50)) == 50


@pytest.mark.parametrize(
    "text, refused",
    [
        ('{"a":' * 100_000 + "1" + "}" * 100_000, True),  # objects nest too, not only lists
        ('["\\"' + "[" * 200 + '"]', False),  # an escaped quote does not end the string: its brackets are text
        ('["\\\\n", ' + "[" * 200 + "]" * 200 + "]", True),  # after an escape, the string ends at its quote
    ],
)
def test_the_depth_is_counted_outside_strings_for_lists_and_objects(text, refused):
    if refused:
        _refused_quickly(lambda: inputs.parse_json(text, "doc.json"), "doc.json", "nested deeper than")
    else:
        assert inputs.parse_json(text, "doc.json") == ['"' + "[" * 200]


def test_a_value_that_is_no_text_is_no_integer():
    for value in (None, 3, b"3"):
        with pytest.raises(BadInput, match=r"^n=.*: expected an integer in ASCII digits"):
            inputs.parse_int(value, "n")


def test_a_json_file_that_is_not_an_object_is_refused_naming_what_it_should_be(tmp_path):
    path = tmp_path / "run.json"
    path.write_text("[1, 2]")
    with pytest.raises(BadInput, match=r"run.json: expected the run's record \(a JSON object\), got a JSON list"):
        inputs.load_json_object(path, "the run's record")
    path.write_text('{"step": 3}')
    assert inputs.load_json_object(path, "the run's record") == {"step": 3}
    path.write_text("{")
    with pytest.raises(BadInput, match=r"run.json: not valid JSON \(line 1"):
        inputs.load_json(path)
    with pytest.raises(BadInput, match=r"run.json: not valid JSON for the run's record \(line 1"):
        inputs.load_json_object(path, "the run's record")


def test_a_file_read_in_several_pieces_is_read_whole(tmp_path):
    path = tmp_path / "big.bin"
    data = bytes(range(256)) * (17 * MiB // 256)  # past one 16 MiB read
    path.write_bytes(data)
    assert inputs.read_bytes(path, "json", cap=len(data)) == data


def test_a_safetensors_file_of_two_tensors_is_read_and_a_short_or_garbled_one_named(tmp_path):
    import torch
    from safetensors.torch import save_file

    good = tmp_path / "two.safetensors"
    save_file({"a": torch.zeros(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)}, str(good))
    entries, _ = inputs.safetensors_header(good)
    assert {k: (e.dtype, e.shape) for k, e in entries.items()} == {"a": ("F32", (2, 3)), "b": ("BF16", (4,))}
    assert sorted(e.offsets for e in entries.values()) in ([(0, 24), (24, 32)], [(0, 8), (8, 32)])
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    with pytest.raises(BadInput, match=r"short.safetensors: 2 bytes, too short for a safetensors file"):
        inputs.safetensors_header(short)
    garbled = tmp_path / "garbled.safetensors"
    garbled.write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(
        BadInput, match=r"garbled.safetensors \(safetensors header\): not valid JSON for a safetensors header \(line 1"
    ):
        inputs.safetensors_header(garbled)


def _zip_declaring(path, members: dict[str, bytes], declared: int | None = None) -> None:
    """An uncompressed zip of `members`; with `declared`, its one member's central record claims that many bytes
    (stored and inflated alike) whatever it holds: a file that lies about its sizes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)
        if declared is not None:
            (info,) = z.filelist
            info.file_size = info.compress_size = declared


def test_torch_saves_own_file_passes_and_records_past_the_files_size_are_refused(tmp_path):
    import torch

    saved = tmp_path / "weights.pth"
    torch.save({"w": torch.arange(6.0)}, saved)
    inputs.check_pickled_weights(saved)  # a file torch.save wrote: every record stored as it is

    # records that declare exactly the file's size are bounded by it; one byte more is not
    lying = tmp_path / "lying.pth"
    _zip_declaring(lying, {"archive/data/0": b"x" * 8}, declared=0)
    size = lying.stat().st_size  # the central directory's length does not depend on the sizes it declares
    _zip_declaring(lying, {"archive/data/0": b"x" * 8}, declared=size)
    assert lying.stat().st_size == size
    inputs.check_pickled_weights(lying)
    _zip_declaring(lying, {"archive/data/0": b"x" * 8}, declared=size + 1)
    with pytest.raises(
        BadInput, match=rf"lying.pth: record 'archive/data/0': its records declare more bytes than the file's {size}$"
    ):
        inputs.check_pickled_weights(lying)

    deflated = tmp_path / "deflated.pth"
    with zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data/0", bytes(4096))
    with pytest.raises(
        BadInput, match=r"deflated.pth: record 'archive/data/0': compressed \(\d+ bytes declaring 4096\)"
    ):
        inputs.check_pickled_weights(deflated)


def test_npz_arrays_adding_up_to_the_cap_are_read_and_one_byte_more_is_refused(tmp_path):
    path = tmp_path / "two.npz"
    np.savez(path, a=np.zeros(3, np.float32), b=np.zeros((2, 2), np.uint8))  # 12 + 4 bytes
    want = {"a": ((3,), np.dtype(np.float32)), "b": ((2, 2), np.dtype(np.uint8))}
    assert inputs.npy_members(path, cap=16) == want
    with pytest.raises(BadInput, match=r"two.npz: its arrays add up to more than 15 bytes$"):
        inputs.npy_members(path, cap=15)


def test_a_line_past_the_limit_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "clips.jsonl"
    path.write_text("short\r\n" + "y" * 10 + "\n" + "z" * 11 + "\n")
    lines = inputs.read_lines(path, "jsonl", max_line=10)
    assert next(lines) == (1, "short") and next(lines) == (2, "y" * 10)
    with pytest.raises(BadInput, match=r"clips.jsonl:3: a line longer than 10 characters; not a jsonl file gcc reads$"):
        next(lines)


def test_a_shard_is_read_and_inflated_only_at_the_size_its_index_declares(tmp_path):
    path = tmp_path / "shard.00000.mds.zstd"
    raw = bytes(range(256)) * 8
    blob = zstandard.ZstdCompressor().compress(raw)
    path.write_bytes(blob)
    assert inputs.read_shard_file(path, len(blob), "shard 0") == blob
    assert inputs.inflate_shard(blob, "zstd", len(raw), "shard 0") == raw

    path.write_bytes(blob[:-1])  # truncated: fewer bytes than declared
    with pytest.raises(
        DamagedData, match=rf"^shard 0: {len(blob) - 1} bytes, its index.json says {len(blob)} — restore"
    ):
        inputs.read_shard_file(path, len(blob), "shard 0")
    with pytest.raises(
        DamagedData, match=rf"^shard 0: inflates to {len(raw)} bytes, its index.json says {len(raw) + 1}"
    ):
        inputs.inflate_shard(blob, "zstd", len(raw) + 1, "shard 0")
    with pytest.raises(
        DamagedData, match=r"^shard 0: inflates to more than 2047 bytes.*declares 2047 bytes\) — restore"
    ):
        inputs.inflate_shard(blob, "zstd", len(raw) - 1, "shard 0")
    with pytest.raises(DamagedData, match=r"^shard 0: compression 'gzip' is not convert_data's \(zstd\)$"):
        inputs.inflate_shard(blob, "gzip", len(raw), "shard 0")
