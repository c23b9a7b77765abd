"""Every file gcc reads from outside is opened here (docs/training.md, "Trust and safety").

One rule for all of them: a regular file only (a FIFO would block the reader for ever, a device such as
/dev/zero never ends, a socket is not data), opened without blocking, and no larger than the cap of its kind,
checked before anything is read; what is read is at most the cap. A failure is a `BadInput` naming the path and
what was expected, which every entry point turns into its one-line message.

The formats with sizes declared inside them are checked here too, before anything is allocated:
`safetensors_header` parses a safetensors file's header alone (its length, each tensor's dtype, shape and byte
range against the file's size), `npy_members` reads an npz's member headers (shape and dtype) without inflating
a byte of data, and `decompress_zstd` inflates a frame with a cap on the output.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import re
import stat
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from gcc.errors import BadInput, DamagedData, errno_words

MiB = 1 << 20
# the largest file of each kind gcc reads whole; a larger one is refused before a byte is read
CAPS = {
    "yaml": 16 * MiB,  # a training config
    "json": 64 * MiB,  # manifest.json, index.json, run.json, synth.json, a checkpoint's metadata
    "jsonl": 1024 * MiB,  # clips.jsonl: one line per clip
    "csv": 1024 * MiB,  # train_log.csv, val_log.csv: streamed line by line, never read whole
    "text": 16 * MiB,  # a list of clip ids, a prompt file
    "safetensors_header": 100 * MiB,  # safetensors' own limit on a header
    "npz": 4096 * MiB,  # the inflated size of all members of one npz
    "shard": 4096 * MiB,  # an MDS shard (its offsets are uint32); each is read at the size its index declares
    "pth": 16384 * MiB,  # pickled weights (torch.save: the VAE's Wan2.2_VAE.pth, 2.8 GB as published)
}
# nesting of a json document or a yaml tree beyond which it is refused (Python's parsers recurse)
MAX_DEPTH = 64

_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


def kind_of(mode: int) -> str:
    """What a file of `mode` (st_mode) is, in a message's words: "a FIFO (named pipe)", "a folder", ..."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _size_words(n: int) -> str:
    return f"{n / MiB:.1f} MB" if n >= MiB else f"{n} bytes"


@contextmanager
def open_regular(path: str | os.PathLike, kind: str, cap: int | None = None) -> Iterator[tuple[int, int]]:
    """`(fd, size)` of `path` opened for reading: refused unless it is a regular file of at most `cap` bytes (by
    default the cap of `kind`). The descriptor is closed when the block ends."""
    cap = CAPS[kind] if cap is None else cap
    try:
        # O_NONBLOCK: opening a FIFO for reading must not wait for a writer; a regular file ignores it
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise BadInput(f"{path}: {errno_words(e)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{path}: is {kind_of(st.st_mode)}, expected a regular {kind} file")
        if st.st_size > cap:
            raise BadInput(f"{path}: {_size_words(st.st_size)}, larger than a {kind} file may be ({_size_words(cap)})")
        yield fd, st.st_size
    finally:
        os.close(fd)


def read_bytes(path: str | os.PathLike, kind: str, cap: int | None = None) -> bytes:
    """The whole of `path`, a regular file of at most `cap` bytes (by default the cap of `kind`)."""
    cap = CAPS[kind] if cap is None else cap
    with open_regular(path, kind, cap) as (fd, _):
        chunks, left = [], cap + 1  # the file may grow after fstat: never read more than the cap
        while left > 0:
            b = os.read(fd, min(left, 16 * MiB))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
    data = b"".join(chunks)
    if len(data) > cap:
        raise BadInput(f"{path}: larger than a {kind} file may be ({_size_words(cap)})")
    return data


