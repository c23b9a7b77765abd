"""The launch: who this run is, and where it starts. Read top to bottom, it is what rank 0 decides before any
work (docs/design.md §9.3, §9.5) and every rank then acts on (`RunStart`):

1. `agree_on_start`: rank 0 runs `prepare_run` and broadcasts its verdict, so that every rank starts, refuses or
   fails on the config alike;
2. `prepare_run`, under the run lock, every check first: the run folder's entries (`run_folder.check_run_folder`),
   the data's manifest (`read_manifest_bytes`, `check_data`), the checkpoint prefix's run record
   (`adopt_remote_record`), the run signature against run.json (`run_signature`, `run_folder.identity`), the
   checkpoint folder's repair planned, a start from step 0 checked not to destroy anything (`check_fresh_start`),
   the node's shard cache locked (`hold_cache`); then the writes: the prefix claimed, run.json written with this
   launch appended to its lineage (which code: gcc/provenance.py), the checkpoint folder repaired, the prefix's
   last commit fetched;
3. `fetch_on_this_node`: with a checkpoint prefix, every node gets the checkpoint that rank 0 resumes from.

A Refusal ends the launch with exit 3 and a ConfigError with exit 2, on every rank (gcc/exit_codes.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from composer.utils import dist

from gcc import storage
from gcc.data.shards import MANIFEST, parse_manifest
from gcc.errors import BadInput, StorageUnavailable
from gcc.provenance import Provenance, this_code
from gcc.redact import redact
from gcc.storage import join
from gcc.training.checkpoint.files import checkpoint_step, ckpt_dir, is_complete, plan_repair, repair_checkpoints
from gcc.training.checkpoint.store import CheckpointStore, Head, store_for
from gcc.training.config import DECAYING, ConfigError, TrainConfig, duration_in_batches, signed_values
from gcc.training.ranks import node_rank, world_size
from gcc.training.run_folder import (
    FIRST_CHECKPOINT,
    REPLACED,
    Refusal,
    RunLock,
    check_run_folder,
    file_digest,
    identity,
    set_aside,
    stored_record,
    what_a_restart_loses,
    why_not_remade,
    with_launch,
    write_record,
)
from gcc.training.signature import diff_signatures

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunStart:
    """What rank 0 decided for this launch (`prepare_run`), the same on every rank."""

    manifest: dict[str, Any]  # the data's manifest.json, parsed and checked
    lineage: dict[str, Any]  # run.json's lineage: the warm start's weights, the global-batch changes
    launch: str  # this launch's claim on the checkpoint prefix ("" without save_folder)
    committed_files: dict[str, Any] | None  # the committed checkpoint's files, when the resume is from the prefix
    resumed_from: str  # the checkpoint resumed from ("" for a start from step 0)
    resumed_step: int | None  # its step (None for a start from step 0)
    store: CheckpointStore | None = None  # save_folder's store, built once here (None without save_folder)
    provenance: Provenance = field(default_factory=this_code)  # the code of this launch, read by rank 0

    @property
    def resumed(self) -> bool:
        return self.resumed_step is not None


def train_clips(manifest: dict, limit: int | None) -> int:
    """The clips an epoch of training draws from: the train split's, or its `data.limit` subset's."""
    n = len(manifest["splits"]["train"]["clip_ids"])
    return min(n, limit) if limit else n


def steps_per_epoch(n_train: int, world: int, per_rank_batch: int) -> int:
    """Streaming gives every rank ceil(n / world) samples an epoch (it pads with repeats); the partial last batch
    is dropped (builders.build_train_loader)."""
    return -(-n_train // world) // per_rank_batch


def schedule_horizon(cfg: TrainConfig, manifest: dict[str, Any]) -> int:
    """The batches the lr schedule runs over: max_duration at this launch (epochs at its global batch)."""
    n = train_clips(manifest, cfg.data.limit)
    return duration_in_batches(cfg.max_duration, steps_per_epoch(n, world_size(), cfg.per_rank_batch(world_size())))


SCHEDULE_HORIZON = "scheduler.horizon"  # run signature: a decaying schedule's max_duration, in batches


def schedule_jump(cfg: TrainConfig, stored: dict[str, Any], horizon: int, step: int | None) -> str:
    """For a decaying schedule (config.DECAYING) whose horizon the stored signature holds and this launch changes:
    what the change would do to the rate at the resumed step (the lr factor before and after); "" otherwise."""
    old = stored.get(SCHEDULE_HORIZON)
    if cfg.scheduler.name not in DECAYING or not isinstance(old, int) or old == horizon:
        return ""
    from gcc.training.schedule import composer_scheduler, lr_factor  # Composer's schedulers

    s = cfg.scheduler
    scheduler = composer_scheduler(s)
    at = (step or 0) + 1
    before, after = lr_factor(scheduler, at, old), lr_factor(scheduler, at, horizon)
    return (
        f"\nmax_duration {old} -> {horizon} batches changes the schedule: {s.name} decays over max_duration, so at "
        f"step {at} the lr factor would jump from {before:.3f} to {after:.3f}. A decaying schedule's length is part "
        f"of the run: relaunch with max_duration={old}, or start a longer run in another run_dir "
        f"(constant_with_warmup may be extended on resume)"
    )


def data_name(cfg: TrainConfig, manifest: dict[str, Any]) -> str:
    """The data's name for export metadata (`data`): the manifest's `name` (convert_data --name, checked when the
    manifest was read); a manifest of an earlier convert_data has none, and then the conversion folder's name."""
    return manifest.get("name") or cfg.data.path.rstrip("/").rsplit("/", 1)[-1]


