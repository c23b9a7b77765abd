"""The builders (gcc/training/builders.py) give the run's pieces what the config says: the train loader's dropouts,
seen as the rates the loader draws. The callbacks they build: tests/training/callbacks/test_every_callback.py."""

from __future__ import annotations

from pathlib import Path

from draw_reference import within_binomial

from gcc.data.dataset import Dropouts
from gcc.training import builders as B
from gcc.training.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_configured_dropouts_reach_the_train_loader_as_its_draw_rates(tmp_path, shards):
    """data.text_dropout, cond_dropout, mask_p, mask_calibration and max_frame_coverage, each at a value of its
    own, are the train loader's dropouts; over 8 epochs the text and condition drop at their configured rates
    (within a 5σ binomial bound: a swap of the two, 0.8 and 0.15, is far outside it)."""
    cfg = load_config(
        ROOT / "yamls" / "tiny_cpu.yaml",
        [
            f"run_dir={tmp_path / 'run'}",
            f"data.path={shards}",
            "data.num_workers=0",
            "data.text_dropout=0.8",
            "data.cond_dropout=0.15",
            "data.mask_p=0.35",
            "data.mask_calibration=cap",
            "data.max_frame_coverage=0.3",
        ],
    )
    loader = B.build_train_loader(cfg, per_rank_batch=2)
    want = Dropouts(text=0.8, cond=0.15, mask=0.35, calibration="cap", max_frame_coverage=0.3)
    assert loader.dataset.dropouts == want
    text = cond = n = 0
    for _ in range(8):
        for b in loader:
            n += len(b["clip_id"])
            text += int(b["drop_text"].sum())
            cond += int(b["drop_cond"].sum())
    assert n >= 100, n
    assert within_binomial(text, n, 0.8) and within_binomial(cond, n, 0.15), (text, cond, n)
