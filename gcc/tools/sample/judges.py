"""How a sampled clip is turned into pictures and numbers: the Wan2.2 VAE against the ground-truth frames, or, for
data made by `gcc.synth.world` (no VAE), the synthetic world's own decoder against the clip's sem ids.

Both serve the one per-clip loop of `gcc.tools.sample.cli.run`: `reference` reads what the sample is compared with
(counted as the clip's data time), `compare` decodes the sampled latents, measures and writes the clip's files.
docs/sample.md describes both.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gcc.geometry import Geometry, latent_frame_spans
from gcc.inputs import shown
from gcc.sampling.decoders import SynthDecoder
from gcc.sampling.media import latent_frame_rows, write_contact_sheet, write_json, write_panels_mp4
from gcc.sampling.metrics import video_metrics
from gcc.sampling.sampler import sync
from gcc.sampling.vae import load_vae, vae_decode, vae_encode
from gcc.synth import world as synth
from gcc.synth.decode import agreement, cells_to_pixels, gt_cell_classes
from gcc.tools.sample.errors import SampleError
from gcc.tools.sample.sources import read_gt, resample_rgb
from gcc.vocab import NULL_PROMPT, colorize


class VaeJudge:
    """Decode with the Wan2.2 VAE; PSNR/SSIM against the GT jpg frames, and the VAE's own ceiling (encode -> decode of
    the GT)."""

    name = "wan2.2-vae"
    timing_keys = ("data", "sampling", "decode", "recon", "metrics")
    mean_keys = ("psnr", "ssim", "psnr_frame0", "recon_psnr", "recon_ssim", "recon_psnr_frame0")

    def __init__(self, a, vae_path: Path, raw_root: Path | None, vocab: str, device):
        if raw_root is None or not raw_root.is_dir():
            raise SampleError(f"ground-truth root {raw_root} not found: pass --raw_root (the prepared root's raw/)")
        self.a, self.vae_path, self.raw_root, self.vocab, self.device = a, vae_path, raw_root, vocab, device
        self.vae = None

    def header(self) -> dict[str, Any]:
        return {"model_dir": str(self.a.model_dir), "vae": str(self.vae_path)}

    def load(self, dtype) -> None:
        self.vae = load_vae(self.vae_path, self.device, dtype)

    def reference(self, clip, geo: Geometry, sem_ids: np.ndarray) -> np.ndarray:
        return resample_rgb(read_gt(self.raw_root, clip, geo.F), clip.meta().get("dst_hw", geo.dst_hw))

    def compare(self, out: Path, clip, geo: Geometry, gen_lat: torch.Tensor, gt: np.ndarray, sem: np.ndarray):
        """-> (metrics row, [h, w], timings {decode, recon, metrics})."""
        a, device, cid = self.a, self.device, clip.clip_id
        t1 = time.perf_counter()
        gen = vae_decode(self.vae, gen_lat, device, a.vae_tiled)
        sync(device)
        t2 = time.perf_counter()
        recon = None
        if not a.no_recon_ceiling:
            recon = vae_decode(self.vae, vae_encode(self.vae, gt, device, a.vae_tiled), device, a.vae_tiled)
            sync(device)
        t3 = time.perf_counter()
        if gen.shape != gt.shape:
            raise SampleError(f"clip {shown(cid)}: decoded video {gen.shape} differs from the ground truth {gt.shape}")
        m = video_metrics(gen, gt, ssim=not a.no_ssim, device=device)
        rm = video_metrics(recon, gt, ssim=not a.no_ssim, device=device) if recon is not None else None
        write_panels_mp4(out / f"{cid}.mp4", gt, gen, colorize(sem, self.vocab), fps=a.fps)
        t4 = time.perf_counter()
        frames = m.pop("frames")
        if rm is not None:
            for fr, rf in zip(frames, rm.pop("frames")):
                fr["recon_psnr"], fr["recon_ssim"] = rf["psnr"], rf["ssim"]
        write_json(out / f"{cid}.frames.json", {"clip_id": cid, "frames": frames})
        row = {
            **m,
            "recon_psnr": rm["psnr"] if rm else None,
            "recon_ssim": rm["ssim"] if rm else None,
            "recon_psnr_frame0": rm["psnr_frame0"] if rm else None,
        }
        return row, [int(gt.shape[1]), int(gt.shape[2])], {"decode": t2 - t1, "recon": t3 - t2, "metrics": t4 - t3}

    # what the console shows of a clip's numbers, rounded to what they can tell apart (metrics.json keeps them whole):
    # (key, heading, digits)
    COLUMNS = (
        ("psnr", "PSNR dB", 2),
        ("ssim", "SSIM", 4),
        ("psnr_frame0", "frame 0 dB", 2),
        ("recon_psnr", "VAE ceiling dB", 2),
    )

    @classmethod
    def describe(cls, row: dict[str, Any]) -> str:
        return "  ".join(f"{head} {_fmt(row[k], d)}" for k, head, d in cls.COLUMNS)

    @classmethod
    def summary(cls, metrics: dict[str, Any]) -> str:
        """One screen: a row per clip (the first SUMMARY_ROWS), the mean, the clips that failed."""
        rows = [(shown(c), [_fmt(r[k], d) for k, _, d in cls.COLUMNS]) for c, r in metrics["clips"].items()]
        mean = metrics["mean"]
        return _table(
            "PSNR/SSIM of the generated frames 1.. against the ground truth (frame 0 is given; the VAE ceiling is the "
            "ground truth's own round trip)",
            ["clip", *(head for _, head, _ in cls.COLUMNS)],
            rows,
            ["mean", *(_fmt(mean[k], d) for k, _, d in cls.COLUMNS)],
            metrics["failed"],
        )


class SynthJudge:
    """The synthetic world's decoder (`gcc.synth.decode`): sampled latents -> class per latent cell, compared
    with the majority class of the clip's sem ids in each cell; writes the GT | generated | condition mp4 and PNG
    contact sheet."""

    name = "synth"
    timing_keys = ("data", "sampling", "decode", "metrics")
    mean_keys = ("class_agreement", "class_agreement_frame0", "class_agreement_copy_frame0")

    def __init__(self, a, table, vocab: str):
        keys = set(table.keys) - {NULL_PROMPT}
        if not keys <= set(synth.PROMPT_KEYS):
            raise SampleError(
                f"--data {a.data}: marked as gcc.synth.world's ({synth.MARKER}), but its text "
                f"table has keys that world does not write: {sorted(keys - set(synth.PROMPT_KEYS))}"
            )
        self.a, self.vocab = a, vocab
        self.decoder = SynthDecoder(table.keys, vocab)  # the one the samples during training use

    def header(self) -> dict[str, Any]:
        return {"model_dir": "", "vae": ""}

    def load(self, dtype) -> None:
        pass  # the decoder is a fixed matrix

    def reference(self, clip, geo: Geometry, sem_ids: np.ndarray) -> np.ndarray:
        return gt_cell_classes(sem_ids, geo.T, geo.h, geo.w, self.vocab)

    def compare(self, out: Path, clip, geo: Geometry, gen_lat: torch.Tensor, gt: np.ndarray, sem: np.ndarray):
        """gt: the majority class per latent cell [T, h, w] -> (metrics row, [H, W], timings {decode, metrics})."""
        cid = clip.clip_id
        t1 = time.perf_counter()
        decoded = self.decoder.decode(gen_lat, clip.context_ids, gen_lat)
        gen = decoded.cells
        assert gen is not None  # the synthetic decoder classifies every cell
        t2 = time.perf_counter()
        frames: list[dict[str, Any]] = [
            {
                "latent_frame": k,
                "pixel_frames": [lo, hi - 1],
                "class_agreement": agreement(gen[k : k + 1], gt[k : k + 1], first=0),
            }
            for k, (lo, hi) in enumerate(latent_frame_spans(geo.T))
        ]
        # a reference, not the model: the agreement of a video that only repeats the given frame 0
        copy = agreement(np.broadcast_to(gt[:1], gt.shape), gt)
        row = {
            "class_agreement": agreement(gen, gt),
            "class_agreement_frame0": agreement(gen[:1], gt[:1], first=0),
            "class_agreement_copy_frame0": copy,
            "cells": int(gt[1:].size),
        }
        panels = (
            colorize(cells_to_pixels(gt), self.vocab),
            decoded.frames,
            colorize(sem, self.vocab),
        )
        write_panels_mp4(out / f"{cid}.mp4", *panels, fps=self.a.fps)
        notes = {0: "given"} | {k: f"agreement {_fmt(f['class_agreement'], 2)}" for k, f in enumerate(frames) if k}
        sheet, labels = latent_frame_rows(panels, notes)
        present = np.unique(np.concatenate([gt.ravel(), gen.ravel(), np.unique(sem)]))
        write_contact_sheet(
            out / f"{cid}.png",
            sheet,
            ["GT classes", "generated classes", "condition (model input)"],
            labels,
            f"{shown(cid)}: class agreement {_fmt(row['class_agreement'], 3)} (latent frames 1..)",
            present,
            self.vocab,
        )
        write_json(out / f"{cid}.frames.json", {"clip_id": cid, "latent_frames": frames})
        t3 = time.perf_counter()
        return row, [int(sem.shape[1]), int(sem.shape[2])], {"decode": t2 - t1, "metrics": t3 - t2}

    @staticmethod
    def describe(row: dict[str, Any]) -> str:
        return (
            f"class agreement {_fmt(row['class_agreement'], 3)} (latent frame 0: "
            f"{_fmt(row['class_agreement_frame0'], 3)})"
        )

    @staticmethod
    def summary(metrics: dict[str, Any]) -> str:
        """One screen: the mean (against frame 0 repeated), a row per clip (the first SUMMARY_ROWS), the clips that
        failed."""
        mean = metrics["mean"]
        rows = [
            (shown(c), [_fmt(r["class_agreement"], 3), _fmt(r["class_agreement_copy_frame0"], 3)])
            for c, r in metrics["clips"].items()
        ]
        return _table(
            f"class agreement, generated vs GT class per latent cell (latent frames 1..): mean "
            f"{_fmt(mean['class_agreement'], 3)} over {len(metrics['clips'])} clip(s); repeating the given frame 0 "
            f"would score {_fmt(mean['class_agreement_copy_frame0'], 3)}",
            ["clip", "agreement", "frame 0 repeated"],
            rows,
            ["mean", _fmt(mean["class_agreement"], 3), _fmt(mean["class_agreement_copy_frame0"], 3)],
            metrics["failed"],
        )


SUMMARY_ROWS = 12  # clips shown in the summary; the others are in metrics.json


def _table(title: str, heads: list[str], rows: list, last: list[str], failed: dict[str, str]) -> str:
    """The summary: its title, a table (a row per clip, at most SUMMARY_ROWS, then the mean row), and one line per
    failed clip (at most SUMMARY_ROWS)."""
    shown_rows = [[c, *vals] for c, vals in rows[:SUMMARY_ROWS]]
    if len(rows) > SUMMARY_ROWS:
        shown_rows.append([f"... {len(rows) - SUMMARY_ROWS} more", *[""] * (len(heads) - 1)])
    table = [heads, *shown_rows, last]
    widths = [max(len(r[i]) for r in table) for i in range(len(heads))]
    lines = [title] + [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))).rstrip()
        for r in table
    ]
    for c, why in list(failed.items())[:SUMMARY_ROWS]:
        lines.append(f"failed: {shown(c)}: {why}")
    if len(failed) > SUMMARY_ROWS:
        lines.append(f"failed: ... {len(failed) - SUMMARY_ROWS} more (metrics.json)")
    return "\n".join(lines)


def _fmt(v: float | None, digits: int) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"
