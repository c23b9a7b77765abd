"""The data's config section `data:`, declared beside the loader (gcc/data/dataset.py), which takes it whole: the
prepared shards, the cache, the workers, the dropouts and the mask, and Streaming's options (`streaming_args`: a
new one is a field and its line there). Each field's role and range with it (gcc/settings.py);
gcc/training/config.py loads and checks it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from gcc.settings import FRACTION, STEPS, Range, setting

# the v10 run's dropouts and mask (docs/design.md §6), stated once: the config's defaults and the draws'
# (gcc/data/sample_rng.py)
TEXT_DROPOUT, COND_DROPOUT, MASK_P = 0.1, 0.05, 0.5
MaskCalibration = Literal["frame0", "cap"]
MASK_CALIBRATION: MaskCalibration = "frame0"
MAX_FRAME_COVERAGE = 0.4


@dataclass
class DataConfig:
    # signed by its manifest's sha256 (the data's content: a copy elsewhere is the same run)
    path: str = setting(
        "data/gc25d_v10_mds",
        identity="data.manifest_sha256",
        exported="data_root",
        path=True,
        doc="a convert_data output: a local folder or s3://bucket/prefix",
    )
    cache_dir: str = setting(
        "", identity=False, exported=False, path=True, doc='per-node shard cache; "" = <run_dir>/cache/node<N>'
    )
    num_workers: int = setting(
        4, identity=False, exported=False, bounds=Range(0, 256), doc="loader worker processes per rank"
    )
    text_dropout: float = setting(
        TEXT_DROPOUT,
        identity=True,
        exported=True,
        bounds=FRACTION,
        doc="probability of training a clip without its text",
    )
    cond_dropout: float = setting(
        COND_DROPOUT,
        identity=True,
        exported=True,
        bounds=FRACTION,
        doc="probability of training a clip without its semantic condition",
    )
    mask_p: float = setting(
        MASK_P, identity=True, exported=True, bounds=FRACTION, doc="probability of masking the condition's regions"
    )
    mask_calibration: MaskCalibration = setting(  # noqa: RUF009  (a Literal alias: immutable, as the other fields)
        MASK_CALIBRATION,
        identity=True,
        exported=False,
        doc="frame0 | cap (bounds the per-frame coverage by max_frame_coverage)",
    )
    max_frame_coverage: float = setting(
        MAX_FRAME_COVERAGE,
        identity=True,
        exported=False,
        bounds=FRACTION,
        doc="the largest share of a frame a mask covers (cap)",
    )
    num_canonical_nodes: int = setting(
        1,
        identity=True,
        exported=False,
        bounds=Range(1, 1 << 16),
        doc="Streaming's; fixed so the sample order is the same for any number of nodes/GPUs",
    )
    cache_limit: str = setting(
        "", identity=False, exported=False, doc='Streaming cache_limit (e.g. "200gb"); "" = unlimited'
    )
    limit: int | None = setting(
        None,
        identity=True,
        exported="data_limit",
        bounds=Range(
            1, STEPS, said=f"a positive number of train clips, or null (the whole train split), at most {STEPS}"
        ),
        doc="N: train on a seeded subset of N train clips (a smoke run on the real data); null = the whole train split",
    )

    def without_dropouts(self) -> DataConfig:
        """This section with nothing dropped or masked: the val split's (docs/design.md §5), gcc-maskstats'."""
        return replace(self, text_dropout=0.0, cond_dropout=0.0, mask_p=0.0)

    def streaming_args(self) -> dict:
        """This section's options of Streaming's `StreamingDataset`."""
        return dict(num_canonical_nodes=self.num_canonical_nodes, cache_limit=self.cache_limit or None)
