"""Offline TI2V evaluation (SPEC §10): sample val clips with a gc25d teacher, decode, compare with the ground truth.

    python -m gcc.sample (--ckpt X.safetensors | --base [--vocab parts|ids]) --model_dir WAN_DIR \
        --data_root ROOT [--raw_root RAW] (--clip_ids a,b | --clip_ids @file | --val_n N) --out_dir OUT \
        [--steps 50 --shift 5 --cfg 1 --sem_cfg 1 --sem_mode cond|unknown --seed 0 --no_ssim --no_recon_ceiling]

Choices (docs/sample.md has the full description):
* The clean first frame is latent frame 0 of the clip's `input_latents` (what the model was trained with; the
  prep writes the VAE encoding of the same frames), not a re-encoding of the GT jpg.
* Noise is a pure function of (seed, clip_id): a CPU generator seeded with `stable_seed("gcc.sample", seed,
  clip_id)`, so a clip gets the same noise whichever other clips are sampled with it.
* Guidance: e = e_c + (cfg - 1)(e_c - e_nulltext) + (sem_cfg - 1)(e_c - e_unknown), where e_c sees the true
  text and ids, e_nulltext NULL_PROMPT in every cell, e_unknown ids all 255. A scale of 1 skips its forward
  (cfg alone reduces to DiffSynth's e_u + cfg (e_c - e_u)); the variants of one step run as one batch.
* The vocab is the checkpoint's (metadata); `--vocab` with `--ckpt` is only an assertion.
* PSNR of identical videos (MSE 0, PSNR infinite) is reported as `null` in every json.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from gcc.vocab import UNKNOWN, VOCABS, colorize, collapse_parts

VAE_FILES = ("Wan2.2_VAE.pth", "Wan2.2_VAE.safetensors")  # as published / DiffSynth's converted copy
EXIT_ERROR = 2
FPS = 16


class SampleError(ValueError):
    """A user-facing error (bad option, missing clip/file, vocab mismatch); the message says what and where."""


# ---- the VAE ---------------------------------------------------------------------------------------------

def find_vae_file(model_dir: str | os.PathLike) -> Path:
    d = Path(model_dir)
    if not d.is_dir():
        raise SampleError(f"--model_dir {d}: not a directory (expected the Wan2.2-TI2V-5B folder as published)")
    for name in VAE_FILES:
        if (d / name).is_file():
            return d / name
    raise SampleError(f"--model_dir {d}: no VAE file ({' or '.join(VAE_FILES)}); the Wan2.2-TI2V-5B folder as "
                      f"published holds Wan2.2_VAE.pth")


def load_vae(path: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """DiffSynth's `WanVideoVAE38` with the weights of `path` (a `.pth` state dict as published, or safetensors).

    Loaded the way DiffSynth's model loader does it: `diffsynth.core.loader.file.load_state_dict` + the
    registered `WanVideoVAEStateDictConverter` (adds `model.`), modules built under `skip_model_initialization`,
    `load_state_dict(strict, assign)`. The network's widths are read from the file: z_dim = conv2's channels,
    dim = encoder.conv1's, dec_dim = decoder.conv1's / 4. The published file is (z 48, dim 160, dec 256), which
    `WanVideoVAE38(z_dim, dim)` builds; another decoder width (tiny test VAEs) swaps in DiffSynth's
    `VideoVAE38_(dim, z_dim, dec_dim)` as `.model`.
    """
    from gcc.diffsynth_parts import (VideoVAE38_, WanVideoVAE38, WanVideoVAEStateDictConverter, load_state_dict,
                                     skip_model_initialization)

    path = str(path)
    try:
        sd = WanVideoVAEStateDictConverter(load_state_dict(path))
        z_dim = int(sd["model.conv2.weight"].shape[0])
        dim = int(sd["model.encoder.conv1.weight"].shape[0])
        dec_dim = int(sd["model.decoder.conv1.weight"].shape[0]) // 4
    except KeyError as e:
        raise SampleError(f"{path}: not a Wan2.2 VAE state dict (no {e})") from None
    except Exception as e:
        raise SampleError(f"{path}: cannot be read as a VAE state dict: {e}") from None
    with skip_model_initialization():
        vae = WanVideoVAE38(z_dim=z_dim, dim=dim)
        if dec_dim != 256:  # VideoVAE38_'s default decoder width, the published one
            vae.model = VideoVAE38_(dim=dim, z_dim=z_dim, dec_dim=dec_dim).eval().requires_grad_(False)
    try:
        vae.load_state_dict(sd, assign=True, strict=True)
    except RuntimeError as e:
        raise SampleError(f"{path}: does not fit WanVideoVAE38(z_dim={z_dim}, dim={dim}, dec_dim={dec_dim}): "
                          f"{e}") from None
    return vae.to(device=device, dtype=dtype).eval()


def to_vae_range(frames: np.ndarray, dtype=torch.float32) -> torch.Tensor:
    """uint8 [F, H, W, 3] -> [3, F, H, W] in [-1, 1] (DiffSynth's preprocess_video)."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).to(torch.float32)
    return (x * (2.0 / 255.0) - 1.0).permute(3, 0, 1, 2).to(dtype)


def from_vae_range(video: torch.Tensor) -> np.ndarray:
    """[3, F, H, W] in [-1, 1] -> uint8 [F, H, W, 3] (rounded; DiffSynth's vae_output_to_video truncates)."""
    x = ((video.float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return x.permute(1, 2, 3, 0).cpu().numpy()


@torch.no_grad()
def vae_decode(vae, latents: torch.Tensor, device, tiled: bool = False) -> np.ndarray:
    """latents [C, T, h, w] -> uint8 [F, H, W, 3]."""
    p = next(vae.parameters())
    return from_vae_range(vae.decode([latents.to(p.dtype)], device=device, tiled=tiled)[0])


@torch.no_grad()
def vae_encode(vae, frames: np.ndarray, device, tiled: bool = False) -> torch.Tensor:
    p = next(vae.parameters())
    return vae.encode([to_vae_range(frames, p.dtype)], device=device, tiled=tiled)[0]


# ---- metrics ---------------------------------------------------------------------------------------------

METRIC_CHUNK = 4  # frames per torchmetrics call (SSIM keeps ~5 maps of the batch: bounded memory at 480x832)


def _f01(frames: np.ndarray, device="cpu") -> torch.Tensor:
    """uint8 [N, H, W, 3] -> [N, 3, H, W] in [0, 1]: float64 on cpu, float32 on an accelerator."""
    dt = torch.float64 if torch.device(device).type == "cpu" else torch.float32
    x = torch.from_numpy(np.ascontiguousarray(frames)).to(device)
    return x.permute(0, 3, 1, 2).to(dt) / 255.0


def psnr(pred: np.ndarray, target: np.ndarray, device="cpu") -> float | None:
    """PSNR (dB, data range 1 on uint8/255) of the MSE pooled over all given frames, with torchmetrics'
    `PeakSignalNoiseRatio` accumulated chunk by chunk; None when the frames are identical (PSNR infinite)."""
    from torchmetrics.image import PeakSignalNoiseRatio

    if np.array_equal(pred, target):
        return None
    m = PeakSignalNoiseRatio(data_range=1.0).to(device)
    for i in range(0, len(pred), METRIC_CHUNK):
        m.update(_f01(pred[i:i + METRIC_CHUNK], device), _f01(target[i:i + METRIC_CHUNK], device))
    return float(m.compute())


def ssim_frames(pred: np.ndarray, target: np.ndarray, device="cpu") -> list[float]:
    """SSIM of each frame (torchmetrics, gaussian 11x11 sigma 1.5, data range 1)."""
    from torchmetrics.functional.image import structural_similarity_index_measure

    out = []
    for i in range(0, len(pred), METRIC_CHUNK):
        v = structural_similarity_index_measure(_f01(pred[i:i + METRIC_CHUNK], device),
                                                _f01(target[i:i + METRIC_CHUNK], device),
                                                data_range=1.0, reduction="none")
        out += [float(x) for x in v.reshape(-1).cpu()]
    return out


def video_metrics(pred: np.ndarray, target: np.ndarray, ssim: bool = True, device="cpu") -> dict[str, Any]:
    """Per-frame PSNR/SSIM and the summary: `psnr` over frames 1.. (pooled MSE), `ssim` = mean per-frame SSIM over
    frames 1.., `psnr_frame0`. PSNR None = identical (infinite); SSIM None when not computed."""
    if pred.shape != target.shape:
        raise ValueError(f"videos differ in shape: {pred.shape} vs {target.shape}")
    s = ssim_frames(pred, target, device) if ssim else [None] * len(pred)
    frames = [{"frame": f, "psnr": psnr(pred[f:f + 1], target[f:f + 1], device), "ssim": s[f]}
              for f in range(len(pred))]
    rest = s[1:]
    return {"psnr": psnr(pred[1:], target[1:], device) if len(pred) > 1 else None,
            "ssim": float(np.mean(rest)) if ssim and rest else None,
            "psnr_frame0": frames[0]["psnr"], "frames": frames}


# ---- data ------------------------------------------------------------------------------------------------

@dataclass
class Clip:
    clip_id: str
    run: str
    subset: str
    scene: str
    split: str
    drop: bool
    latents: torch.Tensor  # bf16 [C, T, h, w]
    context_ids: np.ndarray  # int64 [T]
    sem_ids: np.ndarray  # uint8 [F, H, W], raw parts values
    meta: dict[str, Any]


class PreparedSource:
    """The prepared layout (SPEC §4): index/clips.jsonl + per-clip latents/sem/meta + text/table."""

    kind = "prepared"

    def __init__(self, root: Path):
        from gcc.convert import BadInput, read_index
        from gcc.text_table import TextTable

        self.root = root
        try:
            self.rows = {r["clip_id"]: r for r in read_index(root)}
        except BadInput as e:
            raise SampleError(str(e)) from None
        self.table = TextTable(root / "text" / "table.safetensors")
        self.default_raw = root / "raw"

    def load(self, clip_id: str) -> Clip:
        from safetensors.torch import load_file

        r = self.rows[clip_id]
        lat = load_file(str(self.root / "latents" / f"{clip_id}.safetensors"))["input_latents"]
        with np.load(self.root / "sem" / f"{clip_id}.npz") as z:
            sem = np.array(z["ids"], dtype=np.uint8)
        meta = json.loads((self.root / "meta" / f"{clip_id}.json").read_text())
        ids = np.array([self.table.ids[k] for k in r["context_keys"]], dtype=np.int64)
        return Clip(clip_id, r["run"], r["subset"], r["scene"], r["split"], bool(r["drop"]), lat, ids, sem, meta)

    def rows_for(self, clip_ids: Sequence[str] | None = None) -> dict[str, dict]:
        return self.rows


class ShardSource:
    """A local conversion (manifest.json + one MDS dataset per split), read with Streaming's LocalDataset.

    The converter writes zstd-compressed shards and LocalDataset reads raw ones, so the shards of a split are
    decompressed (Streaming's `decompress`) into a temporary folder, removed with this object. Only the splits
    that hold the wanted clips are opened (the manifest lists each split's clip ids). Object-store shards are not
    read: an offline eval of a few clips runs on the prepared root or a local copy.
    """

    kind = "shards"

    def __init__(self, root: Path):
        import shutil
        import tempfile
        import weakref

        from gcc.convert import BadInput, read_manifest
        from gcc.shards import TEXT_TABLE
        from gcc.text_table import TextTable

        try:
            self.manifest = read_manifest(str(root))
        except BadInput as e:
            raise SampleError(str(e)) from None
        self.root = root
        self.table = TextTable(root / TEXT_TABLE)
        src = self.manifest.get("source")
        self.default_raw = Path(src) / "raw" if src else None
        self.split_ids = {s: set(v.get("clip_ids", [])) for s, v in self.manifest["splits"].items()}
        self._tmp = tempfile.mkdtemp(prefix="gcc_sample_shards_")
        weakref.finalize(self, shutil.rmtree, self._tmp, True)
        self._ds, self._pos, self._rows = {}, {}, {}

    def _open(self, split: str) -> None:
        import shutil

        from streaming import LocalDataset
        from streaming.base.compression import decompress

        from gcc.shards import ClipRecord

        if split in self._ds:
            return
        local = Path(self._tmp, split)
        index = json.loads((self.root / split / "index.json").read_text())
        for sh in index["shards"]:
            raw = local / sh["raw_data"]["basename"]
            raw.parent.mkdir(parents=True, exist_ok=True)
            if sh.get("compression") and sh.get("zip_data"):
                blob = (self.root / split / sh["zip_data"]["basename"]).read_bytes()
                raw.write_bytes(decompress(sh["compression"], blob))
            else:
                shutil.copyfile(self.root / split / sh["raw_data"]["basename"], raw)
        shutil.copyfile(self.root / split / "index.json", local / "index.json")
        ds = self._ds[split] = LocalDataset(local=str(local))
        for i in range(len(ds)):
            rec = ClipRecord.from_sample(ds[i])
            self._rows[rec.clip_id] = {"clip_id": rec.clip_id, "run": rec.run, "subset": rec.subset,
                                       "scene": rec.scene, "split": split, "drop": rec.drop}
            self._pos[rec.clip_id] = (split, i)

    def rows_for(self, clip_ids: Sequence[str] | None = None) -> dict[str, dict]:
        """Index rows of the splits holding `clip_ids` (None: the val split)."""
        splits = ([s for s, ids in self.split_ids.items() if ids & set(clip_ids)] if clip_ids is not None
                  else [s for s in self.split_ids if s == "val"])
        for s in splits:
            self._open(s)
        return self._rows

    def load(self, clip_id: str) -> Clip:
        from gcc.shards import ClipRecord

        split, i = self._pos[clip_id]
        rec = ClipRecord.from_sample(self._ds[split][i])
        return Clip(clip_id, rec.run, rec.subset, rec.scene, split, rec.drop, rec.input_latents, rec.context_ids,
                    np.array(rec.sem_ids(), dtype=np.uint8), rec.meta())


def open_source(data_root: str | os.PathLike):
    if str(data_root).startswith("s3://"):
        raise SampleError(f"--data_root {data_root}: object-store shards are not read by gcc.sample; use the "
                          f"prepared root or a local copy of the shards")
    root = Path(data_root)
    if (root / "manifest.json").is_file():
        return ShardSource(root)
    if (root / "index" / "clips.jsonl").is_file():
        return PreparedSource(root)
    raise SampleError(f"--data_root {root}: neither a prepared root (index/clips.jsonl) nor a converted shards "
                      f"folder (manifest.json)")


def parse_clip_ids(spec: str) -> list[str]:
    """'a,b' or '@file' (one id per line or comma-separated; blank lines and '#' comments ignored)."""
    if spec.startswith("@"):
        path = Path(spec[1:])
        if not path.is_file():
            raise SampleError(f"--clip_ids {spec}: file {path} not found")
        text = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())
        items = [s for line in text.splitlines() for s in line.split(",")]
    else:
        items = spec.split(",")
    ids = list(dict.fromkeys(s.strip() for s in items if s.strip()))
    if not ids:
        raise SampleError(f"--clip_ids {spec!r}: no clip ids")
    return ids


def select_clips(rows: dict[str, dict], clip_ids: Sequence[str] | None = None, val_n: int | None = None) -> list[str]:
    """Explicit ids (any split; every one must exist) or `val_n` val clips with drop=false, round-robin over runs
    (runs sorted by name, clips sorted within a run: the first clip of every run, then the second, ...)."""
    if clip_ids is not None:
        missing = [c for c in clip_ids if c not in rows]
        if missing:
            raise SampleError(f"clip id(s) not in the data: {', '.join(missing)}")
        return list(clip_ids)
    if val_n is None or val_n < 1:
        raise SampleError("give --clip_ids or --val_n N (N >= 1)")
    from gcc.data import round_robin_by_run

    val = [(rows[c]["run"], c) for c in sorted(rows) if rows[c]["split"] == "val" and not rows[c]["drop"]]
    if not val:
        raise SampleError("no val clips with drop=false in the data")
    out = round_robin_by_run(val, val_n)
    if len(out) < val_n:
        print(f"gcc.sample: only {len(out)} val clips available (asked for {val_n})", file=sys.stderr)
    return out


def read_gt(raw_root: Path, clip: Clip, num_frames: int) -> np.ndarray:
    """Ground truth RGB uint8 [F, src_h, src_w, 3] from `<raw>/<subset>/<scene>/<run>.tar` members
    `<clip_id>/<f:03d>.jpg`."""
    from PIL import Image

    path = raw_root / clip.subset / clip.scene / f"{clip.run}.tar"
    if not path.is_file():
        raise SampleError(f"clip {clip.clip_id}: ground-truth tar {path} not found (--raw_root)")
    frames = []
    with tarfile.open(path) as tf:
        for f in range(num_frames):
            name = f"{clip.clip_id}/{f:03d}.jpg"
            try:
                data = tf.extractfile(name).read()
            except (KeyError, AttributeError):
                raise SampleError(f"clip {clip.clip_id}: {path} has no member {name}") from None
            frames.append(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    return np.stack(frames)


def resample_rgb(frames: np.ndarray, dst_hw: Sequence[int]) -> np.ndarray:
    """uint8 [F, h, w, 3] at src -> dst_hw: bilinear, pixel centres to pixel centres (SPEC §3), antialiased
    when shrinking."""
    H, W = (int(v) for v in dst_hw)
    if frames.shape[1:3] == (H, W):
        return frames
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()
    y = torch.nn.functional.interpolate(x, size=(H, W), mode="bilinear", align_corners=False, antialias=True)
    return y.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


# ---- the model -------------------------------------------------------------------------------------------

def ckpt_vocab(path: str | os.PathLike, requested: str | None) -> tuple[str, str]:
    """(vocab, kind) of a checkpoint: a gc25d export's metadata vocab (checked in full by `check_gc_ckpt`; a
    `requested` vocab that differs is an error), or `requested` (default parts) for a plain Wan export."""
    from safetensors import safe_open

    from gcc.export import GcCkptError, check_gc_ckpt

    path = str(path)
    if not os.path.isfile(path):
        raise SampleError(f"--ckpt {path}: file not found")
    try:
        with safe_open(path, "pt") as fh:
            meta = fh.metadata() or {}
    except Exception as e:
        raise SampleError(f"--ckpt {path}: cannot be read as safetensors: {e}") from None
    if meta.get("format") != "gc25d":
        return requested or "parts", "wan"
    try:
        info = check_gc_ckpt(path)
    except GcCkptError as e:
        raise SampleError(str(e)) from None
    if requested is not None and info["vocab"] != requested:
        raise SampleError(f"--ckpt {path} has vocab {info['vocab']!r} (metadata), but --vocab {requested!r} was "
                          f"requested")
    return info["vocab"], "gc25d"


def load_dit(model: str, vocab: str, device, dtype, ckpt: str | None = None, model_dir: str | None = None):
    from gcc.export import GcCkptError, load_gc_weights
    from gcc.model import build_gc_dit, load_wan_base

    dit = build_gc_dit(model, device=device, vocab=vocab)
    try:
        if ckpt:
            load_gc_weights(dit, ckpt)
        else:
            load_wan_base(dit, model_dir)
    except (GcCkptError, FileNotFoundError) as e:
        raise SampleError(str(e)) from None
    except ValueError as e:
        raise SampleError(f"{ckpt or model_dir}: does not fit the {model!r} model: {e}") from None
    return dit.to(dtype).eval().requires_grad_(False)


def make_sampling_scheduler(steps: int, shift: float):
    from gcc.diffsynth_parts import FlowMatchScheduler

    sched = FlowMatchScheduler("Wan")
    sched.set_timesteps(steps, shift=shift)  # inference schedule (training=False)
    return sched


def clip_noise(seed: int, clip_id: str, shape: Sequence[int]) -> torch.Tensor:
    from gcc.seeds import stable_seed

    g = torch.Generator().manual_seed(stable_seed("gcc.sample", int(seed), str(clip_id)))
    return torch.randn(tuple(shape), generator=g)


@torch.no_grad()
def sample_latents(dit, first: torch.Tensor, context: torch.Tensor, context_ids: torch.Tensor,
                   null_context: torch.Tensor, null_ids: torch.Tensor, sem: torch.Tensor, noise: torch.Tensor,
                   steps: int = 50, shift: float = 5.0, cfg: float = 1.0, sem_cfg: float = 1.0) -> torch.Tensor:
    """TI2V flow-matching sampling of one clip. first [C, 1, h, w] clean frame-0 latent; context [T, L, D],
    ids [T]; sem uint8 [F, H, W] (what the model sees); noise [C, T, h, w]. Returns the latents [C, T, h, w] (fp32).

    Guidance (see the module docstring): variants cond, nulltext (cfg != 1), unknown (sem_cfg != 1, and only when
    the ids are not already all UNKNOWN), run as one batch per step."""
    p = next(dit.parameters())
    dev, dt = p.device, p.dtype
    sched = make_sampling_scheduler(steps, shift)
    first = first.to(dev, torch.float32)
    x = noise.to(dev, torch.float32).clone()  # the state stays fp32; the model sees it in its dtype
    x[:, 0:1] = first
    sem = sem.to(dev)
    ctx, cid = [context], [context_ids]
    sems = [sem]
    use_text = cfg != 1.0
    use_sem = sem_cfg != 1.0 and not bool((sem == UNKNOWN).all())
    if use_text:
        ctx.append(null_context), cid.append(null_ids), sems.append(sem)
    if use_sem:
        ctx.append(context), cid.append(context_ids), sems.append(torch.full_like(sem, UNKNOWN))
    B = len(ctx)
    ctx_b = torch.stack(ctx).to(dev, dt)
    cid_b = torch.stack(cid).to(dev)
    sem_b = torch.stack(sems)
    for t in sched.timesteps:
        ts = t.reshape(1).expand(B).to(dev, torch.float32)
        pred = dit.gc_forward(x.to(dt).unsqueeze(0).expand(B, *x.shape), ts, ctx_b, cid_b, sem_b,
                              first_frame_cond=True).float()
        e = pred[0]
        k = 1
        if use_text:
            e = e + (cfg - 1.0) * (pred[0] - pred[k])
            k += 1
        if use_sem:
            e = e + (sem_cfg - 1.0) * (pred[0] - pred[k])
        x = sched.step(e, t, x)
        x[:, 0:1] = first
    return x


# ---- outputs ---------------------------------------------------------------------------------------------

def write_panels_mp4(path: Path, gt: np.ndarray, gen: np.ndarray, cond_rgb: np.ndarray, fps: int = FPS) -> None:
    """GT | generated | cond side by side, h264 (yuv420p)."""
    import imageio.v2 as imageio

    frames = np.concatenate([gt, gen, cond_rgb], axis=2)
    tmp = path.with_name(path.stem + ".tmp.mp4")
    w = imageio.get_writer(str(tmp), fps=fps, codec="libx264", quality=9, macro_block_size=1,
                           pixelformat="yuv420p", ffmpeg_log_level="error")
    try:
        for f in frames:
            w.append_data(f)
    finally:
        w.close()
    os.replace(tmp, path)


def _dump(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _mean(vals) -> float | None:
    v = [x for x in vals if x is not None]
    return float(np.mean(v)) if v else None


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# ---- main ------------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m gcc.sample", description=__doc__.split("\n")[0])
    w = ap.add_mutually_exclusive_group(required=True)
    w.add_argument("--ckpt", help="gc25d export (.safetensors); its metadata gives the vocab")
    w.add_argument("--base", action="store_true", help="base Wan weights from --model_dir with a zero cond")
    ap.add_argument("--vocab", choices=VOCABS, default=None,
                    help="with --base: the cond's vocab (default parts); with --ckpt: must equal the checkpoint's")
    ap.add_argument("--model_dir", required=True, help="Wan2.2-TI2V-5B folder (sharded DiT + Wan2.2_VAE.pth)")
    ap.add_argument("--model", default="ti2v-5b", help="model preset (ti2v-5b, tiny)")
    ap.add_argument("--data_root", required=True, help="prepared root or converted shards folder (local)")
    ap.add_argument("--raw_root", default=None, help="ground-truth tars (default <prepared root>/raw)")
    sel = ap.add_mutually_exclusive_group(required=True)
    sel.add_argument("--clip_ids", help="a,b,c or @file")
    sel.add_argument("--val_n", type=int, help="N val clips (drop=false), round-robin over runs")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--shift", type=float, default=5.0)
    ap.add_argument("--cfg", type=float, default=1.0, help="text guidance scale (uncond = NULL_PROMPT cells)")
    ap.add_argument("--sem_cfg", type=float, default=1.0, help="semantic guidance scale (uncond = ids all 255)")
    ap.add_argument("--sem_mode", choices=("cond", "unknown"), default="cond",
                    help="unknown: the model gets ids all 255")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out_dir", required=True)
    ap.add_argument("--no_ssim", action="store_true")
    ap.add_argument("--no_recon_ceiling", action="store_true")
    ap.add_argument("--device", default=None, help="default cuda if available, else cpu")
    ap.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto",
                    help="DiT and VAE dtype (auto: bf16 on cuda, fp32 on cpu)")
    ap.add_argument("--vae_tiled", action="store_true", help="DiffSynth's tiled VAE encode/decode")
    ap.add_argument("--fps", type=int, default=FPS)
    return ap


def run(a: argparse.Namespace) -> dict[str, Any]:
    t_start = time.perf_counter()
    if a.steps < 1:
        raise SampleError("--steps must be >= 1")
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}.get(
        a.dtype, torch.bfloat16 if device.type == "cuda" else torch.float32)

    # everything that can be wrong with the inputs is checked before the models load
    from gcc.model import PRESETS

    if a.model not in PRESETS:
        raise SampleError(f"--model {a.model!r}: unknown preset; known: {sorted(PRESETS)}")
    if a.ckpt:
        vocab, ckpt_kind = ckpt_vocab(a.ckpt, a.vocab)
    else:
        vocab, ckpt_kind = a.vocab or "parts", "base"
    vae_path = find_vae_file(a.model_dir)
    src = open_source(a.data_root)
    wanted = parse_clip_ids(a.clip_ids) if a.clip_ids else None
    clip_ids = select_clips(src.rows_for(wanted), wanted, a.val_n)
    raw_root = Path(a.raw_root) if a.raw_root else src.default_raw
    if raw_root is None or not raw_root.is_dir():
        raise SampleError(f"ground-truth root {raw_root} not found: pass --raw_root (the prepared root's raw/)")
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    dit = load_dit(a.model, vocab, device, dtype, ckpt=a.ckpt, model_dir=a.model_dir)
    vae = load_vae(vae_path, device, dtype)
    _sync(device)
    t_load = time.perf_counter() - t_start  # option checks, data index, DiT + VAE
    null_id = src.table.null_id
    null_row = src.table.gather([null_id])[0]

    per_clip, tot = {}, {"data": 0.0, "sampling": 0.0, "decode": 0.0, "recon": 0.0, "metrics": 0.0}
    for n, cid in enumerate(clip_ids):
        t_data = time.perf_counter()
        clip = src.load(cid)
        C, T, h, w = clip.latents.shape
        F = 4 * (T - 1) + 1
        if clip.sem_ids.shape != (F, 16 * h, 16 * w):
            raise SampleError(f"clip {cid}: sem ids {clip.sem_ids.shape} do not match latents "
                              f"{tuple(clip.latents.shape)}")
        sem = clip.sem_ids if vocab == "parts" else collapse_parts(clip.sem_ids)
        if a.sem_mode == "unknown":
            sem = np.full_like(sem, UNKNOWN)
        gt = resample_rgb(read_gt(raw_root, clip, F), clip.meta.get("dst_hw", (16 * h, 16 * w)))

        t0 = time.perf_counter()
        lat = sample_latents(
            dit, clip.latents[:, 0:1].float(), src.table.gather(clip.context_ids),
            torch.from_numpy(clip.context_ids), null_row.expand(T, *null_row.shape),
            torch.full((T,), null_id, dtype=torch.int64), torch.from_numpy(np.ascontiguousarray(sem)),
            clip_noise(a.seed, cid, (C, T, h, w)), steps=a.steps, shift=a.shift, cfg=a.cfg, sem_cfg=a.sem_cfg)
        _sync(device)
        t1 = time.perf_counter()
        gen = vae_decode(vae, lat, device, a.vae_tiled)
        _sync(device)
        t2 = time.perf_counter()
        recon = None
        if not a.no_recon_ceiling:
            recon = vae_decode(vae, vae_encode(vae, gt, device, a.vae_tiled), device, a.vae_tiled)
            _sync(device)
        t3 = time.perf_counter()
        if gen.shape != gt.shape:
            raise SampleError(f"clip {cid}: decoded video {gen.shape} differs from the ground truth {gt.shape}")
        m = video_metrics(gen, gt, ssim=not a.no_ssim, device=device)
        rm = video_metrics(recon, gt, ssim=not a.no_ssim, device=device) if recon is not None else None
        write_panels_mp4(out / f"{cid}.mp4", gt, gen, colorize(sem, vocab), fps=a.fps)
        t4 = time.perf_counter()
        frames = m.pop("frames")
        if rm is not None:
            for fr, rf in zip(frames, rm.pop("frames")):
                fr["recon_psnr"], fr["recon_ssim"] = rf["psnr"], rf["ssim"]
        _dump(out / f"{cid}.frames.json", {"clip_id": cid, "frames": frames})
        row = {**m, "recon_psnr": rm["psnr"] if rm else None, "recon_ssim": rm["ssim"] if rm else None,
               "recon_psnr_frame0": rm["psnr_frame0"] if rm else None,
               "num_frames": int(F), "hw": [int(gt.shape[1]), int(gt.shape[2])], "run": clip.run,
               "split": clip.split,
               "timings": {"data": t0 - t_data, "sampling": t1 - t0, "decode": t2 - t1, "recon": t3 - t2,
                           "metrics": t4 - t3}}
        per_clip[cid] = row
        for k in tot:
            tot[k] += row["timings"][k]
        print(f"[{n + 1}/{len(clip_ids)}] {cid}: psnr {row['psnr']} ssim {row['ssim']} frame0 {row['psnr_frame0']}"
              f" ceiling {row['recon_psnr']} ({t1 - t0:.1f}s sampling)", file=sys.stderr)

    keys = ("psnr", "ssim", "psnr_frame0", "recon_psnr", "recon_ssim", "recon_psnr_frame0")
    metrics = {
        "ckpt": str(a.ckpt) if a.ckpt else "", "weights": ckpt_kind, "vocab": vocab, "model": a.model,
        "model_dir": str(a.model_dir), "vae": str(vae_path), "data_root": str(a.data_root),
        "data_kind": src.kind, "raw_root": str(raw_root),
        "settings": {"steps": a.steps, "shift": a.shift, "cfg": a.cfg, "sem_cfg": a.sem_cfg, "sem_mode": a.sem_mode,
                     "seed": a.seed, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
                     "ssim": not a.no_ssim, "recon_ceiling": not a.no_recon_ceiling, "vae_tiled": a.vae_tiled},
        "clip_ids": clip_ids,
        "mean": {k: _mean(r[k] for r in per_clip.values()) for k in keys},
        "clips": per_clip,
        "timings": {"load": t_load, **tot, "total": time.perf_counter() - t_start},
    }
    _dump(out / "metrics.json", metrics)
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(list(argv) if argv is not None else None)
    try:
        m = run(a)
    except SampleError as e:
        print(f"gcc.sample: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps({"out_dir": a.out_dir, "mean": m["mean"], "timings": m["timings"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
