"""A synthetic world written in the prepared layout (docs/design.md §4, docs/data_format.md).

    python -m gcc.synth.world --out DIR --n N --geometry tiny|wide|full --seed S [--overwrite]

The world of clip i (a pure function of (seed, i), independent of N):
* a ground plane Z = gz (per clip) painted with static classes 0..5 as world-anchored blobs (a domain-warped
  grid of 400 cm cells, `world_class`); sky (6) where a pixel's ray misses the ground;
* a player (parts 10..15) and, in most clips, a boss (parts 16..21), each a group of capsules (one part id
  per capsule) that walk around the camera's look-at point; nearest hit (ground or capsule) wins;
* a camera that travels several metres, pitched down, with yaw drift and (some clips) roll; perspective
  (horizontal FOV) or orthographic (every third clip: i % 3 == 1).

Sem ids are ray-cast at dst_hw from the meta's cameras (the maths of `Cameras.rays` / `ground_points`,
evaluated separably per row and column for speed, so a reader of the meta json gets the same ground points
up to float rounding). RGB ground truth is the palette colour with light shading, resized to
src_hw, stored as jpg in the run's tar.

Latents are a deterministic function of the scene so a model can learn to use the semantic condition:
for latent cell (k, i, j) (latent frame 0 = pixel frame 0, latent frame k >= 1 = pixel frames 4k-3..4k,
16x16 pixel footprint) `latent = fractions @ CLASS_PROJ + TEXT_SCALE * text_vector(context_key[k]) +
NOISE_SCALE * noise`, where fractions are the cell's class fractions over the `parts` vocabulary (+ UNKNOWN)
and CLASS_PROJ [V, 48] and the per-key text vectors are fixed (global, not per seed or clip).

Deterministic per-clip features (tests rely on these; i = clip index, clip_id = f"clip{i:05d}"):
* run r = i // CLIPS_PER_RUN (4 clips per run); runs with r % 3 == 2 are `val`, the rest `train`;
* drop = (i % 10 == 9);
* ground_z: i % 12 == 5 -> no finite entry at all; i % 6 == 2 -> ground_z[0] and every third frame NaN;
* orthographic when i % 3 == 1; shallow pitch (sky visible) when i % 5 == 0; roll when i % 4 == 0;
  no boss when i % 7 == 3; context keys change mid-clip when i % 4 == 2.
Same seed => identical bytes of every file (fixed zip/tar timestamps, sorted members).

Besides the prepared layout, the root holds `synth.json` (MARKER: generator, seed, clips, geometry): the explicit
mark of this world's data, whose latents `gcc.synth.decode` turns back into classes without a VAE.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import sys
import tarfile
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from gcc import inputs, vocab
from gcc.cli import ToolParser, folder_problem, run_tool
from gcc.errors import BadInput
from gcc.geometry import LATENT_C, Cameras, Geometry, ground_points, latent_frame_spans
from gcc.storage import atomic_write
from gcc.synth.render import render_clip, rgb_frame
from gcc.synth.scene import BOSS_CAPSULES, PLAYER_CAPSULES, ClipScene, World, capsules_at
from gcc.synth.wan_layout import PRESETS as WAN_PRESETS
from gcc.synth.wan_layout import write_model_folder

CLIPS_PER_RUN = 4
GLOBAL_SEED = 20250101  # CLASS_PROJ and text vectors: fixed whatever --seed is
TEXT_SCALE = 0.5
NOISE_SCALE = 0.05
# the marker of data made here: gcc-sample decodes such data with gcc.synth.decode, no VAE (docs/sample.md)
MARKER = "synth.json"
LAYOUT = ("index", "latents", "sem", "meta", "text", "raw", MARKER, "READY")
PROMPT_KEYS = ("boss_fight_desert", "boss_fight_forest", "explore_village", "cross_river", "chase_path", "idle_meadow")


# ---- geometry presets ----------------------------------------------------------------------------------
GEOMETRIES: dict[str, Geometry] = {
    "full": Geometry(T=21, h=30, w=52, src_hw=(720, 1248), text_L=512, text_D=4096),  # v10
    "tiny": Geometry(T=3, h=4, w=6, src_hw=(96, 144), text_L=16, text_D=64),
    # tiny frames with the real text width, for the `wide` model preset (the real TI2V-5B layer shapes)
    "wide": Geometry(T=3, h=4, w=6, src_hw=(96, 144), text_L=16, text_D=4096),
}


def get_geometry(geometry: str | Geometry) -> Geometry:
    if isinstance(geometry, Geometry):
        return geometry
    if geometry not in GEOMETRIES:
        raise ValueError(f"geometry must be one of {sorted(GEOMETRIES)}, got {geometry!r}")
    return GEOMETRIES[geometry]


# ---- deterministic clip features (documented in the module docstring) ----------------------------------
def clip_id(i: int) -> str:
    return f"clip{i:05d}"


def run_of(i: int) -> int:
    return i // CLIPS_PER_RUN


def split_of(i: int) -> str:
    return "val" if run_of(i) % 3 == 2 else "train"


def is_dropped(i: int) -> bool:
    return i % 10 == 9


def ground_z_kind(i: int) -> str:
    """'none' (no finite entry), 'partial' (ground_z[0] and every third frame NaN) or 'finite'."""
    if i % 12 == 5:
        return "none"
    if i % 6 == 2:
        return "partial"
    return "finite"


def run_location(r: int) -> tuple[str, str]:
    """(subset, scene) of run r."""
    return ("synth_" + ("desert", "forest")[r % 2], f"scene{(r // 2) % 3}")


def make_scene(seed: int, i: int, geometry: str | Geometry) -> ClipScene:
    """The world, cameras, characters and text cells of clip i: a pure function of (seed, i, geometry)."""
    g = get_geometry(geometry)
    assert g.src_hw is not None  # every synth geometry renders raw frames (GEOMETRIES)
    rng = np.random.default_rng([int(seed), int(i), 7])
    F = g.F
    gz = float(rng.uniform(-400.0, 400.0))
    world = _ground_world(rng)
    s = np.linspace(0.0, 1.0, F)  # the clip's time, 0 at its first frame and 1 at its last
    cams, loc = _camera_path(rng, i, gz, s, g.src_hw, g.dst_hw)
    meta = {
        "clip_id": clip_id(i),
        "src_hw": list(g.src_hw),
        "dst_hw": list(g.dst_hw),
        "ground_z": _ground_z(i, gz, F),
        "cameras": cams.to_meta(),
    }
    # render from what a reader of the meta json gets, so rays are bit-identical downstream
    cams = Cameras.from_meta(json.loads(json.dumps(meta)))
    capsules = _character_capsules(rng, i, cams, gz, loc, s, g.dst_hw)
    keys = _context_keys(rng, i, g.T)
    return ClipScene(index=i, gz=gz, world=world, meta=meta, cameras=cams, capsules=capsules, context_keys=keys)


def _ground_world(rng: np.random.Generator) -> World:
    """The ground's class blobs: a random class table and its domain warp."""
    return World(
        table=rng.integers(0, 6, size=(64, 64)).astype(np.uint8),
        warp_amp=float(rng.uniform(60.0, 160.0)),
        warp_freq=(float(rng.uniform(0.004, 0.01)), float(rng.uniform(0.004, 0.01))),
        warp_phase=(float(rng.uniform(0, 2 * np.pi)), float(rng.uniform(0, 2 * np.pi))),
    )


