"""Samples during training (docs/sample.md, "Samples during training"): at every `sample_every`-th validation
(and the last step's), `sample_n` fixed val clips sampled twice from the same noise, with their semantic
condition and with it off (ids all UNKNOWN), decoded and logged: a video per clip and variant and a contact sheet
(GT | conditioned | unconditioned | condition) to every logger that takes media, `samples/step-N/` in the run
folder, and the scores `sample/<score>_cond`, `sample/<score>_uncond` as scalars.

* One sampler: `gcc.sampling.sampler.sample_latents`, the one `gcc-sample` runs, with the same noise
  (`clip_noise(seed, clip_id)`): an export of step N sampled by `gcc-sample --seed <seed>` starts from this noise.
* Every rank samples its share of the clips, the model still sharded under FSDP: all ranks run the same number of
  forward passes in lockstep (a rank with fewer clips samples a padding clip and drops it). Each rank decodes its
  own clips; rank 0 gathers the frames, writes and logs.
* Deterministic: the noise is a function of (seed, clip), the clips are fixed, the steps at which it samples are
  a function of the step; a resumed run samples step N exactly as an uninterrupted one.
* It runs at EVAL_END before StepDeadline's handler, so under the validation's deadline (`stall_timeout_s`).
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from composer.core import Callback, State
from composer.core.precision import get_precision_context
from composer.loggers import Logger
from composer.utils import dist

from gcc.sampling.media import gif_bytes, latent_frame_rows, png_size, write_contact_sheet, write_panels_mp4
from gcc.sampling.sampler import clip_noise, sample_latents
from gcc.storage import atomic_write
from gcc.vocab import UNKNOWN, VALUE_NAMES, colorize

log = logging.getLogger(__name__)  # not `logger`: Composer passes its Logger under that name

VARIANTS = ("cond", "uncond")
SAMPLES = "samples"
# a round's folder, samples/step-N (ASCII digits: anything else there is not the run's and is left alone)
STEP_FOLDER = re.compile(r"step-([0-9]{1,18})")


@dataclass(frozen=True)
class SampleSettings:
    every_steps: int  # eval_interval × sample_every: the steps at which it samples (and the last step)
    max_steps: int
    steps: int  # denoising steps
    shift: float
    sem_cfg: float
    seed: int
    fps: int
    keep: int  # step-N folders kept in samples/ (0: all)


@dataclass
class ClipSample:
    """One clip's pictures, made on the rank that sampled it and gathered to rank 0."""

    index: int
    clip_id: str
    gt: np.ndarray  # uint8 [F, H, W, 3]
    videos: dict[str, np.ndarray]  # variant -> uint8 [F, H, W, 3]
    condition: np.ndarray  # uint8 [F, H, W, 3]: the sem ids in the palette
    classes: np.ndarray  # the classes shown (the contact sheet's legend)
    scores: dict[str, float | None]  # variant -> score (None: the decoder has none, or PSNR infinite)