def decode_text(data: bytes, where: str, what: str) -> str:
    """`data` as UTF-8; a BadInput naming `where` and the first bad byte otherwise."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{where}: not {what} (not UTF-8 text: byte {e.start} is {e.object[e.start]:#04x})") from None


def read_text(path: str | os.PathLike, kind: str = "text", cap: int | None = None) -> str:
    return decode_text(read_bytes(path, kind, cap), str(path), f"a {kind} file")


# ---- numbers ----------------------------------------------------------------------------------------------------

# the most digits of one integer gcc reads from outside (a size, a step, an offset has at most 20): Python's own
# limit (4300) is a ValueError, and converting a long one costs time quadratic in its length
MAX_INT_DIGITS = 40
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)


def parse_int(text: object, what: str, lo: int | None = None, hi: int | None = None) -> int:
    """`text` as an integer in [lo, hi] written in ASCII digits (a sign, spaces around it), at most MAX_INT_DIGITS
    of them: the one reader of every integer gcc takes from text (an environment variable, a file or folder name,
    a CSV cell). A BadInput naming `what` and the range otherwise: `int()` alone also reads other scripts' digits
    ('٣'), `str.isdigit()` takes '²' (which `int()` refuses) and 5000 digits are a ValueError."""
    raw = text.strip() if isinstance(text, str) else ""
    if _INTEGER.fullmatch(raw) and len(raw.lstrip("+-")) <= MAX_INT_DIGITS:
        n = int(raw)
        if (lo is None or n >= lo) and (hi is None or n <= hi):
            return n
    bounds = (
        f" in [{lo}, {hi}]"
        if lo is not None and hi is not None
        else f" >= {lo}"
        if lo is not None
        else f" <= {hi}"
        if hi is not None
        else ""
    )
    raise BadInput(f"{what}={shown(repr(text), 60)}: expected an integer{bounds} in ASCII digits")


def env_int(name: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
    """The environment variable `name` read by `parse_int` (in [lo, hi]); `default` when it is unset or empty."""
    raw = os.environ.get(name, "")
    return default if raw == "" else parse_int(raw, name, lo, hi)


def _json_int(where: str, what: str, digits: str) -> int:
    """A JSON document's integer (json's `parse_int`: its digits are ASCII), refused past MAX_INT_DIGITS digits."""
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise BadInput(
            f"{where}: not {what}: an integer of {len(digits.lstrip('-'))} digits (at most {MAX_INT_DIGITS})"
        )
    return int(digits)


def parse_json(text: str | bytes, where: str, what: str = "JSON") -> Any:
    """`text` parsed as JSON, with nesting at most MAX_DEPTH and integers of at most MAX_INT_DIGITS digits; a
    BadInput naming `where` otherwise."""
    if isinstance(text, bytes):
        text = decode_text(text, where, what)
    _check_json_depth(text, where)
    try:
        return json.loads(text, parse_int=functools.partial(_json_int, where, what))
    except json.JSONDecodeError as e:
        of = "" if what == "JSON" else f" for {what}"
        raise BadInput(f"{where}: not valid JSON{of} (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise BadInput(f"{where}: nested deeper than {MAX_DEPTH} levels") from None


def _check_json_depth(text: str, where: str) -> None:
    """Refuse nesting beyond MAX_DEPTH without parsing (brackets inside strings skipped)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise BadInput(f"{where}: nested deeper than {MAX_DEPTH} levels")
        elif ch in "]}":
            depth -= 1


def load_json(path: str | os.PathLike, kind: str = "json", what: str = "JSON") -> Any:
    """The JSON document in `path` (a bounded regular file, see `read_bytes`)."""
    return parse_json(read_bytes(path, kind), str(path), what)


def load_json_object(path: str | os.PathLike, what: str, kind: str = "json") -> dict:
    """`load_json`, refused unless the document is an object (`what` names it in the message)."""
    doc = load_json(path, kind, what)
    if not isinstance(doc, dict):
        raise BadInput(f"{path}: expected {what} (a JSON object), got a JSON {type(doc).__name__}")
    return doc


@contextmanager
def open_text(path: str | os.PathLike, kind: str, cap: int | None = None) -> Iterator[IO[str]]:
    """`path` as a text stream (UTF-8, newline='' as the csv module wants) after the checks of `open_regular`;
    for files read line by line (a CSV log, clips.jsonl)."""
    with open_regular(path, kind, cap) as (fd, _):
        f = os.fdopen(os.dup(fd), "r", encoding="utf-8", newline="")
        try:
            yield f
        except UnicodeDecodeError as e:
            raise BadInput(f"{path}: not a {kind} file (not UTF-8 text near byte {e.start})") from None
        finally:
            f.close()


def read_lines(path: str | os.PathLike, kind: str, max_line: int) -> Iterator[tuple[int, str]]:
    """(line number from 1, line without its line break) of `path` (`open_text`: a bounded regular file), one at a
    time: a reader holds one line, never the file. A line longer than `max_line` characters is a BadInput naming the
    file and the line, refused before more of it is read."""
    with open_text(path, kind) as f:
        for n in itertools.count(1):
            line = f.readline(max_line + 1)
            if not line:
                return
            if len(line) > max_line and not line.endswith("\n"):
                raise BadInput(f"{path}:{n}: a line longer than {max_line} characters; not a {kind} file gcc reads")
            yield n, line.rstrip("\r\n")


# ---- formats that declare sizes inside them -------------------------------------------------------------------

# safetensors dtypes and their sizes in bytes
SAFETENSORS_DTYPES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip


