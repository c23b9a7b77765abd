"""Checkpoints on object storage: `save_folder: s3://bucket/prefix` (docs/training.md, "Checkpoints on object
storage").

Composer still writes each checkpoint into `<run_dir>/checkpoints` (a node-local disk will do); the run then puts it
under the prefix and commits it. The prefix is a commit log whose head is one object:

    <prefix>/run.json                            the run record (signature + lineage), as in the run folder
    <prefix>/checkpoints/latest                  the head: the launch that owns the prefix, the newest committed
                                                 checkpoint and its manifest (size and sha256 of each object)
    <prefix>/checkpoints/ep{E}-ba{B}-rank0.pt    DDP: rank 0's file
    <prefix>/checkpoints/ep{E}-ba{B}/...         FSDP: every rank's DCP shard __{R}_0.distcp, and the .metadata
    <prefix>/step-N.safetensors                  exports
    <prefix>/write-probe                         scratch: whether the store honours conditional writes

Claim and commit both rewrite the head, each with a write conditional on the head being the one just read (S3
If-Match): a claim by a newer launch changes the head, so the older launch's next commit fails its precondition
(`TakenOver`, exit 3) instead of naming a checkpoint that the newer launch's start has removed. The newest launch
wins, so a relaunch after a crash is never refused. A launch claims only after every identity check has passed,
and checks that it still owns the prefix before uploading anything. Objects of a checkpoint newer than the head's
are an upload cut short: the owner's next start deletes them. A head that is missing while checkpoints are there,
or unreadable, is a refusal: nothing is deleted. Every key read from the prefix (listing, manifest) must have a
shape the layout above fixes; the committed checkpoint is downloaded, and a local copy trusted, only when each
file's size and sha256 match the manifest.

A store that ignores conditional writes gets the write followed by a re-read of the head (`commit`); what that
leaves open is in docs/training.md.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gcc import exit_codes, inputs, storage
from gcc.errors import BadInput, Refusal, StorageUnavailable
from gcc.training.checkpoint.files import checkpoint_step, ckpt_dir, disk_gb, point_latest, remove_checkpoint, to_rotate

logger = logging.getLogger(__name__)

HEAD_OBJECT = "latest"
HEAD_FORMAT = 1
PROBE_OBJECT = "write-probe"
CLAIM_ATTEMPTS = 5
# the only objects a checkpoint has, relative to <prefix>/checkpoints: ASCII digits only, no other path
KEY_RE = re.compile(r"(ep[0-9]{1,18}-ba[0-9]{1,18})(-rank0\.pt|/__[0-9]{1,9}_0\.distcp|/\.metadata)")
NAME_RE = re.compile(r"ep[0-9]{1,18}-ba[0-9]{1,18}(-rank0\.pt)?")
SHA256_RE = re.compile(r"[0-9a-f]{64}")
KEY_SHAPES = "ep{E}-ba{B}-rank0.pt, ep{E}-ba{B}/__{R}_0.distcp or ep{E}-ba{B}/.metadata"


class TakenOver(Exception):
    """Another launch claimed the prefix: this one uploads and commits nothing more (exit code 3)."""

    exit_code = exit_codes.REFUSED


def checkpoint_of(key: str, where: str) -> str:
    """The checkpoint that `key` (relative to <prefix>/checkpoints) belongs to. Any other key, e.g. one holding `..`
    or an absolute path, is a Refusal naming it: it is never fetched."""
    m = KEY_RE.fullmatch(key)
    if m is None:
        raise Refusal(
            f"{where}/{key}: not an object of a gcc checkpoint (only {KEY_SHAPES}); the prefix was "
            f"written by something else. Remove the object, or use another save_folder"
        )
    return key if m.group(2) == "-rank0.pt" else m.group(1)


def check_manifest(name: str, files: Any, where: str) -> dict[str, dict[str, Any]]:
    """A checkpoint's manifest ({key: {"size": bytes, "sha256": hex}}) as read from `where`: every key one of
    checkpoint `name`'s, a DCP folder with its .metadata. A Refusal naming what is wrong otherwise."""
    if not isinstance(files, dict) or not files:
        raise Refusal(f"{where}: the manifest of {name} is not a non-empty mapping")
    for key, entry in files.items():
        m = KEY_RE.fullmatch(key)
        if m is None or checkpoint_of(key, where) != name:
            raise Refusal(
                f"{where}: the manifest of {name} lists {key!r}, not one of its objects (only {KEY_SHAPES} of {name})"
            )
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("size"), int)
            and entry["size"] >= 0
            and isinstance(entry.get("sha256"), str)
            and SHA256_RE.fullmatch(entry["sha256"])
        ):
            raise Refusal(f"{where}: the manifest entry of {key} is not {{size: bytes, sha256: hex}}: {entry!r}")
    if not name.endswith(".pt") and f"{name}/.metadata" not in files:
        raise Refusal(f"{where}: the manifest of {name} lacks {name}/.metadata")
    return files


