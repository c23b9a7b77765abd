"""The loader: contract, splits, vocabularies, val never drops, determinism across workers / ranks /
resume, text gather, collate, and reading from a real S3 server."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import subprocess
import sys
import uuid
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from gcc.data import convert as C
from gcc.data.batch import gc_collate
from gcc.data.config import DataConfig
from gcc.data.dataset import GcStreamingDataset, build_dataloader
from gcc.data.sample_rng import draw_sample
from gcc.data.shards import MANIFEST
from gcc.errors import BadInput
from gcc.vocab import NULL_PROMPT, UNKNOWN, collapse_parts, invalid_values, key_to_id

ROOT = Path(__file__).resolve().parents[2]
HEAVY = dict(text_dropout=0.3, cond_dropout=0.2, mask_p=0.7)  # more drops than default: few samples exercise every path
NONE = dict(text_dropout=0.0, cond_dropout=0.0, mask_p=0.0)
DATA_FIELDS = {f.name for f in fields(DataConfig)}


def new_ds(shards, split="train", **kw) -> GcStreamingDataset:
    """A dataset of `shards`; the keyword arguments that name `data:` fields go into its config."""
    kw.setdefault("batch_size", 2)
    data = DataConfig(str(shards), **{k: kw.pop(k) for k in [*kw] if k in DATA_FIELDS})
    return GcStreamingDataset(data, split, shards.parent / "caches" / uuid.uuid4().hex, **kw)


def batch_digests(batch) -> list[tuple]:
    out = []
    for i in range(len(batch["clip_id"])):
        out.append(
            (
                batch["clip_id"][i],
                int(batch["epoch"][i]),
                json.dumps(
                    {
                        "text": bool(batch["drop_text"][i]),
                        "cond": bool(batch["drop_cond"][i]),
                        "mask": float(batch["mask_frac"][i]),
                    },
                    sort_keys=True,
                ),
                hashlib.sha1(batch["sem_ids"][i].numpy().tobytes()).hexdigest(),
                tuple(batch["context_ids"][i].tolist()),
                tuple(batch["context_index"][i].tolist()),
                hashlib.sha1(
                    batch["context"][i, : batch["prompts"][i]].view(torch.int16).numpy().tobytes()
                ).hexdigest(),
            )
        )
    return out


def _made_in_shared_memory(samples) -> list[bool]:
    """A collate_fn (it runs in the worker): whether each sample's latents and prompts were made in shared memory."""
    return [s["input_latents"].is_shared() and s["context"].is_shared() for s in samples]


def test_a_workers_samples_are_made_in_shared_memory(shards):
    """In a worker a sample's latents and prompts (88 MB at v10) are written into shared memory from the start, so
    handing them to the main process copies nothing more (gcc/data/batch.py new_tensor)."""
    dl = build_dataloader(new_ds(shards), batch_size=2, num_workers=1, collate_fn=_made_in_shared_memory)
    assert next(iter(dl)) == [True, True]


def run_epochs(ds, workers: int, epochs: int = 1, batch_size: int = 2) -> list[list[tuple]]:
    dl = build_dataloader(ds, batch_size=batch_size, num_workers=workers)
    return [[d for b in dl for d in batch_digests(b)] for _ in range(epochs)]


def test_sample_contract(shards):
    src, out = shards.parent / "prepared", shards
    geo = json.loads((out / MANIFEST).read_text())["geometry"]
    ds = new_ds(shards, **NONE)
    s = ds[0]
    c, t, h, w = geo["latents"]
    L, D = geo["text"]
    assert s["input_latents"].dtype == torch.bfloat16 and list(s["input_latents"].shape) == [c, t, h, w]
    assert s["context"].dtype == torch.bfloat16 and list(s["context"].shape)[1:] == [L, D]
    assert s["context_ids"].dtype == torch.int64 and list(s["context_ids"].shape) == [t]
    assert s["context_index"].dtype == torch.int64 and list(s["context_index"].shape) == [t]
    assert s["sem_ids"].dtype == torch.uint8 and list(s["sem_ids"].shape) == geo["sem"]
    assert isinstance(s["clip_id"], str)
    assert set(s["dropped"]) == {"text", "cond", "mask"}
    # context is the text table's rows for the clip's keys
    row = next(
        json.loads(line)
        for line in (src / "index" / "clips.jsonl").read_text().splitlines()
        if json.loads(line)["clip_id"] == s["clip_id"]
    )
    with safe_open(str(src / "text" / "table.safetensors"), "pt") as f:
        want = torch.stack([f.get_tensor(k) for k in row["context_keys"]])
        ids = key_to_id(f.keys())
        distinct = list(dict.fromkeys(row["context_keys"]))  # each prompt once, in the order of first use
        assert torch.equal(s["context"], torch.stack([f.get_tensor(k) for k in distinct]))
    assert torch.equal(s["context"][s["context_index"]], want)  # every cell's prompt
    assert s["context_ids"].tolist() == [ids[k] for k in row["context_keys"]]


