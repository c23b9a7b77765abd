"""Names from outside checked by one rule where they enter (gcc/names.py, docs/training.md "Trust and safety"):
a path component of a safe character set, a shard basename of the converter's shape, a printable text key, and
`inside` refusing a path that leaves its folder through a planted link."""

from __future__ import annotations

import os

import pytest

from gcc.names import UnsafeName, check_component, check_shard_basename, check_text_key, inside


@pytest.mark.parametrize("name", ["clip00001", "run_7", "a.b+c=d@e-f", "_x", "9", "x" * 200])
def test_safe_components_pass_unchanged(name):
    assert check_component(name, "clip id") == name


@pytest.mark.parametrize(
    "name", ["", ".", "..", ".hidden", "-x", "a/b", "a\\b", "../up", "/abs", "a b", "a\nb", "é", "x" * 201, 3, None]
)
def test_a_component_that_could_name_another_file_is_refused_naming_kind_and_value(name):
    with pytest.raises(UnsafeName, match=r"^clip id .*: must be 1-200 characters") as e:
        check_component(name, "clip id")
    assert "\n" not in str(e.value)  # a control character is shown escaped, never printed


@pytest.mark.parametrize("name", ["shard.00000.mds", "shard.00012.mds.zstd", "chunk_00003/shard.00001.mds.zstd"])
def test_the_converters_shard_names_pass(name):
    assert check_shard_basename(name) == name


@pytest.mark.parametrize(
    "name", ["shard.0.mds", "../shard.00000.mds", "chunk_1/shard.00000.mds", "shard.00000.mds.gz", "x/shard.00000.mds"]
)
def test_other_shard_names_are_refused(name):
    with pytest.raises(UnsafeName, match=r"must be \[chunk_NNNNN/\]shard\.NNNNN\.mds\[\.zstd\]"):
        check_shard_basename(name)


def test_a_text_key_is_any_printable_string_up_to_512_characters():
    for key in ("explore village/../x", "NULL_PROMPT", "é" * 512):
        assert check_text_key(key) == key
    for key in ("", "a\nb", "\x1b[2J", "x" * 513, b"bytes"):
        with pytest.raises(UnsafeName, match="must be 1-512 printable characters"):
            check_text_key(key)


def test_inside_joins_a_name_and_refuses_one_that_leaves_through_a_planted_link(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    assert inside(root, "sub/file") == root / "sub" / "file"
    os.symlink(tmp_path, root / "planted")  # a folder inside root that leads out of it
    with pytest.raises(UnsafeName, match="leads outside"):
        inside(root, "planted/file")
    os.symlink(tmp_path / "elsewhere", root / "last")  # the last component is not resolved: the link itself
    assert inside(root, "last") == root / "last"
    for rel in ("..", "sub/..", "."):
        with pytest.raises(UnsafeName, match="leads outside"):
            inside(root, rel)
