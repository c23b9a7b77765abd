"""`make demo`: the whole chain on built-in synthetic data, on any machine.

    synth (prepared layout) -> convert_data (MDS shards) -> one batch through the loader
    -> gcc-launch -n 2 gcc/train.py yamls/tiny_cpu.yaml model.preset=tiny-p1 (training, validation, exports)
    -> gcc-plot (curves.png)
    -> gcc-sample on a few val clips (a picture of what the model learned)

After the training it prints the validation table: a line per validation, step 0 (the starting weights, validated
before the first step) first, so that each gap shows beside the baseline it started from.

The last step samples `--sample_n` val clips with the last export, without a Wan VAE: the synthetic world's own
decoder (gcc.synth.decode, docs/sample.md) turns the generated latents into a class per latent cell. It
writes, per clip, an mp4 and a PNG contact sheet (GT classes | generated classes | condition) and prints the
per-cell class agreement with the GT (latent frames 1..) for: the trained model, with the default guidance and
with `--sem_cfg 3`; the same model with `--sem_mode unknown` (ids all 255: what the semantic condition adds); and
the weights the run started from (the run writes no step-0 export, so they are rebuilt as the trainer builds
them: the run's preset and vocab initialised from its seed, read from <run_dir>/run.json; the condition path
starts at zero there). A reference line gives what repeating the given frame 0 would score.

Rerunning reuses what is there: the converter is idempotent, the training resumes (or, finished, stops), and the
sampling is redone (seconds).
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from gcc import exit_codes, inputs
from gcc.cli import ToolParser
from gcc.launch_command import gcc_launch, train_command
from gcc.synth import world as synth
from gcc.tools.plot import plot_runs
from gcc.tools.sample.errors import SampleError


def build_parser() -> argparse.ArgumentParser:
    p = ToolParser(
        "python -m gcc.tools.demo",
        "`make demo`: the whole chain on built-in synthetic data, on any machine: gcc-synth -> convert_data ->\n"
        "the loader -> gcc-launch -n NPROC gcc/train.py yamls/tiny_cpu.yaml -> gcc-plot -> gcc-sample. A rerun reuses\n"
        "what is there (the training resumes, or, finished, stops).",
        renamed={"--clips": "--n", "--gpus": "--nproc"},
    )
    p.add_argument("--out", default="runs/demo", help="folder for everything the demo writes")
    p.add_argument("--n", type=int, default=48, help="synthetic clips to make")
    p.add_argument("--seed", type=int, default=0, help="the synthetic world's seed")
    p.add_argument("--workers", type=int, default=2, help="convert_data's processes")
    p.add_argument("--nproc", type=int, default=2, help="training processes, on the CPU (gcc-launch --nproc)")
    p.add_argument("--no_train", action="store_true", help="stop after the data part")
    p.add_argument("--sample_n", type=int, default=4, help="val clips sampled after the training (0: none)")
    p.add_argument("--sample_steps", type=int, default=20, help="denoising steps of that sampling")
    return p


SEM_CFG = 3.0  # guidance amplifies the condition's effect: its line shows how far the model already follows it

# what the demo's training changes in yamls/tiny_cpu.yaml (the one place; printed in its command line): the model
# with one token per latent cell, whose condition says which class each cell holds (gcc/model/dit.py PRESETS,
# docs/sample.md "Reading the numbers")
TRAIN_SETTINGS = ("model.preset=tiny-p1",)


def _step_of(path: Path) -> int:
    return int(path.stem.split("-", 1)[1])


def initial_weights(run_dir: Path, last_export: Path, path: Path) -> str | None:
    """Write the weights the run started from as an export at `path` (the trainer writes no step-0 export): the
    run's preset and vocab initialised from its seed (run.json's signature), as `build_model` builds them, with the
    last export's metadata at step 0. Returns None when they cannot be rebuilt, else a description. A run that
    started from base or warm-start weights is not rebuilt: those files are not the demo's."""
    # heavy (diffsynth, ~4 s): only for the sampling step; keeps --help fast
    from gcc.model.dit import build_gc_dit
    from gcc.model.export import save_gc

    sig = inputs.load_json_object(run_dir / "run.json", "a run record")["signature"]
    if sig.get("model.base_weights") or sig.get("model.init_ckpt") or sig.get("model.legacy_zero_ckpt"):
        return None
    meta = dict(inputs.safetensors_header(last_export)[1])
    meta.update(step="0", resumed_from="", resumed_step="")
    preset, seed = sig["model.preset"], int(sig["seed"])
    dit = build_gc_dit(
        preset,
        vocab=sig["model.vocab"],
        init_seed=seed,
        **inputs.parse_json(sig["model.overrides"], "run.json: model.overrides"),
    )
    save_gc(dit.state_dict(), path, meta)
    return f"the {preset!r} preset initialised from the run's seed {seed}, as the trainer builds it"


