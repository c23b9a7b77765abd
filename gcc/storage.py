"""Local paths and s3:// URLs behind one small interface.

S3 uses boto3 with the endpoint from `S3_ENDPOINT_URL`, the same variable Streaming's own up/downloaders
read, so one setting points the converter, the loader and Streaming at the same store. Every S3 client here and
Streaming's shard downloads (`BoundedS3Downloader`) retry with botocore's standard mode, a bounded number of
times (`s3_config`); a store that still does not answer raises `StorageUnavailable` naming the object.
Writes are atomic where the store allows: local files go through `atomic_path` (a temporary name, fsync,
rename, fsync of the folder); an S3 PUT is atomic. Every file the project must never leave half-written goes
through `atomic_path` / `atomic_write`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gcc import inputs
from gcc.errors import BadInput, StorageUnavailable, disk_full, is_unreachable


def fsync_dir(d: str | os.PathLike) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


@contextmanager
def atomic_path(path: str | os.PathLike, mode: int | None = None, suffix: str = "") -> Iterator[Path]:
    """A temporary name beside `path` to write to (`<name>.tmp<pid><suffix>`: two processes never share one;
    `suffix` for writers that choose the format by the extension, e.g. ".mp4" for ffmpeg). When the
    block ends normally the file is fsynced, renamed over `path` and the folder fsynced, so a reader (or a
    relaunch after a crash) sees the old file or the whole new one; if it raises, the temporary is removed (and a
    write that found the disk full raises DiskFull naming `path`). The file gets `mode`, by default what the
    user's umask gives a new file (0o644 under the usual 022), whatever mode its writer created it with."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}{suffix}")
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, mode if mode is not None else 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        full = disk_full(e, path.parent, str(path)) if isinstance(e, Exception) else None
        if full is not None:
            raise full from e
        raise
    fsync_dir(path.parent)


def atomic_write(path: str | os.PathLike, data: bytes | str, mode: int | None = None) -> None:
    with atomic_path(path, mode) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


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


def s3_attempts() -> int:
    return int(os.environ.get("AWS_MAX_ATTEMPTS") or S3_MAX_ATTEMPTS)


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
    local one through `gcc.inputs.read_bytes` (a regular file only), an object refused by its declared length
    and read no further than the cap, whatever it says (a BadInput naming it)."""
    if not is_remote(url):
        return inputs.read_bytes(url, kind, cap)
    cap = inputs.CAPS[kind] if cap is None else cap
    bucket, key = _split_s3(url)
    with _unreachable_named(url):
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
    return data


def write_bytes(url: str, data: bytes, mode: int | None = None) -> None:
    """Atomic write: a reader sees the old file, or the complete new one, never part of it."""
    if is_remote(url):
        bucket, key = _split_s3(url)
        with _unreachable_named(url):
            _s3().put_object(Bucket=bucket, Key=key, Body=data)
        return
    atomic_write(url, data, mode)


def upload_file(local: str, url: str) -> None:
    if is_remote(url):
        bucket, key = _split_s3(url)
        with _unreachable_named(url):
            _s3().upload_file(str(local), bucket, key)
    else:
        Path(url).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, url)


def download_file(url: str, local: str) -> None:
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    if is_remote(url):
        bucket, key = _split_s3(url)
        with _unreachable_named(url):
            _s3().download_file(bucket, key, str(local))
    else:
        shutil.copyfile(url, local)


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


# ---- conditional writes (S3 If-Match / If-None-Match): the checkpoint commit log (gcc/training/checkpoint_store.py)
def error_code(e: BaseException) -> str | None:
    return getattr(e, "response", {}).get("Error", {}).get("Code")


# 412; 409 when a concurrent conditional write won; 404 for If-Match on an object deleted since it was read
_LOST_RACE = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409", "NoSuchKey", "404")


def read_with_etag(url: str) -> tuple[bytes, str] | None:
    """An S3 object's bytes and its ETag (what a conditional write names), or None when it does not exist."""
    bucket, key = _split_s3(url)
    try:
        with _unreachable_named(url):
            got = _s3().get_object(Bucket=bucket, Key=key)
            return got["Body"].read(), got["ETag"]
    except StorageUnavailable:
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