def _camera_path(
    rng: np.random.Generator, i: int, gz: float, s: np.ndarray, src_hw: tuple[int, int], dst_hw: tuple[int, int]
) -> tuple[Cameras, np.ndarray]:
    """The clip's cameras at times s, and their locations [F, 3]."""
    # camera: travels `dist` cm along `heading`, pitched down
    F = len(s)
    ortho = i % 3 == 1
    pitch0 = float(rng.uniform(-28.0, -18.0)) if (i % 5 == 0 and not ortho) else float(rng.uniform(-70.0, -40.0))
    yaw0 = float(rng.uniform(0.0, 360.0))
    roll0 = float(rng.choice([-1, 1]) * rng.uniform(5.0, 20.0)) if i % 4 == 0 else 0.0
    height = float(rng.uniform(900.0, 1500.0))
    dist = float(rng.uniform(300.0, 1200.0))
    travel_dir = math.radians(yaw0 + float(rng.uniform(-60.0, 60.0)))
    fov = float(rng.uniform(60.0, 90.0))
    ortho_w = float(rng.uniform(2000.0, 3500.0))
    yaw_drift = float(rng.uniform(-15.0, 15.0))
    start = rng.uniform(-5000.0, 5000.0, size=2)
    loc = np.stack(
        [
            start[0] + dist * s * math.cos(travel_dir) + 80.0 * np.sin(np.pi * s),
            start[1] + dist * s * math.sin(travel_dir),
            gz + height + 100.0 * s,
        ],
        -1,
    )
    rot = np.stack([pitch0 + 3.0 * np.sin(np.pi * s), yaw0 + yaw_drift * s, np.full(F, roll0)], -1)
    cams = Cameras(
        location=loc,
        rotation=rot,
        orthographic=np.full(F, ortho),
        fov_deg=np.full(F, np.nan if ortho else fov),
        ortho_width=np.full(F, ortho_w if ortho else np.nan),
        src_hw=src_hw,
        dst_hw=dst_hw,
    )
    return cams, loc