def step_folder(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / SAMPLES / f"step-{step}"


class TrainingSamples(Callback):
    def __init__(
        self,
        run_dir: str | Path,
        model,
        load_clip: Callable[[int], dict],
        sample_ids: Sequence[int],
        decoder,
        settings: SampleSettings,
        vocab: str,
    ):
        """`model`: the GcTrainModel (its `dit` sharded in place under FSDP); `load_clip(sample_id)` a val sample as
        the dataset gives it; `decoder` one of gcc.sampling.decoders'."""
        self.run_dir, self.model, self.load_clip = Path(run_dir), model, load_clip
        self.sample_ids, self.decoder, self.s, self.vocab = list(sample_ids), decoder, settings, vocab
        self.last: dict[str, Any] | None = None  # the latest round's summary (tests, the console)
        self._gt: dict[str, Any] = {}  # clip id -> its decoded GT: the same every round (a VAE decode saved)

    def due(self, step: int) -> bool:
        return bool(self.sample_ids) and (step % self.s.every_steps == 0 or step == self.s.max_steps)

    def eval_end(self, state: State, logger: Logger) -> None:
        step = int(state.timestamp.batch)
        if not self.due(step):
            return
        t0 = time.perf_counter()
        with get_precision_context(state.precision, state.precision_config):
            mine = self._sample_my_share()
        gathered = _gather_to_rank0(mine)
        seconds = time.perf_counter() - t0
        scalars = {"sample/seconds": seconds}
        if dist.get_global_rank() == 0:
            clips = sorted((c for part in gathered for c in part), key=lambda c: c.index)
            folder = self._write(step, clips, seconds)
            for name in VARIANTS:
                scores = [c.scores[name] for c in clips if c.scores[name] is not None]
                if self.decoder.score_name and scores:
                    scalars[f"sample/{self.decoder.score_name}_{name}"] = float(np.mean(scores))
            media = [_media(c, folder, self.s.fps) for c in clips]
            for dest in logger.destinations:
                if hasattr(dest, "log_samples"):  # gcc's TensorBoard, W&B and MLflow loggers
                    dest.log_samples(step, folder, media)
            self.last = {"step": step, "folder": folder, "scalars": dict(scalars)}
            log.info(
                f"samples at step {step}: {len(clips)} clip(s) x {len(VARIANTS)} variants, {self.s.steps} steps, "
                f"decoded by the {self.decoder.name}, in {seconds:.1f} s: {folder}"
                + "".join(f", {k.removeprefix('sample/')} {v:.3f}" for k, v in scalars.items() if k != "sample/seconds")
            )
        logger.log_metrics(scalars)

    @torch.no_grad()
    def _sample_my_share(self) -> list[ClipSample]:
        """This rank's clips: index r, r + world, ...; every rank runs the same number of samplings (FSDP's
        collectives), a padding slot samples the first clip and drops it."""
        rank, world = dist.get_global_rank(), dist.get_world_size()
        n = len(self.sample_ids)
        out = []
        for slot in range(math.ceil(n / world)):
            index = slot * world + rank
            real = index < n
            clip = self.load_clip(self.sample_ids[index if real else 0])
            latents = {name: self._sample(clip, name) for name in VARIANTS}
            if real:
                out.append(self._decode(index, clip, latents))
        return out

    def _sample(self, clip: dict, variant: str) -> torch.Tensor:
        lat = clip["input_latents"]
        sem = clip["sem_ids"] if variant == "cond" else torch.full_like(clip["sem_ids"], UNKNOWN)
        return sample_latents(
            self.model.dit,
            lat[:, 0:1].float(),
            clip["context"],
            clip["context_index"],
            self.model.null_context,
            sem,
            clip_noise(self.s.seed, clip["clip_id"], tuple(lat.shape)),
            steps=self.s.steps,
            shift=self.s.shift,
            sem_cfg=self.s.sem_cfg if variant == "cond" else 1.0,
        ).cpu()

    def _decode(self, index: int, clip: dict, latents: dict[str, torch.Tensor]) -> ClipSample:
        gt_lat, ids = clip["input_latents"], clip["context_ids"].tolist()
        gt = self._gt.get(clip["clip_id"]) or self._gt.setdefault(
            clip["clip_id"], self.decoder.decode(gt_lat, ids, gt_lat)
        )
        videos, scores, shown = {}, {}, [np.unique(clip["sem_ids"].numpy())]
        for name, lat in latents.items():
            d = self.decoder.decode(lat, ids, gt_lat)
            videos[name], scores[name] = d.frames, self.decoder.score(d, gt)
            if d.cells is not None:
                shown.append(np.unique(d.cells))
        if gt.cells is not None:
            shown.append(np.unique(gt.cells))
        sem = clip["sem_ids"].numpy()
        return ClipSample(
            index,
            clip["clip_id"],
            gt.frames,
            videos,
            colorize(sem, self.vocab),
            np.unique(np.concatenate(shown)),
            scores,
        )

    def _write(self, step: int, clips: list[ClipSample], seconds: float) -> Path:
        """samples/step-N/ written whole under a temporary name, then renamed (a step's folder is complete or
        absent; a relaunch that samples step N again replaces it with the same pictures); then the rotation."""
        final = step_folder(self.run_dir, step)
        tmp = final.with_name(f".{final.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for c in clips:
            for name, video in c.videos.items():
                write_panels_mp4(tmp / f"{c.clip_id}.{name}.mp4", c.gt, video, c.condition, fps=self.s.fps)
            _sheet(tmp / f"{c.clip_id}.png", c, step, self.decoder, self.vocab)
        atomic_write(
            tmp / "samples.json",
            json.dumps(
                {
                    "step": step,
                    "decoder": self.decoder.name,
                    "score": self.decoder.score_name,
                    "settings": {k: getattr(self.s, k) for k in ("steps", "shift", "sem_cfg", "seed")},
                    "seconds": seconds,
                    "clips": {c.clip_id: c.scores for c in clips},
                },
                indent=1,
            )
            + "\n",
        )
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        rotate_samples(self.run_dir, self.s.keep)
        return final


def _media(c: ClipSample, folder: Path, fps: int) -> dict[str, Any]:
    """What a logger gets per clip: each variant's mp4 (file name) and animated GIF (bytes, (h, w)), and the contact
    sheet's PNG (file name, bytes, (h, w))."""
    videos = {}
    for name, v in c.videos.items():
        gif, hw = gif_bytes(np.concatenate([c.gt, v, c.condition], axis=2), fps)
        videos[name] = {"file": f"{c.clip_id}.{name}.mp4", "gif": gif, "hw": hw}
    png = (folder / f"{c.clip_id}.png").read_bytes()
    return {
        "clip_id": c.clip_id,
        "videos": videos,
        "sheet": {"file": f"{c.clip_id}.png", "png": png, "hw": png_size(png)},
    }


def _sheet(path: Path, c: ClipSample, step: int, decoder, vocab: str) -> None:
    rows, labels = latent_frame_rows([c.gt, c.videos["cond"], c.videos["uncond"], c.condition], {0: "given"})
    scores = ", ".join(f"{name} {'n/a' if v is None else f'{v:.3f}'}" for name, v in c.scores.items())
    caption = f"{c.clip_id} at step {step}" + (f": {decoder.score_name} {scores}" if decoder.score_name else "")
    classes = np.array([v for v in c.classes if int(v) in VALUE_NAMES[vocab]], dtype=np.uint8)
    write_contact_sheet(
        path, rows, ["GT", "conditioned", "unconditioned", "condition (model input)"], labels, caption, classes, vocab
    )


def rotate_samples(run_dir: str | Path, keep: int) -> list[Path]:
    """Keep the `keep` newest samples/step-N folders (0: all); returns what was removed."""
    root = Path(run_dir) / SAMPLES
    if keep <= 0 or not root.is_dir():
        return []
    steps = sorted(
        (int(m[1]), p) for p in root.iterdir() if p.is_dir() and (m := STEP_FOLDER.fullmatch(p.name)) is not None
    )
    doomed = [p for _, p in steps[:-keep]]
    for p in doomed:
        shutil.rmtree(p)
    return doomed


def _gather_to_rank0(obj: Any) -> list[Any]:
    """Every rank's `obj` on rank 0 (a list by rank), [] elsewhere."""
    if dist.get_world_size() == 1:
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_global_rank() == 0 else None
    torch.distributed.gather_object(obj, out, dst=0)
    return out or []
