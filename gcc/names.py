"""Names that come from outside — clip ids, runs, subsets and scenes, shard basenames, text keys — checked by one
rule where they enter (docs/training.md, "Trust and safety").

A name that becomes part of a path is a relative path inside the folder it belongs to: never absolute, no `..`,
`.` or empty component, no backslash or control character, and the shape the format fixes where it fixes one
(shards: `[chunk_NNNNN/]shard.NNNNN.mds[.zstd]`; clip ids and the other per-clip names: one path component of a
safe character set). A text key is never joined into a path; it must still be printable, so that it cannot
rewrite a log line or a message.

`inside(root, rel)` joins a checked name to its folder where a file is written or deleted: it also resolves the
folders on the way and refuses a path that leaves `root` (through a symbolic link planted inside it, say).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gcc import exit_codes
from gcc.inputs import shown

# one path component: starts with a letter, digit or underscore (never '.', so never '..' or a hidden file)
COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=@-]{0,199}")
# a shard of a convert_data split: MDS's own names, under the converter's chunk folders
SHARD = re.compile(r"(chunk_[0-9]{5}/)?shard\.[0-9]{5}\.mds(\.zstd)?")
TEXT_KEY_MAX = 512


class UnsafeName(ValueError):
    """A name from outside that breaks the rule; the message names the kind, the value and what is expected."""

    exit_code = exit_codes.CONFIG


def _shown(value: object) -> str:
    return shown(repr(value), 120)  # quoted, control characters escaped, bounded


def check_component(value: object, what: str) -> str:
    """A name used as one path component (a clip id, a run, subset or scene)."""
    if not isinstance(value, str) or not COMPONENT.fullmatch(value):
        raise UnsafeName(
            f"{what} {_shown(value)}: must be 1-200 characters of A-Z a-z 0-9 _ . + = @ -, "
            f"starting with a letter, digit or _ (it names files)"
        )
    return value


def check_shard_basename(value: object, what: str = "shard basename") -> str:
    if not isinstance(value, str) or not SHARD.fullmatch(value):
        raise UnsafeName(
            f"{what} {_shown(value)}: must be [chunk_NNNNN/]shard.NNNNN.mds[.zstd], as convert_data writes it"
        )
    return value


def check_text_key(value: object, what: str = "text key") -> str:
    if not isinstance(value, str) or not value or len(value) > TEXT_KEY_MAX or not value.isprintable():
        raise UnsafeName(f"{what} {_shown(value)}: must be 1-{TEXT_KEY_MAX} printable characters")
    return value


def inside(root: str | os.PathLike, rel: str, what: str = "name") -> Path:
    """`root/rel`, refused unless its folder resolves inside `root` (`rel` must already be a checked name). The
    last component is not resolved: removing or replacing it acts on the entry in `root` (a link in a cache), never
    on what it points to."""
    base = os.path.realpath(root)
    path = os.path.join(base, rel)
    folder = os.path.realpath(os.path.dirname(path))
    if os.path.commonpath([base, folder]) != base or os.path.basename(path) in ("", ".", ".."):
        raise UnsafeName(f"{what} {_shown(rel)}: leads outside {root}")
    return Path(root, rel)