def test_streamings_defaults_are_given_so_it_logs_no_notice(shards, caplog):
    """predownload and shuffle_block_size at the values Streaming would pick itself (the same shuffle), given
    explicitly: unset, Streaming logs a notice about each for every dataset."""
    with caplog.at_level(logging.INFO, logger="streaming"):
        ds = new_ds(shards, batch_size=3, num_canonical_nodes=2)
        run_epochs(ds, workers=0, batch_size=3)
    assert [r.getMessage() for r in caplog.records if "not specified" in r.getMessage()] == []
    assert (ds.predownload, ds.shuffle_block_size) == (8 * 3, max(4_000_000 // 2, 1 << 18))


def test_splits_and_drop(shards):
    src = shards.parent / "prepared"
    rows = [json.loads(line) for line in (src / "index" / "clips.jsonl").read_text().splitlines()]
    for split in ("train", "val"):
        ds = new_ds(shards, split, **NONE)
        got = [ds[i]["clip_id"] for i in range(len(ds))]
        assert sorted(got) == sorted(r["clip_id"] for r in rows if r["split"] == split and not r["drop"])
        # sample id i is the manifest's clip i (validation picks its fixed clips by this)
        assert got == ds.manifest["splits"][split]["clip_ids"]


def test_val_never_drops(shards):
    ds = new_ds(shards, "val", text_dropout=1.0, cond_dropout=1.0, mask_p=1.0)
    assert (ds.config.text_dropout, ds.config.cond_dropout, ds.config.mask_p) == (0, 0, 0)
    for epoch in run_epochs(ds, workers=0, epochs=2):
        for d in epoch:
            assert json.loads(d[2]) == {"text": False, "cond": False, "mask": 0.0}


def test_dropout_paths(shards):
    ds = new_ds(shards, **HEAVY)
    table_null = key_to_id(ds.text.keys)[NULL_PROMPT]
    seen = {"text": 0, "cond": 0, "mask": 0}
    for e in range(3):
        for i in range(len(ds)):
            s = ds.make_sample(_record(ds, i), i, e)
            raw = _record(ds, i).sem_ids()
            if s["dropped"]["text"]:
                seen["text"] += 1
                assert (s["context_ids"] == table_null).all()
            if s["dropped"]["cond"]:
                seen["cond"] += 1
                assert (s["sem_ids"] == UNKNOWN).all() and s["dropped"]["mask"] == 0.0
            elif s["dropped"]["mask"] > 0:
                seen["mask"] += 1
                changed = s["sem_ids"].numpy() != raw
                assert (s["sem_ids"].numpy()[changed] == UNKNOWN).all()
                assert (raw[changed] <= 6).all()  # only static pixels are masked
                assert s["dropped"]["mask"] == pytest.approx(changed.mean())
            else:
                assert np.array_equal(s["sem_ids"].numpy(), raw)
    assert all(v > 0 for v in seen.values()), seen


def _record(ds, i):
    from streaming import StreamingDataset

    from gcc.data.shards import ClipRecord

    return ClipRecord.from_sample(StreamingDataset.get_item(ds, i))


def test_cond_drop_never_decodes_sem(shards, monkeypatch):
    from gcc.data.shards import ClipRecord

    ds = new_ds(shards, text_dropout=0, cond_dropout=1.0, mask_p=1.0)

    def boom(self):
        raise AssertionError("sem ids decoded for a cond-dropped sample")

    monkeypatch.setattr(ClipRecord, "sem_ids", boom)
    s = ds[0]
    assert s["dropped"]["cond"] and (s["sem_ids"] == UNKNOWN).all()


def test_ids_vocab_collapses_after_masking(shards):
    parts = new_ds(shards, **HEAVY, vocab="parts")
    ids = new_ds(shards, **HEAVY, vocab="ids")
    for i in range(len(parts)):
        a, b = parts.make_sample(_record(parts, i), i, 1), ids.make_sample(_record(ids, i), i, 1)
        assert a["dropped"] == b["dropped"]
        assert np.array_equal(collapse_parts(a["sem_ids"].numpy()), b["sem_ids"].numpy())
        assert invalid_values(b["sem_ids"].numpy(), "ids") == []


@pytest.mark.slow  # over 5 s: make test, not the edit loop's test-fast
def test_same_samples_for_0_1_2_workers_and_epochs_differ(shards):
    results = {w: run_epochs(new_ds(shards, **HEAVY), workers=w, epochs=2) for w in (0, 1, 2)}
    as_sets = {w: [sorted(e) for e in r] for w, r in results.items()}
    assert as_sets[0] == as_sets[1] == as_sets[2]
    e0, e1 = as_sets[0]
    assert [d[0] for d in e0] == [d[0] for d in e1]  # same clips every epoch...
    # ...with new draws: compared without the epoch number (d[1]), which alone would make them differ
    assert [d[:1] + d[2:] for d in e0] != [d[:1] + d[2:] for d in e1]
    assert [d[1] for d in e1] == [1] * len(e1)


def test_resume_mid_epoch_continues_exactly(shards):
    full = run_epochs(new_ds(shards, **HEAVY), workers=2, epochs=2)
    bs, k = 2, 3
    ds = new_ds(shards, **HEAVY)
    dl = build_dataloader(ds, batch_size=bs, num_workers=2)
    it = iter(dl)
    first = [d for _ in range(k) for d in batch_digests(next(it))]
    state = ds.state_dict(num_samples=k * bs, from_beginning=True)
    del it
    resumed_ds = new_ds(shards, **HEAVY)
    resumed_ds.load_state_dict(state)
    rest = run_epochs(resumed_ds, workers=1, epochs=2)
    assert first == full[0][: k * bs]
    assert rest[0] == full[0][k * bs :]
    assert rest[1] == full[1]


def test_limit_trains_on_the_same_seeded_subset_every_epoch_and_resumes_exactly(shards):
    """data.limit: every epoch is a new shuffle of the same 7 clips, those that Random(seed) picks; a mid-epoch
    resume continues exactly; another seed picks others."""
    from gcc.data.dataset import subset_ids

    manifest = json.loads((shards / MANIFEST).read_text())
    train = manifest["splits"]["train"]["clip_ids"]  # sample id i is clip i
    want = subset_ids(len(train), 7, seed=5)
    assert len(want) == len(set(want.tolist())) == 7 and list(want) == sorted(want)
    assert list(want) != list(subset_ids(len(train), 7, seed=6))
    assert list(subset_ids(len(train), 100, seed=5)) == list(range(len(train)))  # a limit past the split: all
    ds = new_ds(shards, **HEAVY, seed=5, limit=7, batch_size=1)
    assert len(ds) == ds.epoch_size == 7
    full = run_epochs(ds, workers=1, epochs=2, batch_size=1)
    assert [sorted(d[0] for d in e) for e in full] == [sorted(train[i] for i in want)] * 2
    assert [d[0] for d in full[0]] != [d[0] for d in full[1]]  # a new order each epoch
    k = 3
    ds = new_ds(shards, **HEAVY, seed=5, limit=7, batch_size=1)
    it = iter(build_dataloader(ds, batch_size=1, num_workers=1))
    first = [d for _ in range(k) for d in batch_digests(next(it))]
    state = ds.state_dict(num_samples=k, from_beginning=True)
    del it
    resumed = new_ds(shards, **HEAVY, seed=5, limit=7, batch_size=1)
    resumed.load_state_dict(state)
    rest = run_epochs(resumed, workers=1, epochs=2, batch_size=1)
    assert first + rest[0] == full[0] and rest[1] == full[1]


RANK_SCRIPT = """
import json, os, sys, hashlib
sys.path[:0] = {tests!r}  # this test's folder and tests/ (its helpers)
from pathlib import Path
from test_data import rank_batches

if __name__ == "__main__":  # a spawned process that imports this file must not run it
    rank = int(os.environ.get("RANK", 0))
    res = rank_batches({out!r}, Path({cache!r}), int(sys.argv[1]))  # one cache per node, shared by its ranks
    Path({res!r}, f"rank{{rank}}.json").write_text(json.dumps(res))
"""


def rank_batches(shards, cache: Path, batch_size: int) -> list[list[tuple]]:
    """This rank's batches of an epoch, as digests. In the rank's own process: a loader worker's start (~10 s of
    CPU) would change no batch (test_same_samples_for_0_1_2_workers_and_epochs_differ)."""
    ds = GcStreamingDataset(DataConfig(str(shards), **HEAVY), "train", cache, batch_size=batch_size, seed=0)
    return [batch_digests(b) for b in build_dataloader(ds, batch_size=batch_size, num_workers=0)]


@pytest.mark.slow
def test_same_global_batches_for_1_and_2_ranks(shards, tmp_path):
    """Global batch 4 = 1 rank × 4 (in this process) = 2 ranks × 2 (separate processes via the composer
    launcher)."""

    def launch(nproc, per_rank_bs, tag):
        res = tmp_path / tag
        res.mkdir()
        script = tmp_path / f"ranks_{tag}.py"
        script.write_text(
            RANK_SCRIPT.format(
                tests=[str(Path(__file__).parent), str(ROOT / "tests")],
                out=str(shards),
                cache=str(tmp_path / f"cache_{tag}"),
                res=str(res),
            )
        )
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        r = subprocess.run(
            [str(Path(sys.executable).with_name("composer")), "-n", str(nproc), str(script), str(per_rank_bs)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return [json.loads((res / f"rank{i}.json").read_text()) for i in range(nproc)]

    one = json.loads(json.dumps(rank_batches(str(shards), tmp_path / "cache_one", 4)))  # as the ranks write them
    two = launch(2, 2, "two")
    global_two = [sorted(map(tuple, two[0][i] + two[1][i])) for i in range(len(two[0]))]
    # Streaming pads an epoch to a multiple of the rank count by repeating samples, so only the epoch's
    # tail (its last, partial global batch) may differ; every full global batch must be identical.
    n_full = sum(len(b) for b in one) // 4
    assert n_full >= 3
    assert [sorted(map(tuple, b)) for b in one][:n_full] == global_two[:n_full]


@pytest.mark.slow
def test_reads_from_s3(shards, tmp_path, s3_bucket):
    remote = f"{s3_bucket}/shards"
    C.convert(shards.parent / "prepared", remote, chunk_clips=4, progress=False)
    ds = GcStreamingDataset(DataConfig(remote, **HEAVY), "train", tmp_path / "cache", batch_size=2)
    local = new_ds(shards, **HEAVY)
    assert run_epochs(ds, workers=1) == run_epochs(local, workers=1)
    assert (tmp_path / "cache" / "text" / "table.safetensors").exists()


def test_local_shards_are_read_in_place_and_compressed_ones_give_the_same_samples(shards, tmp_path):
    """A local dataset's shards enter the run's cache as links (no byte of a shard is copied; the cache holds only
    the checked copy of index.json); a zstd conversion of the same clips is decompressed into the cache and gives
    the same samples."""
    cache = tmp_path / "cache"
    ds = GcStreamingDataset(DataConfig(str(shards), **HEAVY), "train", cache, batch_size=2)
    plain = run_epochs(ds, workers=0)
    files = [p for p in (cache / "train").rglob("*") if p.is_file() or p.is_symlink()]
    shard_files = [p for p in files if ".mds" in p.name]
    copies = [p for p in files if not p.is_symlink()]
    assert shard_files and all(p.is_symlink() for p in shard_files), copies
    assert [p.name for p in copies] == ["index.json"]
    assert copies[0].read_bytes() == (shards / "train" / "index.json").read_bytes()
    assert all(p.resolve().is_relative_to(shards.resolve()) for p in shard_files)

    zipped = tmp_path / "zstd"
    C.convert(shards.parent / "prepared", str(zipped), chunk_clips=4, compression="zstd", progress=False)
    assert all(s["compression"] == "zstd" for s in json.loads((zipped / "train" / "index.json").read_text())["shards"])
    zcache = tmp_path / "zcache"
    assert run_epochs(GcStreamingDataset(DataConfig(str(zipped), **HEAVY), "train", zcache, batch_size=2), 0) == plain
    raw = [p for p in (zcache / "train").rglob("*.mds") if not p.is_symlink()]
    assert raw, "the compressed shards are decompressed into the cache"


def test_refuses_data_without_manifest(shards, tmp_path):
    import shutil

    broken = tmp_path / "shards"
    shutil.copytree(shards, broken)
    (broken / MANIFEST).unlink()
    with pytest.raises(BadInput, match="manifest.json"):
        GcStreamingDataset(DataConfig(str(broken)), "train", tmp_path / "cache", batch_size=2)


def test_a_shard_whose_fetch_failed_is_handed_back_so_the_next_reader_fails_too_instead_of_waiting(shards, tmp_path):
    """Streaming marks a shard as being fetched before it fetches it, and left the mark when the fetch failed: the
    next reader of that shard (this worker's next sample, a download thread, the node's other ranks) waited for it
    forever, without a word (a CI run hung so when its object store went away). Now each reader fails, naming it."""
    import shutil
    import threading

    from gcc.errors import DamagedData

    data = tmp_path / "shards"
    shutil.copytree(shards, data)
    ds = GcStreamingDataset(DataConfig(str(data)), "train", tmp_path / "cache", batch_size=2)
    shard_id, _ = ds.spanner[0]
    raw, _ = ds.shards[shard_id].file_pairs[0]
    (data / "train" / raw.basename).unlink()  # not there when it is fetched
    for reader in ("first", "second"):
        got: list = []
        t = threading.Thread(target=lambda out=got: out.append(_raised(ds.get_item, 0)), daemon=True)
        t.start()
        t.join(60)
        assert not t.is_alive(), f"the {reader} reader of a shard whose fetch failed is still waiting after 60 s"
        assert isinstance(got[0], DamagedData) and raw.basename in str(got[0]), got


def _raised(f, *args) -> BaseException | None:
    try:
        f(*args)
    except BaseException as e:
        return e
    return None


def test_collate(shards):
    ds = new_ds(shards, **HEAVY)
    samples = [ds[i] for i in range(3)]
    b = gc_collate(samples)
    assert b["input_latents"].shape[0] == 3 and b["sem_ids"].dtype == torch.uint8
    assert b["clip_id"] == [s["clip_id"] for s in samples]
    assert b["drop_text"].tolist() == [s["dropped"]["text"] for s in samples]
    assert b["mask_frac"].tolist() == pytest.approx([s["dropped"]["mask"] for s in samples])
    for k in ("input_latents", "context_ids", "context_index", "sem_ids"):
        assert all(torch.equal(b[k][i], samples[i][k]) for i in range(3))
    # each clip's prompts, padded with zero rows to the batch's most; the count of each on the host
    assert b["prompts"] == [s["context"].shape[0] for s in samples] and b["context"].shape[1] == max(b["prompts"])
    for i, s in enumerate(samples):
        p = s["context"].shape[0]
        assert torch.equal(b["context"][i, :p], s["context"]) and not b["context"][i, p:].any()
    assert b["sample_id"] == [s["sample_id"] for s in samples] and b["epoch"] == [s["epoch"] for s in samples]


HOLD_SCRIPT = """
import sys, time
from pathlib import Path
from gcc.data.config import DataConfig
from gcc.data.dataset import GcStreamingDataset
ds = GcStreamingDataset(DataConfig(sys.argv[1]), "train", sys.argv[2], batch_size=1)
Path(sys.argv[3]).touch()
time.sleep(300)
"""


@pytest.mark.slow  # over 5 s: make test, not the edit loop's test-fast
def test_release_stale_shm_after_a_killed_process_group(shards, tmp_path):
    """A SIGKILLed launch (its resource tracker included) leaves Streaming shared memory behind; a relaunch
    on the same cache is refused until `release_stale_shm` frees exactly those segments."""
    import signal
    import time

    from gcc.compat.streaming import release_stale_shm, shm_prefixes

    cache, ready = tmp_path / "cache", tmp_path / "ready"
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD_SCRIPT, str(shards), str(cache), str(ready)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while not ready.exists():
            assert p.poll() is None and time.time() < deadline, "holder process failed"
            time.sleep(0.2)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    other = new_ds(shards)  # a live dataset on another cache must survive the release
    # the dead holder's segments are still registered for this cache. Streaming refuses a dataset on it ("Reused
    # local directory") only when its scan of the prefixes reaches them: the scan stops at the first free number,
    # which another job's finished dataset may open below them, so the refusal itself is not asserted here
    assert len(shm_prefixes([cache / "train"])) == 1
    assert release_stale_shm([cache / "train"]) == 1
    assert shm_prefixes([cache / "train"]) == []
    assert len(GcStreamingDataset(DataConfig(str(shards)), "train", cache, batch_size=2)) == len(other)
    assert run_epochs(other, workers=1)  # its shared memory is intact


def test_round_robin_by_run_and_fixed_val_ids():
    from gcc.data.dataset import round_robin_by_run
    from gcc.training.builders import select_val_ids

    items = [("b", "b0"), ("a", "a0"), ("a", "a1"), ("c", "c0"), ("c", "c1"), ("c", "c2")]
    assert round_robin_by_run(items, 4) == ["a0", "b0", "c0", "a1"]
    assert round_robin_by_run(items, 10) == ["a0", "b0", "c0", "a1", "c1", "c2"]
    manifest = {"splits": {"val": {"clip_runs": ["r1", "r1", "r1", "r2", "r3", "r3"]}}}
    assert select_val_ids(manifest, 4) == [0, 1, 3, 4]


def test_releasing_orphaned_shared_memory_spares_live_datasets(shards, tmp_path):
    """`release_stale_shm()` (what a test session runs at its start, beside other jobs) frees only segments whose
    cache folders are gone; a live dataset of another job keeps its shared memory and goes on reading."""
    import shutil

    from gcc.compat.streaming import release_stale_shm

    live = new_ds(shards)
    gone_cache = tmp_path / "gone"
    orphan = GcStreamingDataset(DataConfig(str(shards)), "train", gone_cache, batch_size=2)  # holds its segments
    assert len(orphan) == len(live)
    shutil.rmtree(gone_cache)
    assert release_stale_shm() >= 1
    assert run_epochs(live, workers=1)  # its shared memory is intact


def test_the_v10_rates_are_stated_once_as_the_configs_defaults_and_the_draws():
    """The v10 rates (gcc/data/config.py) are DataConfig's defaults, which the loader takes whole, and the draws'."""
    d = DataConfig()
    assert (d.text_dropout, d.cond_dropout, d.mask_p, d.mask_calibration, d.max_frame_coverage) == (
        *(0.1, 0.05, 0.5),
        *("frame0", 0.4),
    )
    draw_defaults = [p.default for p in inspect.signature(draw_sample).parameters.values()][3:]
    assert draw_defaults == [d.text_dropout, d.cond_dropout, d.mask_p]
    assert d.without_dropouts() == replace(d, text_dropout=0.0, cond_dropout=0.0, mask_p=0.0)


def test_the_configured_frame_coverage_caps_the_mask(shards):
    """With calibration "cap" the dataset's max_frame_coverage reaches the mask: the same draws under a lower cap
    mask no more of any clip, and less of some (docs/training.md, "Dropouts and the UNKNOWN mask")."""
    caps = (dict(NONE, mask_p=1.0, mask_calibration="cap", max_frame_coverage=c) for c in (0.05, 0.6))
    low, high = (new_ds(shards, **cap) for cap in caps)
    fracs = [(low[i]["dropped"]["mask"], high[i]["dropped"]["mask"]) for i in range(len(low))]
    assert all(a <= b for a, b in fracs) and any(a < b for a, b in fracs), fracs