def run_signature(
    cfg: TrainConfig, manifest_bytes: bytes, known: dict[str, Any] | None = None, horizon: int | None = None
) -> dict[str, Any]:
    """Everything that makes two launches the same run (docs/design.md §9.3): the value of every field declared
    `identity=True` (gcc/training/config.py), and for a field that names a file or the data, what identifies it
    (the key its declaration names), computed here. Every other field may change on resume: max_duration, global
    batch (a change continues at the next epoch: gcc/training/batch_change.py), micro-batch/accumulation split,
    workers, logging, export/checkpoint/validation cadence; so may the GPU/node count. A decaying schedule
    (cosine, linear decay) runs over max_duration: its `horizon` (max_duration in batches at this launch; by
    default max_duration given in batches) is signed too, so that a relaunch cannot make its rate jump."""
    m = cfg.model
    known = known or {}
    base = ""
    if m.model_dir:
        index = Path(m.model_dir) / "diffusion_pytorch_model.safetensors.index.json"
        base = storage.sha256_file(index) if index.exists() else os.path.realpath(m.model_dir)
    computed: dict[str, Any] = {  # under the key each field declares as its identity
        "model.base_weights": base,  # model.model_dir
        "model.init_ckpt": file_digest(m.init_ckpt, known.get("model.init_ckpt")) if m.init_ckpt else "",
        "model.legacy_zero_ckpt": os.path.realpath(m.legacy_zero_ckpt) if m.legacy_zero_ckpt else "",
        "data.manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),  # data.path: the data by its content
    }
    if cfg.scheduler.name in DECAYING:
        computed[SCHEDULE_HORIZON] = horizon if horizon is not None else cfg.max_duration
    return redact({**signed_values(cfg), **computed})  # a credential in a path or URL never reaches run.json


def read_manifest_bytes(cfg: TrainConfig) -> bytes:
    return storage.read_bytes(storage.join(cfg.data.path, MANIFEST))


def validates(cfg: TrainConfig) -> bool:
    """Whether the run validates at all: `eval_interval` 0 or `val_n` 0 turn every validation off (step 0's too)."""
    return cfg.val_n > 0 and cfg.eval_interval > 0