def validation_table(val: list[dict]) -> list[str]:
    """The closing table: one line per validation in val_log.csv, the means over its timesteps, step 0 (the
    starting weights: the run's baseline) first, so that each gap shows beside where it started."""
    steps: dict[int, list[dict]] = {}
    for v in val:
        steps.setdefault(int(v["step"]), []).append(v)
    ts = ", ".join(f"{float(v['timestep']):.1f}" for v in next(iter(steps.values()), []))
    out = [
        f"validation, the mean over t = {ts} (the condition helps when gap_uncond > 0, the text when "
        f"gap_nulltext > 0):",
        f"  {'step':>6}  {'mse':>7}  {'gap_uncond':>10}  {'gap_nulltext':>12}",
    ]
    for step, vs in sorted(steps.items()):
        mean = {k: sum(float(v[k]) for v in vs) / len(vs) for k in ("mse", "gap_uncond", "gap_nulltext")}
        out.append(
            f"  {step:>6}  {mean['mse']:7.4f}  {mean['gap_uncond']:+10.4f}  {mean['gap_nulltext']:+12.4f}"
            + ("   (the starting weights)" if step == 0 else "")
        )
    return out


def _sample_one(
    sample_cli, ckpt: Path, preset: str, prepared: Path, out: Path, clips: int, steps: int, seed: int, extra: list[str]
) -> dict | None:
    """One gcc-sample run (its command line printed first); None on an error (printed)."""
    argv = [
        "--ckpt",
        str(ckpt),
        "--model",
        preset,
        "--data",
        str(prepared),
        "--n",
        str(clips),
        "--steps",
        str(steps),
        "--seed",
        str(seed),
        "--device",
        "cpu",
        "--out",
        str(out),
        "--no_progress",
        *extra,
    ]
    print(f"  gcc-sample {' '.join(argv)}")
    try:
        return sample_cli.run(sample_cli.build_parser().parse_args(argv))
    except SampleError as e:
        print(f"gcc-sample: error: {e}", file=sys.stderr)
        return None


