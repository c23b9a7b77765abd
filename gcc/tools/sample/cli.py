"""Offline TI2V evaluation (docs/design.md §10): sample val clips with a gc25d teacher, decode, compare with the ground truth.

    python -m gcc.tools.sample (--ckpt X.safetensors | --base [--vocab parts|ids]) [--model_dir WAN_DIR] \
        --data ROOT [--raw_root RAW] (--clip_ids a,b | --clip_ids @file | --n N) --out OUT \
        [--steps 50 --shift 5 --cfg 1 --sem_cfg 1 --sem_mode cond|unknown --seed 0 --no_ssim --no_recon_ceiling]

Choices (docs/sample.md has the full description):
* With --model_dir the Wan2.2 VAE decodes and PSNR/SSIM compare with the GT frames. Without it the data must be
  `gcc.synth.world`'s (its prepared root holds `synth.json`): the synthetic world's own decoder turns the latents
  into classes, compared cell by cell with the clip's sem ids (`gcc.tools.sample.judges`).
* The clean first frame is latent frame 0 of the clip's `input_latents` (what the model was trained with; the
  prep writes the VAE encoding of the same frames), not a re-encoding of the GT jpg.
* Noise is a pure function of (seed, clip_id); guidance as in `gcc.sampling.sampler`.
* The vocab is the checkpoint's (metadata); `--vocab` with `--ckpt` is only an assertion.
* PSNR of identical videos (MSE 0, PSNR infinite) is reported as `null` in every json.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from gcc.cli import ToolParser, fail, folder_problem, run_tool
from gcc.geometry import Geometry
from gcc.inputs import shown
from gcc.model.config import WAN_SHIFT
from gcc.names import UnsafeName, check_component
from gcc.sampling.media import FPS, write_json
from gcc.sampling.sampler import clip_noise, sample_latents, sync
from gcc.sampling.vae import VaeError, find_vae_file
from gcc.synth.world import MARKER, is_synthetic
from gcc.tools.sample.dit import check_fits, ckpt_model, ckpt_vocab, load_dit
from gcc.tools.sample.errors import SampleError
from gcc.tools.sample.judges import SynthJudge, VaeJudge
from gcc.tools.sample.sources import open_source, parse_clip_ids, select_clips
from gcc.vocab import UNKNOWN, VOCABS, collapse_parts

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    ap = ToolParser(
        "gcc-sample",
        "Offline TI2V evaluation: sample val clips with a gc25d teacher (or the base Wan weights), decode them and\n"
        "compare with the ground truth (PSNR/SSIM through the Wan VAE, or per-cell class agreement on gcc-synth\n"
        "data); writes an mp4 per clip and the metrics as json.",
        renamed={"--data_root": "--data", "--out_dir": "--out", "--val_n": "--n"},
    )
    w = ap.add_mutually_exclusive_group(required=True)
    w.add_argument("--ckpt", help="gc25d export (.safetensors); its metadata gives the vocab")
    w.add_argument("--base", action="store_true", help="base Wan weights from --model_dir with a zero cond")
    ap.add_argument(
        "--vocab",
        choices=VOCABS,
        default=None,
        help="with --base: the cond's vocab (default: parts); with --ckpt: must equal the checkpoint's",
    )
    ap.add_argument(
        "--model_dir",
        default=None,
        help="Wan2.2-TI2V-5B folder (sharded DiT + Wan2.2_VAE.pth); may be left out for data made by "
        "gcc-synth, which is then decoded by the synthetic world's own decoder",
    )
    ap.add_argument(
        "--model",
        default=None,
        help="model preset (ti2v-5b, wide, tiny, tiny-p1); default: the one the export records (or whose layout "
        "it has), ti2v-5b with --base",
    )
    ap.add_argument("--data", required=True, help="prepared root or converted shards folder (local)")
    ap.add_argument("--raw_root", default=None, help="ground-truth tars (default: <prepared root>/raw)")
    sel = ap.add_mutually_exclusive_group(required=True)
    sel.add_argument("--clip_ids", help="a,b,c or @file")
    sel.add_argument("--n", type=int, help="N val clips (drop=false), round-robin over runs")
    ap.add_argument("--steps", type=int, default=50, help="denoising steps (FlowMatchScheduler, Wan's schedule)")
    ap.add_argument("--shift", type=float, default=WAN_SHIFT, help="the schedule's sigma shift (Wan2.2 TI2V uses 5)")
    ap.add_argument("--cfg", type=float, default=1.0, help="text guidance scale (uncond = NULL_PROMPT cells)")
    ap.add_argument("--sem_cfg", type=float, default=1.0, help="semantic guidance scale (uncond = ids all 255)")
    ap.add_argument(
        "--sem_mode", choices=("cond", "unknown"), default="cond", help="unknown: the model gets ids all 255"
    )
    ap.add_argument("--seed", type=int, default=0, help="noise seed; a clip's noise depends on (seed, clip id) only")
    ap.add_argument(
        "--out",
        required=True,
        help="folder for the mp4 panels (and PNG contact sheets without --model_dir) and the json files",
    )
    ap.add_argument("--no_ssim", action="store_true", help="skip SSIM (the slowest metric)")
    ap.add_argument(
        "--no_recon_ceiling",
        action="store_true",
        help="skip the VAE round trip of the ground truth (the metrics' ceiling)",
    )
    ap.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    ap.add_argument(
        "--dtype",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="DiT and VAE dtype (auto: bf16 on cuda, fp32 on cpu)",
    )
    ap.add_argument("--vae_tiled", action="store_true", help="DiffSynth's tiled VAE encode/decode")
    ap.add_argument("--fps", type=int, default=FPS, help="frame rate of the written mp4 files")
    ap.add_argument("--no_progress", action="store_true", help="no per-step progress bar (the per-clip lines stay)")
    return ap


class SetProgress:
    """A per-step bar for each clip's denoising loop (tqdm: the clip's steps, rate and time left) whose postfix
    estimates the time left for the whole set: the remaining steps at this clip's pace plus the remaining clips at
    the mean time of a finished clip (its data, decode, recon and metrics included)."""

    def __init__(self, n_clips: int, steps: int):
        self.n_clips, self.steps = n_clips, steps
        self.clip_times: list[float] = []
        self._bar: Any = None  # the running clip's tqdm bar

    def clip_bar(self, n: int, cid: str, device) -> Callable[[], None]:
        self._bar = tqdm(
            total=self.steps,
            desc=f"[{n + 1}/{self.n_clips}] {shown(cid)}",
            unit="step",
            leave=False,
            mininterval=1.0,
            file=sys.stderr,
        )
        t0, left_clips = time.perf_counter(), self.n_clips - n - 1

        def step() -> None:
            sync(device)
            bar = self._bar
            bar.update(1)
            per_step = (time.perf_counter() - t0) / bar.n
            per_clip = _mean(self.clip_times) or per_step * self.steps
            left = (self.steps - bar.n) * per_step + left_clips * per_clip
            bar.set_postfix_str(f"set: {left_clips} clip(s) after this one, ~{left / 60:.1f} min left")  # drawn now

        return step

    def clip_done(self, seconds: float) -> None:
        self.clip_times.append(seconds)
        if self._bar is not None:
            self._bar.close()


def _mean(vals) -> float | None:
    v = [x for x in vals if x is not None]
    return float(np.mean(v)) if v else None


def check_args(a: argparse.Namespace) -> torch.device:
    """The flags' values and the output folder, before anything is read; returns the device."""
    if a.steps < 1:
        raise SampleError(f"--steps must be >= 1, got {a.steps}")
    if a.fps < 1:
        raise SampleError(f"--fps must be >= 1, got {a.fps}")
    for flag, v in (("--shift", a.shift), ("--cfg", a.cfg), ("--sem_cfg", a.sem_cfg)):
        if not math.isfinite(v) or (flag == "--shift" and v <= 0):
            raise SampleError(f"{flag} must be a finite number{' > 0' if flag == '--shift' else ''}, got {v}")
    problem = folder_problem(a.out)
    if problem:
        raise SampleError(f"--out {a.out}: {problem}")
    try:
        device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError:
        raise SampleError(f"--device {a.device!r}: not a device (expected cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not (torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()):
        raise SampleError(
            f"--device {a.device}: no such CUDA device here ({torch.cuda.device_count()} visible); use --device cpu"
        )
    if device.type not in ("cpu", "cuda"):
        raise SampleError(f"--device {a.device!r}: only cpu and cuda are supported")
    return device


def run(a: argparse.Namespace) -> dict[str, Any]:
    t_start = time.perf_counter()
    device = check_args(a)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}.get(
        a.dtype, torch.bfloat16 if device.type == "cuda" else torch.float32
    )

    # everything that can be wrong with the inputs is checked before the models load
    model, vocab, ckpt_kind, ckpt_weights = _model_and_vocab(a)
    vae_path, src = _open_data(a, model, vocab)
    rows, clip_ids = _select_clips(a, src)
    judge, raw_root = _make_judge(a, src, vae_path, vocab, device)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    dit = load_dit(model, vocab, device, dtype, ckpt=a.ckpt, model_dir=a.model_dir)
    judge.load(dtype)
    sync(device)
    t_load = time.perf_counter() - t_start  # option checks, data index, DiT + VAE

    per_clip, failed, tot = _sample_clips(a, src, judge, dit, vocab, out, device, clip_ids, rows)

    metrics = {
        "ckpt": str(a.ckpt) if a.ckpt else "",
        "weights": ckpt_kind,
        "ckpt_weights": ckpt_weights,  # raw, or ema (a run's step-N.ema.safetensors)
        "vocab": vocab,
        "model": model,
        **judge.header(),
        "decoder": judge.name,
        "data_root": str(a.data),
        "data_kind": src.kind,
        "raw_root": str(raw_root) if raw_root is not None else "",
        "settings": {
            "steps": a.steps,
            "shift": a.shift,
            "cfg": a.cfg,
            "sem_cfg": a.sem_cfg,
            "sem_mode": a.sem_mode,
            "seed": a.seed,
            "device": str(device),
            "dtype": str(dtype).replace("torch.", ""),
            "ssim": not a.no_ssim,
            "recon_ceiling": not a.no_recon_ceiling,
            "vae_tiled": a.vae_tiled,
        },
        "clip_ids": clip_ids,
        "mean": {k: _mean(r[k] for r in per_clip.values()) for k in judge.mean_keys},
        "clips": per_clip,
        "failed": failed,  # clip id -> why it has no row (the mean is over the others)
        "timings": {"load": t_load, **tot, "total": time.perf_counter() - t_start},
    }
    write_json(out / "metrics.json", metrics)
    metrics["summary"] = judge.summary(metrics)
    return metrics


