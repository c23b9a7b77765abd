"""One mapping from errors to exit codes (docs/training.md, "Exit codes"): every error class of gcc carries its code,
`gcc.errors.exit_for` gives any error its code and one-line message, the trainer's faults (`as_fault`) and the
launch's verdict (`agree_on_start`) take theirs from it, and the docs' table is gcc/exit_codes.py's."""

from __future__ import annotations

import ast
import builtins
import errno
import importlib
import json
import re
from pathlib import Path

import pytest

from gcc import exit_codes
from gcc.errors import BadInput, DamagedData, DiskFull, Refusal, StorageUnavailable, exit_for

ROOT = Path(__file__).resolve().parents[1]

# every error class defined under gcc/ and the code it carries; a class added without a row here fails
# `test_every_error_class_of_gcc_has_its_documented_code`, so that its code is chosen, not inherited by chance
CODES = {
    "gcc.errors.BadInput": exit_codes.CONFIG,
    "gcc.errors.DamagedData": exit_codes.DATA,
    "gcc.errors.StorageUnavailable": exit_codes.STORAGE,
    "gcc.errors.DiskFull": exit_codes.DISK,
    "gcc.errors.Refusal": exit_codes.REFUSED,
    "gcc.storage.LinkRefused": exit_codes.CONFIG,
    "gcc.names.UnsafeName": exit_codes.CONFIG,
    "gcc.locks.LockHeld": exit_codes.REFUSED,
    "gcc.model.export.GcCkptError": exit_codes.CONFIG,
    "gcc.sampling.vae.VaeError": exit_codes.CONFIG,
    "gcc.tools.sample.errors.SampleError": exit_codes.CONFIG,
    "gcc.settings.ConfigError": exit_codes.CONFIG,
    "gcc.training.checkpoint.store.TakenOver": exit_codes.REFUSED,
    "gcc.training.callbacks.nonfinite.NonFiniteLoss": exit_codes.NONFINITE,
    "gcc.training.callbacks.preemption.PreemptedBeforeFirstStep": exit_codes.OK,
    "gcc.training.ending.PeerGone": exit_codes.PEER_LOST,
}