class TensorEntry(tuple):
    """(dtype, shape, (begin, end)) of one tensor in a safetensors header."""

    __slots__ = ()

    def __new__(cls, dtype: str, shape: tuple[int, ...], offsets: tuple[int, int]):
        return super().__new__(cls, (dtype, shape, offsets))

    dtype = property(lambda self: self[0])
    shape = property(lambda self: self[1])
    offsets = property(lambda self: self[2])


def safetensors_header(
    path: str | os.PathLike, cap: int | None = None
) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """({name: TensorEntry}, metadata) of a safetensors file, read from its header alone. Refused (BadInput
    naming the file and the tensor) unless the header is at most `cap` bytes of JSON, every dtype is known, every
    shape is a list of non-negative integers, and every tensor's bytes (its shape times its dtype's size) lie
    inside the file without overlapping another's."""
    cap = CAPS["safetensors_header"] if cap is None else cap
    with open_regular(path, "safetensors_header", cap=1 << 62) as (fd, size):
        head = os.read(fd, 8)
        if len(head) < 8:
            raise BadInput(f"{path}: {size} bytes, too short for a safetensors file")
        n = int.from_bytes(head, "little")
        if n > cap or n > size - 8:
            raise BadInput(
                f"{path}: its header claims {n} bytes (the file has {size}; at most {_size_words(cap)}), "
                "not a safetensors file"
            )
        raw = b""
        while len(raw) < n:
            b = os.read(fd, n - len(raw))
            if not b:
                break
            raw += b
    doc = parse_json(raw, f"{path} (safetensors header)", "a safetensors header")
    if not isinstance(doc, dict):
        raise BadInput(f"{path}: its safetensors header is not a JSON object")
    meta = doc.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise BadInput(f"{path}: __metadata__ must map strings to strings")
    data_size, tensors, spans = size - 8 - n, {}, []
    for name, entry in doc.items():
        tensors[name] = _tensor_entry(path, name, entry, data_size)
        spans.append(tensors[name].offsets)
    spans.sort()
    for (_, end), (begin, _) in itertools.pairwise(spans):
        if begin < end:
            raise BadInput(f"{path}: two tensors share bytes {begin}-{end}, not a safetensors file")
    return tensors, meta