def _model_and_vocab(a: argparse.Namespace) -> tuple[str, str, str, str]:
    """The model preset, the vocab, the weights' kind and which weights (raw or ema) of --ckpt or --base."""
    from gcc.model.dit import PRESETS  # heavy (diffsynth, ~4 s): keeps --help and argument errors fast

    if a.model is not None and a.model not in PRESETS:
        raise SampleError(f"--model {a.model!r}: unknown preset; known: {sorted(PRESETS)}")
    model = a.model or (ckpt_model(a.ckpt) if a.ckpt else "ti2v-5b")
    if a.ckpt:
        vocab, ckpt_kind, ckpt_weights = ckpt_vocab(a.ckpt, a.vocab, model)
    else:
        vocab, ckpt_kind, ckpt_weights = a.vocab or "parts", "base", "raw"
        if not a.model_dir:
            raise SampleError(
                "--base loads the Wan weights of --model_dir: pass --model_dir (the Wan2.2-TI2V-5B folder)"
            )
    return model, vocab, ckpt_kind, ckpt_weights


def _open_data(a: argparse.Namespace, model: str, vocab: str):
    """The VAE file (None without --model_dir) and the opened --data, once the model is known to fit; data without
    a decoder (no VAE, not gcc-synth's) is refused."""
    try:
        vae_path = find_vae_file(a.model_dir) if a.model_dir else None
    except VaeError as e:
        raise SampleError(f"--model_dir {e}") from None
    check_fits(model, vocab, ckpt=a.ckpt, model_dir=a.model_dir)
    src = open_source(a.data)
    if vae_path is None and not is_synthetic(src.prepared_root):
        raise SampleError(
            f"--data {a.data}: no --model_dir, and the data is not gcc.synth.world's (its "
            f"prepared root {src.prepared_root} holds no {MARKER}), so there is no decoder: pass "
            f"--model_dir (the Wan2.2-TI2V-5B folder, whose VAE decodes)"
        )
    return vae_path, src


