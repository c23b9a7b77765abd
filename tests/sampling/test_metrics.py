"""PSNR / SSIM of a generated video against the ground truth (gcc/sampling/metrics.py): PSNR of the MSE pooled over
all frames however many torchmetrics calls (`METRIC_CHUNK` frames each) it takes, SSIM one value per frame, the
summary over frames 1.. (frame 0 is given, not generated). The per-frame arithmetic on a hand-computed case is in
tests/tools/test_sample.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gcc.sampling import metrics as M

N = 2 * M.METRIC_CHUNK + 1  # frames over three chunks


def video(seed: int, n: int = N) -> np.ndarray:
    return np.random.default_rng(seed).integers(30, 220, size=(n, 16, 16, 3), dtype=np.uint8)


def pooled_psnr(pred: np.ndarray, target: np.ndarray) -> float:
    mse = np.mean(((pred.astype(np.float64) - target.astype(np.float64)) / 255.0) ** 2)
    return 10 * math.log10(1.0 / mse)


def test_psnr_pools_the_mse_over_every_chunk_of_frames():
    gt = video(0)
    gen = gt.copy()
    rng = np.random.default_rng(1)
    for f in range(N):  # errors that differ from frame to frame: an average of per-chunk PSNRs is another number
        gen[f] = np.clip(gt[f].astype(int) + rng.integers(-3 * (f + 1), 3 * (f + 1) + 1, gt[f].shape), 0, 255)
    assert M.psnr(gen, gt) == pytest.approx(pooled_psnr(gen, gt), abs=1e-3)
    m = M.video_metrics(gen, gt, ssim=False)
    assert m["psnr"] == pytest.approx(pooled_psnr(gen[1:], gt[1:]), abs=1e-3)  # frames 1..
    assert m["psnr_frame0"] == pytest.approx(pooled_psnr(gen[:1], gt[:1]), abs=1e-3)
    assert [f["frame"] for f in m["frames"]] == list(range(N))
    for f in range(N):
        assert m["frames"][f]["psnr"] == pytest.approx(pooled_psnr(gen[f], gt[f]), abs=1e-3)


def test_ssim_is_one_value_per_frame_one_for_equal_frames_and_the_summary_is_the_mean_over_frames_1_on():
    gt, other = video(0), video(2)
    pred = gt.copy()
    pred[1::2] = other[1::2]  # every other frame unrelated to the truth
    s = M.ssim_frames(pred, gt)
    assert len(s) == N
    for f in range(N):
        assert s[f] == pytest.approx(1.0, abs=1e-9) if f % 2 == 0 else s[f] < 0.5
    m = M.video_metrics(pred, gt)
    assert m["ssim"] == pytest.approx(float(np.mean(s[1:])))
    assert [f["ssim"] for f in m["frames"]] == pytest.approx(s)


def test_one_frame_has_no_summary_and_videos_of_other_shapes_are_refused():
    gt = video(0, 1)
    m = M.video_metrics(video(1, 1), gt)
    assert m["psnr"] is None and m["ssim"] is None and m["psnr_frame0"] is not None
    with pytest.raises(ValueError, match="differ in shape"):
        M.video_metrics(video(0, 3), video(0, 4))