@dataclass(frozen=True)
class Head:
    """<prefix>/checkpoints/latest: the launch that owns the prefix and the newest committed checkpoint."""

    launch: str
    owner: dict[str, Any]  # host, pid, started: for the messages
    checkpoint: str | None  # None: claimed, nothing committed yet
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # the checkpoint's manifest
    etag: str = ""  # as read: the precondition of the next write

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "format": HEAD_FORMAT,
                "launch": self.launch,
                "owner": self.owner,
                "checkpoint": self.checkpoint,
                "files": self.files,
            },
            indent=1,
            sort_keys=True,
        ).encode()

    def who(self) -> str:
        o = self.owner
        return f"pid {o.get('pid')} on {o.get('host')}, started {o.get('started')}"


def parse_head(data: bytes, etag: str, url: str) -> Head:
    """The head as read from `url`; a Refusal naming it when it is not one gcc writes."""
    text = data.decode(errors="replace").strip()
    if NAME_RE.fullmatch(text):
        raise Refusal(
            f"{url} names {text} without a manifest: a checkpoint prefix written by an earlier gcc, whose "
            f"checkpoints this one cannot verify. Finish the run with the gcc that wrote it, or point "
            f"save_folder at a new prefix (the run then resumes from its run folder's checkpoints)"
        )
    try:
        d = inputs.parse_json(text, url, "a commit record")
    except BadInput:  # not JSON, or nested deeper than any record gcc writes
        d = None
    if not (
        isinstance(d, dict)
        and d.get("format") == HEAD_FORMAT
        and isinstance(d.get("launch"), str)
        and isinstance(d.get("owner"), dict)
        and isinstance(d.get("files"), dict)
        and (d.get("checkpoint") is None or isinstance(d["checkpoint"], str))
    ):
        raise Refusal(
            f"{url}: unreadable (not the commit record gcc writes: JSON with format {HEAD_FORMAT}, launch, "
            f"owner, checkpoint, files), so which checkpoint is committed is unknown; nothing is deleted. "
            f"Restore it, or use another save_folder"
        )
    name = d["checkpoint"]
    if name is not None:
        if not NAME_RE.fullmatch(name):
            raise Refusal(f"{url}: names {name!r}, not a gcc checkpoint (ep{{E}}-ba{{B}}[-rank0.pt])")
        check_manifest(name, d["files"], url)
    elif d["files"]:
        raise Refusal(f"{url}: a manifest without a checkpoint")
    return Head(d["launch"], d["owner"], name, d["files"] if name else {}, etag)


def _differing(pairs: list[tuple[Path, dict[str, Any]]]) -> list[Path]:
    """The files whose size or sha256 differs from their manifest entry (missing ones included); hashed in threads
    (hashlib releases the GIL), so a resume checks a sharded checkpoint at the disk's pace."""

    def differs(pair: tuple[Path, dict[str, Any]]) -> bool:
        path, entry = pair
        if not path.is_file() or path.stat().st_size != entry["size"]:
            return True
        return storage.sha256_file(path) != entry["sha256"]

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(pairs)))) as pool:
        return [p for (p, _), bad in zip(pairs, pool.map(differs, pairs)) if bad]


