"""Checkpoints on object storage: `checkpoint_dir: s3://bucket/prefix` (docs/training.md, "Checkpoints on object
storage").

Composer still writes each checkpoint into `<run_dir>/checkpoints` (a node-local disk will do); the run then puts it
under the prefix and commits it:

    <prefix>/run.json                            the run record (signature + lineage), as in the run folder
    <prefix>/owner.json                          the launch that owns the prefix (the guard, below)
    <prefix>/checkpoints/ep{E}-ba{B}-rank0.pt    DDP: rank 0's file
    <prefix>/checkpoints/ep{E}-ba{B}/...         FSDP: every rank's DCP shard, and the .metadata
    <prefix>/checkpoints/latest                  the name of the newest committed checkpoint: the commit point
    <prefix>/step-N.safetensors                  exports

A checkpoint is committed once every rank has uploaded what it wrote (a barrier) and rank 0 has rewritten `latest`
(one PUT, which S3 makes atomic). Objects of a checkpoint newer than `latest` are an upload cut short: the next
start deletes them, so they are never loaded. Rotation (`keep_checkpoints`) applies to the remote checkpoints as
to the local ones, across restarts. A start whose local folder lacks the newest committed checkpoint (a fresh
machine, an empty run folder) downloads it first; the run record comes from the prefix too, so the run signature
is checked against the run that wrote the checkpoints.

The guard against two live runs on one prefix: each launch writes a fresh id to owner.json when it starts, and
each commit first reads it back. A launch that finds another id there (a second launch started on the prefix)
commits nothing and stops with exit code 3. The newest launch wins, so a relaunch after a crash is never refused;
S3 has no lock, so the older launch runs on until its next checkpoint, and its uncommitted uploads are removed by
the next start.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from gcc.data import storage
from gcc.train.run_folder import (CKPT_RE, Refusal, checkpoint_step, ckpt_dir, disk_gb, is_complete,
                                  point_latest, remove_checkpoint, to_rotate)

logger = logging.getLogger(__name__)

LATEST_OBJECT = "latest"


class TakenOver(Exception):
    """Another launch claimed the prefix: this one commits nothing more (exit code 3)."""


class CheckpointStore:
    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.ckpts = storage.join(self.url, "checkpoints")

    def _object(self, *parts: str) -> str:
        return storage.join(self.url, *parts)

    # ---- run record and owner -------------------------------------------------------------------------
    def read_record(self) -> dict[str, Any] | None:
        url = self._object("run.json")
        return json.loads(storage.read_bytes(url)) if storage.exists(url) else None

    def write_record(self, record: dict[str, Any]) -> None:
        storage.write_bytes(self._object("run.json"), json.dumps(record, indent=1, sort_keys=True).encode())

    def claim(self) -> str:
        """Make this launch the prefix's owner; returns its id."""
        launch = uuid.uuid4().hex
        owner = {"launch": launch, "host": socket.gethostname(), "pid": os.getpid(),
                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        storage.write_bytes(self._object("owner.json"), json.dumps(owner).encode())
        return launch

    def check_owner(self, launch: str) -> None:
        owner = json.loads(storage.read_bytes(self._object("owner.json")))
        if owner.get("launch") != launch:
            raise TakenOver(f"{self.url}: another launch claimed this checkpoint prefix (pid {owner.get('pid')} on "
                            f"{owner.get('host')}, started {owner.get('started')}); this launch commits nothing more "
                            f"and stops. Two live runs must not share a checkpoint_dir")

    # ---- checkpoints ----------------------------------------------------------------------------------
    def checkpoints(self) -> dict[str, list[str]]:
        """Checkpoint name -> its object keys (relative to <prefix>/checkpoints), in step order."""
        found: dict[str, list[str]] = {}
        for key in storage.list_prefix(self.ckpts):
            head = key.split("/", 1)[0]
            if CKPT_RE.match(head):
                found.setdefault(head, []).append(key)
        return dict(sorted(found.items(), key=lambda kv: checkpoint_step(kv[0])))

    def latest(self) -> str | None:
        url = storage.join(self.ckpts, LATEST_OBJECT)
        return storage.read_bytes(url).decode().strip() if storage.exists(url) else None

    def upload(self, local: Path, key: str) -> None:
        storage.upload_file(str(local), storage.join(self.ckpts, key))

    def upload_export(self, local: Path) -> None:
        storage.upload_file(str(local), self._object(local.name))

    def commit(self, name: str, launch: str) -> None:
        self.check_owner(launch)
        storage.write_bytes(storage.join(self.ckpts, LATEST_OBJECT), name.encode())

    def _delete(self, names: list[str], ckpts: dict[str, list[str]]) -> None:
        storage.delete_keys(self.ckpts, [k for n in names for k in ckpts[n]])

    def repair(self) -> str | None:
        """Delete the objects of checkpoints newer than `latest` (uploads cut short); returns `latest`."""
        latest, ckpts = self.latest(), self.checkpoints()
        newer = [n for n in ckpts if latest is None or checkpoint_step(n) > checkpoint_step(latest)]
        if newer:
            logger.info(f"checkpoints: removing uncommitted uploads {', '.join(newer)} from {self.ckpts}")
            self._delete(newer, ckpts)
        return latest

    def rotate(self, keep: int) -> list[str]:
        latest, ckpts = self.latest(), self.checkpoints()
        doomed = to_rotate(list(ckpts), latest, keep) if latest is not None else []
        self._delete(doomed, ckpts)
        return doomed

    def whole_here(self, name: str, run_dir: Path) -> bool:
        """Whether <run_dir>/checkpoints holds every file of the remote checkpoint `name`: a node-local run folder
        of a sharded run holds only its own ranks' shards."""
        local = ckpt_dir(run_dir) / name
        keys = self.checkpoints().get(name, [])
        return local.exists() and is_complete(local) and all((ckpt_dir(run_dir) / k).exists() for k in keys)

    def fetch(self, name: str, run_dir: Path) -> Path:
        """Download checkpoint `name` into <run_dir>/checkpoints (under a temporary name, renamed when whole) and
        point `latest` at it."""
        keys = self.checkpoints().get(name)
        if not keys:
            raise Refusal(f"{self.ckpts}/{LATEST_OBJECT} names {name}, which has no objects there; the prefix was "
                          f"changed by hand")
        clear_fetch_leftovers(run_dir)
        dest = ckpt_dir(run_dir) / name
        tmp = dest.with_name(f".{name}.fetch{os.getpid()}")
        t0 = time.perf_counter()
        for key in keys:
            rel = key[len(name):].lstrip("/")  # "" for a DDP file, the shard's name in a DCP folder
            storage.download_file(storage.join(self.ckpts, key), str(tmp / rel if rel else tmp))
        if dest.exists():
            remove_checkpoint(dest)
        os.replace(tmp, dest)
        point_latest(run_dir, name)
        logger.info(f"checkpoints: fetched {name} from {self.ckpts} ({disk_gb(dest):.3g} GB in "
                    f"{time.perf_counter() - t0:.1f} s)")
        return dest


def store_for(checkpoint_dir: str) -> CheckpointStore | None:
    """The store of a `checkpoint_dir` setting: None when it is empty (checkpoints only in the run folder)."""
    return CheckpointStore(checkpoint_dir) if checkpoint_dir else None


def clear_fetch_leftovers(run_dir: Path) -> None:
    """A fetch cut short leaves its temporary name; nothing reads it, the next start removes it."""
    d = ckpt_dir(run_dir)
    for p in d.glob(".*.fetch*") if d.exists() else []:
        remove_checkpoint(p)