def sample_demo(run_dir: Path, prepared: Path, out: Path, clips: int, steps: int, seed: int) -> list[Path] | None:
    """gcc-sample (in this process) on `clips` val clips: the last export (default guidance and --sem_cfg), the
    same with --sem_mode unknown, and the initial weights; prints the command lines and the per-cell class
    agreement of each, and the frame-0-repeated reference. Returns the first contact sheet of each variant (the
    trained model's first), None on an error (printed)."""
    t0 = time.time()  # the imports count: they are the demo's extra time too
    # heavy (torch ~1.3 s): loaded in the sampling step, whose time includes them; keeps --help fast
    import torch

    from gcc.tools.sample import cli as sample_cli

    exports = sorted(run_dir.glob("step-*.safetensors"), key=_step_of)
    if not exports:
        print(f"no export in {run_dir}: nothing to sample", file=sys.stderr)
        return None
    last = exports[-1]
    preset = inputs.load_json_object(run_dir / "run.json", "a run record")["signature"]["model.preset"]
    out.mkdir(parents=True, exist_ok=True)
    init = out / "initial.safetensors"
    init_note = initial_weights(run_dir, last, init)
    variants = [
        (f"trained ({last.stem})", "trained", last, [], "the last export, default guidance"),
        (
            f"trained, --sem_cfg {SEM_CFG:g}",
            "trained_sem_cfg",
            last,
            ["--sem_cfg", f"{SEM_CFG:g}"],
            "the same, the semantic condition's effect amplified by guidance",
        ),
        (
            "trained, --sem_mode unknown",
            "sem_unknown",
            last,
            ["--sem_mode", "unknown"],
            "the same model given ids all 255: the gap to the lines above is what the condition adds",
        ),
    ]
    if init_note is not None:
        variants.append(
            (
                "step 0 (initial weights)",
                "step0",
                init,
                [],
                f"{init_note}; its condition path is zero, so --sem_cfg changes nothing",
            )
        )
    results, copy = [], None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model gains nothing from a second thread, and on a busy machine it spins
    try:
        for label, name, ckpt, extra, note in variants:
            m = _sample_one(sample_cli, ckpt, preset, prepared, out / name, clips, steps, seed, extra)
            if m is None:
                return None
            results.append((label, m["mean"]["class_agreement"], note))
            copy = m["mean"]["class_agreement_copy_frame0"]  # the same clips every time
    finally:
        torch.set_num_threads(threads)
    results.append(
        (
            "reference: frame 0 repeated",
            copy,
            "the GT classes of the given frame 0 kept in every frame: "
            "what a model that only copies its first frame scores",
        )
    )
    print(
        f"\nclass agreement with the GT, per latent cell (latent frames 1..; {clips} val clips, {steps} steps, "
        f"computed in {time.time() - t0:.0f} s):"
    )
    width = max(len(r[0]) for r in results)
    for label, value, note in results:
        shown = "n/a" if value is None else f"{value:.3f}"
        print(f"  {label:<{width}}  {shown}   ({note})")
    return [sorted((out / name).glob("*.png"))[0] for _, name, *_ in variants]


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="  %(message)s", stream=sys.stdout)  # the converter's lines
    out = Path(args.out)
    prepared, shards = out / "prepared", out / "shards"

    from gcc.data.convert import convert  # heavy (torch ~1.3 s): keeps --help and argument errors fast

    t0 = time.time()
    n = 5 if args.sample_n > 0 else 4  # steps shown as [i/n]
    _synthetic_data(prepared, args.n, args.seed, n)
    print(f"[2/{n}] convert_data --data {prepared} --out {shards} --workers {args.workers}")
    manifest = convert(prepared, str(shards), workers=args.workers, chunk_clips=8)

    ds, batch = _read_back(out, shards, manifest, args.seed, n)
    if args.no_train:
        print(f"done in {time.time() - t0:.0f} s. Prepared data: {prepared}  Shards: {shards}")
        return 0
    run_dir = out / "train"
    cmd = _demo_train_command(run_dir, shards, args.nproc)
    print(f"[4/{n}] training: {' '.join(cmd[:1] + cmd[1:])}")
    del ds, batch  # release the loader's shared memory before the training's ranks start
    r = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        print(f"training exited with {r.returncode}", file=sys.stderr)
        return r.returncode
    with inputs.open_text(run_dir / "val_log.csv", "csv") as f:
        print("\n" + "\n".join(validation_table(list(csv.DictReader(f)))))
    curves = run_dir / "curves.png"
    plot_runs([run_dir], curves)
    sheets: list[Path] | None = []
    if args.sample_n > 0:
        print(f"\n[5/{n}] sampling {args.sample_n} val clips with gcc-sample (no --model_dir: the synthetic decoder)")
        sheets = sample_demo(run_dir, prepared, out / "samples", args.sample_n, args.sample_steps, args.seed)
        if sheets is None:  # the error printed above is bad input to gcc-sample: its code
            return exit_codes.CONFIG
    _print_outputs(run_dir, curves, sheets, n, t0)
    return 0


def _synthetic_data(prepared: Path, clips: int, seed: int, n: int) -> None:
    """Step 1: the synthetic prepared data, written unless an earlier demo's is there."""
    # a prepared folder of an older demo lacks the synth marker that gcc-sample needs; the same seed rewrites the
    # same bytes, so the shards made from it stay valid
    if (prepared / "READY").exists() and (prepared / synth.MARKER).exists():
        print(f"[1/{n}] synthetic prepared data: reusing {prepared}")
    else:
        print(f"[1/{n}] synthetic prepared data: {clips} tiny clips -> {prepared}")
        synth.write_prepared(prepared, clips=clips, geometry="tiny", seed=seed, overwrite=True)


