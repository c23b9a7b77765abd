"""A sweep of hostile input through gcc's real entry points, one process per case (docs/training.md, "Trust and
safety"): code in the working directory, hard and symbolic links in the run folder, inputs sized or declared to
take memory, big and foreign numbers, the launcher's environment, the `latest` checkpoint pointer, secrets in
every form, options checked late, a tracking server that does not answer; and their neighbours.

    .venv/bin/python bench/hostile_sweep.py [--out runs/hostile_sweep] [--only CLASS ...]

Each case is a command (a console script of this environment, `python gcc/train.py`, `gcc-launch`, or the run's
own output writer), what is expected of it (its exit code and a phrase of its one-line answer) and what it did.
Every case is checked for: a traceback in anything it printed or wrote to train.log; an escape (a module of a
hostile working directory imported, a file outside what it may write changed: the target of a planted link, its
inputs); a secret (the planted credential, or a piece of it, in anything it printed or wrote); and its peak
memory (the largest resident set of any of its processes, as the kernel counts it for the processes waited for).
The table (markdown) goes to stdout and `<out>/sweep.md` (the last one committed: bench/hostile_sweep.md); the exit
code is 0 when every case met its expectation with no traceback, no escape and no secret.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from hostile import hostile_folder, plant, ran_in, write_logs  # noqa: E402

from gcc.training.columns import TRAIN_COLUMNS  # noqa: E402

BIN = Path(sys.executable).parent
PY = sys.executable
TRAIN = str(ROOT / "gcc" / "train.py")
TINY = str(ROOT / "yamls" / "tiny_cpu.yaml")
SECRET = "SeCr3tQZ7vK9"  # planted wherever a credential can enter; no piece of it may come out
MiB = 1 << 20
# the trainer's settings for a few steps on the sweep's data (tests/_launch.py BASE, one process)
RUN = [
    "global_train_batch_size=2",
    "device_train_microbatch_size=1",
    "save_interval=2",
    "export_every=2",
    "eval_interval=2",
    "val_n=2",
    "val_batch=1",
    "sample_every=0",
    "progress_bar=false",
    "loggers={}",
    "data.num_workers=0",
    "scheduler.t_warmup=1",
]
# the process that runs a case: it waits for the command and reports the largest resident set of its processes
WRAP = """
import json, resource, subprocess, sys
r = subprocess.run(sys.argv[2:], stdin=subprocess.DEVNULL)
with open(sys.argv[1], "w") as f:
    json.dump({"code": r.returncode, "rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}, f)
"""


@dataclasses.dataclass
class Case:
    klass: str
    name: str
    argv: list[str]
    codes: tuple[int, ...]  # the exit codes expected
    says: str = ""  # a regular expression its output must match ("" none)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    cwd: Path | None = None
    watch: list[Path] = dataclasses.field(default_factory=list)  # outside what it may write: must not change
    hostile: Path | None = None  # a hostile working directory whose modules must not be imported
    absent: list[Path] = dataclasses.field(default_factory=list)  # what it must not create
    check: Callable[[str], str | None] | None = None  # another check of its output: a problem, or None
    timeout: float = 600
    tool: str = ""


@dataclasses.dataclass
class Result:
    case: Case
    code: int | None
    rss_mb: float
    seconds: float
    first: str
    problems: list[str]
    traceback: bool
    escape: bool
    secret: bool


def tool_of(argv: list[str]) -> str:
    if TRAIN in argv:
        return "gcc-launch" if Path(argv[0]).name == "gcc-launch" else "gcc/train.py"
    return Path(argv[0]).name if argv[0] != PY else Path(argv[1]).name if len(argv) > 1 else "python"


# ---- the world the cases break ---------------------------------------------------------------------------------
class World:
    def __init__(self, out: Path):
        self.out = out
        self.cases = out / "cases"
        self.prep = out / "world" / "prep"
        self.shards = out / "world" / "shards"
        self.base = out / "world" / "base"

    def build(self) -> None:
        """A prepared dataset, its shards and a trained run (checkpoints of steps 2 and 4, exports): made once."""
        if not (self.out / "world" / "done").exists():
            shutil.rmtree(self.out / "world", ignore_errors=True)
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            for argv in (
                [str(BIN / "gcc-synth"), "--out", str(self.prep), "--n", "12", "--seed", "3"],
                [str(BIN / "convert_data"), "--data", str(self.prep), "--out", str(self.shards), "--no_progress"],
                self.train(self.base, "max_duration=4"),
            ):
                subprocess.run(argv, check=True, env=env, capture_output=True)
            (self.out / "world" / "done").touch()
        shutil.rmtree(self.cases, ignore_errors=True)
        self.cases.mkdir(parents=True)

    def case(self, name: str) -> Path:
        d = self.cases / name
        d.mkdir(parents=True)
        return d

    def train(self, run: Path, *overrides: str, launcher: list[str] | None = None) -> list[str]:
        head = [PY] if launcher is None else launcher
        return [*head, TRAIN, TINY, f"run_dir={run}", f"data.path={self.shards}", *RUN, *overrides]

    def run_copy(self, name: str, dereference: bool = False) -> Path:
        """A copy of the trained run (as `cp -r`, or as `cp -rL` with `dereference`)."""
        dst = self.case(name) / "run"
        shutil.copytree(self.base, dst, symlinks=not dereference, ignore=shutil.ignore_patterns("cache", ".lock"))
        return dst


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def silent_server() -> int:
    """A port that accepts connections and never answers (a tracking server that hangs)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    held = []
    threading.Thread(target=lambda: [held.append(s.accept()) for _ in iter(int, 1)], daemon=True).start()
    return s.getsockname()[1]


def huge(n: int = 5000) -> str:
    return "9" * n


# ---- the cases, by class --------------------------------------------------------------------------------------
def cwd_cases(w: World) -> list[Case]:
    """Code run from the working directory: every entry point and its helpers started in a folder holding modules
    named gcc, convert_data, multiprocessing, torch, streaming and composer."""
    out = []
    for script in (
        "convert_data",
        "gcc-synth",
        "gcc-sample",
        "gcc-maskstats",
        "gcc-inspect",
        "gcc-plot",
        "gcc-compare",
    ):
        cwd = hostile_folder(w.case(f"cwd-{script}-help") / "cwd")
        out.append(Case("cwd", f"{script} --help", [str(BIN / script), "--help"], (0,), "usage", cwd=cwd, hostile=cwd))
    cwd = hostile_folder(w.case("cwd-launch-print") / "cwd")
    out.append(
        Case(
            "cwd",
            "gcc-launch --print_config",
            [str(BIN / "gcc-launch"), TRAIN, "--print_config"],
            (0,),
            "seed",
            cwd=cwd,
            hostile=cwd,
        )
    )
    cwd = hostile_folder(w.case("cwd-convert") / "cwd", package=False)
    argv = [str(BIN / "convert_data"), "--data", str(w.prep), "--out", str(cwd.parent / "out"), "--workers", "2"]
    out.append(
        Case(
            "cwd",
            "convert_data --workers 2 (forkserver, pool)",
            [*argv, "--chunk_clips", "2"],
            (0,),
            "done in",
            cwd=cwd,
            hostile=cwd,
            watch=[w.prep],
        )
    )
    cwd = hostile_folder(w.case("cwd-maskstats") / "cwd")
    out.append(
        Case(
            "cwd",
            "gcc-maskstats (Streaming's resource tracker)",
            [str(BIN / "gcc-maskstats"), "--data", str(w.shards), "--n", "2"],
            (0,),
            "frame0",
            cwd=cwd,
            hostile=cwd,
            watch=[w.shards],
        )
    )
    d = w.case("cwd-launch")
    cwd = hostile_folder(d / "cwd")
    argv = w.train(d / "run", "max_duration=2", "data.num_workers=1", launcher=[str(BIN / "gcc-launch"), "-n", "2"])
    out.append(
        Case(
            "cwd",
            "gcc-launch -n 2, a loader worker a rank (writers, forkservers, trackers)",
            argv,
            (0,),
            "done: step 2",
            cwd=cwd,
            hostile=cwd,
            watch=[w.shards],
        )
    )
    d = w.case("cwd-composer")
    cwd = hostile_folder(d / "cwd", package=False)
    argv = w.train(d / "run", "max_duration=2", "data.num_workers=1", launcher=[str(BIN / "composer"), "-n", "1"])
    out.append(
        Case(
            "cwd",
            "composer -n 1 gcc/train.py (gcc's helpers under Composer's launcher)",
            argv,
            (0,),
            "done: step 2",
            cwd=cwd,
            hostile=cwd,
        )
    )
    return out


def link_cases(w: World) -> list[Case]:
    """Hard links (and their neighbours: symbolic links, FIFOs, another user's file) planted in a run folder where
    gcc writes in place: the launch refuses naming the file, the file elsewhere is unchanged."""
    out = []
    said = {"hard link": "2 names", "symbolic link": "symbolic link", "fifo": "not a regular file"}
    said["another user's"] = "another user"
    for name, kind in [
        ("train.log", "hard link"),
        (".lock", "hard link"),
        ("train_log.csv", "hard link"),
        ("val_log.csv", "hard link"),
        ("stacks/rank0.txt", "hard link"),
        ("train.log", "symbolic link"),
        ("train_log.csv", "symbolic link"),
        ("train.log", "fifo"),
        ("train.log", "another user's"),
        (".lock", "another user's"),
    ]:
        run = w.run_copy(f"link-{name.replace('/', '-')}-{kind.replace(' ', '-')}")
        victim = run.parent / "victim.csv"
        victim.write_text(",".join(TRAIN_COLUMNS) + "\n")
        plant(run / name, kind, victim)
        out.append(
            Case(
                "hard links",
                f"{name} a {kind} (resume)",
                w.train(run, "max_duration=6"),
                (3,),
                re.escape(said[kind]),
                watch=[victim],
            )
        )
    run = w.run_copy("link-launch-train-log")
    victim = run.parent / "victim.log"
    victim.write_text("someone's log\n")
    (run / "train.log").unlink(missing_ok=True)
    os.link(victim, run / "train.log")
    argv = w.train(run, "max_duration=6", launcher=[str(BIN / "gcc-launch"), "-n", "2"])
    out.append(
        Case(
            "hard links",
            "gcc-launch: train.log a hard link",
            argv,
            (3,),
            "gcc.train: refused: .*2 names",
            watch=[victim],
        )
    )
    return out


def memory_cases(w: World) -> list[Case]:
    """Memory that grows with a size declared, or with the rows a file holds: each reader near its cap's use."""
    out = []
    d = w.case("mem-plot")
    size = write_logs(d / "run", 100_000)
    out.append(
        Case(
            "memory", f"gcc-plot on {size / MiB:.0f} MB of logs", [str(BIN / "gcc-plot"), str(d / "run")], (0,), "wrote"
        )
    )
    d = w.case("mem-compare")
    size = write_logs(d / "a", 100_000)
    shutil.copytree(d / "a", d / "b")
    out.append(
        Case(
            "memory",
            f"gcc-compare on 2 x {size / MiB:.0f} MB of logs",
            [str(BIN / "gcc-compare"), str(d / "a"), str(d / "b")],
            (0,),
            "they agree",
            watch=[d / "a", d / "b"],
        )
    )
    d = w.case("mem-csv-line")
    (d / "run").mkdir()
    (d / "run" / "train_log.csv").write_text("step,loss\n1," + "7" * (3 * MiB) + "\n")
    out.append(
        Case(
            "memory",
            "gcc-plot: a CSV cell of 3 MB",
            [str(BIN / "gcc-plot"), str(d / "run")],
            (2,),
            "not a CSV log|field larger",
        )
    )
    for name, lines in [
        ("empty objects", ["{}\n"] * 6_000_000),
        ("one 2 MB line", ['{"clip_id": "' + "a" * (2 * MiB) + '"}\n']),
    ]:
        d = w.case(f"mem-index-{name.replace(' ', '-')}")
        src = d / "prep"
        shutil.copytree(w.prep, src)
        with open(src / "index" / "clips.jsonl", "w") as f:
            f.writelines(lines)
        mb = (src / "index" / "clips.jsonl").stat().st_size / MiB
        says = "not read further" if name == "empty objects" else "a line longer than"
        out.append(
            Case(
                "memory",
                f"convert_data: clips.jsonl of {mb:.0f} MB, {name}",
                [str(BIN / "convert_data"), "--data", str(src), "--out", str(d / "out")],
                (2,),
                says,
            )
        )
    d = w.case("mem-index-rows")
    src = d / "prep"
    shutil.copytree(w.prep, src)
    row = json.loads((w.prep / "index" / "clips.jsonl").read_text().splitlines()[0])
    rng = random.Random(1)
    with open(src / "index" / "clips.jsonl", "w") as f:
        for i in range(120_000):
            keys = [f"k{rng.getrandbits(40):x}" for _ in row["context_keys"]]
            f.write(json.dumps({**row, "clip_id": f"c{i:07d}", "run": f"r{i % 700}", "context_keys": keys}) + "\n")
    mb = (src / "index" / "clips.jsonl").stat().st_size / MiB
    out.append(
        Case(
            "memory",
            f"convert_data: clips.jsonl of {mb:.0f} MB of rows that pass",
            [str(BIN / "convert_data"), "--data", str(src), "--out", str(d / "out")],
            (2,),
            "c0000000",
        )
    )
    d = w.case("mem-pth")
    pth = pth_bomb(d, 1 << 30)
    load = LOAD_VAE
    out.append(
        Case(
            "memory",
            "the VAE reader: a 1 MB .pth declaring 1 GB",
            [PY, "-c", load, str(pth)],
            (1,),
            "compressed",
            tool="load_vae",
        )
    )
    d = w.case("mem-safetensors")
    st = d / "x.safetensors"
    head = json.dumps({"w": {"dtype": "F32", "shape": [1 << 20, 1 << 20], "data_offsets": [0, 4 << 40]}}).encode()
    st.write_bytes(len(head).to_bytes(8, "little") + head + b"\0" * 64)
    out.append(
        Case(
            "memory",
            "gcc-inspect: a safetensors tensor declaring 4 TB",
            [str(BIN / "gcc-inspect"), str(st)],
            (2,),
            "do not hold them",
        )
    )
    return out


# the VAE's reader (gcc-sample's and a run's), answering as a tool does
LOAD_VAE = """
import sys
from gcc.sampling.vae import VaeError, load_vae
try:
    load_vae(sys.argv[1])
except VaeError as e:
    sys.exit(f"load_vae: error: {e}")
"""


def pth_bomb(d: Path, declared: int) -> Path:
    import torch

    torch.save({"w": torch.zeros(4)}, d / "small.pth")
    with zipfile.ZipFile(d / "small.pth") as z, zipfile.ZipFile(d / "bomb.pth", "w") as bomb:
        for info in z.infolist():
            if info.filename.endswith("/data/0"):
                deflated = zipfile.ZipInfo(info.filename)
                deflated.compress_type = zipfile.ZIP_DEFLATED
                with bomb.open(deflated, "w") as f:  # deflated as it is written
                    chunk = bytes(16 * MiB)
                    for _ in range(declared // len(chunk)):
                        f.write(chunk)
            else:
                bomb.writestr(info, z.read(info))
    return d / "bomb.pth"


def number_cases(w: World) -> list[Case]:
    """Big and foreign numbers: JSON integers past 4300 digits, yaml's too, digits of other scripts in flags,
    cells, names and the environment."""
    out = []

    def json_file(name: str, src: Path, edit) -> Path:
        d = w.case(f"num-{name}")
        dst = d / src.name
        shutil.copytree(src, dst) if src.is_dir() else shutil.copyfile(src, dst)
        edit(dst)
        return dst

    def put_huge(path: Path, key: str) -> None:
        text = path.read_text()
        doc = json.loads(text)
        doc[key] = 0
        path.write_text(json.dumps(doc).replace(f'"{key}": 0', f'"{key}": {huge()}'))

    shards = json_file("manifest", w.shards, lambda p: put_huge(p / "manifest.json", "gcc_big"))
    out.append(
        Case(
            "numbers",
            "gcc-maskstats: manifest.json with a 5000-digit integer",
            [str(BIN / "gcc-maskstats"), "--data", str(shards), "--n", "1"],
            (2,),
            "5000 digits",
        )
    )
    out.append(
        Case(
            "numbers",
            "the trainer: manifest.json with a 5000-digit integer",
            w.train(shards.parent / "run", f"data.path={shards}", "max_duration=2"),
            (3,),
            "5000 digits",
        )
    )
    split = json_file("index", w.shards, lambda p: put_huge(p / "train" / "index.json", "gcc_big"))
    out.append(
        Case(
            "numbers",
            "gcc-maskstats: a split's index.json with a 5000-digit integer",
            [str(BIN / "gcc-maskstats"), "--data", str(split), "--n", "1"],
            (2, 6),
            "5000 digits",
        )
    )
    export = sorted(w.base.glob("step-*.safetensors"))[0]

    def big_meta(p: Path) -> None:
        raw = p.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        head = raw[8 : 8 + n].decode().replace('"__metadata__":{', f'"__metadata__":{{"big":{huge()},', 1)
        head = head.replace('"__metadata__": {', f'"__metadata__": {{"big": {huge()}, ', 1)
        data = head.encode()
        p.write_bytes(len(data).to_bytes(8, "little") + data + raw[8 + n :])

    big = json_file("export", export, big_meta)
    out.append(
        Case(
            "numbers",
            "gcc-inspect: an export header with a 5000-digit integer",
            [str(BIN / "gcc-inspect"), str(big)],
            (2,),
            "5000 digits",
        )
    )
    out.append(
        Case(
            "numbers",
            "gcc-sample: --ckpt of that export",
            [
                str(BIN / "gcc-sample"),
                "--ckpt",
                str(big),
                "--model",
                "tiny",
                "--data",
                str(w.prep),
                "--n",
                "1",
                "--out",
                str(big.parent / "s"),
            ],
            (2,),
            "5000 digits",
        )
    )
    run = w.run_copy("num-run-json")
    put_huge(run / "run.json", "big")
    out.append(
        Case(
            "numbers",
            "the trainer: run.json with a 5000-digit integer",
            w.train(run, "max_duration=6"),
            (3,),
            "5000 digits",
        )
    )
    out.append(
        Case("numbers", "gcc-inspect RUN_DIR: that run.json", [str(BIN / "gcc-inspect"), str(run)], (2,), "5000 digits")
    )
    src = json_file("clips", w.prep, lambda p: (p / "index" / "clips.jsonl").write_text(f'{{"clip_id": {huge()}}}\n'))
    out.append(
        Case(
            "numbers",
            "convert_data: clips.jsonl with a 5000-digit integer",
            [str(BIN / "convert_data"), "--data", str(src), "--out", str(src.parent / "out")],
            (2,),
            "5000 digits",
        )
    )
    d = w.case("num-yaml")
    (d / "c.yaml").write_text(Path(TINY).read_text() + f"\nseed: {huge()}\n")
    out.append(
        Case(
            "numbers",
            "the trainer: a yaml integer of 5000 digits",
            [PY, TRAIN, str(d / "c.yaml"), f"run_dir={d / 'run'}"],
            (2,),
            "5000 digits",
            absent=[d / "run"],
        )
    )
    for value, says in [(huge(), "5000 digits"), ("²", "seed"), ("٣", "seed")]:
        out.append(
            Case(
                "numbers",
                f"the trainer: seed={value[:8]}",
                w.train(w.case(f"num-seed-{len(out)}") / "run", f"seed={value}"),
                (2,),
                says,
            )
        )
    out.append(
        Case(
            "numbers",
            "the trainer: max_duration=٣ba",
            w.train(w.case("num-duration") / "run", "max_duration=٣ba"),
            (2,),
            "max_duration",
        )
    )
    for tool, argv, flag in [
        ("gcc-maskstats", ["--data", str(w.shards)], "--n"),
        ("gcc-synth", ["--out", "x"], "--n"),
        ("gcc-compare", [str(w.base), str(w.base)], "--from"),
        ("convert_data", ["--data", str(w.prep), "--out", "x"], "--workers"),
        ("gcc-sample", ["--base", "--data", str(w.prep), "--out", "x"], "--n"),
    ]:
        for value in ("٣", "²", huge()):
            out.append(
                Case(
                    "numbers",
                    f"{tool} {flag} {value[:8]}",
                    [str(BIN / tool), *argv, flag, value],
                    (2,),
                    "invalid int value",
                    cwd=w.case(f"num-flag-{len(out)}"),
                )
            )
    for cell in ("٣", "²", huge(), "inf"):
        d = w.case(f"num-cell-{len(out)}")
        for side in ("a", "b"):
            (d / side).mkdir()
            (d / side / "train_log.csv").write_text(
                ",".join(TRAIN_COLUMNS) + "\n" + ",".join([cell, *["1"] * (len(TRAIN_COLUMNS) - 1)]) + "\n"
            )
        out.append(
            Case(
                "numbers",
                f"gcc-compare: a step cell {cell[:8]}",
                [str(BIN / "gcc-compare"), str(d / "a"), str(d / "b")],
                (2,),
                "step",
            )
        )
    d = w.case("num-names")
    for side in ("a", "b"):
        shutil.copytree(w.base, d / side, ignore=shutil.ignore_patterns("checkpoints", "cache", ".lock"))
        for n in ("²", "٣", "9" * 30):
            (d / side / f"step-{n}.safetensors").write_bytes(b"not an export")
    out.append(
        Case(
            "numbers",
            "gcc-compare: exports named step-².safetensors, step-٣..., step-<30 digits>",
            [str(BIN / "gcc-compare"), str(d / "a"), str(d / "b")],
            (0,),
            "they agree",
        )
    )
    run = w.run_copy("num-samples-names")
    for n in ("²", "٣"):
        (run / "samples" / f"step-{n}").mkdir(parents=True)
    argv = w.train(run, "max_duration=6", "sample_every=1", "sample_n=1", "sample_steps=2", "keep_samples=1")
    out.append(
        Case(
            "numbers",
            "a resume sampling and rotating samples/, which holds step-² and step-٣",
            argv,
            (0,),
            "done: step 6",
        )
    )
    for name in ("ep٣-ba٣-rank0.pt", "ep0-ba" + "9" * 40 + "-rank0.pt"):
        run = w.run_copy(f"num-ckpt-name-{len(out)}")
        (run / "checkpoints" / name).write_bytes(b"")
        out.append(
            Case(
                "numbers",
                f"a resume: checkpoints/{name[:16]} (Composer reads it as a step)",
                w.train(run, "max_duration=6"),
                (3,),
                "not in ASCII digits",
            )
        )
    env = {**os.environ, "AWS_MAX_ATTEMPTS": "²", "S3_ENDPOINT_URL": f"http://127.0.0.1:{closed_port()}"}
    out.append(
        Case(
            "numbers",
            "convert_data --out s3://: AWS_MAX_ATTEMPTS=²",
            [str(BIN / "convert_data"), "--data", str(w.prep), "--out", "s3://bucket/x"],
            (2,),
            "AWS_MAX_ATTEMPTS",
            env=env,
        )
    )
    env = {**os.environ, "AWS_MAX_ATTEMPTS": huge(50), "S3_ENDPOINT_URL": f"http://127.0.0.1:{closed_port()}"}
    out.append(
        Case(
            "numbers",
            "the trainer, data.path s3://: AWS_MAX_ATTEMPTS of 50 digits",
            w.train(w.case("num-aws") / "run", "data.path=s3://bucket/x"),
            (2,),
            "AWS_MAX_ATTEMPTS",
            env=env,
        )
    )
    return out


def env_cases(w: World) -> list[Case]:
    """The launcher's environment: a rank's (gcc/train.py) and gcc-launch's, and gcc-launch's -n."""
    out = []
    for env in [
        {"RANK": "x"},
        {"RANK": "²"},
        {"WORLD_SIZE": "0"},
        {"WORLD_SIZE": "٣"},
        {"WORLD_SIZE": "2", "RANK": "2"},
        {"LOCAL_WORLD_SIZE": "0"},
        {"LOCAL_RANK": "5"},
        {"NODE_RANK": "-1"},
        {"MASTER_PORT": "99999"},
        {"WORLD_SIZE": huge()},
    ]:
        d = w.case(f"env-{len(out)}")
        said = ",".join(f"{k}={v[:6]}" for k, v in env.items())
        var = next(k for k in env if k != "WORLD_SIZE" or len(env) == 1)
        out.append(
            Case(
                "launcher env",
                f"gcc/train.py with {said}",
                w.train(d / "run"),
                (2,),
                f"environment: {var}=",
                env={**os.environ, **env},
                absent=[d / "run"],
            )
        )
    for flags, env, says in [
        (["-n", "0"], {}, "nproc must be 1 or greater"),
        (["-n", "²"], {}, "invalid int value"),
        (["-n", "99999"], {}, "at most 1024"),
        (["--nproc", "abc"], {}, "invalid int value"),
        ([], {"LOCAL_WORLD_SIZE": "x"}, "LOCAL_WORLD_SIZE="),
        ([], {"WORLD_SIZE": "0"}, "WORLD_SIZE="),
        ([], {"MASTER_PORT": "٣"}, "MASTER_PORT="),
        ([], {"NODE_RANK": "²"}, "NODE_RANK="),
    ]:
        d = w.case(f"env-{len(out)}")
        said = " ".join(flags) or ",".join(f"{k}={v}" for k, v in env.items())
        argv = w.train(d / "run", launcher=[str(BIN / "gcc-launch"), *flags])
        out.append(
            Case(
                "launcher env",
                f"gcc-launch {said}",
                argv,
                (2,),
                f"gcc-launch: error: .*{says}",
                env={**os.environ, **env},
                absent=[d / "run"],
            )
        )
    return out


def latest_cases(w: World) -> list[Case]:
    """The `latest` pointer of a run folder (the trained run: checkpoints of steps 2 and 4): a hint; a resume finds
    the newest complete checkpoint itself, and an entry named like a checkpoint that is not one is refused."""
    out = []
    ckpt = "ep0-ba4-rank0.pt"

    def resume(name: str, plant, codes=(0,), says=r"resuming from \S*ep0-ba4-rank0\.pt", dereference=False) -> None:
        run = w.run_copy(f"latest-{len(out)}", dereference)
        link = run / "checkpoints" / "latest-rank0.pt"
        plant(run, link)
        out.append(Case("latest", name, w.train(run, "max_duration=6"), codes, says))

    resume("a cp -rL copy: latest a regular file", lambda run, link: None, dereference=True)
    resume("latest missing", lambda run, link: link.unlink())
    resume("latest -> itself (a loop)", lambda run, link: (link.unlink(), link.symlink_to(link.name)))
    resume("latest -> ../../etc/passwd", lambda run, link: (link.unlink(), link.symlink_to("../../etc/passwd")))
    resume("latest -> a name that is no checkpoint's", lambda run, link: (link.unlink(), link.symlink_to("model.pt")))
    resume("latest -> a partial checkpoint (newest cut short)", lambda run, link: cut_and_point(run, link))
    resume("latest dangling", lambda run, link: (link.unlink(), link.symlink_to("ep0-ba99-rank0.pt")))
    resume(
        "latest a FIFO",
        lambda run, link: (link.unlink(), os.mkfifo(link)),
        (3,),
        "named like a checkpoint but not a link",
    )
    resume(
        "a folder named ep0-ba6-rank0.pt",
        lambda run, link: (run / "checkpoints" / "ep0-ba6-rank0.pt").mkdir(),
        (3,),
        "named like a checkpoint but not a file",
    )
    resume(
        "a file named ep0-ba6 (an FSDP name)",
        lambda run, link: (run / "checkpoints" / "ep0-ba6").write_bytes(b"x"),
        (3,),
        "named like a checkpoint but not a folder",
    )
    resume(
        "a checkpoint name that is a symbolic link",
        lambda run, link: (run / "checkpoints" / "ep0-ba6-rank0.pt").symlink_to(ckpt),
        (3,),
        "named like a checkpoint but a symbolic link",
    )
    return out


def cut_and_point(run: Path, link: Path) -> None:
    part = run / "checkpoints" / "ep0-ba6-rank0.pt"
    part.write_bytes((run / "checkpoints" / "ep0-ba4-rank0.pt").read_bytes()[:100])
    link.unlink()
    link.symlink_to(part.name)


def masked_log(path: Path) -> Callable[[str], str | None]:
    """A check that `path` (a train.log) was written and holds a masked credential."""
    return lambda text: None if path.is_file() and "***" in path.read_text() else f"no masked line in {path.name}"


WRITER = """
import os, sys
from gcc.training.console import configure_logging, open_run_log
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the console passes a rank's bytes on as they are: train.log is the case
from gcc.training.ending import leave_now
configure_logging("INFO", 0)
open_run_log(sys.argv[1], 0, 1, capture_output=True)
text = open(sys.argv[2]).read()
for i in range(0, len(text), int(sys.argv[3])):  # written in pieces, as a program that prints as it goes
    sys.stdout.write(text[i : i + int(sys.argv[3])])
    sys.stdout.flush()
print()
leave_now(0)
"""


def secret_cases(w: World) -> list[Case]:
    """Secrets: in every form, across train.log's 64 KiB cut (the rank's real output writer), in every tool's
    argument errors (with control characters), in a URL's user info, in an endpoint."""
    out = []
    forms = [
        f"AWS_SECRET_ACCESS_KEY = {SECRET}",
        f"api_key: {SECRET}",
        f"--token {SECRET}",
        f'"password": "{SECRET}"',
        f"https://alice:{SECRET}@mlflow.example/api",
        f"Authorization: Bearer {SECRET}",
    ]
    for i, form in enumerate(forms):
        d = w.case(f"secret-cut-{i}")
        (d / "line.txt").write_text("x" * (65536 - 5 - 3 * i) + " " + form + " " + "y" * 70_000)
        check = masked_log(d / "run" / "train.log")
        out.append(
            Case(
                "secrets",
                f"train.log's writer: '{form.replace(SECRET, 'S')}' across the 64 KiB cut",
                [PY, "-c", WRITER, str(d / "run"), str(d / "line.txt"), "4096"],
                (0,),
                cwd=ROOT,
                check=check,
                tool="output writer",
            )
        )
    for tool, argv in [
        ("gcc-plot", ["x"]),
        ("gcc-compare", ["a", "b"]),
        ("gcc-inspect", ["x"]),
        ("gcc-synth", ["--out", "x"]),
        ("convert_data", ["--data", "x", "--out", "y"]),
        ("gcc-maskstats", ["--data", "x"]),
        ("gcc-sample", ["--base", "--data", "x", "--out", "y", "--n", "1"]),
    ]:
        out.append(
            Case(
                "secrets",
                f"{tool} --api_key=S --token S \\x1b[2J",
                [str(BIN / tool), *argv, f"--api_key={SECRET}", "--token", SECRET, "\x1b[2J"],
                (2,),
                r"unrecognized arguments: --api_key=\*\*\* --token \*\*\* \\x1b",
                cwd=w.case(f"secret-args-{tool}"),
            )
        )
    d = w.case("secret-train-args")
    out.append(
        Case(
            "secrets",
            "gcc/train.py yaml --password S",
            [PY, TRAIN, TINY, "--password", SECRET, f"run_dir={d / 'run'}"],
            (2,),
            r"--password \*\*\*",
            absent=[d / "run"],
        )
    )
    out.append(
        Case(
            "secrets",
            "gcc-launch --api-key S",
            [str(BIN / "gcc-launch"), f"--api-key={SECRET}", TRAIN],
            (2,),
            r"--api-key=\*\*\*",
        )
    )
    d = w.case("secret-s3")
    out.append(
        Case(
            "secrets",
            "the trainer: data.path=s3://KEY:S@bucket",
            w.train(d / "run", f"data.path=s3://AKIDX:{SECRET}@bucket/p"),
            (2,),
            "credentials",
            absent=[d / "run"],
        )
    )
    env = {**os.environ, "S3_ENDPOINT_URL": f"http://AKIDX:{SECRET}@127.0.0.1:{closed_port()}", "AWS_MAX_ATTEMPTS": "1"}
    out.append(
        Case(
            "secrets",
            "convert_data --out s3://, S3_ENDPOINT_URL with user:S@",
            [str(BIN / "convert_data"), "--data", str(w.prep), "--out", "s3://bucket/x"],
            (2, 7),
            "",
            env=env,
        )
    )
    d = w.case("secret-override")
    out.append(
        Case(
            "secrets",
            "the trainer: an unknown key auth_token=S",
            w.train(d / "run", f"loggers.wandb.init_kwargs.api_key={SECRET}", "nope.auth_token=x"),
            (2,),
            "nope",
            absent=[d / "run"],
        )
    )
    return out


def late_cases(w: World) -> list[Case]:
    """Checked first, not late: a logger's or a callback's number, gcc-launch's config, before anything is created."""
    out = []
    for override, says in [
        ("loggers={tensorboard: {flush_interval: 0}}", "flush_interval: must be >= 1"),
        ("loggers={mlflow: {logging_buffer_seconds: -1}}", "logging_buffer_seconds: must be >= 0"),
        ("loggers={mlflow: {log_duplicated_metric_every_n_steps: -5}}", "log_duplicated_metric_every_n_steps"),
        ("callbacks={speed_monitor: {window_size: 0}}", "window_size: must be >= 1"),
    ]:
        d = w.case(f"late-{len(out)}")
        out.append(
            Case(
                "checked first",
                f"gcc/train.py {override}",
                w.train(d / "run", override),
                (2,),
                says,
                absent=[d / "run"],
            )
        )
        d = w.case(f"late-{len(out)}")
        argv = w.train(d / "run", override, launcher=[str(BIN / "gcc-launch"), "-n", "2"])
        out.append(
            Case(
                "checked first",
                f"gcc-launch -n 2 {override}",
                argv,
                (2,),
                f"gcc.train: config error: .*{says}",
                absent=[d / "run"],
            )
        )
    d = w.case("late-runfile")
    (d / "run").write_text("a file")
    out.append(
        Case(
            "checked first",
            "gcc-launch: run_dir a file",
            w.train(d / "run", launcher=[str(BIN / "gcc-launch"), "-n", "2"]),
            (2,),
            "run_dir",
            watch=[d / "run"],
        )
    )
    return out


def server_cases(w: World) -> list[Case]:
    """An MLflow server that does not answer: refused, or silent (accepts and never answers)."""
    out = []
    for name, port in [("refuses", closed_port()), ("accepts and never answers", silent_server())]:
        d = w.case(f"mlflow-{len(out)}")
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP")}
        argv = w.train(d / "run", "max_duration=2", f"loggers={{mlflow: {{tracking_uri: 'http://127.0.0.1:{port}'}}}}")
        out.append(
            Case(
                "mlflow", f"a tracking server that {name}", argv, (7,), "a server did not answer", env=env, timeout=240
            )
        )
    return out


CLASSES = {
    "cwd": cwd_cases,
    "hard links": link_cases,
    "memory": memory_cases,
    "numbers": number_cases,
    "launcher env": env_cases,
    "latest": latest_cases,
    "secrets": secret_cases,
    "checked first": late_cases,
    "mlflow": server_cases,
}


# ---- running and checking a case ------------------------------------------------------------------------------
def tree_state(root: Path) -> dict[str, tuple]:
    """{path: (size, mtime, inode) or a link's target} of everything under `root`."""
    out: dict[str, tuple] = {}
    if root.is_file() or root.is_symlink():
        st = os.lstat(root)
        return {str(root): (st.st_size, st.st_mtime_ns, st.st_ino, os.readlink(root) if root.is_symlink() else "")}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[p] = (st.st_size, st.st_mtime_ns, st.st_ino, os.readlink(p) if os.path.islink(p) else "")
    return out


def digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for root in paths:
        for p, state in sorted(tree_state(root).items()):
            h.update(f"{p}{state}".encode())
            if os.path.isfile(p) and not os.path.islink(p) and state[0] < 256 * MiB:
                with open(p, "rb") as f:
                    h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def pieces_of(secret: str, text: str) -> bool:
    return any(secret[i : i + 6] in text for i in range(len(secret) - 5))


def run_case(case: Case, scratch: Path) -> Result:
    case_dir = scratch.parent
    before = tree_state(case_dir) if case_dir.is_dir() else {}
    watched = digest(case.watch)
    result_file = scratch / "result.json"
    env = {**(case.env or os.environ), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    try:
        r = subprocess.run(
            [PY, "-P", "-c", WRAP, str(result_file), *case.argv],
            cwd=case.cwd or case_dir,
            env=env,
            capture_output=True,
            timeout=case.timeout,
        )
        text = (r.stdout + r.stderr).decode("utf-8", "backslashreplace")
        got = json.loads(result_file.read_text())
        code, rss = got["code"], got["rss_kb"] / 1024
    except subprocess.TimeoutExpired as e:
        text = ((e.stdout or b"") + (e.stderr or b"")).decode("utf-8", "backslashreplace")
        code, rss = None, 0.0
    seconds = time.monotonic() - t0
    after = tree_state(case_dir)
    written = [p for p, s in after.items() if before.get(p) != s and os.path.isfile(p) and not os.path.islink(p)]
    written_text = ""
    for p in written:
        if os.path.getsize(p) < 64 * MiB and not p.endswith((".pt", ".safetensors", ".png", ".mp4", ".mds", ".zstd")):
            written_text += Path(p).read_text(errors="backslashreplace")
    problems = []
    if code not in case.codes:
        problems.append(f"exit {code}, expected {'/'.join(map(str, case.codes))}")
    if case.says and not re.search(case.says, text):
        problems.append(f"no /{case.says}/ in its output")
    if case.check is not None and (why := case.check(text)):
        problems.append(why)
    for p in case.absent:
        if p.exists():
            problems.append(f"{p.name} created")
    traceback = "Traceback (most recent call last)" in text + written_text
    escape = bool(case.hostile and ran_in(case.hostile)) or digest(case.watch) != watched
    secret = pieces_of(SECRET, text) or pieces_of(SECRET, written_text)
    lines = [
        ln
        for ln in text.splitlines()
        if re.match(
            r"^\S+: (rank \d+: )?(error|config error|refused|damaged data|storage|disk|a server|wrote|they)", ln
        )
    ]
    first = (lines[0] if lines else (text.strip().splitlines() or [""])[-1])[:160]
    return Result(case, code, rss, seconds, first, problems, traceback, escape, secret)


def cell(text: str, width: int = 90) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= width else text[: width - 1] + "…"


def command(case: Case) -> str:
    argv = [a.replace(str(ROOT) + "/", "") for a in case.argv]
    argv = [re.sub(r"\S*/cases/[^/ ]+/", "", a) for a in argv]
    argv = [a if len(a) < 40 else a[:18] + "…" + a[-12:] for a in argv]
    env = [f"{k}={v[:10]}" for k, v in case.env.items() if os.environ.get(k) != v]
    return " ".join([*env, Path(argv[0]).name if argv[0] == PY else argv[0].rsplit("/", 1)[-1], *argv[1:]])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "hostile_sweep")
    ap.add_argument("--only", action="append", choices=list(CLASSES), help="only these classes (repeatable)")
    args = ap.parse_args()
    w = World(args.out.resolve())
    print(f"building the sweep's data and a trained run in {w.out / 'world'} ...", file=sys.stderr, flush=True)
    w.build()
    cases = [c for k, build in CLASSES.items() if not args.only or k in args.only for c in build(w)]
    results = []
    for i, case in enumerate(cases, 1):
        case.tool = case.tool or tool_of(case.argv)
        scratch = w.cases / f"run-{i:03d}"
        scratch.mkdir()
        case.watch.append(w.out / "world")  # the sweep's own data and trained run: no case may change them
        r = run_case(case, scratch)
        results.append(r)
        flag = "ok" if not (r.problems or r.traceback or r.escape or r.secret) else "FAIL"
        print(
            f"[{i}/{len(cases)}] {flag} {case.klass}: {case.name} -> {r.code} ({r.seconds:.0f} s, {r.rss_mb:.0f} MB) {'; '.join(r.problems)}",
            file=sys.stderr,
            flush=True,
        )
    report = table(results).replace(str(w.out), "<out>")
    (w.out / "sweep.md").write_text(report)
    print(report)
    bad = [r for r in results if r.problems or r.traceback or r.escape or r.secret]
    return 0 if not bad else 1


def table(results: list[Result]) -> str:
    lines = [
        "| # | class | case | command | expected | actual | peak RSS MB | tb | esc | sec |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(results, 1):
        c = r.case
        expected = f"exit {'/'.join(map(str, c.codes))}" + (f", /{c.says}/" if c.says else "")
        actual = f"exit {r.code}: {r.first}" + (f" **{'; '.join(r.problems)}**" if r.problems else "")
        marks = ["X" if x else "0" for x in (r.traceback, r.escape, r.secret)]
        lines.append(
            f"| {i} | {c.klass} | {cell(c.name, 60)} | `{cell(command(c), 70)}` | {cell(expected, 60)} | "
            f"{cell(actual, 110)} | {r.rss_mb:.0f} | {' | '.join(marks)} |"
        )
    met = sum(not r.problems for r in results)
    lines += [
        "",
        f"{len(results)} cases: {met} as expected, {len(results) - met} not; "
        f"{sum(r.traceback for r in results)} tracebacks, {sum(r.escape for r in results)} escapes, "
        f"{sum(r.secret for r in results)} secrets.",
        "",
        "| class | cases | as expected |",
        "|---|---|---|",
    ]
    for klass in dict.fromkeys(r.case.klass for r in results):
        rs = [r for r in results if r.case.klass == klass]
        lines.append(f"| {klass} | {len(rs)} | {sum(not r.problems for r in rs)} |")
    lines += ["", "| tool | cases | peak RSS MB (largest case) |", "|---|---|---|"]
    for tool in sorted({r.case.tool for r in results}):
        rs = [r for r in results if r.case.tool == tool]
        top = max(rs, key=lambda r: r.rss_mb)
        lines.append(f"| {tool} | {len(rs)} | {top.rss_mb:.0f} ({cell(top.case.name, 60)}) |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