def _select_clips(a: argparse.Namespace, src):
    """The data's index rows of the wanted clips (--clip_ids, checked names) and the clip ids to sample (--n)."""
    try:
        wanted = parse_clip_ids(a.clip_ids) if a.clip_ids else None
        # a clip id of the data is a checked name (gcc/names.py): one that is not cannot be there, and is shown
        # escaped, never printed raw (docs/training.md, "Trust and safety")
        for cid in wanted or ():
            check_component(cid, "--clip_ids: clip id")
    except UnicodeDecodeError as e:  # an @file that is not text
        raise SampleError(f"--clip_ids {shown(a.clip_ids)}: not UTF-8 text (byte {e.start})") from None
    except UnsafeName as e:
        raise SampleError(f"{e}; no clip of the data has such an id") from None
    rows = src.rows_for(wanted)
    clip_ids = select_clips(rows, wanted, a.n)
    return rows, clip_ids


def _make_judge(a: argparse.Namespace, src, vae_path, vocab: str, device) -> tuple[VaeJudge | SynthJudge, Path | None]:
    """The judge (the Wan VAE's with a VAE file, else the synthetic world's) and the ground truth's raw root."""
    judge: VaeJudge | SynthJudge
    if vae_path is not None:
        raw_root = Path(a.raw_root) if a.raw_root else src.default_raw
        judge = VaeJudge(a, vae_path, raw_root, vocab, device)
    else:
        raw_root = None  # the synthetic decoder compares with the sem ids, not the GT frames
        judge = SynthJudge(a, src.table, vocab)
    return judge, raw_root


