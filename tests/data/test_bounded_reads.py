"""Every file gcc reads from outside goes through gcc/inputs.py (docs/training.md, "Trust and safety"): the run
folder's record and logs, the checkpoint prefix's run record, objects read whole from a store, the Wan weights'
index. A FIFO, a device, a file or object larger than its kind's cap, or JSON nested beyond the limit is refused
quickly, naming it, where old code hung, read until MemoryError or died on a RecursionError. (The data's own
files: tests/data/test_trust_data.py.)"""

from __future__ import annotations

import json
import os

import pytest
from hostile import refused_quickly

from gcc import storage
from gcc.errors import BadInput, Refusal


def _fifo(path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("name", ["run.json", "train_log.csv", "val_log.csv"])
def test_a_run_folder_file_that_is_a_fifo_is_a_refusal_not_a_hang(tmp_path, name):
    from gcc.training.run_folder import stored_record, what_a_restart_loses

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"signature": {}, "lineage": {}}))
    _fifo(run_dir / name)  # old code: open() waited for a writer for ever
    refused_quickly(lambda: stored_record(run_dir), Refusal, str(run_dir / name), "FIFO")
    if name.endswith(".csv"):
        refused_quickly(lambda: what_a_restart_loses(run_dir), Refusal, str(run_dir / name), "FIFO")


def test_the_csv_logger_never_waits_on_a_fifo(tmp_path):
    from gcc.training.csv_logger import CSVLogger

    _fifo(tmp_path / "train_log.csv")
    logger = CSVLogger(tmp_path, {"train_log": ["step", "loss"]})
    refused_quickly(lambda: logger._prepare("train_log"), BadInput, "train_log.csv", "FIFO")


def test_a_run_record_nested_beyond_the_limit_is_a_refusal(tmp_path):
    from gcc.training.checkpoint.store import CheckpointStore

    prefix = tmp_path / "prefix"
    prefix.mkdir()
    (prefix / "run.json").write_text("[" * 100_000 + "]" * 100_000)  # old code: RecursionError, a traceback
    with pytest.raises(Refusal, match="run.json: unreadable"):
        CheckpointStore(str(prefix)).read_record()
    (prefix / "run.json").unlink()
    (prefix / "run.json").symlink_to("/dev/zero")  # old code: read until MemoryError
    refused_quickly(lambda: CheckpointStore(str(prefix)).read_record(), Refusal, "run.json: unreadable")


def test_a_local_read_is_a_regular_file_within_its_cap(tmp_path):
    link = tmp_path / "manifest.json"
    link.symlink_to("/dev/zero")
    refused_quickly(lambda: storage.read_bytes(str(link)), BadInput, str(link), "character device")
    small = tmp_path / "small.json"
    small.write_bytes(b"x" * 2048)
    with pytest.raises(BadInput, match="larger than a json file may be"):
        storage.read_bytes(str(small), cap=1024)
    assert storage.read_bytes(str(small), cap=2048) == b"x" * 2048


def test_an_object_larger_than_its_cap_is_refused_by_its_declared_length(s3_bucket):
    url = f"{s3_bucket}/data/manifest.json"
    storage.write_bytes(url, b"x" * 4096)
    with pytest.raises(BadInput, match=rf"{url}: 4096 bytes, larger than a json object may be \(1024\)"):
        storage.read_bytes(url, cap=1024)  # old code: read whatever the store sent
    assert storage.read_bytes(url, cap=4096) == b"x" * 4096


def test_the_wan_index_is_read_bounded_and_its_file_names_stay_inside_the_folder(tmp_path):
    from _gc_helpers import tiny_dit

    from gcc.model.dit import WAN_INDEX, load_wan_base

    model_dir = tmp_path / "wan"
    model_dir.mkdir()
    dit = tiny_dit()
    key = next(iter(dit.state_dict()))
    (model_dir / WAN_INDEX).write_text(json.dumps({"weight_map": {key: "../outside.safetensors"}}))
    with pytest.raises(ValueError, match=r"weight_map\['.*'\] '../outside.safetensors': must be"):
        load_wan_base(dit, model_dir, check_only=True)  # old code: joined the name to the folder unchecked
    _fifo(model_dir / WAN_INDEX)  # old code: "neither ... found", not what is wrong with it
    refused_quickly(lambda: load_wan_base(dit, model_dir, check_only=True), ValueError, WAN_INDEX, "FIFO")


