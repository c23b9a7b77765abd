"""A run's signature compared with another's (docs/design.md §9.3): the one rule the launch (run.json against this
launch, the checkpoint prefix's against the run folder's) and gcc-compare (two run folders) both use. Light: no
torch, no Composer (gcc-compare loads neither)."""

from __future__ import annotations

from typing import Any

from gcc.training.config import signature_key_name

# signature fields added after some runs were recorded, with the value those runs had
ADDED_FIELDS = {
    "parallelism": "ddp",  # before FSDP2 every CPU run (the only ones recorded) was DDP
    "data.limit": None,
}  # the whole train split
# fields that earlier runs recorded and that may now change on resume (gcc/training/batch_change.py)
DROPPED_FIELDS = ("global_batch",)
# fields compared only when both signatures hold them: a run recorded before the field was signed keeps resuming
# as before (a decaying schedule's horizon: launch.SCHEDULE_HORIZON)
COMPARED_IF_RECORDED = ("scheduler.horizon",)


def comparable(signature: dict[str, Any]) -> dict[str, Any]:
    """A signature as compared: a file digest (path, size, mtime, sha256) compares by its sha256 only."""
    signature = {**ADDED_FIELDS, **signature}
    return {
        k: (v.get("sha256", "") if isinstance(v, dict) else v) for k, v in signature.items() if k not in DROPPED_FIELDS
    }


def diff_signatures(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Each field that differs, by the name the config gives it now (a signature keeps the names of its first
    launch: `config.signature_key_name`), as `key: stored -> now`."""
    old, new = comparable(old), comparable(new)
    for k in COMPARED_IF_RECORDED:
        if k not in old or k not in new:
            old.pop(k, None)
            new.pop(k, None)
    return [
        f"{signature_key_name(k)}: {old.get(k, '<absent>')!r} -> {new.get(k, '<absent>')!r}"
        for k in sorted(set(old) | set(new))
        if old.get(k) != new.get(k)
    ]
