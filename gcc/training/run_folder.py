"""The run folder: one live run at a time, one run identity per folder, and checkpoints that are never half-read.

    <run_dir>/.lock                 flock held by global rank 0 while the run lives (freed by the OS on any death)
    <run_dir>/run.json              the run signature (docs/design.md §9.3) and lineage (init_ckpt), written at first
                                    start; each launch is appended to the lineage (`with_launch`: which code), and so
                                    is a changed global batch (batch_change.py)
    <run_dir>/checkpoints/          Composer checkpoints + latest-rank0.pt symlink to the newest:
                                    DDP: one file ep{E}-ba{B}-rank0.pt; FSDP: a folder ep{E}-ba{B}/ of torch DCP
                                    shards (__<rank>_0.distcp, one per rank) and its .metadata
    <run_dir>/step-N.safetensors    exports (docs/design.md §9.9)

Composer writes a checkpoint in place and then replaces the `latest` symlink (remove + create). A SIGKILL can
therefore leave a truncated file or a partial folder newer than `latest`, or no `latest` at all. A periodic
checkpoint written in the background (gcc/training/async_checkpoint.py) goes to a temporary name first
(`<name>.tmp<pid>`, renamed once complete; a DCP folder gets its `.metadata` last), and `latest` names it only
once the write is complete: a SIGKILL during it leaves the temporary or the folder newer than `latest`.
`repair_checkpoints` runs before the Trainer starts: it points `latest` at the newest complete checkpoint and
deletes anything newer, so a partial checkpoint is never loaded and Composer's "newer checkpoint in folder"
check never trips on one. Complete means: a torch.save file is a zip with its end-of-central-directory record;
a DCP folder has its `.metadata`, which DCP writes (to a temporary name, then renamed) only after every rank
has written and fsynced its shard.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gcc import inputs
from gcc.compat.composer import CHECKPOINT_RE, COMPOSER_READS_AS_CHECKPOINT, LATEST_LINK
from gcc.compat.torch import DCP_METADATA
from gcc.errors import BadInput, Refusal
from gcc.locks import LockHeld, take_flock
from gcc.storage import LinkRefused, atomic_write, in_place_problem, open_folder, sha256_file
from gcc.training.signature import diff_signatures

logger = logging.getLogger(__name__)

# Composer's names for a checkpoint (a DDP file or an FSDP folder) and its "latest" link; what completes a DCP folder
CKPT_RE, LATEST = CHECKPOINT_RE, LATEST_LINK
CKPT_TMP_RE = re.compile(r"^(.+)\.tmp[0-9]+\Z")  # gcc.storage's temporary of a checkpoint file: <name>.tmp<pid>


# ---- lock ---------------------------------------------------------------------------------------------
class RunLock:
    """The run folder's lock (`<run_dir>/.lock`), held by global rank 0 for the life of the process, and the node's
    shard cache's (`hold_cache`), held by the node's local rank 0: one run at a time in each."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / ".lock"
        self.fd: int | None = None
        self.cache_fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = _take(
            self.path, self.path.parent, "the run's lock file", "wait for it to finish or stop it first", ""
        )

    def hold_cache(self, cache: Path) -> None:
        """The lock of the shard cache `cache` (`<cache>/.lock`): a second run sharing it is refused, naming the
        holder, before its start could release the first's live shared memory (gcc/compat/streaming.py)."""
        cache.mkdir(parents=True, exist_ok=True)
        self.cache_fd = _take(
            cache / ".lock",
            cache,
            "the shard cache's lock file",
            "two runs never share a data.cache_dir: give this run its own",
            f", run {self.path.parent}",
        )

    def release(self) -> None:
        for fd in (self.fd, self.cache_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.cache_fd = None


def _take(path: Path, folder: Path, what: str, advice: str, run: str) -> int:
    """`take_flock` (holder: this process, host and `run`), its failures a Refusal naming the lock file (a link, not
    a file) or its live holder."""
    try:
        return take_flock(path, f"pid {os.getpid()} on {socket.gethostname()}{run}", 0o666)
    except LockHeld as e:
        raise Refusal(f"{folder}: another live run holds {path} ({e.holder}); {advice}") from None
    except LinkRefused as e:
        raise Refusal(f"{e}; it is {what}: move it away and relaunch") from None
    except OSError as e:
        raise Refusal(
            f"{path}: cannot be opened as {what} ({e.strerror}; a symbolic link or not a file?); remove it and relaunch"
        ) from None


# ---- what the run folder holds ------------------------------------------------------------------------
# what a run writes at the top of its folder (docs/training.md, "The run folder"): none of them may be a link
RUN_FOLDERS = ("checkpoints", "samples", "stacks", "cache", "replaced", "tensorboard")
LOGS = ("train_log.csv", "val_log.csv")
RUN_FILES = ("run.json", "config.json", *LOGS)
# what a run writes in place (appends to or rewrites), not by a rename: none of them may have another name either
IN_PLACE = (".lock", "train.log", *LOGS)


def check_run_folder(run_dir: Path) -> None:
    """The entries the launch reads or writes in `run_dir`, checked before it reads or writes any (docs/training.md,
    "Trust and safety"): none of the run's own folders and files is a link (a write would land where it points);
    `checkpoints` a folder; each export (`step-N.safetensors`) a file, not a link (dangling or not); what the run
    writes in place (`IN_PLACE`, `stacks/`) a file of its own (`gcc.storage.in_place_problem`: no other name, a hard
    link say, no other owner). A Refusal naming the entry otherwise."""
    run_dir = Path(run_dir)
    for name in (*RUN_FOLDERS, *RUN_FILES):
        if (run_dir / name).is_symlink():
            raise Refusal(
                f"{run_dir / name}: a symbolic link, expected the run's own {name}; gcc never writes through one: "
                "move it away and relaunch"
            )
    ckpts = ckpt_dir(run_dir)
    if ckpts.exists() and not ckpts.is_dir():
        raise Refusal(f"{ckpts}: not a folder, expected the folder of the run's checkpoints; move it away and relaunch")
    for p in sorted(ckpts.iterdir()) if ckpts.is_dir() else []:
        problem = _ckpt_kind(p) if CKPT_RE.match(p.name) else None
        if problem is None and COMPOSER_READS_AS_CHECKPOINT.match(p.name) and not CKPT_RE.match(p.name):
            problem = "its step is not in ASCII digits (or has more than 18): Composer would take it for one"
        if p.name == LATEST and not (p.is_symlink() or p.is_file() or p.is_dir()):
            problem = "not a link, a file or a folder"
        if problem is not None:
            raise Refusal(f"{p}: named like a checkpoint but {problem}; move it away and relaunch")
    for p in sorted(run_dir.glob("step-*.safetensors")):
        if p.is_symlink() or not p.is_file():
            what = "a symbolic link" if p.is_symlink() else "not a file"
            raise Refusal(f"{p}: {what}, expected an export the run wrote; move it away and relaunch")
    stacks = run_dir / "stacks"
    for p in [run_dir / name for name in IN_PLACE] + (sorted(stacks.iterdir()) if stacks.is_dir() else []):
        problem = in_place_problem(p)
        if problem is not None:
            raise Refusal(f"{p}: {problem}; gcc writes into it in place, so it must be the run's own: move it away")


# ---- identity -----------------------------------------------------------------------------------------
def file_digest(path: str, known: dict[str, Any] | None = None) -> dict[str, Any]:
    """sha256 of a (possibly 10 GB) file, reusing a stored digest when path, size and mtime are unchanged."""
    if not path:
        return {"path": "", "sha256": ""}
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if known and known.get("sha256") and known.get("path") == os.path.realpath(path):
            return known  # moved since the launch that recorded it: that digest stands (a resume does not read it)
        raise
    stamp = {"path": os.path.realpath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if known and all(known.get(k) == v for k, v in stamp.items()):
        return known
    return {**stamp, "sha256": sha256_file(path)}


def stored_record(run_dir: Path) -> dict[str, Any] | None:
    """The run folder's run.json (None when there is none), read through `gcc.inputs` (a regular file, bounded);
    its CSV logs, which a resume reads and rewrites, must be regular files too. A Refusal naming the file
    otherwise."""
    path = Path(run_dir) / "run.json"
    if not path.exists():
        return None
    try:
        record = inputs.load_json(path, "json", "a run record")
    except BadInput as e:
        raise Refusal(f"{e}; not a run record gcc wrote, restore it, or use another run_dir") from None
    for name in LOGS:
        if (Path(run_dir) / name).exists():
            _checked_log(Path(run_dir) / name)
    if not (
        isinstance(record, dict)
        and isinstance(record.get("signature"), dict)
        and isinstance(record.get("lineage"), dict)
        and isinstance(record["lineage"].get(LAUNCHES, []), list)
    ):
        raise Refusal(
            f"{path}: not a run record gcc wrote (expected an object with 'signature' and 'lineage', its "
            f"'{LAUNCHES}' a list); restore it, or use another run_dir"
        )
    return record


# run.json lineage: [{time, world, from_step (0: a start; a launch of an earlier gcc has none), gcc_version,
# git_revision, git_dirty}, ...]
LAUNCHES = "launches"
# run.json lineage: the step of the run's first committed checkpoint, null until there is one (a run started by an
# earlier gcc: the first one committed since). A record of an earlier gcc without the key: whether its run committed
# a checkpoint is read from what it wrote (`why_not_remade`)
FIRST_CHECKPOINT = "first_checkpoint"


def with_launch(record: dict[str, Any], launch: dict[str, Any]) -> dict[str, Any]:
    """The record with this launch appended to its lineage's launch history (a record of an earlier gcc has
    none): which code made each launch of the run. Not part of the signature: a resume with newer code is the
    same run."""
    lineage = record["lineage"]
    return {**record, "lineage": {**lineage, LAUNCHES: [*lineage.get(LAUNCHES, []), launch]}}


def record_first_checkpoint(run_dir: Path, step: int) -> bool:
    """Note in run.json's lineage that the run committed a checkpoint (`FIRST_CHECKPOINT`), once: from then on a
    folder of this run without checkpoints is one whose checkpoints were deleted, never restarted by a relaunch
    (`why_not_remade`). True when run.json was written."""
    record = stored_record(run_dir)
    if record is None or record["lineage"].get(FIRST_CHECKPOINT) is not None:
        return False
    write_record(run_dir, {**record, "lineage": {**record["lineage"], FIRST_CHECKPOINT: step}})
    return True


def check_identity(run_dir: Path, signature: dict[str, Any], lineage: dict[str, Any]) -> dict[str, Any]:
    """First start: record signature + lineage. Relaunch: the signature must match (exit 3 otherwise)."""
    record, new = identity(run_dir, signature, lineage)
    if new:
        write_record(run_dir, record)
    return record


def write_record(run_dir: Path, record: dict[str, Any]) -> None:
    """run.json, through the writer that never follows a link inside the run folder (gcc/storage.py)."""
    atomic_write(Path(run_dir) / "run.json", json.dumps(record, indent=1, sort_keys=True), root=run_dir)


def identity(
    run_dir: Path, signature: dict[str, Any], lineage: dict[str, Any], adopted: dict[str, Any] | None = None
) -> tuple[dict[str, Any], bool]:
    """`check_identity`'s verdict, writing nothing: (the run's record, True when run.json is still to write). A
    run folder without run.json takes `adopted` (the checkpoint prefix's record), checked the same way."""
    path = Path(run_dir) / "run.json"
    new = not path.exists()
    if new and adopted is None:
        if list_checkpoints(run_dir):
            raise Refusal(
                f"{run_dir}: holds checkpoints but no run.json, so its run signature is unknown; use another run_dir"
            )
        return {"signature": signature, "lineage": lineage}, True
    record = adopted if new else stored_record(run_dir)
    assert record is not None  # new: `adopted` is set (above); else run.json exists
    diffs = diff_signatures(record["signature"], signature)
    if diffs:
        raise Refusal(
            f"{run_dir}: holds a run with a different signature; these fields differ "
            f"(stored -> now):\n  "
            + "\n  ".join(diffs)
            + "\nOnly max_duration (unless a decaying schedule runs over it), the GPU/node count, the global batch "
            "(the run then continues at the next epoch), workers and logging may change on resume. Use another run_dir to start a different "
            "run."
        )
    return record, new


# ---- checkpoints --------------------------------------------------------------------------------------
def ckpt_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_step(path: str | Path) -> int:
    """The optimizer step B of a checkpoint named ep{E}-ba{B}-rank0.pt (DDP) or ep{E}-ba{B} (FSDP folder)."""
    m = CKPT_RE.match(Path(path).name)
    if m is None:
        raise ValueError(f"{path}: not a checkpoint name (ep<E>-ba<B>)")
    return int(m.group(2))


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    d = ckpt_dir(run_dir)
    if not d.exists():
        return []
    out = [(int(m.group(2)), p) for p in d.iterdir() if (m := CKPT_RE.match(p.name)) and _ckpt_kind(p) is None]
    return sorted(out)


def is_complete(path: Path) -> bool:
    if path.is_dir():
        return (path / DCP_METADATA).is_file()
    return zipfile.is_zipfile(path)


def remove_checkpoint(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def disk_gb(path: Path) -> float:
    """Size of a checkpoint (a file, or a folder of shards), GB."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 1e9


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint `latest` names: only a symbolic link to the name of a checkpoint of this folder, of its kind
    (`_ckpt_kind`), is read, as a hint. Anything else there is None: missing, a regular file or a folder in its place
    (a copy by `cp -rL` or `rsync -L`), a link to itself or to another name or path; `plan_repair` then finds the
    newest complete checkpoint itself."""
    try:
        target = os.readlink(ckpt_dir(run_dir) / LATEST)
    except OSError:  # missing, or not a link
        return None
    path = ckpt_dir(run_dir) / target
    return path if CKPT_RE.match(target) and _ckpt_kind(path) is None else None


def _ckpt_kind(path: Path) -> str | None:
    """Why `path`, named like a checkpoint, is not one: a DDP name (ep<E>-ba<B>-rank0.pt) must be a file, an FSDP
    name (ep<E>-ba<B>) a folder, neither a symbolic link. None if it is of its kind."""
    m = CKPT_RE.match(path.name)
    want = "a folder" if m is not None and m.group(3) is None else "a file"
    if path.is_symlink():
        return f"a symbolic link, not {want}"
    if not (path.is_dir() if want == "a folder" else path.is_file()):
        return f"not {want}"
    return None


@dataclass(frozen=True)
class Repair:
    """What `repair_checkpoints` does, decided without writing (`plan_repair`): the checkpoint resumed from, whether
    `latest` is repointed at it (or removed, with none), and the partial or newer leftovers deleted."""

    latest: Path | None
    relink: bool
    doomed: tuple[Path, ...]

    def apply(self, run_dir: Path) -> Path | None:
        link = ckpt_dir(run_dir) / LATEST
        if self.relink and not link.is_symlink():  # a copy in its place (`cp -rL`): a file, or a DCP folder
            remove_checkpoint(link)
        if self.relink and self.latest is not None:
            point_latest(run_dir, self.latest.name)
            logger.info(f"checkpoints: 'latest' repaired -> {self.latest.name}")
        elif self.relink:
            link.unlink(missing_ok=True)
        for p in self.doomed:
            logger.info(f"checkpoints: removing incomplete/stale {p.name}")
            remove_checkpoint(p)
        return self.latest


def plan_repair(run_dir: Path) -> Repair:
    ckpts = list_checkpoints(run_dir)
    link = ckpt_dir(run_dir) / LATEST
    latest = latest_checkpoint(run_dir)
    relink = False
    if latest is None or not is_complete(latest):
        complete = [p for _, p in ckpts if is_complete(p)]
        latest = complete[-1] if complete else None
        relink = latest is not None or os.path.lexists(link)
    latest_batch = checkpoint_step(latest) if latest is not None else -1
    doomed = tuple(p for batch, p in ckpts if batch > latest_batch or (p != latest and not is_complete(p)))
    return Repair(latest, relink, doomed + unfinished_writes(run_dir))


def unfinished_writes(run_dir: Path) -> tuple[Path, ...]:
    """The temporaries of checkpoint files whose write never completed (a background write renames its temporary,
    `<name>.tmp<pid>`, once complete: gcc/training/async_checkpoint.py)."""
    d = ckpt_dir(run_dir)
    if not d.is_dir():
        return ()
    return tuple(sorted(p for p in d.iterdir() if (m := CKPT_TMP_RE.match(p.name)) and CKPT_RE.match(m.group(1))))


def repair_checkpoints(run_dir: Path) -> Path | None:
    """Point `latest` at the newest complete checkpoint; delete partial/newer leftovers (and the temporaries of
    unfinished writes). Returns it."""
    return plan_repair(run_dir).apply(run_dir)


def to_rotate(ckpts: list, latest, keep: int) -> list:
    """Of checkpoints in step order (local paths or remote names), those rotation deletes: all but the `keep`
    newest up to `latest` (a newer one is a leftover that `repair` handles)."""
    upto = ckpts[: ckpts.index(latest) + 1] if latest in ckpts else ckpts
    return upto[:-keep] if keep > 0 else []


def rotate_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """Keep the `keep` newest checkpoints up to `latest` (across restarts); returns what was deleted."""
    latest = latest_checkpoint(run_dir)
    if latest is None:
        return []
    doomed = to_rotate([p for _, p in list_checkpoints(run_dir)], latest, keep)
    for p in doomed:
        remove_checkpoint(p)
    return doomed


def point_latest(run_dir: Path, name: str) -> None:
    """`latest` -> checkpoints/<name> (replaced atomically: a symlink under a temporary name, renamed)."""
    link = ckpt_dir(run_dir) / LATEST
    tmp = link.with_name(f"{LATEST}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(name, tmp)
    os.replace(tmp, link)


# ---- starting over ------------------------------------------------------------------------------------
OUTPUTS = (
    "step-*.safetensors",
    "train_log*.csv",
    "val_log*.csv",
    "config.json",
    "done.json",
    "curves.png",
    "tensorboard",
    "stacks",
    "checkpoints",
)
REPLACED = "replaced"


def _checked_log(path: Path) -> None:
    """A CSV log of the run folder is a regular file of at most the csv cap (`gcc.inputs`); a Refusal naming it."""
    try:
        with inputs.open_regular(path, "csv"):
            pass
    except BadInput as e:
        raise Refusal(f"{e}; not a log gcc wrote, restore it, or use another run_dir") from None


def _first_cells(path: Path) -> Iterator[str]:
    """The first cell (the step) of each row of the CSV log `path` after its header, read a line at a time (a log
    of any length costs one line); none once it cannot be read. A log that is not a regular file: a Refusal."""
    _checked_log(path)
    try:
        with inputs.open_text(path, "csv") as f:
            rows = (line for line in f if line.strip())
            next(rows, None)  # the header
            for line in rows:
                yield line.split(",", 1)[0].strip()
    except (OSError, BadInput):
        return


def _data_rows(path: Path) -> int:
    """The rows of a CSV log, but for the header and the step-0 validation's: a start from step 0 writes those
    again (the same numbers: the same starting weights), so they do not make a folder used."""
    if not path.exists():
        return 0
    return sum(1 for cell in _first_cells(path) if cell != "0")


def what_a_restart_loses(run_dir: Path, doomed: tuple[Path, ...] = ()) -> list[str]:
    """What a start from step 0 in `run_dir` would overwrite or drop: exports, logged rows (but step 0's),
    checkpoints (but the leftovers `doomed` that the repair deletes anyway). train.log is never lost: every launch
    appends to it."""
    run_dir = Path(run_dir)
    exports = sorted(run_dir.glob("step-*.safetensors"), key=lambda p: p.stat().st_mtime)
    found = [f"{len(exports)} export(s) (newest {exports[-1].name})"] if exports else []
    found += [f"{name} with {n} row(s)" for name in LOGS if (n := _data_rows(run_dir / name))]
    ckpts = [c for c in list_checkpoints(run_dir) if c[1] not in doomed]
    found += [f"{len(ckpts)} checkpoint(s) (newest {ckpts[-1][1].name})"] if ckpts else []
    return found


# a step as the run's logs and exports write it: ASCII digits, at most 18 (anything else is not the run's)
STEP_DIGITS = "[0-9]{1,18}"
EXPORT_STEP_RE = re.compile(rf"^step-({STEP_DIGITS})(?:\.ema)?\.safetensors\Z")


def _last_step(run_dir: Path) -> int:
    """The newest step the run folder holds a log row or an export of (0 for none)."""
    last = 0
    for name in LOGS:
        if (run_dir / name).exists():
            for cell in _first_cells(run_dir / name):
                if re.fullmatch(STEP_DIGITS, cell):
                    last = max(last, int(cell))
    exports = [int(m.group(1)) for p in run_dir.glob("step-*.safetensors") if (m := EXPORT_STEP_RE.match(p.name))]
    return max([last, *exports])


def why_not_remade(record: dict[str, Any] | None, run_dir: Path, first_save: int) -> str | None:
    """None when a start from step 0 remakes everything the run in `run_dir` wrote, because it never committed a
    checkpoint (killed before its first one): run.json's lineage says so (`FIRST_CHECKPOINT` null), or, for a
    record of an earlier gcc, which has no such key, no log row or export is later than the first save point
    (`first_save`: save_interval), so that no checkpoint can have been committed and deleted since. Else why not:
    the reason a relaunch refuses to start over (`record` None: no run.json, the run is unknown)."""
    if record is None:
        return "no run.json says which run wrote them"
    lineage = record["lineage"]
    if FIRST_CHECKPOINT in lineage:
        step = lineage[FIRST_CHECKPOINT]
        return None if step is None else f"its run committed a checkpoint at step {step} (run.json), gone since"
    last = _last_step(Path(run_dir))
    if last <= first_save:
        return None
    return f"it holds step {last}'s rows or export, past the first checkpoint (save_interval={first_save}), gone since"


def set_aside(run_dir: Path, stamp: str) -> Path:
    """Start over on purpose (`allow_existing: true`): move everything a run wrote into
    `<run_dir>/replaced/<stamp>/`, so that nothing is lost; run.json (the same signature) and the cache stay."""
    run_dir = Path(run_dir)
    os.close(open_folder(run_dir, REPLACED))  # a link there is refused: what the run wrote stays in the run folder
    dest, n = run_dir / REPLACED / stamp, 1
    while True:  # two starts over within a second (a launch killed at once, relaunched at once): the next free name
        try:
            dest.mkdir()
            break
        except FileExistsError:
            n += 1
            dest = run_dir / REPLACED / f"{stamp}-{n}"
    for pattern in OUTPUTS:
        for p in sorted(run_dir.glob(pattern)):
            os.replace(p, dest / p.name)
    return dest