def _sample_clips(a: argparse.Namespace, src, judge, dit, vocab: str, out: Path, device, clip_ids, rows):
    """Every clip sampled and judged in turn: (rows per clip id, failed clip id -> why, summed timings)."""
    per_clip, failed, tot = {}, {}, {k: 0.0 for k in judge.timing_keys}
    progress = SetProgress(len(clip_ids), a.steps)
    for n, cid in enumerate(clip_ids):
        t_data = time.perf_counter()
        try:
            bar = None if a.no_progress else progress.clip_bar(n, cid, device)
            row = sample_clip(a, src, judge, dit, vocab, out, device, cid, rows[cid], bar)
        except Exception as e:  # a clip that cannot be read or judged: said, recorded, and the others go on
            reason = clip_failure(e)
            failed[cid] = reason
            progress.clip_done(time.perf_counter() - t_data)
            logger.warning("[%d/%d] %s: failed: %s", n + 1, len(clip_ids), shown(cid), reason)
            continue
        per_clip[cid] = row
        progress.clip_done(time.perf_counter() - t_data)
        for k in tot:
            tot[k] += row["timings"][k]
        logger.info(
            "[%d/%d] %s: %s (%.1f s sampling)",
            n + 1,
            len(clip_ids),
            shown(cid),
            judge.describe(row),
            row["timings"]["sampling"],
        )
    return per_clip, failed, tot


def clip_failure(e: Exception) -> str:
    """Why a clip failed, in one line: an error of its input (its files, their contents: exit 2 or 6 anywhere
    else); any other error (a full disk, storage away, a bug) stops the evaluation as it would anyway."""
    from gcc import exit_codes
    from gcc.errors import exit_for

    verdict = exit_for(e)
    if verdict is None or verdict[0] not in (exit_codes.CONFIG, exit_codes.DATA):
        raise e
    return verdict[1]


def sample_clip(a, src, judge, dit, vocab: str, out: Path, device, cid: str, row_of: dict, on_step) -> dict:
    """One clip sampled, decoded and judged: its metrics row (docs/sample.md)."""
    t_data = time.perf_counter()
    clip = src.load(cid)
    lat = clip.input_latents
    geo = Geometry.from_shapes(lat.shape, src.table.shape)
    sem_ids = clip.sem_ids()
    if sem_ids.shape != geo.sem_shape:
        raise SampleError(f"clip {shown(cid)}: sem ids {sem_ids.shape} do not match latents {tuple(lat.shape)}")
    sem = sem_ids if vocab == "parts" else collapse_parts(sem_ids)
    if a.sem_mode == "unknown":
        sem = np.full_like(sem, UNKNOWN)
    ref = judge.reference(clip, geo, sem_ids)

    t0 = time.perf_counter()
    prompts, index = src.table.prompts(clip.context_ids)
    gen_lat = sample_latents(
        dit,
        lat[:, 0:1].float(),
        prompts,
        index,
        src.table.row(src.table.null_id),
        torch.from_numpy(np.ascontiguousarray(sem)),
        clip_noise(a.seed, cid, geo.latent_shape),
        steps=a.steps,
        shift=a.shift,
        cfg=a.cfg,
        sem_cfg=a.sem_cfg,
        on_step=on_step,
    )
    sync(device)
    t1 = time.perf_counter()
    m, hw, times = judge.compare(out, clip, geo, gen_lat, ref, sem)
    return {
        **m,
        "num_frames": int(geo.F),
        "hw": hw,
        "run": clip.run,
        "split": row_of["split"],
        "timings": {"data": t0 - t_data, "sampling": t1 - t0, **times},
    }


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    p = build_parser()
    a = p.parse_args(list(argv) if argv is not None else None)

    def body() -> int:
        from gcc import exit_codes

        m = run(a)
        print(m["summary"])
        print(f"metrics: {Path(a.out) / 'metrics.json'} (every number, per clip and per frame)")
        if m["failed"]:  # the others were judged: their numbers are in metrics.json
            return fail(
                p.prog,
                f"{len(m['failed'])} of {len(m['clip_ids'])} clip(s) failed: "
                + "; ".join(f"{shown(c)}: {why}" for c, why in m["failed"].items()),
                exit_codes.DATA,
            )
        return 0

    return run_tool(p.prog, body)
