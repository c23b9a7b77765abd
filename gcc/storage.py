"""Local paths and s3:// URLs behind one small interface.

S3 uses boto3 with the endpoint from `S3_ENDPOINT_URL`, the same variable Streaming's own up/downloaders
read, so one setting points the converter, the loader and Streaming at the same store. Every S3 client here and
Streaming's shard downloads (`BoundedS3Downloader`) retry with botocore's standard mode, a bounded number of
times (`s3_config`); a store that still does not answer raises `StorageUnavailable` naming the object.
Writes are atomic where the store allows: local files go through one writer (`atomic_path`, `atomic_write`,
`atomic_copy`: a temporary in the destination folder created with O_CREAT|O_EXCL|O_NOFOLLOW, fsync, rename,
fsync of the folder), which never writes through a symbolic link: neither the destination nor a folder between
the output root and it may be one (docs/training.md, "Trust and safety"); an S3 PUT is atomic. Every file the
project must never leave half-written goes through it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import stat
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gcc import inputs
from gcc.errors import BadInput, StorageUnavailable, disk_full, is_unreachable


def umask() -> int:
    """This process's umask, read without changing it (os.umask can only be read by setting it, which would race
    with other threads creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


class LinkRefused(BadInput):
    """A write whose destination, or a folder on its way inside the output root, is a symbolic link (or not a
    folder): gcc never writes through one (docs/training.md, "Trust and safety"). The message names it."""


def _refuse(where: Path, root: Path, found: str) -> LinkRefused:
    return LinkRefused(f"{where}: {found} inside {root}; gcc never writes through one (remove it, or write elsewhere)")


def _what_is(dir_fd: int, name: str) -> str:
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    return "a folder" if stat.S_ISDIR(st.st_mode) else "not a folder"