def test_a_ground_truth_tar_is_read_bounded_and_its_frames_checked_before_decoding(prepared_tiny, tmp_path):
    import io
    import shutil
    import tarfile

    from PIL import Image

    from gcc.tools.sample import sources as SRC
    from gcc.tools.sample.errors import SampleError

    src = SRC.PreparedSource(prepared_tiny)
    clip = src.load(sorted(src.rows)[0])
    src_h, src_w = clip.meta()["src_hw"]
    raw = tmp_path / "raw"
    shutil.copytree(prepared_tiny / "raw", raw)
    tar = raw / clip.subset / clip.scene / f"{clip.run}.tar"
    tar.unlink()
    os.mkfifo(tar)  # old code: tarfile waited for a writer for ever
    refused_quickly(lambda: SRC.read_gt(raw, clip, 9), SampleError, str(tar), "FIFO")
    tar.unlink()
    big = Image.new("RGB", (4000, 3000))  # not the clip's src_hw: refused from its header, before decoding
    buf = io.BytesIO()
    big.save(buf, "JPEG")
    with tarfile.open(tar, "w") as tf:
        info = tarfile.TarInfo(f"{clip.clip_id}/000.jpg")
        info.size = len(buf.getvalue())
        tf.addfile(info, io.BytesIO(buf.getvalue()))
    with pytest.raises(SampleError, match=rf"000.jpg is 4000x3000, the clip's meta says src_hw {src_w}x{src_h}"):
        SRC.read_gt(raw, clip, 9)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["data/manifest.json", "run/run.json", "run/train_log.csv"])
def test_the_trainer_refuses_a_fifo_among_its_inputs_instead_of_hanging(shards, tmp_path, name, request):
    """A real launch (the manifest is read once the process group is up: tests/_launch.py): exit 3 naming the
    file, where old code waited for a writer until the test's timeout. The log is met on a resume: of the session's
    reference run at its step-9 checkpoint (tests/_launch.py stopped_copy)."""
    import shutil

    from _launch import launch, stopped_copy

    data = tmp_path / "data"
    run_dir = tmp_path / "run"
    steps = "max_duration=6"
    if name == "run/train_log.csv":
        data = request.getfixturevalue("e2e_shards")  # the reference's own data, read only
        stopped_copy(request.getfixturevalue("reference"), run_dir, at=9)
        steps = "max_duration=12"  # past the checkpoint: a resume
    else:
        shutil.copytree(shards, data)
        run_dir.mkdir()
    _fifo(tmp_path / name)
    r = launch(run_dir, data, steps, timeout=120, direct=True)
    out = r.stdout + r.stderr
    assert r.returncode == 3, out[-3000:]
    assert "refused" in out and str(tmp_path / name) in out and "FIFO" in out and "Traceback" not in out, out[-3000:]


def test_a_remote_shard_of_another_size_than_its_index_declares_is_refused_before_its_download(
    shards, tmp_path, s3_bucket
):
    """Streaming's downloader fetches whatever the store holds; gcc's asks the object's length first: a shard
    replaced by a larger one is refused naming it, and no byte of it reaches the cache."""
    from gcc.data.config import DataConfig
    from gcc.data.dataset import GcStreamingDataset
    from gcc.errors import DamagedData

    remote = f"{s3_bucket}/shards"
    index = json.loads((shards / "train" / "index.json").read_text())
    name = index["shards"][0]["raw_data"]["basename"]
    for f in ("manifest.json", "text/table.safetensors", "train/index.json"):  # what the dataset opens with
        storage.write_bytes(f"{remote}/{f}", (shards / f).read_bytes())
    url = f"{remote}/train/{name}"
    storage.write_bytes(url, (shards / "train" / name).read_bytes() + b"\0" * 4096)
    cache = tmp_path / "cache"
    ds = GcStreamingDataset(DataConfig(remote), "train", cache, batch_size=2)
    with pytest.raises(DamagedData, match=rf"{url}: \d+ bytes, its index.json says \d+"):
        ds.streams[0]._download_file(name)
    assert not [p for p in cache.rglob("*") if name in p.name]  # old code: downloaded whole, then refused
