"""Bad input to every entry point (docs/training.md, "Tools" and "Exit codes"): exit 2 and one message that names
the input (file, flag or key) and says what was expected, never a traceback. The trainer answers bad config
before any rank starts work; its data and run-folder problems keep their codes (3 refused, 6 damaged data, in a tool
too).

Each case calls the entry point's own `main(argv)` in this process (the console scripts' functions and gcc/train.py's)
and reads what it printed: the message and the exit code are the process's, and an exception that escaped would
fail the test with its traceback. The process boundary is proven where it is the point: every console script as a
real process in tests/test_cli.py, the trainer's run-phase verdicts and the `composer -n 2` launcher below."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hostile import Outcome, run_entry
from test_cli import ROOT

BIN = Path(sys.executable).parent
YAML = str(ROOT / "yamls" / "tiny_cpu.yaml")
TRAIN = [sys.executable, str(ROOT / "gcc" / "train.py")]
COMPOSER = [str(BIN / "composer"), "-n", "2", str(ROOT / "gcc" / "train.py")]


def env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


def run(cmd: list[str], timeout: float = 300, preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env(), preexec_fn=preexec_fn
    )


@pytest.fixture
def call(in_process) -> Callable[[str, list[str]], Outcome]:
    """`call(prog, argv)`: the program's main(argv) in this process (tests/hostile.py `run_entry`): its exit code
    (an argparse error's SystemExit is its exit code, as for the process) and what it printed."""
    return run_entry


TRAINER_VERDICTS = ("config error: ", "refused: ", "damaged data: ", "storage unavailable: ")


def check(r: subprocess.CompletedProcess, code: int, fragments: list[str], prog: str, ranks: int = 1) -> str:
    """Exit `code`, no traceback, and one stderr line `<prog>: error: ...` per process (the trainer's:
    `gcc.train: config error: ...`, `... refused: ...`) holding every fragment; returns that line."""
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out[-4000:]
    assert r.returncode == code, (r.returncode, out[-4000:])
    if prog == "gcc.train":
        lines = [
            line
            for line in r.stderr.splitlines()
            if line.startswith("gcc.train: ") and any(v in line for v in TRAINER_VERDICTS)
        ]
    else:
        lines = [line for line in r.stderr.splitlines() if line.startswith(f"{prog}: error: ")]
    assert 1 <= len(lines) <= ranks, r.stderr[-4000:]
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


class World:
    """What the cases break: files made on demand in the test's own folder; the session's datasets copied when
    a case changes them."""

    def __init__(self, tmp_path: Path, request):
        self.tmp, self.request = tmp_path, request

    def file(self, name: str, data: bytes | str = b"x") -> str:
        p = self.tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        return str(p)

    def folder(self, name: str = "folder") -> str:
        (self.tmp / name).mkdir(parents=True, exist_ok=True)
        return str(self.tmp / name)

    def prepared(self) -> Path:
        """A copy of the session's prepared layout (24 tiny clips) to break."""
        dst = self.tmp / "prepared"
        if not dst.exists():
            shutil.copytree(self.request.getfixturevalue("prepared_tiny"), dst)
        return dst

    @property
    def shards(self) -> Path:
        """The session's converted data (read-only)."""
        return self.request.getfixturevalue("shards")

    def shards_copy(self) -> Path:
        dst = self.tmp / "shards"
        if not dst.exists():
            shutil.copytree(self.shards, dst)
        return dst

    def tiny_export(self) -> str:
        """A gc25d export of the tiny preset."""
        from _gc_helpers import export_metadata, tiny_dit

        from gcc.model.export import save_gc

        meta = export_metadata()
        return str(save_gc(tiny_dit(seed=3).state_dict(), self.tmp / "step-1.safetensors", meta))

    @property
    def run_dir(self) -> str:
        return str(self.tmp / "run")

    def train(self, *overrides: str, yaml: str = YAML, data: str | None = None) -> list[str]:
        """The trainer's argv; `data`: data.path (default the session's shards) for a case refused before it is read."""
        return [
            yaml,
            f"run_dir={self.run_dir}",
            f"data.path={self.shards if data is None else data}",
            "progress_bar=false",
            "loggers={}",
            "max_duration=1",
            *overrides,
        ]


# (prog, exit code, world -> (argv, fragments of the message))
Case = tuple[str, int, Callable[[World], tuple[list[str], list[str]]]]


def _garbage_table(w: World) -> Path:
    """A copy of the converted data whose text table is not a safetensors file."""
    data = w.shards_copy()
    (data / "text" / "table.safetensors").write_bytes(b"not a safetensors file at all")
    return data


def _no_null_table(w: World) -> Path:
    from safetensors.torch import save_file

    src = w.prepared()
    save_file({"a": torch.zeros(2, 3, dtype=torch.bfloat16)}, str(src / "text" / "table.safetensors"))
    return src


def _convert(w: World, src, *flags: str, out=None) -> list[str]:
    return ["--data", str(src), "--out", str(out or w.tmp / "out"), "--no_progress", *flags]


def _prep_break(w: World, rel: str, data: bytes | None) -> Path:
    """The prepared copy with file `rel` replaced by `data` (None: by a folder)."""
    src = w.prepared()
    p = src / rel
    p.unlink()
    if data is None:
        p.mkdir()
    else:
        p.write_bytes(data)
    return src


def _sample(w: World, *flags: str, data_root=None, out_dir=None, ckpt=None) -> list[str]:
    data_root = data_root or w.request.getfixturevalue("prepared_tiny")
    return [
        "--ckpt",
        ckpt or w.tiny_export(),
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--steps",
        "1",
        "--no_progress",
        "--data",
        str(data_root),
        "--out",
        str(out_dir or w.tmp / "eval"),
        *flags,
    ]


def _maskstats(w: World, *flags: str, data=None) -> list[str]:
    return ["--data", str(data or w.shards), "--n", "2", *flags]


def _plot_run(
    w: World, train_csv: bytes = b"step,loss\n1,0.5\n", val_csv: bytes | None = None, val_folder: bool = False
) -> str:
    d = w.folder("plotrun")
    w.file("plotrun/train_log.csv", train_csv)
    if val_csv is not None:
        w.file("plotrun/val_log.csv", val_csv)
    if val_folder:
        w.folder("plotrun/val_log.csv")
    return d


def _manifest(w: World, text: str | bytes) -> Path:
    data = w.shards_copy()
    (data / "manifest.json").write_bytes(text.encode() if isinstance(text, str) else text)
    return data


NOT_UTF8 = b"\xff\xfe\x00garbage"
UNREAD = "data-never-read"  # data.path of a config refused before its data is looked at
# a 460-byte yaml whose aliases expand to 9**9 values under loggers.mlflow.tags (every walk of the config visited them
# all: the launch hung after creating train.log)
ANCHOR_BOMB = (
    "loggers:\n  mlflow:\n    tags:\n      a0: &a0 ["
    + ", ".join(["lol"] * 9)
    + "]\n"
    + "".join(f"      a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 9))
)

CASES: dict[str, Case] = {
    # ---- the trainer: bad config is exit 2 before any work ---------------------------------------------------
    "train-yaml-syntax": (
        "gcc.train",
        2,
        lambda w: (w.train(yaml=w.file("bad.yaml", "seed: [1\n")), ["bad.yaml", "not valid yaml", "line 2"]),
    ),
    "train-yaml-folder": (
        "gcc.train",
        2,
        lambda w: (w.train(yaml=w.folder("dir.yaml")), ["dir.yaml", "is a folder, expected a yaml config file"]),
    ),
    "train-yaml-not-utf8": (
        "gcc.train",
        2,
        lambda w: (w.train(yaml=w.file("bin.yaml", NOT_UTF8)), ["bin.yaml", "not UTF-8"]),
    ),
    "train-yaml-a-list": (
        "gcc.train",
        2,
        lambda w: (w.train(yaml=w.file("list.yaml", "- 1\n")), ["list.yaml", "expected a mapping of keys"]),
    ),
    "train-yaml-endless": (
        "gcc.train",
        2,
        lambda w: (w.train(yaml="/dev/zero"), ["/dev/zero", "expected a regular yaml file"]),
    ),
    "train-yaml-missing": (
        "gcc.train",
        2,
        lambda w: (w.train(yaml=str(w.tmp / "nope.yaml")), ["nope.yaml", "config file not found"]),
    ),
    "train-override-bad-yaml": (
        "gcc.train",
        2,
        lambda w: (w.train("seed=[1"), ["override 'seed=[1'", "not valid yaml"]),
    ),
    "train-override-empty-key": ("gcc.train", 2, lambda w: (w.train("optim..lr=3"), ["optim..lr=3", "empty key"])),
    "train-override-no-equals": ("gcc.train", 2, lambda w: (w.train("seed"), ["'seed'", "dotted.key=value"])),
    "train-unknown-key": ("gcc.train", 2, lambda w: (w.train("optim.bogus=1"), ["unknown key(s): optim.bogus"])),
    "train-unknown-callback": (
        "gcc.train",
        2,
        lambda w: (w.train("callbacks={speed_monitr: {}}"), ["callbacks.speed_monitr: unknown callback", "choose"]),
    ),
    "train-callback-argument": (
        "gcc.train",
        2,
        lambda w: (
            w.train("callbacks.speed_monitor.window=10"),
            ["callbacks.speed_monitor.window: not an argument of Composer's SpeedMonitor", "window_size"],
        ),
    ),
    "train-wrong-type": (
        "gcc.train",
        2,
        lambda w: (w.train("max_duration=many"), ["max_duration", "expected a whole number"]),
    ),
    "train-lr-negative": ("gcc.train", 2, lambda w: (w.train("optimizer.lr=-1"), ["optimizer.lr", "must be >= 0"])),
    "train-lr-nan": ("gcc.train", 2, lambda w: (w.train("optimizer.lr=.nan"), ["optimizer.lr", "finite"])),
    "train-cond-lr-inf": (
        "gcc.train",
        2,
        lambda w: (w.train("optimizer.cond_lr=inf"), ["optimizer.cond_lr", "finite"]),
    ),
    "train-weight-decay-negative": (
        "gcc.train",
        2,
        lambda w: (w.train("optimizer.weight_decay=-1"), ["optimizer.weight_decay", ">= 0"]),
    ),
    "train-warmup-negative": (
        "gcc.train",
        2,
        lambda w: (w.train("scheduler.t_warmup=-5"), ["scheduler.t_warmup", ">= 0"]),
    ),
    "train-seed-negative": ("gcc.train", 2, lambda w: (w.train("seed=-1"), ["seed", "[0, 2**32)"])),
    "train-seed-huge": ("gcc.train", 2, lambda w: (w.train(f"seed={2**70}"), ["seed", "[0, 2**32)"])),
    "train-val-timesteps-empty": (
        "gcc.train",
        2,
        lambda w: (w.train("val_timesteps=[]"), ["val_timesteps", "non-empty list"]),
    ),
    "train-val-timesteps-words": (
        "gcc.train",
        2,
        lambda w: (w.train("val_timesteps=[abc]"), ["val_timesteps", "numbers in [0, 1000]"]),
    ),
    "train-cache-limit": (
        "gcc.train",
        2,
        lambda w: (w.train("data.cache_limit=lots"), ["data.cache_limit", "200gb", "'lots'"]),
    ),
    "train-canonical-nodes-zero": (
        "gcc.train",
        2,
        lambda w: (w.train("data.num_canonical_nodes=0"), ["data.num_canonical_nodes", ">= 1"]),
    ),
    "train-dist-timeout-huge": ("gcc.train", 2, lambda w: (w.train("dist_timeout=1e308"), ["dist_timeout", "at most"])),
    "train-overrides-unknown-field": (
        "gcc.train",
        2,
        lambda w: (w.train("model.overrides={nope: 1}"), ["model.overrides.nope", "known:"]),
    ),
    "train-overrides-wrong-type": (
        "gcc.train",
        2,
        lambda w: (w.train("model.overrides={dim: wide}"), ["model.overrides.dim", "positive integer"]),
    ),
    "train-overrides-heads": (
        "gcc.train",
        2,
        lambda w: (w.train("model.overrides={num_heads: 3}"), ["model.overrides", "num_heads=3"]),
    ),
    "train-init-ckpt-a-folder": (
        "gcc.train",
        2,
        lambda w: (w.train(f"model.init_ckpt={w.folder()}"), ["model.init_ckpt", "is a folder"]),
    ),
    "train-init-ckpt-garbage": (
        "gcc.train",
        2,
        lambda w: (
            w.train(f"model.init_ckpt={w.file('x.safetensors')}"),
            ["model.init_ckpt", "x.safetensors", "cannot be read as safetensors"],
        ),
    ),
    "train-init-ckpt-other-preset": (
        "gcc.train",
        2,
        lambda w: (
            w.train(f"model.init_ckpt={w.tiny_export()}", "model.overrides={dim: 128, num_heads: 4}"),
            ["model.init_ckpt", "step-1.safetensors", "has shape", "model expects"],
        ),
    ),
    "train-model-dir-a-file": (
        "gcc.train",
        2,
        lambda w: (w.train(f"model.model_dir={w.file('wan')}"), ["model.model_dir", "is a file"]),
    ),
    "train-model-dir-empty": (
        "gcc.train",
        2,
        lambda w: (w.train(f"model.model_dir={w.folder('wan')}"), ["model.model_dir", "diffusion_pytorch_model"]),
    ),
    "train-vae-path-missing": (
        "gcc.train",
        2,
        lambda w: (
            w.train(f"model.vae_path={w.folder()}/Wan2.2_VAE.pth"),
            ["model.vae_path", "Wan2.2_VAE.pth", "not found"],
        ),
    ),
    "train-vae-path-a-folder": (
        "gcc.train",
        2,
        lambda w: (w.train(f"model.vae_path={w.folder('vae')}"), ["model.vae_path", "is a folder, expected a file"]),
    ),
    "train-sample-steps-zero": ("gcc.train", 2, lambda w: (w.train("sample_steps=0"), ["sample_steps", ">= 1"])),
    # ---- the yaml loader is bounded (gcc/yaml_reader.py BoundedLoader): refused naming the key path ----------
    "train-yaml-int-key": (
        "gcc.train",
        2,
        lambda w: (
            w.train(yaml=w.file("k.yaml", "seed: 0\n1: 2\n"), data=UNREAD),
            ["k.yaml", "key '1' is not a string"],
        ),
    ),
    "train-yaml-bool-key": (
        "gcc.train",
        2,
        lambda w: (w.train(yaml=w.file("k.yaml", "optim:\n  true: 2\n"), data=UNREAD), ["optim", "key 'true'"]),
    ),
    "train-override-int-key": (
        "gcc.train",
        2,
        lambda w: (w.train("loggers={mlflow: {tags: {1: x}}}", data=UNREAD), ["loggers.mlflow.tags", "key '1'"]),
    ),
    "train-yaml-anchor-bomb": (
        "gcc.train",
        2,
        lambda w: (
            w.train(yaml=w.file("bomb.yaml", ANCHOR_BOMB), data=UNREAD),
            ["loggers.mlflow.tags", "more than 100000"],
        ),
    ),
    "train-yaml-too-many-aliases": (
        "gcc.train",
        2,
        lambda w: (
            w.train(yaml=w.file("a.yaml", "x: &x 1\nval_timesteps: [" + ", ".join(["*x"] * 101) + "]\n"), data=UNREAD),
            ["a.yaml", "val_timesteps", "more than 100 aliases"],
        ),
    ),
    "train-yaml-alias-inside-itself": (
        "gcc.train",
        2,
        lambda w: (
            w.train(yaml=w.file("c.yaml", "val_timesteps: &t [*t]\n"), data=UNREAD),
            ["refers to a node that holds"],
        ),
    ),
    "train-yaml-5000-deep": (
        "gcc.train",
        2,
        lambda w: (
            w.train(yaml=w.file("deep.yaml", "seed: " + "[" * 5000 + "]" * 5000 + "\n"), data=UNREAD),
            ["deep.yaml", "seed.0.0", "nested deeper than 64 levels"],
        ),
    ),
    # ---- numeric bounds on what sizes work (gcc/training/config.py BOUNDS, gcc/model/config.py MODEL_BOUNDS) -------------------------
    "train-num-layers-huge": (
        "gcc.train",
        2,
        lambda w: (
            w.train("model.overrides={num_layers: 100000000}", data=UNREAD),
            ["model.overrides.num_layers", "at most 256", "100000000"],
        ),
    ),
    "train-val-n-huge": (
        "gcc.train",
        2,
        lambda w: (w.train("val_n=10000000", data=UNREAD), ["val_n", "at most 100000"]),
    ),
    "train-legacy-ckpt-without-latest": (
        "gcc.train",
        2,
        lambda w: (w.train(f"model.legacy_zero_ckpt={w.folder('zero')}"), ["model.legacy_zero_ckpt", "'latest'"]),
    ),
    "train-run-dir-a-file": (
        "gcc.train",
        2,
        lambda w: (w.train(f"run_dir={w.file('afile')}"), ["run_dir", "afile", "is a file, expected a folder"]),
    ),
    "train-run-dir-under-a-file": (
        "gcc.train",
        2,
        lambda w: (w.train(f"run_dir={w.file('afile')}/run"), ["run_dir", "afile is a file, expected a folder"]),
    ),
    "train-cache-dir-a-file": (
        "gcc.train",
        2,
        lambda w: (w.train(f"data.cache_dir={w.file('afile')}"), ["data.cache_dir", "is a file, expected a folder"]),
    ),
    "train-data-a-file": (
        "gcc.train",
        2,
        lambda w: (w.train(f"data.path={w.file('afile')}"), ["data.path", "is a file", "convert_data output folder"]),
    ),
    "train-data-other-scheme": (
        "gcc.train",
        2,
        lambda w: (w.train("data.path=gs://bucket/data"), ["data.path", "gs://bucket/data", "s3://bucket/prefix"]),
    ),
    # ---- convert_data ----------------------------------------------------------------------------------------
    "convert-out-a-file": (
        "convert_data",
        2,
        lambda w: (
            ["--data", str(w.prepared()), "--out", w.file("afile"), "--no_progress"],
            ["--out", "afile", "is a file, expected a folder"],
        ),
    ),
    "convert-out-is-src": (
        "convert_data",
        2,
        lambda w: (
            ["--data", str(w.prepared()), "--out", str(w.prepared()) + "/", "--no_progress"],
            ["--out", "is --data"],
        ),
    ),
    "convert-size-limit-negative": (
        "convert_data",
        2,
        lambda w: (_convert(w, w.prepared(), "--size_limit", "-1"), ["--size_limit", "-1"]),
    ),
    "convert-size-limit-huge": (
        "convert_data",
        2,
        lambda w: (_convert(w, w.prepared(), "--size_limit", str(2**40)), ["--size_limit", "2**32"]),
    ),
    "convert-workers-zero": ("convert_data", 2, lambda w: (_convert(w, w.prepared(), "--workers", "0"), ["--workers"])),
    "convert-out-other-scheme": (
        "convert_data",
        2,
        lambda w: (
            ["--data", str(w.prepared()), "--out", "gs://bucket/x", "--no_progress"],
            ["--out gs://bucket/x", "s3://bucket/prefix"],
        ),
    ),
    "convert-src-missing": ("convert_data", 2, lambda w: (_convert(w, w.tmp / "nope"), ["nope", "no such folder"])),
    "convert-text-table-garbage": (
        "convert_data",
        2,
        lambda w: (
            _convert(w, _prep_break(w, "text/table.safetensors", b"not a safetensors file")),
            ["table.safetensors", "not a text table"],
        ),
    ),
    "convert-text-table-a-folder": (
        "convert_data",
        2,
        lambda w: (
            _convert(w, _prep_break(w, "text/table.safetensors", None)),
            ["table.safetensors", "text table missing"],
        ),
    ),
    "convert-text-table-without-null-prompt": (
        "convert_data",
        2,
        lambda w: (_convert(w, _no_null_table(w)), ["table.safetensors", "NULL_PROMPT"]),
    ),
    "convert-index-not-utf8": (
        "convert_data",
        2,
        lambda w: (_convert(w, _prep_break(w, "index/clips.jsonl", NOT_UTF8)), ["clips.jsonl", "not UTF-8"]),
    ),
    "convert-index-a-folder": (
        "convert_data",
        2,
        lambda w: (
            _convert(w, _prep_break(w, "index/clips.jsonl", None)),
            ["clips.jsonl", "is a folder"],
        ),
    ),
    "convert-meta-not-utf8": (
        "convert_data",
        2,
        lambda w: (_convert(w, _prep_break(w, "meta/clip00000.json", NOT_UTF8)), ["failed"]),
    ),  # the clip's own line follows: checked below
    "convert-meta-a-folder": (
        "convert_data",
        2,
        lambda w: (_convert(w, _prep_break(w, "meta/clip00000.json", None)), ["failed"]),
    ),
    "convert-out-holds-a-garbage-manifest": (
        "convert_data",
        2,
        lambda w: (
            _convert(w, w.prepared(), out=Path(w.file("out/manifest.json", "garbage")).parent),
            ["manifest.json", "not a manifest that convert_data wrote"],
        ),
    ),
    # ---- gcc-synth -------------------------------------------------------------------------------------------
    "synth-out-a-file": (
        "gcc-synth",
        2,
        lambda w: (["--out", w.file("afile")], ["--out", "is a file, expected a folder"]),
    ),
    "synth-out-under-a-file": (
        "gcc-synth",
        2,
        lambda w: (
            ["--out", w.file("afile") + "/x"],
            ["--out", "afile is a file, expected a folder"],
        ),
    ),
    "synth-out-s3": (
        "gcc-synth",
        2,
        lambda w: (["--out", "s3://bucket/x"], ["--out s3://bucket/x", "local folder"]),
    ),
    "synth-out-not-empty": (
        "gcc-synth",
        2,
        lambda w: (["--out", str(w.prepared())], ["--out", "not empty", "--overwrite"]),
    ),
    "synth-seed-negative": (
        "gcc-synth",
        2,
        lambda w: (["--out", str(w.tmp / "s"), "--seed", "-1"], ["--seed", ">= 0"]),
    ),
    "synth-clips-zero": (
        "gcc-synth",
        2,
        lambda w: (["--out", str(w.tmp / "s"), "--n", "0"], ["--n", ">= 1"]),
    ),
    # ---- gcc-inspect -----------------------------------------------------------------------------------------
    "inspect-unknown-model": (
        "gcc-inspect",
        2,
        lambda w: (["--model", "nope"], ["--model 'nope'", "ti2v-5b"]),
    ),
    "inspect-unknown-vocab": (
        "gcc-inspect",
        2,
        lambda w: (
            ["--model", "tiny", "--vocab", "klingon"],
            ["--vocab", "klingon", "parts"],
        ),
    ),
    "inspect-file-a-folder": (  # not a run folder
        "gcc-inspect",
        2,
        lambda w: ([w.folder()], ["folder", "a folder without run.json, expected a run folder or a .safetensors"]),
    ),
    "inspect-file-missing": (
        "gcc-inspect",
        2,
        lambda w: ([str(w.tmp / "nope")], ["nope", "not found"]),
    ),
    "inspect-file-garbage": (
        "gcc-inspect",
        2,
        lambda w: (
            [w.file("x.safetensors")],
            ["x.safetensors", "cannot be read as safetensors"],
        ),
    ),
    # ---- gcc-plot --------------------------------------------------------------------------------------------
    "plot-no-step-column": (
        "gcc-plot",
        2,
        lambda w: ([_plot_run(w, b"a,b\n1,2\n")], ["train_log.csv", "'step'"]),
    ),
    "plot-not-utf8": (
        "gcc-plot",
        2,
        lambda w: ([_plot_run(w, NOT_UTF8)], ["train_log.csv", "not a csv file (not UTF-8"]),
    ),
    "plot-val-no-timestep": (
        "gcc-plot",
        2,
        lambda w: ([_plot_run(w, val_csv=b"step,mse\n1,1\n")], ["val_log.csv", "'timestep'"]),
    ),
    "plot-val-a-folder": (
        "gcc-plot",
        2,
        lambda w: (
            [_plot_run(w, val_folder=True)],
            ["val_log.csv", "is a folder, expected a regular csv file"],
        ),
    ),
    "plot-no-run-folder": (
        "gcc-plot",
        2,
        lambda w: ([str(w.tmp / "nope")], ["train_log.csv", "no train rows"]),
    ),
    "plot-out-a-folder": (
        "gcc-plot",
        2,
        lambda w: (
            [_plot_run(w), "--out", w.folder()],
            ["--out", "is a folder, expected a file name"],
        ),
    ),
    "plot-out-under-a-file": (
        "gcc-plot",
        2,
        lambda w: (
            [_plot_run(w), "--out", w.file("afile") + "/c.png"],
            ["--out", "afile is a file, expected a folder"],
        ),
    ),
    "plot-smoothing-nan": (
        "gcc-plot",
        2,
        lambda w: ([_plot_run(w), "--smoothing", "nan"], ["--smoothing", "[0, 1)"]),
    ),
    # ---- gcc-maskstats ---------------------------------------------------------------------------------------
    "maskstats-manifest-not-utf8": (
        "gcc-maskstats",
        2,
        lambda w: (_maskstats(w, data=_manifest(w, NOT_UTF8)), ["manifest.json", "not valid JSON"]),
    ),
    "maskstats-text-table-garbage": (  # converted data damaged: exit 6, as in a run
        "gcc-maskstats",
        6,
        lambda w: (_maskstats(w, data=_garbage_table(w)), ["damaged data: ", "table.safetensors", "not a text table"]),
    ),
    "maskstats-seed-negative": ("gcc-maskstats", 2, lambda w: (_maskstats(w, "--seed", "-1"), ["--seed"])),
    "maskstats-json-a-folder": (
        "gcc-maskstats",
        2,
        lambda w: (_maskstats(w, "--out", w.folder()), ["--out", "is a folder, expected a file name"]),
    ),
    "maskstats-preview-under-a-file": (
        "gcc-maskstats",
        2,
        lambda w: (
            _maskstats(w, "--preview", w.file("afile") + "/p.png"),
            ["--preview", "afile is a file, expected a folder"],
        ),
    ),
    # ---- gcc-sample ------------------------------------------------------------------------------------------
    "sample-out-dir-a-file": (
        "gcc-sample",
        2,
        lambda w: (_sample(w, "--n", "1", out_dir=w.file("afile")), ["--out", "is a file, expected a folder"]),
    ),
    "sample-device-unknown": (
        "gcc-sample",
        2,
        lambda w: (_sample(w, "--n", "1", "--device", "klingon"), ["--device 'klingon'"]),
    ),
    "sample-shift-nan": (
        "gcc-sample",
        2,
        lambda w: (_sample(w, "--n", "1", "--shift", "nan"), ["--shift", "finite"]),
    ),
    "sample-cfg-inf": ("gcc-sample", 2, lambda w: (_sample(w, "--n", "1", "--cfg", "inf"), ["--cfg", "finite"])),
    "sample-fps-zero": ("gcc-sample", 2, lambda w: (_sample(w, "--n", "1", "--fps", "0"), ["--fps", ">= 1"])),
    "sample-clip-ids-not-utf8": (
        "gcc-sample",
        2,
        lambda w: (_sample(w, "--clip_ids", "@" + w.file("ids.txt", NOT_UTF8)), ["--clip_ids", "ids.txt", "not UTF-8"]),
    ),
    "sample-ckpt-a-folder": (
        "gcc-sample",
        2,
        lambda w: (_sample(w, "--n", "1", ckpt=w.folder()), ["--ckpt", "folder", "is a folder, expected a file"]),
    ),
    "sample-ckpt-garbage": (
        "gcc-sample",
        2,
        lambda w: (
            _sample(w, "--n", "1", ckpt=w.file("x.safetensors")),
            ["--ckpt", "x.safetensors", "safetensors"],
        ),
    ),
    "sample-base-model-dir-without-dit": (
        "gcc-sample",
        2,
        lambda w: (
            [
                "--base",
                "--model_dir",
                str(Path(w.file("wan/Wan2.2_VAE.pth")).parent),
                "--model",
                "tiny",
                "--device",
                "cpu",
                "--data",
                str(w.request.getfixturevalue("prepared_tiny")),
                "--n",
                "1",
                "--out",
                str(w.tmp / "eval"),
            ],
            ["--model_dir", "wan", "diffusion_pytorch_model"],
        ),
    ),
    "sample-text-table-garbage": (
        "gcc-sample",
        2,
        lambda w: (_sample(w, "--n", "1", data_root=_garbage_table(w)), ["table.safetensors", "not a text table"]),
    ),
    # a clip whose files are damaged: reported, the others judged, exit 6 at the end (docs/sample.md)
    "sample-prepared-meta-not-utf8": (
        "gcc-sample",
        6,
        lambda w: (
            _sample(w, "--clip_ids", "clip00000", data_root=_prep_break(w, "meta/clip00000.json", NOT_UTF8)),
            ["clip00000.json", "not UTF-8"],
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_message_and_exit_2(case, tmp_path, request, call):
    prog, code, make = CASES[case]
    argv, fragments = make(World(tmp_path, request))
    r = call(prog, argv)
    check(r, code, fragments, prog)
    if prog == "gcc.train":  # before any work: not even the run folder
        assert not (tmp_path / "run").exists()
    if case.startswith("convert-meta"):  # the failed clip is named on the line after the summary
        assert "clip clip00000: " in r.stderr and "meta/clip00000.json: " in r.stderr, r.stderr
    if case == "convert-out-is-src":
        assert not (tmp_path / "prepared" / "manifest.json").exists()


@pytest.mark.slow
def test_sample_refuses_a_checkpoint_of_another_preset_before_building_it(tmp_path, request):
    """`--model ti2v-5b` with a tiny export: found from the header, not after building 5B parameters in fp32 (20 GB):
    the tool runs with its address space capped at 10 GiB."""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (10 << 30, 10 << 30))

    w = World(tmp_path, request)
    argv = _sample(w, "--n", "1")
    argv[argv.index("tiny")] = "ti2v-5b"
    r = run([str(BIN / "gcc-sample"), *argv], preexec_fn=cap)
    check(r, 2, ["--ckpt", "step-1.safetensors", "key set differs", "ti2v-5b"], "gcc-sample")
    assert not (tmp_path / "eval").exists()


@pytest.mark.slow
# ---- the trainer's data and run folder: refusals (3) and damaged data (6), no traceback ------------------------
# (found by rank 0 once the process group is up: a real trainer process, `python gcc/train.py`)
@pytest.mark.parametrize(
    "case", ["manifest-garbage", "run-json-garbage", "run-json-a-list", "text-table-garbage", "batch-beyond-the-data"]
)
def test_the_trainers_data_and_run_folder_problems_keep_their_codes(case, tmp_path, request):
    w = World(tmp_path, request)
    data, code, extra = w.shards, 3, []
    if case == "batch-beyond-the-data":  # no step in an epoch: the run looped over empty epochs for ever
        extra = ["global_train_batch_size=64", "device_train_microbatch_size=2"]
        fragments = ["refused", "fewer than its batch of 64", "lower global_train_batch_size"]
    elif case.startswith("manifest"):
        data = _manifest(w, "garbage" if case == "manifest-garbage" else "{}")
        fragments = ["refused", "manifest.json", "not valid JSON" if case == "manifest-garbage" else "format_version"]
    elif case.startswith("run-json"):
        w.file("run/run.json", "garbage" if case == "run-json-garbage" else "[]")
        fragments = ["refused", "run.json", "not a run record"]
    else:
        data, code = _garbage_table(w), 6
        fragments = ["damaged data", "table.safetensors", "not a text table"]
    check(run([*TRAIN, *w.train(f"data.path={data}", *extra)]), code, fragments, "gcc.train")


# ---- object storage --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "case", ["train-data", "train-checkpoint-dir", "convert-out", "maskstats-data", "train-no-credentials"]
)
def test_a_bucket_that_does_not_exist_is_named(case, tmp_path, request, s3_bucket, monkeypatch, call):
    w = World(tmp_path, request)
    url = "s3://no-such-bucket-gcc/x"
    fragments = ["no-such-bucket-gcc", "does not exist"]
    if case == "train-data":
        argv, prog, fragments = w.train(f"data.path={url}"), "gcc.train", ["data.path", *fragments]
    elif case == "train-checkpoint-dir":
        argv, prog, fragments = w.train(f"save_folder={url}"), "gcc.train", ["save_folder", *fragments]
    elif case == "train-no-credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        argv, prog = w.train(f"save_folder={s3_bucket}/x"), "gcc.train"
        fragments = ["save_folder", "no S3 credentials"]
    elif case == "convert-out":
        argv, prog, fragments = _convert(w, w.prepared(), out=url), "convert_data", ["--out", *fragments]
    else:
        argv, prog, fragments = _maskstats(w, data=url), "gcc-maskstats", ["--data", *fragments]
    check(call(prog, argv), 2, fragments, prog)


def test_object_storage_that_does_not_answer_is_exit_7(tmp_path, request, monkeypatch, call):
    monkeypatch.setenv("S3_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    w = World(tmp_path, request)
    r = call("gcc.train", w.train("save_folder=s3://bucket/x"))
    check(r, 7, ["storage unavailable", "s3://bucket/x"], "gcc.train")
    r = call("convert_data", _convert(w, w.prepared(), out="s3://bucket/x"))
    check(r, 7, ["storage unavailable", "s3://bucket/x"], "convert_data")


# ---- credentials in a URL: refused where the URL enters, never printed (docs/training.md, "Trust and safety") ----
SECRET = "SeCrEt/Word"  # an AWS secret key may hold a '/'
CREDENTIAL_URL = f"s3://AKIDKEY:{SECRET}@bucket/p"
# every flag or key that takes a path or URL: (prog, world -> argv)
CREDENTIAL_ENTRIES: dict[str, tuple[str, Callable[[World], list[str]]]] = {
    **{
        f"train-{key}": ("gcc.train", lambda w, key=key: w.train(f"{key}={CREDENTIAL_URL}", data=UNREAD))
        for key in (
            "data.path",
            "save_folder",
            "run_dir",
            "data.cache_dir",
            "model.model_dir",
            "model.init_ckpt",
            "model.legacy_zero_ckpt",
            "model.vae_path",
        )
    },
    "convert-src": ("convert_data", lambda w: _convert(w, CREDENTIAL_URL)),
    "convert-out": ("convert_data", lambda w: _convert(w, w.folder("src"), out=CREDENTIAL_URL)),
    "maskstats-data": ("gcc-maskstats", lambda w: _maskstats(w, data=CREDENTIAL_URL)),
    "maskstats-json": ("gcc-maskstats", lambda w: _maskstats(w, "--out", CREDENTIAL_URL, data=CREDENTIAL_URL)),
    "sample-ckpt": ("gcc-sample", lambda w: _sample(w, "--n", "1", ckpt=CREDENTIAL_URL, data_root=w.folder())),
    "sample-data-root": ("gcc-sample", lambda w: _sample(w, "--n", "1", data_root=CREDENTIAL_URL)),
    "sample-out-dir": (
        "gcc-sample",
        lambda w: _sample(w, "--n", "1", ckpt="x", data_root=w.folder(), out_dir=CREDENTIAL_URL),
    ),
    "inspect-file": ("gcc-inspect", lambda w: [CREDENTIAL_URL]),
    "plot-run-dir": ("gcc-plot", lambda w: [CREDENTIAL_URL]),
    "plot-out": ("gcc-plot", lambda w: [_plot_run(w), "--out", CREDENTIAL_URL]),
    "synth-out": ("gcc-synth", lambda w: ["--out", CREDENTIAL_URL, "--n", "1"]),
}


# where the URL enters, as the refusal names it (the test's key id ends in "KEY", so its whole user:password@bucket
# reads as a credential's name and value and is masked: gcc/redact.py)
ENTERS = {
    **{f"train-{key}": f"config error: {key}: " for key in ("data.path", "save_folder", "run_dir", "data.cache_dir")},
    **{
        f"train-model.{key}": f"config error: model.{key}: "
        for key in ("model_dir", "init_ckpt", "legacy_zero_ckpt", "vae_path")
    },
    "convert-src": "--data s3://***",
    "convert-out": "--out s3://***",
    "maskstats-data": "--data s3://***",
    "maskstats-json": "--out s3://***",
    "sample-ckpt": "--ckpt s3://***",
    "sample-out-dir": "--out s3://***",
    "inspect-file": "error: s3://***",
    "plot-out": "--out s3://***",
}
# the entries that refuse such a URL for another reason first (a flag that takes no object storage), or read it as
# the local path it also is
CREDENTIAL_SAID = {
    "sample-data-root": ["--data s3://***", "object-store shards are not read"],
    "synth-out": ["--out s3://***", "a local folder is needed"],
    "plot-run-dir": ["no train rows to plot (is *** a run folder?)"],
}


def test_every_credential_case_names_what_it_expects():
    assert sorted(CREDENTIAL_ENTRIES) == sorted({*ENTERS, *CREDENTIAL_SAID})


@pytest.mark.parametrize("case", sorted(CREDENTIAL_ENTRIES))
def test_a_url_with_credentials_is_refused_and_its_secret_never_printed(case, tmp_path, request, call, monkeypatch):
    """`s3://KEY:SECRET@bucket/p` anywhere a path enters: exit 2 before anything is read or written, one line, and
    neither the secret nor a traceback on the console (the trainer used to exit 1 with botocore's traceback
    echoing the bucket `KEY:SECRET@bucket`; gcc-maskstats printed it; gcc-plot wrote its PNG to the local path
    `s3:/KEY:SECRET@bucket/p` and printed that)."""
    monkeypatch.chdir(tmp_path)  # a tool that took the URL for a local path writes here, not in the checkout
    prog, make = CREDENTIAL_ENTRIES[case]
    r = call(prog, make(World(tmp_path, request)))
    said = CREDENTIAL_SAID.get(case) or [ENTERS[case], "a URL with credentials in it (user:password@) is refused"]
    check(r, 2, said, prog)
    assert SECRET not in r.stdout + r.stderr and "SeCrEt" not in r.stdout + r.stderr, r.stdout + r.stderr
    if prog == "gcc.train":
        assert "credentials" in r.stderr and not (tmp_path / "run").exists(), r.stderr


@pytest.mark.parametrize("prog", ["gcc.train", "gcc-maskstats"])
def test_aws_max_attempts_that_is_not_a_number_is_named(prog, tmp_path, request, monkeypatch, call):
    """AWS_MAX_ATTEMPTS=abc: exit 2 naming the variable and what it must be (the message blamed S3_ENDPOINT_URL)."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "abc")
    w = World(tmp_path, request)
    argv = w.train(data="s3://bucket/p") if prog == "gcc.train" else _maskstats(w, data="s3://bucket/p")
    line = check(call(prog, argv), 2, ["AWS_MAX_ATTEMPTS='abc'", "expected an integer in [1, 100]"], prog)
    assert "S3_ENDPOINT_URL" not in line, line


# ---- the real launcher: bad config stops every rank before any work, exit 2 ----------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("case", ["yaml-syntax", "override-bad-yaml", "run-dir-a-file"])
def test_the_launcher_answers_bad_config_with_exit_2(case, tmp_path, request):
    w = World(tmp_path, request)
    argv = (
        w.train(yaml=w.file("bad.yaml", "seed: [1\n"))
        if case == "yaml-syntax"
        else w.train("seed=[1")
        if case == "override-bad-yaml"
        else w.train(f"run_dir={w.file('afile')}")
    )
    argv = COMPOSER + argv
    fragments = {
        "yaml-syntax": ["bad.yaml", "not valid yaml"],
        "override-bad-yaml": ["seed=[1", "not valid yaml"],
        "run-dir-a-file": ["run_dir", "is a file, expected a folder"],
    }[case]
    check(run(argv), 2, fragments, "gcc.train", ranks=2)
    assert not (tmp_path / "run").exists()
