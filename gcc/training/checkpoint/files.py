"""A run's checkpoints on its local disk, `<run_dir>/checkpoints/`: Composer's checkpoints and the
`latest-rank0.pt` symlink to the newest (DDP: one file ep{E}-ba{B}-rank0.pt; FSDP: a folder ep{E}-ba{B}/ of torch DCP
shards, one per rank, and its .metadata); which are complete, the repair before a start, the rotation, `latest`.

Composer writes a checkpoint in place and then replaces the `latest` symlink (remove + create). A SIGKILL can
therefore leave a truncated file or a partial folder newer than `latest`, or no `latest` at all. A periodic
checkpoint written in the background (gcc/training/checkpoint/background.py) goes to a temporary name first
(`<name>.tmp<pid>`, renamed once complete; a DCP folder gets its `.metadata` last), and `latest` names it only
once the write is complete: a SIGKILL during it leaves the temporary or the folder newer than `latest`.
`repair_checkpoints` runs before the Trainer starts: it points `latest` at the newest complete checkpoint and
deletes anything newer, so a partial checkpoint is never loaded and Composer's "newer checkpoint in folder"
check never trips on one. Complete means: a torch.save file is a zip with its end-of-central-directory record;
a DCP folder has its `.metadata`, which DCP writes (to a temporary name, then renamed) only after every rank
has written and fsynced its shard.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from gcc.compat.composer import CHECKPOINT_RE, LATEST_LINK
from gcc.compat.torch import DCP_METADATA

logger = logging.getLogger(__name__)

# Composer's names for a checkpoint (a DDP file or an FSDP folder) and its "latest" link; what completes a DCP folder
CKPT_RE, LATEST = CHECKPOINT_RE, LATEST_LINK
CKPT_TMP_RE = re.compile(r"^(.+)\.tmp[0-9]+\Z")  # gcc.storage's temporary of a checkpoint file: <name>.tmp<pid>


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
    out = [(int(m.group(2)), p) for p in d.iterdir() if (m := CKPT_RE.match(p.name)) and checkpoint_problem(p) is None]
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
    (`checkpoint_problem`), is read, as a hint. Anything else there is None: missing, a regular file or a folder in its place
    (a copy by `cp -rL` or `rsync -L`), a link to itself or to another name or path; `plan_repair` then finds the
    newest complete checkpoint itself."""
    try:
        target = os.readlink(ckpt_dir(run_dir) / LATEST)
    except OSError:  # missing, or not a link
        return None
    path = ckpt_dir(run_dir) / target
    return path if CKPT_RE.match(target) and checkpoint_problem(path) is None else None


def checkpoint_problem(path: Path) -> str | None:
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
    `<name>.tmp<pid>`, once complete: gcc/training/checkpoint/background.py)."""
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
