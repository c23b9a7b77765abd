"""Hostile input to the tools that read exports, and names from outside in their output (docs/training.md,
"Trust and safety"): a crafted export never builds a model of the size its keys claim, and is answered with exit 2
and one line naming the key and what was expected; a clip id is never printed raw.

The exports are the project's own (`save_gc` of the tiny preset) with their safetensors header edited, the data
left valid, so that only what the header claims is hostile. Each tool is called in this process (`main(argv)`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _gc_helpers import export_metadata, tiny_dit
from hostile import Outcome, run_entry, time_limit
from test_bad_input import check

from gcc.model.export import GcCkptError, check_gc_ckpt, load_gc_weights, save_gc
from gcc.vocab import num_classes

PROJ_IN = "gc_sem_cond.proj_in.weight"


@pytest.fixture
def call(in_process) -> Callable[[str, list[str]], Outcome]:
    """`call(prog, argv)`: the tool's main(argv) here (tests/hostile.py `run_entry`); a case that builds a model of
    10^8 blocks (hours, and all the memory) is interrupted at the time limit and fails instead."""
    return run_entry


def tiny_export(path: Path) -> Path:
    return save_gc(tiny_dit(seed=3).state_dict(), path, export_metadata())


def edit_header(path: Path, edit) -> Path:
    """Rewrite a safetensors file's header with `edit(header, data) -> data` (the data bytes after the header)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8 : 8 + n]), raw[8 + n :]
    data = edit(header, data)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)
    return path


def with_key(key: str):
    """An edit adding a BF16 tensor `key` of one element after the others."""

    def edit(header: dict, data: bytes) -> bytes:
        header[key] = {"dtype": "BF16", "shape": [1], "data_offsets": [len(data), len(data) + 2]}
        return data + b"\0\0"

    return edit


def flattened(key: str):
    """An edit that declares `key` 1-D, its bytes unchanged (the header stays consistent with the file)."""

    def edit(header: dict, data: bytes) -> bytes:
        shape = header[key]["shape"]
        header[key]["shape"] = [shape[0] * shape[1]]
        return data

    return edit


def _sample_argv(ckpt: Path, data_root: Path, out: Path, *flags: str) -> list[str]:
    return [
        "--ckpt",
        str(ckpt),
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--data",
        str(data_root),
        "--out",
        str(out),
        "--no_progress",
        *(flags or ("--n", "1")),
    ]


# ---- an export's keys never size a model --------------------------------------------------------------------

HUGE_BLOCK_KEYS = ["blocks.100000000.x", "blocks.100000000.ffn.0.bias"]


@pytest.mark.parametrize("key", HUGE_BLOCK_KEYS)
def test_inspect_refuses_a_block_index_of_10e8_by_name_at_once(tmp_path, call, key):
    """Before: the block count came from the largest key index, and a model of 10^8 blocks was built (a hang)."""
    path = edit_header(tiny_export(tmp_path / "step-1.safetensors"), with_key(key))
    t0 = time.perf_counter()
    r = call("gcc-inspect", [str(path)])
    elapsed = time.perf_counter() - t0
    check(r, 2, [str(path), f"'{key}'"], "gcc-inspect")
    assert elapsed < 5, elapsed  # the header alone: well under a second on an idle machine


@pytest.mark.parametrize("key", HUGE_BLOCK_KEYS)
def test_sample_refuses_a_block_index_of_10e8_before_building_a_model(tmp_path, call, key):
    path = edit_header(tiny_export(tmp_path / "step-1.safetensors"), with_key(key))
    t0 = time.perf_counter()
    r = call("gcc-sample", _sample_argv(path, tmp_path / "no-data", tmp_path / "eval"))
    elapsed = time.perf_counter() - t0
    check(r, 2, ["--ckpt", str(path), key, "unexpected", "--model 'tiny'"], "gcc-sample")
    assert elapsed < 5, elapsed
    assert not (tmp_path / "eval").exists()


def test_the_block_count_is_bounded_by_the_keys_also_for_the_api(tmp_path):
    path = edit_header(tiny_export(tmp_path / "step-1.safetensors"), with_key("blocks.100000000.ffn.0.bias"))
    with time_limit(10), pytest.raises(GcCkptError, match=r"'blocks\.100000000\.ffn\.0\.bias' names block 100000000"):
        check_gc_ckpt(path)
    with time_limit(10), pytest.raises(GcCkptError, match=r"unexpected \['blocks\.100000000\.ffn\.0\.bias'\]"):
        check_gc_ckpt(path, preset="tiny")
    with pytest.raises(GcCkptError, match=r"blocks\.100000000\.ffn\.0\.bias"):  # the trainer's warm start
        load_gc_weights(tiny_dit(), path, check_only=True)


# ---- every tensor's shape and dtype -------------------------------------------------------------------------