def check_data(
    manifest: dict,
    data: str,
    per_rank_batch: int = 1,
    world: int = 1,
    limit: int | None = None,
    validation: bool = False,
) -> None:
    """Refuse data the run cannot train on: no train clips, no val clips for a run that validates
    (`validation`), fewer clips a rank than its batch (no step per epoch: the run would loop over empty epochs for
    ever), or train and val sharing clips or runs. `limit`: data.limit."""
    tr, va = manifest["splits"]["train"], manifest["splits"]["val"]
    if not tr["clip_ids"]:
        raise Refusal(f"data {data}: the train split has no clips")
    if validation and not va["clip_ids"]:
        raise Refusal(
            f"data {data}: no val split (its conversion has 0 val clips), and validation is on: set "
            "eval_interval: 0 to train without validation, or convert data that has val clips"
        )
    n = train_clips(manifest, limit)
    per_rank = -(-n // world)  # Streaming pads every rank to ceil(N / ranks) (docs/training.md)
    if per_rank < per_rank_batch:
        what = (
            f"data.limit={limit} clips of the train split"
            if n < len(tr["clip_ids"])
            else f"the train split's {n} clips"
        )
        raise Refusal(
            f"data {data}: {what} give each of the {world} rank(s) {per_rank} samples an epoch, fewer than "
            f"its batch of {per_rank_batch} (global_train_batch_size / world_size): no step could be taken; lower "
            f"global_train_batch_size"
        )
    clips = sorted(set(tr["clip_ids"]) & set(va["clip_ids"]))
    runs = sorted(set(tr["runs"]) & set(va["runs"]))
    if clips or runs:
        raise Refusal(f"data {data}: train/val leak: shared clips {clips[:5]}, shared runs {runs[:5]}")


def cache_dir(cfg: TrainConfig) -> Path:
    """Per-node shard cache, shared by the node's ranks (Streaming's download/lock protocol needs that)."""
    base = Path(cfg.data.cache_dir) if cfg.data.cache_dir else Path(cfg.run_dir) / "cache"
    return base / f"node{node_rank()}"


def hold_cache(cfg: TrainConfig, lock: RunLock) -> None:
    """The node's shard cache is locked by its local rank 0 (`RunLock.hold_cache`): a second run sharing it (a
    `data.cache_dir` of its own, or one naming this run's default `<run_dir>/cache`) is refused, naming the
    holder, before its start could release this run's live Streaming shared memory."""
    lock.hold_cache(cache_dir(cfg))


def prepare_run(cfg: TrainConfig, lock: RunLock) -> RunStart:
    """Rank 0's checks before any work (docs/design.md §9.3, §9.5). Returns what every rank needs to know. Every
    check runs before the first write: a refused launch leaves the run folder as it was (but its lock file and a
    line in train.log), and the checkpoint prefix too."""
    lock.acquire()
    run_dir = Path(cfg.run_dir)
    check_run_folder(run_dir)
    manifest_bytes, manifest = _checked_manifest(cfg)
    store, launch, committed_files = store_for(cfg.save_folder), "", None
    record, local = _run_record(cfg, run_dir, store, manifest_bytes, manifest)
    repair = plan_repair(run_dir) if cfg.autoresume else None
    latest = repair.latest if repair is not None else None
    committed = store.head() if store is not None else None  # read only: the claim comes after every check
    restart = ""  # what a start over after a launch killed before its first checkpoint moves aside
    if latest is None and not (cfg.autoresume and committed is not None and committed.checkpoint):
        # nothing to resume: a start from step 0
        restart = check_fresh_start(cfg, run_dir, committed, repair.doomed if repair is not None else (), local)
    hold_cache(cfg, lock)  # the last check (the default cache is in the run folder: its lock file is a first write)
    # only now, every check passed, the first writes: a refused launch leaves the prefix (and its live owner) and
    # the run folder alone
    provenance = this_code()
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resumes = [checkpoint_step(c) for c in (latest, committed.checkpoint if committed else None) if c]
    from_step = max(resumes) if resumes and cfg.autoresume else 0  # the step this launch resumes from
    record = with_launch(record, {"time": when, "world": world_size(), "from_step": from_step, **provenance.as_dict()})
    if store is not None:
        launch = store.claim()
        store.write_record(record)  # the prefix's copy too: a fresh machine adopts the whole launch history
    write_record(run_dir, record)
    if repair is not None:
        repair.apply(run_dir)
    if store is not None:
        head = store.repair(launch) if cfg.autoresume else None
        remote = head.checkpoint if head is not None else None
        if remote is not None and (latest is None or checkpoint_step(remote) >= checkpoint_step(latest)):
            assert head is not None  # remote is its checkpoint
            committed_files = head.files  # what every node verifies its copy against (fetch_on_this_node)
            if not store.whole_here(remote, run_dir, head.files):
                latest = store.fetch(remote, run_dir, head.files)
    if latest is None and (cfg.allow_existing or restart) and what_a_restart_loses(run_dir):
        _set_aside_for_restart(run_dir, restart)
    return RunStart(
        manifest=manifest,
        lineage=record["lineage"],
        launch=launch,
        committed_files=committed_files,
        resumed_from=str(latest.resolve()) if latest else "",
        resumed_step=checkpoint_step(latest) if latest else None,
        store=store,
        provenance=provenance,
    )


def _checked_manifest(cfg: TrainConfig) -> tuple[bytes, dict[str, Any]]:
    """The data's manifest.json (its bytes and its parsed contents), checked to be data the run can train on; a
    Refusal otherwise."""
    try:
        manifest_bytes = read_manifest_bytes(cfg)
    except StorageUnavailable:
        raise
    except Exception as e:  # missing file (local or S3)
        raise Refusal(
            f"data {cfg.data.path}: no readable manifest.json — not a finished convert_data output "
            f"({type(e).__name__}: {e})"
        ) from None

    try:
        manifest = parse_manifest(manifest_bytes, join(cfg.data.path, MANIFEST))
    except BadInput as e:  # data the launch cannot train on is refused (exit 3), its file named as a tool names it
        raise Refusal(str(e)) from None
    check_data(
        manifest,
        cfg.data.path,
        cfg.per_rank_batch(world_size()),
        world_size(),
        cfg.data.limit,
        validates(cfg),
    )
    return manifest_bytes, manifest


def _run_record(
    cfg: TrainConfig,
    run_dir: Path,
    store: CheckpointStore | None,
    manifest_bytes: bytes,
    manifest: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The run's record checked against this launch's signature (`identity`, writing nothing), and the run
    folder's own run.json (None when it has none)."""
    remote_record = adopt_remote_record(store, run_dir) if store is not None else None
    local = stored_record(run_dir)
    old = local or remote_record
    known = (old or {}).get("signature")
    horizon = schedule_horizon(cfg, manifest)
    try:  # a moved init_ckpt keeps the digest recorded at the first launch (a resume loads the checkpoint)
        signature = run_signature(cfg, manifest_bytes, known=known, horizon=horizon)
    except FileNotFoundError as e:
        raise ConfigError(missing_init_ckpt(e.filename, run_dir, (known or {}).get("model.init_ckpt"))) from None
    lineage = {
        "init_ckpt": os.path.realpath(cfg.model.init_ckpt) if cfg.model.init_ckpt else "",
        FIRST_CHECKPOINT: None,  # none committed yet (CheckpointRotation records the first)
    }
    try:
        record, _ = identity(run_dir, signature, lineage, adopted=remote_record)
    except Refusal as e:  # a decaying schedule's horizon changed: say what it does to the rate
        resumed = plan_repair(run_dir).latest
        at = checkpoint_step(resumed) if resumed is not None else None
        raise Refusal(f"{e}{schedule_jump(cfg, known or {}, horizon, at)}") from None
    return record, local


def _set_aside_for_restart(run_dir: Path, restart: str) -> None:
    """A start over from step 0 moves what the run folder holds aside (`set_aside`), and says why."""
    moved = set_aside(run_dir, time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
    if restart:
        logger.info(
            f"{run_dir}: its launch stopped before the run's first checkpoint, so there is nothing to resume: "
            f"starting the run over from step 0; what that launch wrote ({restart}) is now in {moved}"
        )
    else:
        logger.info(f"allow_existing: starting over in {run_dir}; what the run had written is now in {moved}")


def missing_init_ckpt(path: str, run_dir: Path, recorded: Any) -> str:
    """The message for a `model.init_ckpt` that is not there (exit 2) and whose digest the run does not know: a
    first start, or a resume naming another file than the one the run was warm-started from (docs/training.md,
    "Resuming": the one recorded is never read again, so it resumes even when gone)."""
    message = f"model.init_ckpt: {path}: not found (the warm start's weights)"
    if isinstance(recorded, dict) and recorded.get("path"):
        message += (
            f"; the run in {run_dir} was warm-started from {recorded['path']}: a resume with that model.init_ckpt "
            f"does not read it (its digest is in run.json), so it resumes even when the file is gone"
        )
    return message


def check_fresh_start(
    cfg: TrainConfig,
    run_dir: Path,
    committed: Head | None,
    doomed: tuple[Path, ...] = (),
    record: dict[str, Any] | None = None,
) -> str:
    """A launch with nothing to resume starts from step 0. It must not destroy what the run wrote: a run folder
    holding exports, log rows or checkpoints is refused unless `allow_existing` (they are then moved aside, not
    deleted), or unless its run never committed a checkpoint (a launch killed before its first one: `record`, the
    folder's run.json, and `run_folder.why_not_remade` say so), whose relaunch starts over, moving them aside
    too; a prefix holding a committed checkpoint is refused always (its rotation would delete them). `doomed`: the
    partial checkpoints the repair deletes, which lose nothing. The weights such a start loads must exist
    (ConfigError: exit 2). Returns what such a relaunch moves aside ("" for nothing, or `allow_existing`)."""
    m = cfg.model
    for key, path, kind in (
        ("model.init_ckpt", m.init_ckpt, "file"),
        ("model.model_dir", m.model_dir, "folder"),
        ("model.legacy_zero_ckpt", m.legacy_zero_ckpt, "folder"),
    ):
        if path and not (os.path.isfile(path) if kind == "file" else os.path.isdir(path)):
            raise ConfigError(
                f"{key}: {path}: no such {kind}; a start from step 0 loads its weights (a resume "
                f"would not: {run_dir} has no checkpoint)"
            )
    if committed is not None and committed.checkpoint:
        raise Refusal(
            f"{cfg.save_folder}: commits {committed.checkpoint} of this run, but autoresume is off, so "
            f"this launch would start from step 0 and its rotation would delete the committed checkpoints. "
            f"Set autoresume=true to continue the run, or use another save_folder"
        )
    lost = what_a_restart_loses(run_dir, doomed)
    if not lost or cfg.allow_existing:
        return ""
    if not cfg.autoresume:
        why = "autoresume is off"
    elif (not_remade := why_not_remade(record, run_dir, cfg.save_interval)) is None:
        return ", ".join(lost)  # a launch killed before the run's first checkpoint: the relaunch starts over
    else:
        why = f"it holds no checkpoint to resume from ({not_remade})"
    raise Refusal(
        f"{run_dir}: holds {', '.join(lost)}, and {why}: a start from step 0 would overwrite them. "
        f"Use another run_dir, or start over here on purpose with allow_existing=true (what the run "
        f"wrote is then moved to {run_dir}/{REPLACED}/<time>/)"
    )


def adopt_remote_record(store: CheckpointStore, run_dir: Path) -> dict | None:
    """The prefix's run record is the run's: returned for `prepare_run` to copy into a run folder that has none (a
    fresh machine) once every check passed, and a run folder that holds another run is refused. A prefix with
    checkpoints but no record is refused, as a run folder is (its run signature is unknown). Writes nothing."""
    remote, local = store.read_record(), stored_record(run_dir)
    if remote is None:
        if store.checkpoints():
            raise Refusal(
                f"{store.url}: holds checkpoints but no run.json, so its run signature is unknown; use "
                f"another save_folder"
            )
        return None
    if local is not None and (diffs := diff_signatures(remote["signature"], local["signature"])):
        raise Refusal(
            f"{run_dir} and save_folder {store.url} hold different runs; their run.json signatures "
            f"differ (prefix -> run folder):\n  "
            + "\n  ".join(diffs)
            + "\nPoint run_dir and save_folder at the same run"
        )
    return remote


def fetch_on_this_node(cfg: TrainConfig, start: RunStart, lock: RunLock) -> None:
    """Each node other than rank 0's: its local rank 0 locks the node's shard cache (`hold_cache`), and with remote
    checkpoints (every node needs the checkpoint in its own run folder, which may be node-local) downloads what
    rank 0 resumes from, unless its folder holds it file for file as committed (the manifest rank 0 read). A node
    that cannot is a Refusal on every rank."""
    fetch = bool(cfg.save_folder and start.resumed_from)
    name, run_dir, files = Path(start.resumed_from).name, Path(cfg.run_dir), start.committed_files
    refused = ""
    if dist.get_local_rank() == 0 and dist.get_global_rank() != 0:
        try:
            hold_cache(cfg, lock)
            if fetch:
                assert start.store is not None  # fetch: save_folder is set
                _fetch(start.store, name, run_dir, files)
        except Refusal as e:
            refused = f"node of rank {dist.get_global_rank()}: {e}"
    refusals = [r for r in dist.all_gather_object(refused) if r]  # also the barrier
    if refusals:
        raise Refusal(refusals[0])


def _fetch(store: CheckpointStore, name: str, run_dir: Path, files: dict[str, Any] | None) -> None:
    if files is None:  # rank 0 resumes from its own folder's checkpoint, newer than the committed one
        if not is_complete(ckpt_dir(run_dir) / name):
            raise Refusal(
                f"rank 0 resumes from {name}, a checkpoint of its run folder never committed to "
                f"{store.url}; this node's run folder {run_dir} lacks it"
            )
    elif not store.whole_here(name, run_dir, files):
        store.fetch(name, run_dir, files)
        repair_checkpoints(run_dir)  # what this node wrote after `name` was never committed


def agree_on_start(cfg: TrainConfig, lock: RunLock) -> RunStart:
    """Global rank 0 runs `prepare_run`; every rank gets its verdict: the `RunStart`, or the same Refusal (exit 3)
    or ConfigError (exit 2, a file the config names is missing), with rank 0's message, raised on every rank. A
    fault (storage away, disk full) leaves rank 0 at once with its exit code; the launcher then stops the others."""
    verdict: list = [None]
    if dist.get_global_rank() == 0:
        try:
            verdict[0] = prepare_run(cfg, lock)
        except (Refusal, ConfigError) as e:
            verdict[0] = (type(e), str(e))
    dist.broadcast_object_list(verdict, src=0)
    if isinstance(verdict[0], RunStart):
        return verdict[0]
    error, message = verdict[0]
    raise error(message)
