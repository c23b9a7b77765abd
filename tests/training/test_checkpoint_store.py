"""The remote side of `save_folder: s3://...` (gcc/training/checkpoint/store.py) against a real S3 server on
loopback (moto): the commit log's head (owner + committed checkpoint + manifest, written conditionally), the guard
between two launches and its races, the repair of uploads cut short and the refusals that replace deletions,
rotation, the keys read from the prefix, and the download into a run folder. The end-to-end runs are in
tests/training/test_remote_checkpoints.py."""

from __future__ import annotations

import json
import os
import re
import zipfile

import pytest

from gcc import inputs, storage
from gcc.training.checkpoint.files import LATEST, ckpt_dir, is_complete, latest_checkpoint
from gcc.training.checkpoint.store import CheckpointStore, TakenOver
from gcc.training.run_folder import Refusal


def ddp_file(path, payload: bytes = b"weights"):
    """A stand-in for a torch.save file: a zip, which is what `is_complete` checks."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("data.pkl", payload)
    return path


def put_ddp(store: CheckpointStore, tmp_path, name: str, payload: bytes | None = None) -> dict:
    """Upload a DDP checkpoint file; returns its manifest."""
    return {name: store.upload(ddp_file(tmp_path / "src" / name, payload or name.encode()), name)}


def put_dcp(store: CheckpointStore, tmp_path, name: str, ranks: int = 2) -> dict:
    files = {}
    for f in [f"__{r}_0.distcp" for r in range(ranks)] + [".metadata"]:
        src = tmp_path / "src" / name / f
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_bytes(f"{name}/{f}".encode())
        files[f"{name}/{f}"] = store.upload(src, f"{name}/{f}")
    return files


def committed(store: CheckpointStore, tmp_path, name: str, launch: str) -> dict:
    files = (put_ddp if name.endswith(".pt") else put_dcp)(store, tmp_path, name)
    store.commit(name, files, launch)
    return files


def raw_put(url: str, data: bytes = b"x") -> None:
    """An object written by something other than gcc, byte for byte under the key given."""
    storage.write_bytes(url, data)


def test_the_newest_launch_owns_the_prefix_and_an_older_one_uploads_and_commits_nothing(s3_bucket, tmp_path):
    first, second = CheckpointStore(f"{s3_bucket}/run"), CheckpointStore(f"{s3_bucket}/run/")
    a = first.claim()
    committed(first, tmp_path, "ep0-ba3-rank0.pt", a)
    b = second.claim()  # a second launch on the same prefix: the committed checkpoint stays committed
    assert second.head().launch == b and second.latest() == "ep0-ba3-rank0.pt"
    files = put_ddp(first, tmp_path, "ep0-ba6-rank0.pt")
    with pytest.raises(TakenOver, match=rf"{s3_bucket}/run: another launch claimed this checkpoint prefix \(pid "):
        first.commit("ep0-ba6-rank0.pt", files, a)
    assert first.latest() == "ep0-ba3-rank0.pt"  # the older launch moved nothing
    export = tmp_path / "step-6.safetensors"
    export.write_bytes(b"export")
    with pytest.raises(TakenOver):
        first.upload_export(export, a)
    assert not storage.exists(f"{s3_bucket}/run/step-6.safetensors")
    second.upload_export(export, b)
    assert storage.exists(f"{s3_bucket}/run/step-6.safetensors")
    second.commit("ep0-ba6-rank0.pt", files, b)
    assert first.latest() == "ep0-ba6-rank0.pt"


def test_the_head_carries_the_owner_and_each_committed_objects_size_and_sha256(s3_bucket, tmp_path):
    store = CheckpointStore(f"{s3_bucket}/run")
    assert store.conditional  # moto's server honours If-Match, as AWS S3 and MinIO do
    launch = store.claim()
    committed(store, tmp_path, "ep1-ba6", launch)
    head = json.loads(storage.read_bytes(f"{s3_bucket}/run/checkpoints/latest"))
    src = tmp_path / "src" / "ep1-ba6"
    assert head["launch"] == launch and head["checkpoint"] == "ep1-ba6"
    assert head["files"] == {
        f"ep1-ba6/{p.name}": {"size": p.stat().st_size, "sha256": storage.sha256_file(p)} for p in src.iterdir()
    }
    with pytest.raises(Refusal, match="lacks ep1-ba9/.metadata"):  # a DCP checkpoint is not committed without it
        store.commit("ep1-ba9", {"ep1-ba9/__0_0.distcp": head["files"]["ep1-ba6/__0_0.distcp"]}, launch)


def test_a_claim_between_the_owner_check_and_the_commit_fails_the_commit(s3_bucket, tmp_path, monkeypatch):
    """The race: the old launch has checked that it owns the prefix; a relaunch claims and repairs (deleting the
    old launch's new upload, newer than the committed checkpoint); then the old launch writes the head. The write is
    conditional on the head it checked, so it fails, and the head still commits an existing checkpoint."""
    old, new = CheckpointStore(f"{s3_bucket}/run"), CheckpointStore(f"{s3_bucket}/run")
    a = old.claim()
    committed(old, tmp_path, "ep0-ba3-rank0.pt", a)
    files = put_ddp(old, tmp_path, "ep0-ba6-rank0.pt")
    put_if = storage.put_if
    relaunch = {}

    def claim_and_repair_first(url, data, etag):
        if not relaunch:  # once: the relaunch's own claim writes the head too
            relaunch["launch"] = None
            relaunch["launch"] = b = new.claim()
            new.repair(b)
        return put_if(url, data, etag)

    monkeypatch.setattr(storage, "put_if", claim_and_repair_first)
    with pytest.raises(TakenOver, match="another launch claimed"):
        old.commit("ep0-ba6-rank0.pt", files, a)
    head = new.head()
    assert head.launch == relaunch["launch"] and head.checkpoint == "ep0-ba3-rank0.pt"
    assert list(new.checkpoints()) == ["ep0-ba3-rank0.pt"]  # the repair removed the uncommitted upload...
    got = new.fetch(head.checkpoint, tmp_path / "fresh")  # ...and the committed one is whole
    assert got.read_bytes() == (tmp_path / "src" / "ep0-ba3-rank0.pt").read_bytes()


def test_without_conditional_writes_the_commit_reads_the_head_back(s3_bucket, tmp_path, monkeypatch):
    """A store that ignores If-Match: a claim that lands after the old launch's write stands (the old launch stops);
    one that lands between its check and its write is overwritten, and the claimer's repair then refuses rather than
    delete what the head now commits (the window docs/training.md states)."""
    url = f"{s3_bucket}/run"
    old, new = CheckpointStore(url, conditional=False), CheckpointStore(url, conditional=False)
    a = old.claim()
    committed(old, tmp_path, "ep0-ba3-rank0.pt", a)
    files = put_ddp(old, tmp_path, "ep0-ba6-rank0.pt")
    write_bytes = storage.write_bytes
    claimed = []

    def claim_after_the_write(u, data, *args):
        write_bytes(u, data, *args)
        if u == old.head_url and not claimed:  # once: the claim writes the head too
            claimed.append(None)
            claimed[0] = new.claim()

    monkeypatch.setattr(storage, "write_bytes", claim_after_the_write)
    with pytest.raises(TakenOver, match="another launch claimed"):
        old.commit("ep0-ba6-rank0.pt", files, a)
    assert new.head().launch == claimed[0]
    monkeypatch.setattr(storage, "write_bytes", write_bytes)

    # between the check and the write: the old launch's write overwrites the claim, unseen by it
    b = new.claim()
    files = put_ddp(new, tmp_path, "ep0-ba9-rank0.pt")
    c = CheckpointStore(url, conditional=False)

    def claim_before_the_write(u, data, *args):
        if u == new.head_url and not claimed[1:]:
            claimed.append(None)
            claimed[1] = c.claim()
        write_bytes(u, data, *args)

    monkeypatch.setattr(storage, "write_bytes", claim_before_the_write)
    new.commit("ep0-ba9-rank0.pt", files, b)
    monkeypatch.setattr(storage, "write_bytes", write_bytes)
    with pytest.raises(Refusal, match="another launch claimed this checkpoint prefix while this one was starting"):
        c.repair(claimed[1])
    assert c.latest() == "ep0-ba9-rank0.pt" and "ep0-ba9-rank0.pt" in c.checkpoints()  # nothing deleted


def test_repair_removes_uploads_newer_than_the_committed_checkpoint_and_rotation_keeps_n(s3_bucket, tmp_path):
    store = CheckpointStore(f"{s3_bucket}/run")
    launch = store.claim()
    for step in (3, 6, 9):
        committed(store, tmp_path, f"ep0-ba{step}", launch)
    put_dcp(store, tmp_path, "ep1-ba12", ranks=1)  # killed mid-upload: never committed
    raw_put(f"{store.ckpts}/ep0-ba9/__7_0.distcp")  # an object of the committed checkpoint its manifest lacks
    assert list(store.checkpoints()) == ["ep0-ba3", "ep0-ba6", "ep0-ba9", "ep1-ba12"]
    assert store.repair(launch).checkpoint == "ep0-ba9"
    assert list(store.checkpoints()) == ["ep0-ba3", "ep0-ba6", "ep0-ba9"]
    assert store.rotate(2) == ["ep0-ba3"]
    assert list(store.checkpoints()) == ["ep0-ba6", "ep0-ba9"]
    assert store.checkpoints()["ep0-ba9"] == ["ep0-ba9/.metadata", "ep0-ba9/__0_0.distcp", "ep0-ba9/__1_0.distcp"]


def test_repair_of_a_claimed_prefix_without_a_commit_removes_the_uploads(s3_bucket, tmp_path):
    store = CheckpointStore(f"{s3_bucket}/run")
    launch = store.claim()  # the head says: nothing committed yet
    put_ddp(store, tmp_path, "ep0-ba3-rank0.pt")
    assert store.repair(launch).checkpoint is None and store.checkpoints() == {}


@pytest.mark.parametrize("head", [None, b"\x00\xffnot json", b'{"format": 1, "launch": 3}', b"[]"])
def test_a_missing_or_unreadable_head_with_checkpoints_is_a_refusal_that_deletes_nothing(head, s3_bucket, tmp_path):
    store = CheckpointStore(f"{s3_bucket}/run")
    launch = store.claim()
    committed(store, tmp_path, "ep0-ba3-rank0.pt", launch)
    put_ddp(store, tmp_path, "ep0-ba6-rank0.pt")
    if head is None:
        storage.delete_keys(store.ckpts, ["latest"])
        why = rf"{store.head_url} is missing, but {store.ckpts} holds checkpoints \(ep0-ba3-rank0.pt, ep0-ba6"
    else:
        raw_put(store.head_url, head)
        why = rf"{store.head_url}: unreadable \(not the commit record gcc writes"
    for step in (lambda: store.repair(launch), store.claim):
        with pytest.raises(Refusal, match=why):
            step()
    assert list(store.checkpoints()) == ["ep0-ba3-rank0.pt", "ep0-ba6-rank0.pt"]


def test_a_head_larger_than_any_gcc_writes_is_refused_unread(s3_bucket, tmp_path, monkeypatch):
    """The head is read with a cap (its declared length first, then never past the cap), like every object."""
    store = CheckpointStore(f"{s3_bucket}/run")
    launch = store.claim()
    committed(store, tmp_path, "ep0-ba3-rank0.pt", launch)
    monkeypatch.setitem(inputs.CAPS, "json", 4096)  # 64 MiB in production: the same rule, a smaller object
    raw_put(store.head_url, store.head().to_bytes() + b" " * 4096)  # still a valid head, but too long to read
    for step in (lambda: store.repair(launch), store.claim):
        with pytest.raises(Refusal, match=rf"{store.head_url}: \d+ bytes, larger than a json object may be \(4096\)"):
            step()
    assert list(store.checkpoints()) == ["ep0-ba3-rank0.pt"]


def test_a_head_written_by_an_earlier_gcc_is_refused_naming_the_way_on(s3_bucket, tmp_path):
    store = CheckpointStore(f"{s3_bucket}/run")
    put_ddp(store, tmp_path, "ep0-ba3-rank0.pt")
    raw_put(f"{s3_bucket}/run/owner.json", b'{"launch": "0123"}')
    raw_put(store.head_url, b"ep0-ba3-rank0.pt")  # the earlier layout: `latest` holds a bare name
    with pytest.raises(
        Refusal,
        match="names ep0-ba3-rank0.pt without a manifest: a checkpoint prefix written by an "
        "earlier gcc.*point save_folder at a new prefix",
    ):
        store.claim()


def test_an_empty_prefix_is_claimed_and_holds_nothing_to_repair(s3_bucket):
    store = CheckpointStore(f"{s3_bucket}/run")
    assert store.head() is None and store.repair("") is None  # nothing there: nothing to refuse
    launch = store.claim()
    assert store.head().launch == launch and store.head().checkpoint is None


@pytest.mark.parametrize(
    "key",
    [
        "ep0-ba3/../../../../escape.pt",
        "ep0-ba3/sub/__0_0.distcp",
        "notes.txt",
        "ep0-ba3-rank1.pt",
        "ep0-ba3/__0_0.distcp.bak",
    ],
)
def test_a_key_outside_the_layout_in_the_listing_is_refused_naming_it(key, s3_bucket, tmp_path):
    store = CheckpointStore(f"{s3_bucket}/run")
    launch = store.claim()
    committed(store, tmp_path, "ep0-ba3-rank0.pt", launch)
    raw_put(f"{store.ckpts}/{key}")
    assert key in storage.list_prefix(store.ckpts)  # the store keeps the key as written
    for step in (store.checkpoints, lambda: store.repair(launch)):
        with pytest.raises(Refusal, match=re.escape(f"{store.ckpts}/{key}: not an object of a gcc checkpoint")):
            step()


@pytest.mark.parametrize("key", ["ep0-ba3/../../../../escape", "/abs/ep0-ba3/.metadata", "ep0-ba6/.metadata"])
def test_a_manifest_naming_a_key_outside_its_checkpoint_is_refused_and_nothing_is_fetched(key, s3_bucket, tmp_path):
    store = CheckpointStore(f"{s3_bucket}/run")
    launch = store.claim()
    files = committed(store, tmp_path, "ep0-ba3", launch)
    head = json.loads(storage.read_bytes(store.head_url))
    head["files"][key] = files["ep0-ba3/.metadata"]
    raw_put(store.head_url, json.dumps(head).encode())
    run_dir = tmp_path / "a" / "b" / "c" / "run"
    with pytest.raises(Refusal, match=re.escape(f"the manifest of ep0-ba3 lists '{key}', not one of its objects")):
        store.fetch("ep0-ba3", run_dir)
    assert not any(p.is_file() for p in (tmp_path / "a").rglob("*"))


def test_a_diverged_local_copy_of_the_committed_checkpoint_is_replaced_not_trusted(s3_bucket, tmp_path):
    """A launch that was taken over left its own ep0-ba10-rank0.pt in the run folder; the prefix commits another."""
    store = CheckpointStore(f"{s3_bucket}/run")
    launch = store.claim()
    files = committed(store, tmp_path, "ep0-ba10-rank0.pt", launch)
    run_dir = tmp_path / "run"
    mine = ddp_file(ckpt_dir(run_dir) / "ep0-ba10-rank0.pt", b"diverged weights")
    assert is_complete(mine) and not store.whole_here("ep0-ba10-rank0.pt", run_dir)
    got = store.fetch("ep0-ba10-rank0.pt", run_dir, files)
    assert got.read_bytes() == (tmp_path / "src" / "ep0-ba10-rank0.pt").read_bytes()
    assert store.whole_here("ep0-ba10-rank0.pt", run_dir)


def test_a_sharded_checkpoint_is_whole_here_only_file_for_file(s3_bucket, tmp_path):
    store = CheckpointStore(f"{s3_bucket}/run")
    launch = store.claim()
    committed(store, tmp_path, "ep1-ba6", launch)
    run_dir = tmp_path / "run"
    store.fetch("ep1-ba6", run_dir)
    assert store.whole_here("ep1-ba6", run_dir)
    shard = ckpt_dir(run_dir) / "ep1-ba6" / "__1_0.distcp"
    shard.write_bytes(b"ep1-ba6/__1_0.distcX")  # same size, other bytes
    assert not store.whole_here("ep1-ba6", run_dir)
    shard.unlink()  # a node-local folder: only some ranks' shards
    assert not store.whole_here("ep1-ba6", run_dir)


def test_an_object_replaced_after_its_commit_is_refused_not_resumed(s3_bucket, tmp_path):
    store = CheckpointStore(f"{s3_bucket}/run")
    launch = store.claim()
    committed(store, tmp_path, "ep1-ba6", launch)
    raw_put(f"{store.ckpts}/ep1-ba6/__0_0.distcp", b"ep1-ba6/__0_0.distcX")  # e.g. a stale launch's upload
    run_dir = tmp_path / "run"
    with pytest.raises(Refusal, match=r"ep1-ba6/__0_0.distcp differ from the manifest committed in .*latest"):
        store.fetch("ep1-ba6", run_dir)
    assert not (ckpt_dir(run_dir) / "ep1-ba6").exists() and not list(ckpt_dir(run_dir).glob(".*fetch*"))
    storage.delete_keys(store.ckpts, ["ep1-ba6/__0_0.distcp"])
    with pytest.raises(Refusal, match=r"ep1-ba6/__0_0.distcp: committed in .*latest but missing"):
        store.fetch("ep1-ba6", run_dir)


@pytest.mark.parametrize("kind", ["ddp", "dcp"])
def test_fetch_downloads_whole_and_points_latest(kind, s3_bucket, tmp_path):
    store = CheckpointStore(f"{s3_bucket}/run")
    launch = store.claim()
    name = "ep1-ba6-rank0.pt" if kind == "ddp" else "ep1-ba6"
    committed(store, tmp_path, name, launch)
    run_dir = tmp_path / "fresh"
    older = ddp_file(ckpt_dir(run_dir) / "ep0-ba3-rank0.pt")
    os.symlink(older.name, ckpt_dir(run_dir) / LATEST)
    leftover = ckpt_dir(run_dir) / f".{name}.fetch999"  # a fetch killed earlier
    leftover.mkdir()
    got = store.fetch(name, run_dir)
    assert got == ckpt_dir(run_dir) / name and is_complete(got)
    assert latest_checkpoint(run_dir) == got.resolve()
    assert not leftover.exists()
    src = tmp_path / "src" / name
    if kind == "ddp":
        assert got.read_bytes() == src.read_bytes()
    else:
        assert sorted(p.name for p in got.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        assert all((got / p.name).read_bytes() == p.read_bytes() for p in src.iterdir())
    with pytest.raises(Refusal, match="does not commit ep0-ba3-rank0.pt"):  # only the committed one is fetched
        store.fetch("ep0-ba3-rank0.pt", run_dir)


def test_record_round_trip(s3_bucket):
    store = CheckpointStore(f"{s3_bucket}/run")
    assert store.read_record() is None
    store.write_record({"signature": {"seed": 1}, "lineage": {"init_ckpt": ""}})
    assert store.read_record() == {"signature": {"seed": 1}, "lineage": {"init_ckpt": ""}}
    raw_put(f"{s3_bucket}/run/run.json", b"{not json")
    with pytest.raises(Refusal, match=rf"{s3_bucket}/run/run.json: unreadable"):
        store.read_record()


def test_a_launch_refused_for_another_runs_signature_leaves_the_prefix_to_its_owner(s3_bucket, shards, tmp_path):
    """prepare_run claims the prefix only once every identity check has passed."""
    from _launch import ROOT

    from gcc.training.config import load_config
    from gcc.training.run_folder import RunLock
    from gcc.training.run_start import prepare_run

    def prepare(run_dir, *overrides):
        cfg = load_config(ROOT / "yamls" / "tiny_cpu.yaml", [f"run_dir={run_dir}", f"data.path={shards}", *overrides])
        lock = RunLock(run_dir)
        try:
            return prepare_run(cfg, lock)
        finally:
            lock.release()

    remote = f"{s3_bucket}/runs/a"
    live = prepare(tmp_path / "a", f"save_folder={remote}")  # the live run's start
    store = CheckpointStore(remote)
    assert store.head().launch == live.launch
    prepare(tmp_path / "other", "seed=5")  # a run folder of another run...
    with pytest.raises(Refusal, match="hold different runs"):  # ...pointed at the live run's prefix
        prepare(tmp_path / "other", "seed=5", f"save_folder={remote}")
    with pytest.raises(Refusal, match="holds a run with a different signature"):  # a fresh folder, another signature
        prepare(tmp_path / "fresh", "seed=5", f"save_folder={remote}")
    assert store.head().launch == live.launch