class CheckpointStore:
    def __init__(self, url: str, conditional: bool | None = None):
        """`conditional`: whether the store honours If-Match; None = ask it once (`storage.honours_conditions`)."""
        self.url = url.rstrip("/")
        self.ckpts = storage.join(self.url, "checkpoints")
        self.head_url = storage.join(self.ckpts, HEAD_OBJECT)
        self._conditional = conditional

    def _object(self, *parts: str) -> str:
        return storage.join(self.url, *parts)

    @property
    def conditional(self) -> bool:
        if self._conditional is None:
            self._conditional = storage.honours_conditions(self._object(PROBE_OBJECT))
            if not self._conditional:
                logger.warning(
                    f"checkpoints: {self.url}: the store ignores conditional writes (If-Match); the "
                    f"guard between two launches falls back to re-reading (docs/training.md, "
                    f'"Checkpoints on object storage")'
                )
        return self._conditional

    # ---- run record ----------------------------------------------------------------------------------
    def read_record(self) -> dict[str, Any] | None:
        url = self._object("run.json")
        if not storage.exists(url):
            return None
        try:
            record = inputs.parse_json(storage.read_bytes(url, "json"), url, "a run record")
        except BadInput:  # larger than a run record, not a file, not UTF-8 or not JSON
            record = None
        if not (isinstance(record, dict) and isinstance(record.get("signature"), dict)):
            raise Refusal(f"{url}: unreadable (not the run record gcc writes: JSON with a signature)")
        return record

    def write_record(self, record: dict[str, Any]) -> None:
        storage.write_bytes(self._object("run.json"), json.dumps(record, indent=1, sort_keys=True).encode())

    # ---- the head: owner and commit ------------------------------------------------------------------
    def head(self) -> Head | None:
        try:
            got = storage.read_with_etag(self.head_url)
        except BadInput as e:  # larger than any head gcc writes
            raise Refusal(f"{e}: not the commit record gcc writes; the prefix was written by something else") from None
        return None if got is None else parse_head(got[0], got[1], self.head_url)

    def _write_head(self, new: Head, old: Head | None) -> bool:
        """Write `new` if the head is still `old` (conditional store); always, otherwise. Whether it was written."""
        if not self.conditional:
            storage.write_bytes(self.head_url, new.to_bytes())
            return True
        return storage.put_if(self.head_url, new.to_bytes(), old.etag if old is not None else None) is not None

    def claim(self) -> str:
        """Make this launch the prefix's owner, keeping the committed checkpoint; returns its id. Call it only once
        every identity check has passed: a refused launch must leave the prefix as it was."""
        launch = uuid.uuid4().hex
        owner = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        for _ in range(CLAIM_ATTEMPTS):
            head = self.head()
            if head is None:
                self._refuse_headless()
            new = Head(launch, owner, head.checkpoint if head else None, head.files if head else {})
            if self._write_head(new, head):
                return launch
            # a commit or another claim landed between the read and the write: read it again
        raise Refusal(
            f"{self.head_url}: changed under each of {CLAIM_ATTEMPTS} attempts to claim it; another "
            f"launch is writing this prefix. Two live runs must not share a save_folder"
        )

    def _refuse_headless(self) -> None:
        """No head: fine on a fresh prefix; with checkpoints there, which one is committed is unknown."""
        names = list(self.checkpoints())
        if names:
            raise Refusal(
                f"{self.head_url} is missing, but {self.ckpts} holds checkpoints ({', '.join(names)}): "
                f"which one is committed is unknown, so nothing is deleted or resumed. Restore it, or use "
                f"another save_folder"
            )

    def check_owner(self, launch: str) -> Head:
        """The head, if this launch still owns the prefix; TakenOver otherwise."""
        head = self.head()
        if head is None:
            raise TakenOver(f"{self.head_url} is gone; this launch commits nothing more and stops")
        if head.launch != launch:
            raise TakenOver(
                f"{self.url}: another launch claimed this checkpoint prefix ({head.who()}); this launch "
                f"uploads and commits nothing more and stops. Two live runs must not share a "
                f"save_folder"
            )
        return head

    def commit(self, name: str, files: dict[str, dict[str, Any]], launch: str) -> None:
        """Make checkpoint `name` (uploaded; `files` its manifest) the committed one, if this launch still owns
        the prefix. On a conditional store the write succeeds only if the head is the one the ownership check
        read, so a claim landing in between makes this commit fail (TakenOver) rather than point the head at what
        the claimer's start deletes. Otherwise: the write, then the head read back; a claim that landed after the
        write stands (TakenOver), one between the check and the write is overwritten (docs/training.md)."""
        check_manifest(name, files, f"commit of {name} to {self.head_url}")
        head = self.check_owner(launch)
        if not self._write_head(Head(launch, head.owner, name, files), head):
            self.check_owner(launch)
            raise TakenOver(
                f"{self.head_url}: changed while this launch committed {name}; it commits nothing more and stops"
            )
        if not self.conditional:
            self.check_owner(launch)

    # ---- checkpoints ----------------------------------------------------------------------------------
    def checkpoints(self) -> dict[str, list[str]]:
        """Checkpoint name -> its object keys (relative to <prefix>/checkpoints), in step order. Any key but the
        head and a checkpoint's objects is a Refusal naming it."""
        found: dict[str, list[str]] = {}
        for key in storage.list_prefix(self.ckpts):
            if key != HEAD_OBJECT:
                found.setdefault(checkpoint_of(key, self.ckpts), []).append(key)
        return dict(sorted(found.items(), key=lambda kv: checkpoint_step(kv[0])))

    def latest(self) -> str | None:
        """The committed checkpoint's name."""
        head = self.head()
        return head.checkpoint if head else None

    def upload(self, local: Path, key: str) -> dict[str, Any]:
        """Put one file of a checkpoint; returns its manifest entry (size, sha256: hashed while it uploads)."""
        checkpoint_of(key, self.ckpts)
        with ThreadPoolExecutor(max_workers=1) as pool:
            digest = pool.submit(storage.sha256_file, local)
            storage.upload_file(str(local), storage.join(self.ckpts, key))
            return {"size": local.stat().st_size, "sha256": digest.result()}

    def upload_export(self, local: Path, launch: str) -> None:
        """Put an export beside the checkpoints, if this launch still owns the prefix (TakenOver otherwise)."""
        self.check_owner(launch)
        storage.upload_file(str(local), self._object(local.name))

    def _delete(self, keys: list[str]) -> None:
        storage.delete_keys(self.ckpts, keys)

    def repair(self, launch: str) -> Head | None:
        """At this owner's start: delete the objects of checkpoints newer than the committed one (uploads cut short)
        and objects of the committed one that its manifest lacks; returns the head. A missing head with
        checkpoints present, or an unreadable one, is a Refusal: nothing is deleted."""
        head, ckpts = self.head(), self.checkpoints()
        if head is None:
            self._refuse_headless()
            return None
        if head.launch != launch:
            raise Refusal(
                f"{self.url}: another launch claimed this checkpoint prefix while this one was starting "
                f"({head.who()}). Two live runs must not share a save_folder"
            )
        committed = head.checkpoint
        newer = [n for n in ckpts if committed is None or checkpoint_step(n) > checkpoint_step(committed)]
        stray = [k for k in ([] if committed is None else ckpts.get(committed, [])) if k not in head.files]
        if newer or stray:
            logger.info(f"checkpoints: removing uncommitted uploads {', '.join(newer + stray)} from {self.ckpts}")
            self._delete([k for n in newer for k in ckpts[n]] + stray)
        return head

    def rotate(self, keep: int) -> list[str]:
        latest, ckpts = self.latest(), self.checkpoints()
        doomed = to_rotate(list(ckpts), latest, keep) if latest is not None else []
        self._delete([k for n in doomed for k in ckpts[n]])
        return doomed

    def _files(self, name: str, files: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
        """The manifest of checkpoint `name`: `files`, or the head's, which must name it."""
        if files is not None:
            return check_manifest(name, files, self.head_url)
        head = self.head()
        if head is None or head.checkpoint != name:
            raise Refusal(
                f"{self.head_url}: does not commit {name} (it commits "
                f"{head.checkpoint if head else 'nothing'}); another launch moved it"
            )
        return head.files

    def whole_here(self, name: str, run_dir: Path, files: dict[str, dict[str, Any]] | None = None) -> bool:
        """Whether <run_dir>/checkpoints holds committed checkpoint `name` file for file, each file's size and
        sha256 as its manifest says: a copy of the same name that differs (a node-local folder of a sharded run
        holds only its own ranks' shards; a launch that was taken over wrote its own) is not it."""
        files = self._files(name, files)
        local = ckpt_dir(run_dir)
        top = local / name
        have = (
            {f"{name}/{p.name}" for p in top.iterdir()}
            if top.is_dir() and not name.endswith(".pt")
            else {name}
            if top.is_file()
            else set()
        )
        return have == set(files) and not _differing([(local / k, e) for k, e in files.items()])

    def fetch(self, name: str, run_dir: Path, files: dict[str, dict[str, Any]] | None = None) -> Path:
        """Download committed checkpoint `name` into <run_dir>/checkpoints (under a temporary name, renamed when
        every file matches its manifest, replacing a local copy) and point `latest` at it."""
        files = self._files(name, files)
        clear_fetch_leftovers(run_dir)
        dest = ckpt_dir(run_dir) / name
        tmp = dest.with_name(f".{name}.fetch{os.getpid()}")
        t0 = time.perf_counter()
        got = []
        for key, entry in files.items():
            rel = key[len(name) :].lstrip("/")  # "" for a DDP file, the shard's name in a DCP folder
            target = tmp / rel if rel else tmp
            url = storage.join(self.ckpts, key)
            try:
                storage.download_file(url, str(target))
            except StorageUnavailable:
                raise
            except Exception as e:
                if storage.error_code(e) not in ("404", "NoSuchKey", "NotFound"):
                    raise
                remove_checkpoint(tmp)
                raise Refusal(
                    f"{url}: committed in {self.head_url} but missing; the prefix was changed after the commit"
                ) from None
            got.append((target, entry))
        bad = _differing(got)
        if bad:
            remove_checkpoint(tmp)
            keys = [f"{name}/{p.name}" if p != tmp else name for p in bad]
            raise Refusal(
                f"{self.ckpts}: {', '.join(keys)} differ from the manifest committed in {self.head_url} "
                f"(size or sha256): replaced after the commit. Nothing was resumed from them"
            )
        if dest.exists():
            remove_checkpoint(dest)
        os.replace(tmp, dest)
        point_latest(run_dir, name)
        logger.info(
            f"checkpoints: fetched {name} from {self.ckpts} ({disk_gb(dest):.3g} GB in "
            f"{time.perf_counter() - t0:.1f} s)"
        )
        return dest


def store_for(save_folder: str) -> CheckpointStore | None:
    """The store of a `save_folder` setting: None when it is empty (checkpoints only in the run folder). Built once
    a launch, by `launch.prepare_run` (`RunStart.store`)."""
    return CheckpointStore(save_folder) if save_folder else None


def clear_fetch_leftovers(run_dir: Path) -> None:
    """A fetch cut short leaves its temporary name; nothing reads it, the next start removes it."""
    d = ckpt_dir(run_dir)
    for p in d.glob(".*.fetch*") if d.exists() else []:
        remove_checkpoint(p)
