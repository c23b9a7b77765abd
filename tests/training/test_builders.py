"""The builders (gcc/training/builders.py) give the run's pieces what the config says: the train loader's dropouts,
seen as the rates the loader draws. The callbacks they build: tests/training/callbacks/test_every_callback.py."""

from __future__ import annotations

from pathlib import Path

from draw_reference import within_binomial

from gcc.training import builders as B
from gcc.training.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def _cfg(tmp_path, shards, *overrides):
    """The tiny config on `shards`, its loaders in the test's process, with `overrides`."""
    return load_config(
        ROOT / "yamls" / "tiny_cpu.yaml",
        [f"run_dir={tmp_path / 'run'}", f"data.path={shards}", "data.num_workers=0", *overrides],
    )


def _clip_ids(loader) -> list[str]:
    """The clips of one pass over `loader`, in the order it gives them."""
    return [c for b in loader for c in b["clip_id"]]


def test_the_configured_dropouts_reach_the_train_loader_as_its_draw_rates(tmp_path, shards):
    """data.text_dropout, cond_dropout, mask_p, mask_calibration and max_frame_coverage, each at a value of its
    own, are the train loader's dropouts; over 8 epochs the text and condition drop at their configured rates
    (within a 5σ binomial bound: a swap of the two, 0.8 and 0.15, is far outside it)."""
    cfg = _cfg(
        tmp_path,
        shards,
        "data.text_dropout=0.8",
        "data.cond_dropout=0.15",
        "data.mask_p=0.35",
        "data.mask_calibration=cap",
        "data.max_frame_coverage=0.3",
    )
    loader = B.build_train_loader(cfg, per_rank_batch=2)
    assert loader.dataset.config is cfg.data  # the section, whole
    text = cond = n = 0
    for _ in range(8):
        for b in loader:
            n += len(b["clip_id"])
            text += int(b["drop_text"].sum())
            cond += int(b["drop_cond"].sum())
    assert n >= 100, n
    assert within_binomial(text, n, 0.8) and within_binomial(cond, n, 0.15), (text, cond, n)


def test_the_train_loader_shuffles_the_configured_subset_and_the_val_loader_keeps_its_order(tmp_path, shards):
    """data.limit, data.num_canonical_nodes and the shuffle of each split reach the loaders: an epoch of the train
    loader is the limit's 5 clips, in another order the next epoch; the val loader reads its clips in order."""
    cfg = _cfg(tmp_path, shards, "data.limit=5", "data.num_canonical_nodes=2")
    train = B.build_train_loader(cfg, per_rank_batch=1)
    assert train.dataset.shuffle is True and train.dataset.num_canonical_nodes == 2
    epochs = [_clip_ids(train) for _ in range(3)]
    assert all(set(e) == set(epochs[0]) and len(set(e)) == 5 for e in epochs), epochs  # (a node's pad repeats one)
    assert len({tuple(e) for e in epochs}) > 1, epochs  # reshuffled
    val = B.build_val_loader(cfg)
    assert val.dataset.ds.shuffle is False and val.dataset.ds.num_canonical_nodes == 2
    ids = _clip_ids(val)
    assert ids == _clip_ids(val) and len(ids) == len(val.dataset) == min(cfg.val_n, 7)


def test_each_rank_validates_its_own_share_of_the_val_clips(tmp_path, shards, monkeypatch):
    """On 2 ranks (Composer's world as each rank sees it) the val loader of each reads every other clip, rank 0 from
    the first: together the val clips once each, not the whole set twice (with an odd count the last rank's share
    ends in the sampler's padding, which Composer's evaluation drops)."""
    from composer.utils import dist

    cfg = _cfg(tmp_path, shards)
    every = _clip_ids(B.build_val_loader(cfg))
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    shares = []
    for rank in (0, 1):
        monkeypatch.setattr(dist, "get_global_rank", lambda rank=rank: rank)
        shares.append(_clip_ids(B.build_val_loader(cfg)))
    n = len(every)
    assert n > 2 and shares[0] == every[0::2] and shares[1][: n // 2] == every[1::2], (every, shares)
    assert len(shares[1]) == len(shares[0]) == -(-n // 2), shares


def test_the_fault_injections_wrap_the_collate_of_their_rank_only(tmp_path, shards):
    """faults.stall_step / native_crash_step (gcc's own tests of a stalled or crashed loader): on their rank the
    batches before the fault are the loader's own; on another rank nothing is injected."""
    here = _cfg(tmp_path, shards, "faults.stall_step=3", "faults.native_crash_step=4")
    loader = B.build_train_loader(here, per_rank_batch=1)
    batches = iter(loader)
    for _ in range(2):
        assert isinstance(next(batches)["prompts"], list)  # gc_collate's batch
    assert (loader.collate_fn.batch, loader.collate_fn.collate.batch) == (4, 3)
    elsewhere = _cfg(tmp_path, shards, "faults.native_crash_step=2", "faults.native_crash_rank=1")
    loader = B.build_train_loader(elsewhere, per_rank_batch=1)
    assert len([b for b, _ in zip(loader, range(3))]) == 3  # batch 2 is no crash on rank 0


def test_fsdp_is_composers_fsdp2_with_gccs_own_block_wrapping_bf16_compute_and_sharded_checkpoints(tmp_path, shards):
    """Composer must not wrap the blocks for activation checkpointing a second time (gcc wraps them: build_model);
    "DEFAULT" is bf16 compute with fp32 reduction; the checkpoints are sharded (DCP)."""
    assert B.parallelism_config(_cfg(tmp_path, shards, "parallelism=ddp")) is None
    for reshard in (True, False):
        fsdp = B.parallelism_config(_cfg(tmp_path, shards, "parallelism=fsdp", f"fsdp.reshard_after_forward={reshard}"))
        c = fsdp["fsdp"]
        assert (c.reshard_after_forward, c.activation_checkpointing, c.mixed_precision, c.state_dict_type) == (
            reshard,
            False,
            "DEFAULT",
            "sharded",
        )