def _ground_z(i: int, gz: float, F: int) -> list[float]:
    """The meta's ground_z per frame, with the clip's NaN pattern (`ground_z_kind`)."""
    kind = ground_z_kind(i)
    gzs = [gz] * F
    if kind == "none":
        gzs = [float("nan")] * F
    elif kind == "partial":
        gzs = [float("nan") if f % 3 == 0 else gz for f in range(F)]
    return gzs


def _character_capsules(
    rng: np.random.Generator,
    i: int,
    cams: Cameras,
    gz: float,
    loc: np.ndarray,
    s: np.ndarray,
    dst_hw: tuple[int, int],
) -> list[np.ndarray]:
    """The capsules of the player (and, in most clips, the boss) per frame."""
    # characters walk around the look-at point of the image centre
    F = len(s)
    centre = ground_points(cams, np.array([[dst_hw[1] / 2.0 - 0.5, dst_hw[0] / 2.0 - 0.5]]), gz)[:, 0]
    centre = np.where(np.isfinite(centre), centre, loc[:, :2])
    chars = [(PLAYER_CAPSULES, float(rng.uniform(0.9, 1.2)))]
    if i % 7 != 3:
        chars.append((BOSS_CAPSULES, float(rng.uniform(0.9, 1.2))))
    tracks = []
    for n, (parts, scale) in enumerate(chars):
        ang = float(rng.uniform(0, 2 * np.pi))
        rad = float(rng.uniform(100.0, 400.0)) * (1 + n)
        wander = float(rng.uniform(100.0, 300.0))
        ph = float(rng.uniform(0, 2 * np.pi))
        head0 = float(rng.uniform(0, 360.0))
        spin = float(rng.uniform(-90.0, 90.0))
        off = np.stack(
            [
                rad * math.cos(ang) + wander * np.sin(2 * np.pi * s + ph),
                rad * math.sin(ang) + wander * np.cos(2 * np.pi * s + ph),
            ],
            -1,
        )
        tracks.append((parts, scale, centre + off, head0 + spin * s))
    return [np.concatenate([capsules_at(p, pos[f], hd[f], gz, sc) for p, sc, pos, hd in tracks]) for f in range(F)]