def _read_back(out: Path, shards: Path, manifest: dict, seed: int, n: int):
    """Step 3: the first batch read back through the training loader, described; returns (dataset, batch), which
    hold the loader's shared memory until dropped."""
    print(f"[3/{n}] reading the shards back through the training loader (StreamingDataset)")
    # heavy (streaming, ~2 s): imported once step 3 is announced
    from gcc.compat.streaming import release_stale_shm
    from gcc.data.config import DataConfig
    from gcc.data.dataset import GcStreamingDataset, build_dataloader

    release_stale_shm([out / "cache" / "train"])  # left by an earlier demo killed mid-read
    ds = GcStreamingDataset(DataConfig(str(shards)), "train", out / "cache", batch_size=4, seed=seed)
    batch = next(iter(build_dataloader(ds, batch_size=4, num_workers=0)))
    geo = manifest["geometry"]
    print(
        f"  train {manifest['counts']['train']} clips, val {manifest['counts']['val']} clips; "
        f"latents {geo['latents']}, sem ids {geo['sem']}, text {geo['text']}"
    )
    print(f"  first batch: clips {batch['clip_id']}")
    print(
        f"    input_latents {list(batch['input_latents'].shape)} {batch['input_latents'].dtype}, "
        f"context {list(batch['context'].shape)}, sem_ids {list(batch['sem_ids'].shape)}"
    )
    print(
        f"    text drop {batch['drop_text'].tolist()}, cond drop {batch['drop_cond'].tolist()}, "
        f"mask fraction {[round(v, 3) for v in batch['mask_frac'].tolist()]}"
    )
    return ds, batch


def _demo_train_command(run_dir: Path, shards: Path, nproc: int) -> list[str]:
    """Step 4's command: gcc-launch of gcc/train.py on yamls/tiny_cpu.yaml with the demo's settings."""
    root = Path(__file__).resolve().parents[2]  # the repository: gcc/tools/demo.py -> .
    return train_command(
        root / "yamls" / "tiny_cpu.yaml",
        *TRAIN_SETTINGS,
        f"run_dir={run_dir}",
        f"data.path={shards}",
        "progress_bar=false",
        n=nproc,
        launcher=gcc_launch(),  # Composer's launcher, ending quietly (gcc/launcher.py)
    )


def _print_outputs(run_dir: Path, curves: Path, sheets: list[Path] | None, n: int, t0: float) -> None:
    """The closing lines: the time taken and where each output of the demo is."""
    print(f"\ndone in {time.time() - t0:.0f} s.")
    print(f"  curves:      {curves}   (gcc-plot {run_dir})")
    if sheets:
        print(f"  samples:     {sheets[0]}   (contact sheet: GT classes | generated classes | condition)")
        print(f"               one PNG + mp4 per clip in {', '.join(f'{p.parent}/' for p in sheets)}")
    from gcc.training.callbacks.samples import STEP_FOLDER  # imports torch: only here, at the end

    found = {
        int(m[1]): p
        for p in (run_dir / "samples").glob("step-*")
        if p.is_dir() and (m := STEP_FOLDER.fullmatch(p.name))
    }
    rounds = [found[s] for s in sorted(found)]
    if rounds:
        print(
            f"  training samples: {run_dir / 'samples'}/step-{{{','.join(p.name[5:] for p in rounds)}}}/  (per clip: "
            f"GT | conditioned | unconditioned | condition PNG, an mp4 per variant; the same in TensorBoard's Images tab)"
        )
    print(f"  logs:        {run_dir / 'train_log.csv'}, {run_dir / 'val_log.csv'}")
    print(f"  tensorboard: {run_dir / 'tensorboard'}   (tensorboard --logdir {run_dir / 'tensorboard'})")
    print(f"  exports:     {', '.join(sorted(p.name for p in run_dir.glob('step-*.safetensors')))} in {run_dir}")
    # `make demo` takes no training settings, and run again it finds this run finished and leaves it as it is
    print(f"  resume:      the [4/{n}] command with a larger max_duration=...ba added continues this run")


if __name__ == "__main__":
    sys.exit(main())
