"""PSNR / SSIM of a generated video against the ground truth (torchmetrics, uint8 RGB scaled to [0, 1])."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

METRIC_CHUNK = 4  # frames per torchmetrics call (SSIM keeps ~5 maps of the batch: bounded memory at 480x832)


def _f01(frames: np.ndarray, device="cpu") -> torch.Tensor:
    """uint8 [N, H, W, 3] -> [N, 3, H, W] in [0, 1]: float64 on cpu, float32 on an accelerator."""
    dt = torch.float64 if torch.device(device).type == "cpu" else torch.float32
    x = torch.from_numpy(np.ascontiguousarray(frames)).to(device)
    return x.permute(0, 3, 1, 2).to(dt) / 255.0


def psnr(pred: np.ndarray, target: np.ndarray, device="cpu") -> float | None:
    """PSNR (dB, data range 1 on uint8/255) of the MSE pooled over all given frames, with torchmetrics'
    `PeakSignalNoiseRatio` accumulated chunk by chunk; None when the frames are identical (PSNR infinite)."""
    from torchmetrics.image import PeakSignalNoiseRatio  # heavy (~2.5 s): only when metrics are computed

    if np.array_equal(pred, target):
        return None
    m = PeakSignalNoiseRatio(data_range=1.0).to(device)
    for i in range(0, len(pred), METRIC_CHUNK):
        m.update(_f01(pred[i : i + METRIC_CHUNK], device), _f01(target[i : i + METRIC_CHUNK], device))
    return float(m.compute())


def ssim_frames(pred: np.ndarray, target: np.ndarray, device="cpu") -> list[float]:
    """SSIM of each frame (torchmetrics, gaussian 11x11 sigma 1.5, data range 1)."""
    # heavy (~2.5 s): only when metrics are computed
    from torchmetrics.functional.image import structural_similarity_index_measure

    out = []
    for i in range(0, len(pred), METRIC_CHUNK):
        v = structural_similarity_index_measure(
            _f01(pred[i : i + METRIC_CHUNK], device),
            _f01(target[i : i + METRIC_CHUNK], device),
            data_range=1.0,
            reduction="none",
        )
        out += [float(x) for x in v.reshape(-1).cpu()]
    return out


def video_metrics(pred: np.ndarray, target: np.ndarray, ssim: bool = True, device="cpu") -> dict[str, Any]:
    """Per-frame PSNR/SSIM and the summary: `psnr` over frames 1.. (pooled MSE), `ssim` = mean per-frame SSIM over
    frames 1.., `psnr_frame0`. PSNR None = identical (infinite); SSIM None when not computed."""
    if pred.shape != target.shape:
        raise ValueError(f"videos differ in shape: {pred.shape} vs {target.shape}")
    s = ssim_frames(pred, target, device) if ssim else None
    frames = [
        {"frame": f, "psnr": psnr(pred[f : f + 1], target[f : f + 1], device), "ssim": s[f] if s else None}
        for f in range(len(pred))
    ]
    rest = s[1:] if s else []
    return {
        "psnr": psnr(pred[1:], target[1:], device) if len(pred) > 1 else None,
        "ssim": float(np.mean(rest)) if rest else None,
        "psnr_frame0": frames[0]["psnr"],
        "frames": frames,
    }