def _context_keys(rng: np.random.Generator, i: int, T: int) -> list[str]:
    """The text cells' prompt key per latent frame."""
    # text cells: one key per latent frame, sometimes changing mid-clip
    key0 = PROMPT_KEYS[int(rng.integers(len(PROMPT_KEYS)))]
    keys = [key0] * T
    if i % 4 == 2 and T > 1:
        key1 = PROMPT_KEYS[(PROMPT_KEYS.index(key0) + 1 + int(rng.integers(len(PROMPT_KEYS) - 1))) % len(PROMPT_KEYS)]
        keys = [key0] * ((T + 1) // 2) + [key1] * (T - (T + 1) // 2)
    return keys


# ---- latents -------------------------------------------------------------------------------------------
def latent_cell_fractions(ids: np.ndarray, T: int, h: int, w: int, vocab_name: str = "parts") -> np.ndarray:
    """ids uint8 [F, H, W] -> per latent cell class fractions float32 [T, h, w, V] (V = vocab + UNKNOWN).
    Latent frame 0 = pixel frame 0, latent frame k >= 1 = pixel frames 4k-3..4k; cell footprint H/h x W/w."""
    _F, H, W = ids.shape
    V = vocab.num_classes(vocab_name)
    lut = vocab.CHANNEL_LUT[vocab_name].astype(np.int32)
    if vocab.invalid_values(ids, vocab_name):
        raise ValueError(f"invalid sem values {vocab.invalid_values(ids, vocab_name)}")
    cell = ((np.arange(H) // (H // h))[:, None] * w + (np.arange(W) // (W // w))[None, :]).astype(np.int32) * V
    out = np.zeros((T, h * w, V), dtype=np.float32)
    for k, (lo, hi) in enumerate(latent_frame_spans(T)):
        frames = ids[lo:hi]
        counts = np.bincount((cell[None] + lut[frames]).ravel(), minlength=h * w * V).reshape(h * w, V)
        out[k] = counts / counts.sum(-1, keepdims=True)
    return out.reshape(T, h, w, V)


def class_projection(vocab_name: str = "parts") -> np.ndarray:
    """The fixed [V, 48] matrix mapping class fractions to latent channels (global, seed-independent)."""
    rng = np.random.default_rng([GLOBAL_SEED, 1])
    return rng.standard_normal((vocab.num_classes(vocab_name), LATENT_C)).astype(np.float32)


def text_vector(key: str) -> np.ndarray:
    """The fixed [48] latent offset of a prompt key (global, seed-independent)."""
    rng = np.random.default_rng([GLOBAL_SEED, 2, zlib.crc32(key.encode())])
    return rng.standard_normal(LATENT_C).astype(np.float32)


def make_latents(ids: np.ndarray, context_keys: list[str], g: Geometry, rng: np.random.Generator) -> np.ndarray:
    """float32 [48, T, h, w]: class fractions @ CLASS_PROJ + text term + small noise."""
    frac = latent_cell_fractions(ids, g.T, g.h, g.w)  # [T, h, w, V]
    lat = frac @ class_projection()  # [T, h, w, C]
    lat += TEXT_SCALE * np.stack([text_vector(k) for k in context_keys])[:, None, None, :]
    lat += NOISE_SCALE * rng.standard_normal(lat.shape).astype(np.float32)
    return np.ascontiguousarray(lat.transpose(3, 0, 1, 2))


def make_text_table(g: Geometry, seed: int) -> dict[str, np.ndarray]:
    """prompt key -> float32 [L, D] (stored as bf16), includes NULL_PROMPT."""
    out = {}
    for n, key in enumerate(sorted((*PROMPT_KEYS, vocab.NULL_PROMPT))):
        rng = np.random.default_rng([int(seed), 3, n])
        scale = 0.02 if key == vocab.NULL_PROMPT else 0.15
        out[key] = (scale * rng.standard_normal(g.text_shape)).astype(np.float32)
    return out


# ---- deterministic file writers ------------------------------------------------------------------------
def _safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    # heavy (torch ~1.3 s): keeps gcc-synth --help and argument errors fast
    import torch
    from safetensors.torch import save

    return save(
        {
            k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).to(torch.bfloat16)
            for k, v in sorted(tensors.items())
        }
    )


def npz_bytes(arrays: dict[str, np.ndarray], compresslevel: int = 6) -> bytes:
    """Like np.savez_compressed but byte-reproducible: fixed zip timestamps and attributes, sorted names."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3
            info.external_attr = 0o644 << 16
            arr = io.BytesIO()
            np.lib.format.write_array(arr, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            zf.writestr(info, arr.getvalue(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=compresslevel)
    return buf.getvalue()


def _jpeg_bytes(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in sorted(members):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = len(data), 0, 0o644, 0, 0, "", ""
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


# ---- the prepared layout -------------------------------------------------------------------------------
def index_row(i: int, context_keys: list[str]) -> dict[str, Any]:
    r = run_of(i)
    subset, scene = run_location(r)
    return {
        "clip_id": clip_id(i),
        "run": f"run{r:03d}",
        "subset": subset,
        "scene": scene,
        "split": split_of(i),
        "drop": is_dropped(i),
        "context_keys": list(context_keys),
    }


def write_clip(root: Path, seed: int, i: int, g: Geometry) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """Write latents/sem/meta of clip i; return its index row and its raw tar members."""
    scene = make_scene(seed, i, g)
    ids, shade = render_clip(scene)
    cid = clip_id(i)
    lat = make_latents(ids, scene.context_keys, g, np.random.default_rng([int(seed), int(i), 11]))
    atomic_write(root / "latents" / f"{cid}.safetensors", _safetensors_bytes({"input_latents": lat}), root=root)
    atomic_write(root / "sem" / f"{cid}.npz", npz_bytes({"ids": ids}), root=root)
    atomic_write(root / "meta" / f"{cid}.json", (json.dumps(scene.meta) + "\n").encode(), root=root)
    members = [
        (f"{cid}/{f:03d}.jpg", _jpeg_bytes(rgb_frame(ids[f], shade[f], scene.cameras.src_hw))) for f in range(g.F)
    ]
    return index_row(i, scene.context_keys), members


def is_synthetic(prepared_root: str | os.PathLike | None) -> bool:
    """Whether `prepared_root` was written by this generator: it holds `MARKER` naming it."""
    if prepared_root is None:
        return False
    path = Path(prepared_root) / MARKER
    try:
        return inputs.load_json_object(path, "a synthetic world's marker").get("generator") == "gcc.synth.world"
    except BadInput:  # absent, not a regular file, too large, not a JSON object
        return False


def write_prepared(
    out: str | os.PathLike,
    clips: int = 24,
    geometry: str | Geometry = "tiny",
    seed: int = 0,
    overwrite: bool = False,
    verbose: bool = False,
) -> Path:
    """Write a synthetic dataset in the prepared layout under `out` (created); returns its root Path.
    Refuses a non-empty `out` unless `overwrite` (which removes the layout's entries first), and `overwrite` of a
    folder this generator did not write (no `MARKER` naming it: real prepared data, another tool's folder) always
    (BadInput). Every file goes through the writer that never writes through a link inside `out`
    (gcc/storage.py)."""
    g = get_geometry(geometry)
    if clips < 1:
        raise ValueError("clips must be >= 1")
    root = Path(out)
    if root.exists() and any(root.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{root} is not empty (pass overwrite=True / --overwrite)")
        if not is_synthetic(root):
            raise BadInput(
                f"--out {root}: not empty and not gcc-synth's output (no {MARKER} naming it): --overwrite "
                f"replaces only a synthetic dataset, never real prepared data or another tool's folder"
            )
        for name in ("READY", *LAYOUT):
            p = root / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.is_symlink() or p.exists():
                p.unlink()  # a link goes, never what it points to
    root.mkdir(parents=True, exist_ok=True)
    # the mark first: a folder this writes, even one cut short (no READY yet), is its own to --overwrite
    marker = {"generator": "gcc.synth.world", "seed": int(seed), "clips": int(clips), "geometry": g.as_dict()}
    atomic_write(root / MARKER, (json.dumps(marker) + "\n").encode(), root=root)
    t0 = time.time()
    rows: list[dict[str, Any]] = []
    tars: dict[tuple[str, str, str], list[tuple[str, bytes]]] = {}
    for i in range(clips):
        row, members = write_clip(root, seed, i, g)
        rows.append(row)
        tars.setdefault((row["subset"], row["scene"], row["run"]), []).extend(members)
        if verbose:
            print(f"[synth] {row['clip_id']} {time.time() - t0:.1f}s", file=sys.stderr)
    for (subset, scene, run), members in sorted(tars.items()):
        atomic_write(root / "raw" / subset / scene / f"{run}.tar", _tar_bytes(members), root=root)
    atomic_write(root / "text" / "table.safetensors", _safetensors_bytes(make_text_table(g, seed)), root=root)
    atomic_write(root / "index" / "clips.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode(), root=root)
    atomic_write(root / "READY", b"", root=root)
    return root


def make_prepared(tmp_path: str | os.PathLike, clips: int = 24, seed: int = 0, geometry: str = "tiny") -> Path:
    """Tests' helper: a fresh tiny dataset under tmp_path/prepared."""
    return write_prepared(Path(tmp_path) / "prepared", clips=clips, geometry=geometry, seed=seed)


def build_parser() -> argparse.ArgumentParser:
    ap = ToolParser(
        "gcc-synth",
        "A synthetic world written in the prepared layout (what convert_data reads): clips of a camera over a\n"
        "ground painted with classes, a player and (most clips) a boss, with latents a model can learn from the semantic ids.",
        renamed={"--clips": "--n"},
    )
    ap.add_argument("--out", required=True, help="folder for the prepared layout (index/, latents/, ..., READY)")
    ap.add_argument("--n", type=int, default=24, help="how many clips (train and val runs, round-robin)")
    ap.add_argument(
        "--geometry",
        choices=sorted(GEOMETRIES),
        default="tiny",
        help="clip shapes: tiny (CPU tests and demo) or the real run's",
    )
    ap.add_argument("--seed", type=int, default=0, help="the synthetic world's seed (same seed, same bytes)")
    ap.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the dataset in --out, only one gcc-synth wrote (its synth.json); never real prepared data",
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="print each clip as it is written")
    ap.add_argument(
        "--wan_model",
        choices=WAN_PRESETS,
        default=None,
        help="instead of clips, write into --out (new or empty) a random Wan2.2 model folder as published, with "
        "this DiT preset's shapes (DiT shards + index + Wan2.2_VAE.pth; --seed seeds the weights): a stand-in for "
        "Wan2.2-TI2V-5B, for model.model_dir and gcc-sample --model_dir (tiny fits --geometry tiny)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)

    def body() -> int:
        if a.n < 1:
            raise BadInput(f"--n must be >= 1, got {a.n}")
        if a.seed < 0:
            raise BadInput(f"--seed must be >= 0, got {a.seed}")
        if "://" in a.out:
            raise BadInput(f"--out {a.out}: a local folder is needed (gcc-synth writes no object storage)")
        problem = folder_problem(a.out)
        if problem:
            raise BadInput(f"--out {a.out}: {problem}")
        t0 = time.time()
        if a.wan_model:
            n = write_model_folder(a.out, a.wan_model, seed=a.seed)
            print(
                f"wrote a random {a.wan_model} Wan2.2 model folder ({n:,} DiT parameters) to {a.out} in "
                f"{time.time() - t0:.1f}s"
            )
            return 0
        try:
            root = write_prepared(a.out, a.n, a.geometry, a.seed, overwrite=a.overwrite, verbose=a.verbose)
        except FileExistsError:
            raise BadInput(f"--out {a.out}: not empty (pass --overwrite to replace the dataset there)") from None
        print(f"wrote {a.n} {a.geometry} clips to {root} in {time.time() - t0:.1f}s")
        return 0

    return run_tool(p.prog, body)


if __name__ == "__main__":
    sys.exit(main())
