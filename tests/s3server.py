"""A real S3 server (moto's standalone `moto_server`) on loopback, one per test session and xdist worker.

Tests talk to it over HTTP exactly as production talks to an S3-compatible store with a custom endpoint:
through `S3_ENDPOINT_URL`, which both gcc.storage and Streaming's downloaders read.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import suppress
from pathlib import Path

import psutil

RUNNING = re.compile(r"Running on http://127\.0\.0\.1:(\d+)")


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` itself listens on TCP `port` (not another process that holds it)."""
    with suppress(psutil.Error):
        return any(
            c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in psutil.Process(pid).net_connections("tcp")
        )
    return False


class S3Server:
    def __init__(self) -> None:
        self.port = 0  # the first start binds port 0: the system gives a free port, and the server says which
        self.start()

    def start(self) -> None:
        """Start serving: on the port the system gives the first time, on the same port again after `stop` (a
        restarted moto server is empty). The port is the one this server's own process reports (werkzeug's
        "Running on" line) and listens on; no port is picked beforehand and handed over, where another process
        could take it in between."""
        exe = Path(sys.executable).with_name("moto_server")
        self.log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(self.port)], stdout=subprocess.DEVNULL, stderr=self.log
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            said = RUNNING.search(Path(self.log.name).read_text(errors="replace"))
            if said and listens(self.proc.pid, int(said[1])):
                self.port = int(said[1])
                self.endpoint = f"http://127.0.0.1:{self.port}"
                return
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"moto_server exited with {self.proc.returncode}: {Path(self.log.name).read_text()[-2000:]}"
                )
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("moto_server did not start within 30 s")

    def env(self) -> dict[str, str]:
        return {
            "S3_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def new_bucket(self, name: str | None = None) -> str:
        """A fresh bucket per test keeps parallel tests apart."""
        name = name or f"gcc-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def upload_tree(self, local: Path, bucket: str, prefix: str) -> str:
        """Every file under `local`, byte for byte, to s3://bucket/prefix/...; returns that URL."""
        client = self.client()
        for f in sorted(p for p in Path(local).rglob("*") if p.is_file()):
            client.upload_file(str(f), bucket, f"{prefix}/{f.relative_to(local).as_posix()}")
        return f"s3://{bucket}/{prefix}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


def apply_env(server: S3Server) -> dict[str, str | None]:
    """Point this process at the server; returns the previous values for restoring."""
    old = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    return old