def open_folder(root: str | os.PathLike, rel: str | os.PathLike = "") -> int:
    """A descriptor of the folder `root/rel`, each folder of `rel` created if missing and opened without following a
    link: one that is a link or not a folder is refused, naming it (LinkRefused). `root` itself is trusted (the
    output folder the user named, created if missing). `rel` must stay inside `root` (no absolute path, no `..`)."""
    root = Path(root)
    parts = Path(rel).parts
    if Path(rel).is_absolute() or ".." in parts:
        raise LinkRefused(f"{root / rel}: not inside {root}")
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    where = root
    try:
        for part in parts:
            where = where / part
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=fd)
            try:
                sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refuse(where, root, _what_is(fd, part)) from None
                raise
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def _create_exclusive(dir_fd: int, name: str) -> int:
    """`name` in the folder `dir_fd`, created by this call (O_EXCL) and never through a link (O_NOFOLLOW). A leftover
    of a killed process of the same pid is unlinked first (unlinking a link removes the link, not its target)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, 0o600, dir_fd=dir_fd)
    except FileExistsError:
        os.unlink(name, dir_fd=dir_fd)
        return os.open(name, flags, 0o600, dir_fd=dir_fd)


@contextmanager
def _exclusive_temporary(
    path: str | os.PathLike, mode: int | None, suffix: str, root: str | os.PathLike | None
) -> Iterator[tuple[Path, int]]:
    """The one writer (module docstring): (the temporary's path, its descriptor open for writing)."""
    path = Path(path)
    if root is None:
        folder = open_folder(path.parent)
        shown_root = path.parent
    else:
        try:
            rel = path.parent.relative_to(root)
        except ValueError:
            raise LinkRefused(f"{path}: not inside {root}") from None
        folder = open_folder(root, rel)
        shown_root = Path(root)
    tmp_name = f"{path.name}.tmp{os.getpid()}{suffix}"
    try:
        if _what_is(folder, path.name) == "a symbolic link":
            raise _refuse(path, shown_root, "a symbolic link")
        try:
            fd = _create_exclusive(folder, tmp_name)
            try:
                yield path.with_name(tmp_name), fd
            finally:
                os.close(fd)
            # the writer may have replaced the temporary (a library writing its own temporary, then renaming): the
            # name is opened again, never through a link, and must be a regular file
            try:
                fd = os.open(tmp_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
                fd = -1
            try:
                if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise LinkRefused(f"{path.with_name(tmp_name)}: not a regular file once written")
                os.fsync(fd)
                os.fchmod(fd, mode if mode is not None else 0o666 & ~umask())
            finally:
                if fd >= 0:
                    os.close(fd)
            os.replace(tmp_name, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException as e:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name, dir_fd=folder)
            full = disk_full(e, path.parent, str(path)) if isinstance(e, Exception) else None
            if full is not None:
                raise full from e
            raise
        os.fsync(folder)
    finally:
        os.close(folder)


@contextmanager
def atomic_path(
    path: str | os.PathLike, mode: int | None = None, suffix: str = "", root: str | os.PathLike | None = None
) -> Iterator[Path]:
    """A temporary name beside `path` to write to (`<name>.tmp<pid><suffix>`, created empty by this call: two
    processes never share one; `suffix` for writers that choose the format by the extension, e.g. ".mp4" for
    ffmpeg). When the block ends normally the file is fsynced, renamed over `path` and the folder fsynced, so a
    reader (or a relaunch after a crash) sees the old file or the whole new one; if it raises, the temporary is
    removed (and a write that found the disk full raises DiskFull naming `path`). The file gets `mode`, by default
    what the user's umask gives a new file (0o644 under the usual 022), whatever mode its writer created it with.

    Never through a link: `path` itself must not be one, nor any folder between `root` (the output folder the
    caller writes into; default: `path`'s own folder) and `path` (LinkRefused naming it; missing folders are
    created)."""
    with _exclusive_temporary(path, mode, suffix, root) as (tmp, _):
        yield tmp


def atomic_write(
    path: str | os.PathLike, data: bytes | str, mode: int | None = None, root: str | os.PathLike | None = None
) -> None:
    """`data` into `path` through `atomic_path`'s writer, written to the descriptor it created."""
    data = data.encode() if isinstance(data, str) else data
    with _exclusive_temporary(path, mode, "", root) as (_, fd), open(fd, "wb", closefd=False) as f:
        f.write(data)


def atomic_copy(src: str | os.PathLike, path: str | os.PathLike, root: str | os.PathLike | None = None) -> None:
    """A copy of the file `src` into `path` through `atomic_path`'s writer (never through a link, never half
    written)."""
    with (
        open(src, "rb") as source,
        _exclusive_temporary(path, None, "", root) as (_, fd),
        open(fd, "wb", closefd=False) as f,
    ):
        shutil.copyfileobj(source, f, 1 << 24)


def _not_own_file(st: os.stat_result, folder: str | os.PathLike) -> str | None:
    """Why a file with these stats must not be written in place (`open_in_place`): not a regular file, a file
    with other names (a hard link: a write changes it under each of them), or a file of another user than this one
    and the owner of its `folder` (a run folder's owner, when a teammate relaunches the run). None if it may."""
    if not stat.S_ISREG(st.st_mode):
        return f"{inputs.kind_of(st.st_mode)}, not a regular file"
    if st.st_nlink != 1:
        return f"a file with {st.st_nlink} names (hard links): a write would change it under the others too"
    if st.st_uid != os.geteuid() and st.st_uid != os.stat(folder).st_uid:
        return f"a file of another user (uid {st.st_uid}), not of this one ({os.geteuid()}) nor of its folder's"
    return None


def in_place_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be written in place (`open_in_place`'s rule, checked without opening it: before a launch
    writes anything): a symbolic link, or `_not_own_file`. None if it can, or if it does not exist."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    return _not_own_file(st, os.path.dirname(os.path.abspath(path)))


def open_in_place(path: str | os.PathLike, flags: int, mode: int = 0o666) -> int:
    """A file gcc writes in place rather than by `atomic_path` (appends to: train.log, a CSV log, a stacks file;
    truncates: a lock file), opened with `flags` (O_CREAT added), never through a link: a symbolic link is not
    followed (O_NOFOLLOW) and, once open, it must be a regular file with no other name, of this user or of its
    folder's owner (`_not_own_file`), or LinkRefused names it. Opened without blocking: a FIFO is refused, not waited
    on. Returns the descriptor (close-on-exec, blocking); another OSError of the open itself is raised as is."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LinkRefused(f"{path}: a symbolic link, which gcc never writes through") from None
        if e.errno == errno.ENXIO:  # a FIFO without a reader (O_NONBLOCK), a socket
            raise LinkRefused(f"{path}: not a regular file (a FIFO or a socket)") from None
        raise
    try:
        problem = _not_own_file(os.fstat(fd), os.path.dirname(os.path.abspath(path)))
        if problem is not None:
            raise LinkRefused(f"{path}: {problem}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


NAME_MAX, PATH_MAX = 255, 4096  # bytes of one path component and of a whole path (Linux)


def local_path_problem(path: str) -> str | None:
    """Why `path` cannot name a local file or folder: empty (it would be the current folder), a NUL character, a
    component over NAME_MAX bytes or a path over PATH_MAX bytes. None if it can."""
    if not path:
        return "empty, expected a folder"
    if "\0" in path:
        return "holds a NUL character"
    raw = os.fsencode(path)
    if len(raw) >= PATH_MAX:
        return f"{len(raw)} bytes long, more than a path may be ({PATH_MAX - 1})"
    long = next((c for c in raw.split(b"/") if len(c) > NAME_MAX), None)
    if long is not None:
        return f"a component of {len(long)} bytes, more than {NAME_MAX} ({long[:40].decode(errors='replace')}...)"
    return None


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def is_remote(url: str) -> bool:
    return "://" in str(url)


def join(root: str, *parts: str) -> str:
    root = str(root)
    if is_remote(root):
        return "/".join([root.rstrip("/")] + [p.strip("/") for p in parts])
    return str(Path(root, *parts))


# botocore's standard retry mode: exponential backoff with jitter (at most 20 s between attempts); 5 attempts take
# about 15 s of backoff in all. AWS_MAX_ATTEMPTS overrides the count.
S3_MAX_ATTEMPTS = 5
S3_CONNECT_TIMEOUT_S = 10


MAX_S3_ATTEMPTS = 100  # AWS_MAX_ATTEMPTS beyond this would make a store that does not answer a stall


def s3_attempts() -> int:
    """botocore's attempts at each request: AWS_MAX_ATTEMPTS, else S3_MAX_ATTEMPTS. A value that is not an integer
    in [1, MAX_S3_ATTEMPTS] is a BadInput naming the variable."""
    try:
        return inputs.env_int("AWS_MAX_ATTEMPTS", S3_MAX_ATTEMPTS, 1, MAX_S3_ATTEMPTS)
    except BadInput as e:
        raise BadInput(f"{e} (the attempts at each S3 request; unset, {S3_MAX_ATTEMPTS})") from None


def userinfo_problem(url: str) -> str | None:
    """Why `url` must not be used: it carries credentials (`s3://KEY:SECRET@bucket/p`), which would reach logs,
    files and error messages. None for a local path or a URL without user info. Every place a URL enters (the
    config's paths, the tools' flags, `bucket_problem`) asks this (docs/training.md, "Trust and safety")."""
    # one slash as well: a URL that went through pathlib (Path("s3://b") is "s3:/b") still names its store
    m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):/+(.*)", str(url), re.S)
    if m is None:
        return None
    scheme, rest = m.groups()
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    port = authority.rpartition(":")[2] if ":" in authority else ""
    # a secret may hold a '/' (AWS's do): then the '@' lies past the authority, which keeps 'KEY:part-of-SECRET'
    if "@" in authority or (":" in authority and (scheme.lower() == "s3" or not re.fullmatch("[0-9]+", port))):
        return (
            "a URL with credentials in it (user:password@) is refused: set them in the environment "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or an AWS profile"
        )
    return None


def s3_config(read_timeout: float = 60, unsigned: bool = False):
    # optional: boto3/botocore only for s3:// paths (local runs never load them)
    from botocore import UNSIGNED
    from botocore.config import Config

    extra = {"signature_version": UNSIGNED} if unsigned else {}
    return Config(
        retries={"mode": "standard", "total_max_attempts": s3_attempts()},
        connect_timeout=S3_CONNECT_TIMEOUT_S,
        read_timeout=read_timeout,
        **extra,
    )


def _s3():
    import boto3  # optional: only for s3:// paths (local runs never load it)

    return boto3.client("s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL") or None, config=s3_config())


def unavailable(where: str, e: BaseException) -> StorageUnavailable:
    """The error for a store that did not answer while reading `where` (after botocore's retries)."""
    return StorageUnavailable(
        f"{where}: object storage did not answer after {s3_attempts()} attempts ({type(e).__name__}: {e})"
    )


@contextmanager
def _unreachable_named(url: str) -> Iterator[None]:
    try:
        yield
    except Exception as e:
        if is_unreachable(e):
            raise unavailable(url, e) from None
        raise


def _split_s3(url: str) -> tuple[str, str]:
    obj = urllib.parse.urlparse(url)
    if obj.scheme != "s3":
        raise ValueError(f"{url}: only local paths and s3:// URLs are supported")
    return obj.netloc, obj.path.lstrip("/")


def exists(url: str) -> bool:
    if not is_remote(url):
        return os.path.exists(url)
    bucket, key = _split_s3(url)
    try:
        with _unreachable_named(url):
            _s3().head_object(Bucket=bucket, Key=key)
        return True
    except StorageUnavailable:
        raise
    except Exception as e:  # botocore ClientError 404 -> absent; anything else is a real error
        code = getattr(e, "response", {}).get("Error", {}).get("Code")
        if code in ("404", "NoSuchKey", "NotFound"):
            return False
        raise


def bucket_problem(url: str) -> str | None:
    """What keeps the store from serving the s3:// URL `url` (a URL of another scheme, no credentials, a bucket
    that does not exist or refuses them), checked with one HEAD of its bucket; None when it is usable. A store
    that does not answer raises StorageUnavailable."""
    try:
        bucket, _ = _split_s3(url)
    except ValueError:
        return "only local paths and s3://bucket/prefix URLs are supported"
    problem = userinfo_problem(url)
    if problem:
        return problem
    try:
        s3_attempts()
    except BadInput as e:
        return str(e)
    if not bucket:
        return "no bucket name (expected s3://bucket/prefix)"
    from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError  # optional: s3:// only

    try:
        client = _s3()
    except ValueError as e:  # botocore: "Invalid endpoint: ..."
        return f"S3_ENDPOINT_URL={os.environ.get('S3_ENDPOINT_URL')!r} is not a usable endpoint ({e})"
    try:
        with _unreachable_named(url):
            client.head_bucket(Bucket=bucket)
    except (NoCredentialsError, PartialCredentialsError) as e:
        return f"no S3 credentials ({e}; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or an AWS profile)"
    except ClientError as e:
        code = str(e.response.get("Error", {}).get("Code"))
        if code in ("404", "NoSuchBucket", "NotFound"):
            return f"bucket {bucket!r} does not exist"
        if code in ("403", "AccessDenied", "Forbidden"):
            return f"bucket {bucket!r} refuses these credentials (access denied)"
        return f"bucket {bucket!r}: {e}"
    return None


def read_bytes(url: str, kind: str = "json", cap: int | None = None) -> bytes:
    """The whole of a file or object of at most `cap` bytes (by default the cap of `kind`, gcc.inputs.CAPS): a
    local one through `gcc.inputs.read_bytes` (a regular file only), an object through `_get_capped`."""
    if not is_remote(url):
        return inputs.read_bytes(url, kind, cap)
    with _unreachable_named(url):
        return _get_capped(url, kind, cap)[0]


def _get_capped(url: str, kind: str, cap: int | None = None) -> tuple[bytes, str]:
    """An object's bytes and ETag, refused by its declared length and read no further than the cap of `kind`
    (gcc.inputs.CAPS) whatever it says: a BadInput naming it. Every whole-object read of gcc goes through here."""
    cap = inputs.CAPS[kind] if cap is None else cap
    bucket, key = _split_s3(url)
    got = _s3().get_object(Bucket=bucket, Key=key)
    body = got["Body"]
    try:
        if int(got.get("ContentLength") or 0) > cap:
            raise BadInput(f"{url}: {got['ContentLength']} bytes, larger than a {kind} object may be ({cap})")
        data = body.read(cap + 1)
    finally:
        body.close()
    if len(data) > cap:
        raise BadInput(f"{url}: larger than a {kind} object may be ({cap} bytes)")
    return data, got.get("ETag", "")


def write_bytes(url: str, data: bytes, mode: int | None = None, root: str | None = None) -> None:
    """Atomic write: a reader sees the old file, or the complete new one, never part of it. Local: `atomic_write`
    (never through a link between `root` and the file)."""
    if is_remote(url):
        bucket, key = _split_s3(url)
        with _unreachable_named(url):
            _s3().put_object(Bucket=bucket, Key=key, Body=data)
        return
    atomic_write(url, data, mode, root)


def upload_file(local: str, url: str, root: str | None = None) -> None:
    """The file `local` to `url`: an S3 PUT, or locally `atomic_copy` (never through a link between `root` and
    `url`, never half written)."""
    if is_remote(url):
        bucket, key = _split_s3(url)
        with _unreachable_named(url):
            _s3().upload_file(str(local), bucket, key)
    else:
        atomic_copy(local, url, root)


def download_file(url: str, local: str) -> None:
    if is_remote(url):
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        bucket, key = _split_s3(url)
        with _unreachable_named(url):
            _s3().download_file(bucket, key, str(local))
    else:
        atomic_copy(url, local)


def remove_tree(url: str) -> None:
    """Delete a folder (local) or every object under a prefix (S3)."""
    if not is_remote(url):
        shutil.rmtree(url, ignore_errors=True)
        return
    delete_keys(url, list_prefix(url))


def list_prefix(url: str) -> list[str]:
    """The keys of every object under the S3 prefix `url`, relative to it, sorted."""
    bucket, prefix = _split_s3(url)
    prefix = prefix.rstrip("/") + "/"
    with _unreachable_named(url):
        pages = _s3().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"][len(prefix) :] for page in pages for o in page.get("Contents", []))


def delete_keys(url: str, keys: list[str]) -> None:
    """Delete the objects `url`/key for each key (S3), 1000 a request (the API's limit)."""
    bucket, prefix = _split_s3(url)
    prefix = prefix.rstrip("/") + "/"
    client = _s3()
    for i in range(0, len(keys), 1000):
        with _unreachable_named(url):
            client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": prefix + k} for k in keys[i : i + 1000]]})


# ---- conditional writes (S3 If-Match / If-None-Match): the checkpoint commit log (gcc/training/checkpoint/store.py)
def error_code(e: BaseException) -> str | None:
    return getattr(e, "response", {}).get("Error", {}).get("Code")


# 412; 409 when a concurrent conditional write won; 404 for If-Match on an object deleted since it was read
_LOST_RACE = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409", "NoSuchKey", "404")


def read_with_etag(url: str, kind: str = "json") -> tuple[bytes, str] | None:
    """An S3 object's bytes (at most the cap of `kind`, as `read_bytes`) and its ETag (what a conditional write
    names), or None when it does not exist."""
    try:
        with _unreachable_named(url):
            return _get_capped(url, kind)
    except (StorageUnavailable, BadInput):
        raise
    except Exception as e:
        if error_code(e) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def _put_conditional(url: str, data: bytes, etag: str | None) -> str | None:
    bucket, key = _split_s3(url)
    condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
    try:
        return _s3().put_object(Bucket=bucket, Key=key, Body=data, **condition)["ETag"]
    except Exception as e:
        if error_code(e) in _LOST_RACE:
            return None
        raise


def put_if(url: str, data: bytes, etag: str | None) -> str | None:
    """PUT `data` only if the object is still the one read with `etag` (If-Match), or, with etag None, only if it
    does not exist (If-None-Match: *). Returns the new object's ETag, or None when another writer got there first.
    A store that ignores these headers writes unconditionally: `honours_conditions` tells."""
    with _unreachable_named(url):
        return _put_conditional(url, data, etag)


def honours_conditions(url: str) -> bool:
    """Whether the store behind `url` refuses a PUT whose If-Match names another ETag (AWS S3 does; some
    S3-compatible stores ignore the header and write, or answer 501). Writes the scratch object `url`."""
    write_bytes(url, b"a conditional PUT naming another ETag must fail here\n")
    try:
        return _put_conditional(url, b"written: this store ignores If-Match\n", '"' + "0" * 32 + '"') is None
    except Exception as e:
        if error_code(e) in ("NotImplemented", "501"):
            return False
        if is_unreachable(e):
            raise unavailable(url, e) from None
        raise
