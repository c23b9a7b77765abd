"""The one writer (gcc/storage.py; docs/training.md, "Trust and safety"): never through a link, at the destination
or in a folder between the output root and it; never half written; the temporary is this call's own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gcc import storage


@pytest.fixture
def victim(tmp_path) -> Path:
    p = tmp_path / "victim.txt"
    p.write_text("someone else's file")
    return p


def test_a_destination_that_is_a_link_is_refused_naming_it(tmp_path, victim):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.json").symlink_to(victim)
    with pytest.raises(storage.LinkRefused, match=f"{out / 'a.json'}: a symbolic link inside {out}"):
        storage.atomic_write(out / "a.json", "x", root=out)
    with pytest.raises(storage.LinkRefused, match="a symbolic link"):
        storage.upload_file(str(victim), str(out / "a.json"))  # the local upload: the same writer
    assert victim.read_text() == "someone else's file" and sorted(os.listdir(out)) == ["a.json"]


def test_a_folder_inside_the_root_that_is_a_link_is_refused_naming_it(tmp_path, victim):
    out = tmp_path / "out"
    (out / "a").mkdir(parents=True)
    (out / "a" / "b").symlink_to(tmp_path)
    with pytest.raises(storage.LinkRefused, match=f"{out / 'a' / 'b'}: a symbolic link inside {out}"):
        storage.atomic_write(out / "a" / "b" / "victim.txt", "x", root=out)
    assert victim.read_text() == "someone else's file"
    (out / "c").write_text("a file")
    with pytest.raises(storage.LinkRefused, match=f"{out / 'c'}: not a folder inside {out}"):
        storage.atomic_write(out / "c" / "d.txt", "x", root=out)


def test_a_temporary_replaced_by_a_link_is_never_renamed_into_place(tmp_path, victim):
    with pytest.raises(storage.LinkRefused, match="not a regular file once written"):
        with storage.atomic_path(tmp_path / "out.bin") as tmp:
            tmp.unlink()
            tmp.symlink_to(victim)
    assert not (tmp_path / "out.bin").exists() and victim.read_text() == "someone else's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim.txt"]


def test_a_planted_temporary_name_is_replaced_not_written_through(tmp_path, victim):
    """A link planted at the temporary's name (it is predictable: `<name>.tmp<pid>`) is removed, and the
    temporary created anew (O_EXCL|O_NOFOLLOW)."""
    (tmp_path / f"out.txt.tmp{os.getpid()}").symlink_to(victim)
    storage.atomic_write(tmp_path / "out.txt", "ours")
    assert (tmp_path / "out.txt").read_text() == "ours" and victim.read_text() == "someone else's file"
    assert not (tmp_path / "out.txt").is_symlink()