def _error_classes_in_source() -> set[tuple[str, str]]:
    """(module, class name) of every class under gcc/ that derives from a builtin exception or from another such
    class of gcc, read from the source: a module that no test imports is not missed."""
    defs = []  # (module, name, base names)
    for path in sorted((ROOT / "gcc").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
                defs.append((module, node.name, bases))
    errors = {
        n
        for n in dir(builtins)
        if isinstance(getattr(builtins, n), type) and issubclass(getattr(builtins, n), BaseException)
    }
    found: set[tuple[str, str]] = set()
    while True:  # to the fixpoint: a subclass of a subclass of an exception
        more = {(m, n) for m, n, bases in defs if bases & errors and (m, n) not in found}
        if not more:
            return found
        found |= more
        errors |= {n for _, n in more}


def _instance(cls: type[Exception]) -> Exception:
    if cls.__name__ == "LockHeld":
        return cls(Path("/locks/run.lock"), "pid 7 on host h")
    return cls("/data/x: what went wrong")


def test_every_error_class_of_gcc_has_its_documented_code():
    classes = {}
    for module, name in _error_classes_in_source():
        cls = getattr(importlib.import_module(module), name)
        if issubclass(cls, Exception):  # not compat's UnverifiedLibrary: a SystemExit(2) raised at import
            classes[f"{module}.{name}"] = cls
    assert set(classes) == set(CODES), "an error class without a row in CODES, or a row without its class"
    for name, cls in classes.items():
        assert cls.exit_code == CODES[name], name
        code, message = exit_for(_instance(cls))
        assert code == CODES[name] and message, (name, code, message)


@pytest.mark.parametrize(
    "error, code, message",
    [
        (
            StorageUnavailable("s3://b/train/shard.00000.mds: timed out"),
            exit_codes.STORAGE,
            "storage unavailable: s3://b/train/shard.00000.mds: timed out. Rerun the same command once the store "
            "answers",
        ),
        (
            DiskFull("no space left on device writing /o/x.json"),
            exit_codes.DISK,
            "disk full: no space left on device writing /o/x.json",
        ),
        (
            DamagedData("/d/train/shard.00000.mds: cut short"),
            exit_codes.DATA,
            "damaged data: /d/train/shard.00000.mds: cut short",
        ),
        (
            FileNotFoundError(errno.ENOENT, "No such file or directory", "/d/x.json"),
            exit_codes.CONFIG,
            "/d/x.json: not found",
        ),
        (
            IsADirectoryError(errno.EISDIR, "Is a directory", "/d"),
            exit_codes.CONFIG,
            "/d: is a folder, expected a file",
        ),
        (
            OSError(errno.ELOOP, "Too many levels of symbolic links", "/d/l"),
            exit_codes.CONFIG,
            "/d/l: too many levels of symbolic links",
        ),
        (
            PermissionError(errno.EACCES, "Permission denied", "/a", None, "/b"),
            exit_codes.CONFIG,
            "/a -> /b: permission denied",
        ),
        (
            UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
            exit_codes.CONFIG,
            "an input is not what was expected (UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: "
            "invalid start byte)",
        ),
        (
            json.JSONDecodeError("Expecting value", "x", 0),
            exit_codes.CONFIG,
            "an input is not what was expected (JSONDecodeError: Expecting value: line 1 column 1 (char 0))",
        ),
    ],
    ids=[
        "storage",
        "disk",
        "damaged",
        "enoent",
        "eisdir",
        "eloop",
        "two-files",
        "not-utf8",
        "not-json",
    ],
)
def test_a_tool_answers_each_error_with_its_code_and_message(error, code, message):
    assert exit_for(error) == (code, message)


def test_object_storage_that_refuses_is_bad_input_and_one_that_does_not_answer_is_exit_7():
    from botocore.exceptions import ClientError, EndpointConnectionError

    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "GetObject")
    assert exit_for(denied) == (exit_codes.CONFIG, f"object storage refused a request: {denied}")
    away = EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
    assert exit_for(away) == (
        exit_codes.STORAGE,
        f"a server did not answer: {away}. Rerun the same command once it answers",
    )
    busy = ClientError({"Error": {"Code": "503"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "GetObject")
    assert exit_for(busy)[0] == exit_codes.STORAGE


def test_an_error_gcc_does_not_know_keeps_its_traceback():
    assert exit_for(KeyError("x")) is None and exit_for(RuntimeError("boom")) is None
    # the trainer's inputs were checked before its start: another library's OSError there is not bad input
    assert exit_for(FileNotFoundError(errno.ENOENT, "gone", "/x"), foreign_input=False) is None


def test_the_message_of_a_dataloader_worker_is_its_own_line():
    wrapped = DamagedData(
        "Caught DamagedData in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\ngcc.errors.DamagedData: /d/train/shard.00003.mds: failed xxh64 check\n'
    )
    assert exit_for(wrapped) == (exit_codes.DATA, "damaged data: /d/train/shard.00003.mds: failed xxh64 check")


def test_the_trainer_stops_on_a_fault_with_its_own_words(tmp_path):
    from gcc.sampling.vae import VaeError
    from gcc.training.trainer import as_fault

    resumes = ": it resumes from the last complete checkpoint"
    assert as_fault(StorageUnavailable("s3://b/o"), str(tmp_path)) == (
        exit_codes.STORAGE,
        f"storage unavailable: s3://b/o. Relaunch the same command once the store answers{resumes}",
    )
    assert as_fault(DiskFull("no space"), str(tmp_path)) == (
        exit_codes.DISK,
        f"disk full: no space. Free space there and relaunch the same command{resumes}",
    )
    full = as_fault(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x")), str(tmp_path))
    assert full is not None and full[0] == exit_codes.DISK and f"under {tmp_path}" in full[1], full
    assert as_fault(DamagedData("/d/s.mds: cut short"), str(tmp_path)) == (
        exit_codes.DATA,
        "damaged data: /d/s.mds: cut short",
    )
    assert as_fault(VaeError("/v.pth: not a VAE"), str(tmp_path)) == (
        exit_codes.CONFIG,
        "model.vae_path: /v.pth: not a VAE",
    )
    # not a fault of the run: a traceback (or a peer's fault), as before
    assert as_fault(FileNotFoundError(errno.ENOENT, "gone", "/x"), str(tmp_path)) is None
    assert as_fault(RuntimeError("Connection closed by peer"), str(tmp_path)) is None


def test_data_the_launch_cannot_parse_is_refused_naming_it(tmp_path, monkeypatch):
    """The one place the launch reads data before training turns the reader's BadInput into a Refusal (exit 3)
    with the reader's message; BadInput itself is exit 2 everywhere."""
    from gcc.training import run_start as launch
    from gcc.training.config import TrainConfig

    cfg = TrainConfig(run_dir=str(tmp_path / "run"))
    cfg.data.path = str(tmp_path / "data")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    with pytest.raises(launch.Refusal, match="manifest.json") as e:
        launch.prepare_run(cfg, launch.RunLock(Path(cfg.run_dir)))
    assert exit_for(e.value)[0] == exit_codes.REFUSED


def _documented_codes() -> dict[int, str]:
    text = (ROOT / "docs" / "training.md").read_text()
    section = text.split("### Exit codes", 1)[1].split("\n#", 1)[0]
    return {int(m[1]): m[2] for m in re.finditer(r"^\| (\d+) \| ([^|]+) \|", section, re.M)}


def test_the_docs_table_lists_every_exit_code():
    codes = {v for k, v in vars(exit_codes).items() if k.isupper() and isinstance(v, int)}
    assert set(_documented_codes()) == codes


def test_no_module_names_an_exit_code_under_another_name():
    """Every module says `exit_codes.X` (or an error's `exit_code`): an alias such as `EXIT_DISK = exit_codes.DISK`
    (a module's name for a code), or a code imported bare, is a second name to keep in step."""
    aliases = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in sorted((ROOT / "gcc").rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bEXIT_[A-Z_]+\b|^from gcc\.exit_codes import", line)
        or re.match(r"\w[\w, ]*=\s*\(?\s*exit_codes\.", line)
    ]
    assert not aliases, aliases


def test_the_launch_states_its_verdict_before_any_work_in_one_line():
    from gcc.errors import launch_verdict
    from gcc.training.config import ConfigError

    assert launch_verdict(ConfigError("seed: must be in [0, 2**32), got -1")) == (
        exit_codes.CONFIG,
        "config error: seed: must be in [0, 2**32), got -1",
    )
    assert launch_verdict(BadInput("AWS_MAX_ATTEMPTS: expected an integer")) == (
        exit_codes.CONFIG,
        "config error: AWS_MAX_ATTEMPTS: expected an integer",
    )
    assert launch_verdict(Refusal("runs/x is locked by pid 7")) == (
        exit_codes.REFUSED,
        "refused: runs/x is locked by pid 7",
    )
    code, line = launch_verdict(StorageUnavailable("s3://b/manifest.json"))
    assert code == exit_codes.STORAGE and line.startswith("storage unavailable: s3://b/manifest.json. Relaunch")
    with pytest.raises(KeyError):  # a bug keeps its traceback
        launch_verdict(KeyError("a bug"))