def _tensor_entry(path, name: str, entry: Any, data_size: int) -> TensorEntry:
    where = f"{path}: tensor {name[:200]!r}"
    if not isinstance(entry, dict):
        raise BadInput(f"{where}: expected {{dtype, shape, data_offsets}}")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in SAFETENSORS_DTYPES:
        raise BadInput(f"{where}: dtype {str(dtype)[:40]!r} is not a safetensors dtype")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape) or len(shape) > 8:
        raise BadInput(f"{where}: shape {str(shape)[:80]} is not a list of at most 8 non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise BadInput(f"{where}: data_offsets {str(offsets)[:80]} is not [begin, end]")
    begin, end = offsets
    want = math.prod(shape) * SAFETENSORS_DTYPES[dtype]
    if not 0 <= begin <= end <= data_size or end - begin != want:
        raise BadInput(
            f"{where}: {dtype}{shape} needs {want} bytes, its data_offsets [{begin}, {end}] do not hold them "
            f"inside the file's {data_size} data bytes"
        )
    return TensorEntry(dtype, tuple(shape), (begin, end))


@contextmanager
def open_zip(
    path: str | os.PathLike, kind: str, what: str, cap: int | None = None
) -> Iterator[tuple[zipfile.ZipFile, int]]:
    """(the zip archive in `path`, the file's size): a regular file of its kind's cap (`open_regular`), refused as
    BadInput "not <what>" when it is not a zip archive. Nothing is inflated: each member's declared sizes are the
    caller's to check."""
    with open_regular(path, kind, cap) as (fd, size), os.fdopen(os.dup(fd), "rb") as f:
        try:
            z = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            raise BadInput(f"{path}: not {what} ({e})") from None
        with z:
            yield z, size


def _npy_header_readers() -> dict:
    import numpy as np

    return {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def npy_members(path: str | os.PathLike, cap: int | None = None) -> dict[str, tuple[tuple[int, ...], Any]]:
    """{member name without .npy: (shape, numpy dtype)} of an npz, read from each member's header without
    inflating its data. Refused (BadInput naming the file and member) when a member is not a plain .npy array,
    when the declared arrays together exceed `cap` bytes (by default the cap of "npz"), or when a member's stored
    size does not match its header (a zip bomb declares small and inflates large)."""
    import numpy as np

    cap = CAPS["npz"] if cap is None else cap
    npy_headers = _npy_header_readers()
    members, total = {}, 0
    with open_zip(path, "npz", "an npz file", cap=1 << 62) as (z, _):
        for info in z.infolist():
            where = f"{path}: member {info.filename[:200]!r}"
            if not info.filename.endswith(".npy"):
                raise BadInput(f"{where}: not a .npy array")
            try:
                with z.open(info) as m:
                    version = np.lib.format.read_magic(m)
                    read_header = npy_headers.get(version)
                    if read_header is None:
                        raise ValueError(f"npy format version {version} is not 1.0 or 2.0")
                    shape, _, dtype = read_header(m)
                    header_len = m.tell()
            except Exception as e:  # whatever the header holds, it is bad input
                raise BadInput(f"{where}: not a .npy array header ({type(e).__name__}: {e})") from None
            if dtype.hasobject:
                raise BadInput(f"{where}: holds Python objects (pickles), which are never loaded")
            nbytes = math.prod(shape) * dtype.itemsize
            if info.file_size != header_len + nbytes:
                raise BadInput(
                    f"{where}: its header declares {dtype}{list(shape)} ({nbytes} bytes) but the member "
                    f"inflates to {info.file_size - header_len}"
                )
            total += nbytes
            if total > cap:
                raise BadInput(f"{path}: its arrays add up to more than {_size_words(cap)}")
            members[info.filename[:-4]] = (tuple(shape), dtype)
    return members


def check_pickled_weights(path: str | os.PathLike) -> None:
    """A torch.save file (a zip: the pickle, one record per storage) checked before torch's loader reads it: every
    record is stored as torch.save writes it, uncompressed, and its declared size is the size it takes in the file,
    so what the loader allocates is bounded by the file (at most the cap of "pth"). A BadInput naming the file and
    the record otherwise: a record that inflates (2 MB declaring 2 GB: a deflate bomb) is refused unread."""
    with open_zip(path, "pth", "a torch.save file") as (z, size):
        total = 0
        for info in z.infolist():
            where = f"{path}: record {shown(repr(info.filename), 120)}"
            if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
                raise BadInput(
                    f"{where}: compressed ({info.compress_size} bytes declaring {info.file_size}); torch.save "
                    "stores its records as they are, so this is not a file it wrote"
                )
            total += info.file_size
            if total > size:
                raise BadInput(f"{where}: its records declare more bytes than the file's {size}")


def decompress_zstd(data: bytes, cap: int, where: str) -> bytes:
    """A zstd frame inflated as a stream that is stopped at `cap` bytes of output: a frame that would inflate
    beyond it is refused there, whatever its header claims, and never costs more than `cap` of memory."""
    import io

    import zstandard

    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as r:
            result = r.read(cap + 1)
    except zstandard.ZstdError as e:
        raise BadInput(f"{where}: not a zstd frame ({e})") from None
    if len(result) > cap:
        raise BadInput(f"{where}: inflates to more than {_size_words(cap)}, the most it may hold")
    return result


def printable(text: str) -> str:
    """`text` with its control characters other than newline and tab escaped (ESC as \\x1b, CR as \\r, ...): a
    name or a cell from outside, inside a message, cannot move the cursor, clear the screen or overwrite the line it
    is printed in. Every message line of the tools and every log record goes through it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)


def shown(value: object, limit: int = 200) -> str:
    """`value` as text safe to print on one line: every unprintable character escaped (newlines too), at most
    `limit` characters."""
    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def read_shard_file(path: str | os.PathLike, declared: int, where: str) -> bytes:
    """A shard file's bytes, read only when it is a regular file of exactly the size its (checked) index declares;
    DamagedData naming `where` otherwise."""
    try:
        data = read_bytes(path, "shard", cap=declared)
    except BadInput as e:
        raise DamagedData(
            f"{where}: {str(e).removeprefix(f'{path}: ')}; not as its index.json declares it — restore or reconvert it"
        ) from None
    if len(data) != declared:
        raise DamagedData(f"{where}: {len(data)} bytes, its index.json says {declared} — restore or reconvert it")
    return data


def inflate_shard(blob: bytes, compression: str | None, raw_bytes: int, where: str) -> bytes:
    """A compressed shard inflated, never past the raw size its (checked) index declares (`check_index` bounds
    that by the manifest's geometry): a shard that would inflate further is refused there, before it costs more
    memory or cache than its samples may. DamagedData naming `where` otherwise."""
    if compression != "zstd":
        raise DamagedData(f"{where}: compression {compression!r} is not convert_data's (zstd)")
    try:
        data = decompress_zstd(blob, raw_bytes, where)
    except BadInput as e:
        raise DamagedData(f"{e} (its index.json declares {raw_bytes} bytes) — restore or reconvert it") from None
    if len(data) != raw_bytes:
        raise DamagedData(
            f"{where}: inflates to {len(data)} bytes, its index.json says {raw_bytes} — restore or reconvert it"
        )
    return data