def test_inspect_names_a_1d_cond_input_and_the_shape_expected(tmp_path, call):
    """Before: IndexError (shape[1] of a 1-D shape), a traceback."""
    path = edit_header(tiny_export(tmp_path / "step-1.safetensors"), flattened(PROJ_IN))
    v = num_classes("parts")
    r = call("gcc-inspect", [str(path)])
    check(r, 2, [str(path), f"{PROJ_IN} has shape ({32 * v},)", "expected 2 dimension(s)", f"(32, {v})"], "gcc-inspect")
    r = call("gcc-inspect", [str(path), "--model", "tiny"])  # a declared preset: its exact shape
    check(r, 2, [f"{PROJ_IN} has shape ({32 * v},), the 'tiny' preset expects (32, {v})"], "gcc-inspect")


def test_sample_names_a_1d_cond_input_and_the_shape_expected(tmp_path, call):
    path = edit_header(tiny_export(tmp_path / "step-1.safetensors"), flattened(PROJ_IN))
    v = num_classes("parts")
    r = call("gcc-sample", _sample_argv(path, tmp_path / "no-data", tmp_path / "eval"))
    check(r, 2, ["--ckpt", f"{PROJ_IN} has shape ({32 * v},), the 'tiny' preset expects (32, {v})"], "gcc-sample")


def test_a_dtype_other_than_bf16_is_named(tmp_path, call):
    """(Refused before too; now from the header alone, with the other checks.)"""

    def to_f16(header: dict, data: bytes) -> bytes:
        header["head.head.bias"]["dtype"] = "F16"  # as many bytes as BF16: the header stays consistent
        return data

    path = edit_header(tiny_export(tmp_path / "step-1.safetensors"), to_f16)
    check(call("gcc-inspect", [str(path)]), 2, ["head.head.bias is F16, expected BF16"], "gcc-inspect")


def test_a_block_shaped_unlike_block_0_is_named(tmp_path, call):
    def squeeze(header: dict, data: bytes) -> bytes:
        k = "blocks.1.ffn.0.weight"
        a, b = header[k]["shape"]
        header[k]["shape"] = [a // 2, b * 2]
        return data

    path = edit_header(tiny_export(tmp_path / "step-1.safetensors"), squeeze)
    r = call("gcc-inspect", [str(path)])
    check(r, 2, ["blocks.1.ffn.0.weight has shape", "as blocks.0.ffn.0.weight"], "gcc-inspect")


def test_a_good_export_names_its_preset(tmp_path, call):
    path = tiny_export(tmp_path / "step-1.safetensors")
    r = call("gcc-inspect", [str(path), "--model", "tiny"])
    assert r.returncode == 0 and "2 blocks, vocab parts, shaped as the 'tiny' preset" in r.stdout, r
    r = call("gcc-inspect", [str(path)])
    assert r.returncode == 0 and "shaped as the 'tiny' preset" in r.stdout, r
    r = call("gcc-inspect", [str(path), "--model", "wide"])
    check(r, 2, ["has shape", "the 'wide' preset expects"], "gcc-inspect")


# ---- names from outside are printed escaped -----------------------------------------------------------------


@pytest.mark.parametrize("cid", ["clip\x1b[2J\x1b[31mred", "clip00000\rclip00001"])
def test_sample_shows_a_clip_id_with_control_characters_escaped(tmp_path, call, request, cid):
    """ESC (a terminal's clear-screen and colours) and CR (return to the line's start, overwriting it) in
    --clip_ids: refused as no clip id of the data can hold them (gcc/names.py), and shown escaped."""
    ckpt = tiny_export(tmp_path / "step-1.safetensors")
    data = request.getfixturevalue("prepared_tiny")
    r = call("gcc-sample", _sample_argv(ckpt, data, tmp_path / "eval", "--clip_ids", cid))
    assert "\x1b" not in r.stdout + r.stderr and "\r" not in r.stdout + r.stderr, repr(r.stderr)
    check(r, 2, ["--clip_ids: clip id", repr(cid)], "gcc-sample")


def test_inspect_shows_a_metadata_key_with_control_characters_escaped(tmp_path, call):
    """Before: the metadata's keys were printed raw (their values through repr)."""

    def hostile_key(header: dict, data: bytes) -> bytes:
        header["__metadata__"]["x\x1b[2J\rgone"] = "v\x1b[31m"
        return data

    path = edit_header(tiny_export(tmp_path / "step-1.safetensors"), hostile_key)
    r = call("gcc-inspect", [str(path)])
    assert "\x1b" not in r.stdout + r.stderr and "\r" not in r.stdout + r.stderr, repr(r.stdout + r.stderr)
    assert "  x\\x1b[2J\\rgone = 'v\\x1b[31m'" in r.stdout
    check(r, 2, ["metadata keys differ", "unexpected ['x\\x1b[2J\\rgone']"], "gcc-inspect")
