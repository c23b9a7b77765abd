"""Local paths and s3:// URLs behind one small interface.

S3 uses boto3 with the endpoint from `S3_ENDPOINT_URL`, the same variable Streaming's own up/downloaders
read, so one setting points the converter, the loader and Streaming at the same store.
Writes are atomic where the store allows: local files go through `.tmp` + fsync + rename; an S3 PUT is atomic.
"""
from __future__ import annotations

import os
import shutil
import urllib.parse
from pathlib import Path


def is_remote(url: str) -> bool:
    return "://" in str(url)


def join(root: str, *parts: str) -> str:
    root = str(root)
    if is_remote(root):
        return "/".join([root.rstrip("/")] + [p.strip("/") for p in parts])
    return str(Path(root, *parts))


def _s3():
    import boto3

    return boto3.client("s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL") or None)


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
        _s3().head_object(Bucket=bucket, Key=key)
        return True
    except Exception as e:  # botocore ClientError 404 -> absent; anything else is a real error
        code = getattr(e, "response", {}).get("Error", {}).get("Code")
        if code in ("404", "NoSuchKey", "NotFound"):
            return False
        raise


def read_bytes(url: str) -> bytes:
    if not is_remote(url):
        return Path(url).read_bytes()
    bucket, key = _split_s3(url)
    return _s3().get_object(Bucket=bucket, Key=key)["Body"].read()


def write_bytes(url: str, data: bytes, mode: int = 0o644) -> None:
    """Atomic write: a reader sees the old file, or the complete new one, never part of it."""
    if is_remote(url):
        bucket, key = _split_s3(url)
        _s3().put_object(Bucket=bucket, Key=key, Body=data)
        return
    path = Path(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def upload_file(local: str, url: str) -> None:
    if is_remote(url):
        bucket, key = _split_s3(url)
        _s3().upload_file(str(local), bucket, key)
    else:
        Path(url).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, url)


def download_file(url: str, local: str) -> None:
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    if is_remote(url):
        bucket, key = _split_s3(url)
        _s3().download_file(bucket, key, str(local))
    else:
        shutil.copyfile(url, local)


def remove_tree(url: str) -> None:
    """Delete a folder (local) or every object under a prefix (S3)."""
    if not is_remote(url):
        shutil.rmtree(url, ignore_errors=True)
        return
    bucket, prefix = _split_s3(url)
    client = _s3()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
