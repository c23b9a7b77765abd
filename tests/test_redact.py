"""Secrets never leave (docs/training.md, "Trust and safety"): what config.json keeps (`redact`), every log line
and its traceback (`RedactingFilter`, the record factory that `redact.install` sets), and Python's own report of an
uncaught error in any thread of a tool or a rank (the excepthooks `redact.install` sets)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gcc.redact import MASK, redact, redact_text
from gcc.training.console import configure_logging, open_run_log

ROOT = Path(__file__).resolve().parents[1]


def test_config_json_keeps_no_sig_auth_pwd_bearer_or_key():
    """config.json is `redact(asdict(cfg))` (gcc/training/builders.py resolved_config): a presigned URL's sig= and
    auth=, and keys named pwd, bearer or ending in key (wandb_key) were kept as written."""
    tree = {
        "loggers": {
            "mlflow": {
                "tracking_uri": "https://mlflow.example/p?sig=SIGVALUE&auth=AUTHVALUE&experiment=7",
                "tags": {"pwd": "PWDVALUE", "bearer": "BEARERVALUE", "wandb_key": "WANDBVALUE", "team": "vision"},
            }
        },
        "data": {"path": "s3://bucket/p"},
    }
    text = json.dumps(redact(tree))
    for secret in ("SIGVALUE", "AUTHVALUE", "PWDVALUE", "BEARERVALUE", "WANDBVALUE"):
        assert secret not in text, text
    assert "experiment=7" in text and "vision" in text and "s3://bucket/p" in text  # the rest is kept


@pytest.mark.parametrize(
    "line, kept",
    [
        ("GET https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIDX%2F2024&X-Amz-Signature=f00d", "b.s3.amazonaws.com/k"),
        ("header X-Amz-Credential=AKIDX/20240101/us-east-1/s3/aws4_request, SignedHeaders=host", "SignedHeaders=host"),
        ("Authorization: Bearer xyzTOKEN", "Authorization: Bearer"),
        ("{'Authorization': 'Bearer xyzTOKEN'}", "Authorization"),
        ('Invalid bucket name "AKIDX:SECRETVALUE@bucket": Bucket name must match', "@bucket"),
        ("s3://AKIDX:SECRET/VALUE@bucket/p", "@bucket/p"),  # a '/' in the secret, as AWS's may have
        ("http://alice:PASSWORD@mlflow:5000/api", "mlflow:5000/api"),
        ("https://h/x?sig=SIGVALUE&auth=AUTHVALUE&n=2", "n=2"),
        ("loggers.wandb.api_key=KEYVALUE wandb_key=KEYVALUE pwd=PWDVALUE", "loggers.wandb.api_key="),
        ("argv: --wandb_key=KEYVALUE --n 2", "--n 2"),
    ],
)
def test_redact_text_masks_presigned_urls_headers_and_bare_user_info(line, kept):
    masked = redact_text(line)
    for secret in ("AKIDX", "f00d", "xyzTOKEN", "SECRET", "VALUE", "PASSWORD", "alice"):
        assert secret not in masked, masked
    assert kept in masked and MASK in masked, masked


@pytest.mark.parametrize(
    "line",
    [
        "global_train_batch_size=16 is not a multiple of device_train_microbatch_size=3",
        "override 'seed': expected dotted.key=value",
        "sample_sigma=0.5 design=3 at 12:30 for user@example.com",
        "the bearer of this run folder",
        'token="" n=1',  # an empty value: nothing to hide
        "{'token': '', 'name': 'run7'}",  # and a pair whose name is no credential's
    ],
)
def test_redact_text_keeps_lines_without_credentials(line):
    assert redact_text(line) == line


@pytest.mark.parametrize(
    "line, masked",
    [
        ('Invalid bucket name "AKIDX:SECRETVALUE@bucket"', 'Invalid bucket name "***@bucket"'),  # up to the @
        ("auth=, pwd=PWDVALUE", "auth=, pwd=***"),  # a name without a value does not end the search
        ("?sig=s3://,u:p@h", "?sig=***@h"),  # two credentials side by side are one mask
    ],
)
def test_redact_text_masks_exactly_the_credential(line, masked):
    assert redact_text(line) == masked


def test_a_piece_of_a_line_masks_only_what_runs_into_it():
    """`redact_span` (a long line written in pieces): a credential that ends where the piece begins, or begins
    where it ends, is no part of it."""
    from gcc.redact import redact_span

    line = "token=SECRET rest"
    assert redact_span(line, 0, 6) == "token=" and redact_span(line, 12, len(line)) == " rest"
    assert redact_span(line, 0, 9) == "token=***" and redact_span(line, 9, len(line)) == "*** rest"


def _secret_error() -> BaseException:
    try:
        raise RuntimeError("API request to http://alice:PASSWORD@mlflow:5000/api failed")
    except RuntimeError as e:
        return e


def test_a_traceback_logged_with_exc_info_is_masked_on_the_console_and_in_train_log(tmp_path, capsys, in_process):
    """The trainer logs a rank's traceback to train.log with exc_info (gcc/training/trainer.py): the filter masked
    the message only, the exception's text (an MLflow URL with its password) went out as it was."""
    configure_logging("INFO", 0)
    log = open_run_log(tmp_path / "run", 0, 1)
    logger = logging.getLogger("gcc.test_redact")
    e = _secret_error()
    logger.error("stopped on an unexpected error", exc_info=(type(e), e, e.__traceback__))
    logger.warning("a stack %s", "http://alice:PASSWORD@mlflow/", stack_info=True)  # this line is in the stack
    logging.getLogger("gcc").handlers[-1].flush()
    err = capsys.readouterr().err
    written = log.read_text()
    for text in (err, written):
        assert "PASSWORD" not in text and "alice" not in text, text
        assert "RuntimeError: API request to http://***@mlflow:5000/api failed" in text, text
        assert "Traceback (most recent call last)" in text, text  # the traceback itself is kept, masked
        assert "Stack (most recent call last)" in text, text  # and the stack


@pytest.fixture
def fresh_process_hooks(monkeypatch):
    """What `redact.install` replaces, as a process starts (logging's own record factory: an earlier test of the
    worker may have installed gcc's), and put back after the test."""
    import threading
    import warnings

    for owner, name in ((sys, "excepthook"), (threading, "excepthook"), (warnings, "formatwarning")):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(logging.LogRecord)
    yield
    logging.setLogRecordFactory(factory)


def test_every_logger_of_a_process_is_masked_once_installed(capsys, in_process, fresh_process_hooks):
    """A library's own logger and handler (MLflow's, botocore's) bypass gcc's handlers: the record factory that
    `redact.install` sets masks every record as it is made."""
    from gcc import redact

    redact.install()
    lib = logging.getLogger("some_library.test_redact")
    handler = logging.StreamHandler(sys.stderr)
    lib.addHandler(handler)
    try:
        e = _secret_error()
        lib.error("request to %s", "s3://AKIDX:SECRET@bucket/p", exc_info=(type(e), e, e.__traceback__))
    finally:
        lib.removeHandler(handler)
    err = capsys.readouterr().err
    assert "SECRET" not in err and "PASSWORD" not in err and "s3://***@bucket/p" in err, err


SCRIPT = """
import threading
from gcc.cli import run_tool

def bug():
    raise RuntimeError("s3://AKIDX:SECRETVALUE@bucket/p")

def body():
    t = threading.Thread(target=bug, name="worker")
    t.start()
    t.join()
    bug()

run_tool("gcc-tool", body)
"""


def test_uncaught_errors_of_every_thread_are_reported_masked():
    """A tool's bug keeps its traceback (gcc/cli.py), in the main thread and in another, but masked: Python's own
    report printed the URL's secret. The process is the point: the report is the interpreter's, at its end."""
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 1, r.stderr
    assert "SECRETVALUE" not in r.stderr and "AKIDX" not in r.stderr, r.stderr
    assert "Exception in thread worker:" in r.stderr and r.stderr.count("RuntimeError: s3://***@bucket/p") == 2, (
        r.stderr
    )


def test_install_masks_both_excepthooks_and_warnings_in_process_and_wraps_once(capsys, fresh_process_hooks):
    """The hooks that `redact.install` sets, called as Python calls them (the launched processes of the test above
    are beyond mutation testing's reach): each report is masked and keeps its words; a second install (a tool run
    inside a rank) wraps nothing twice."""
    import threading
    import warnings

    from gcc import redact

    redact.install()
    installed = (logging.getLogRecordFactory(), sys.excepthook, threading.excepthook, warnings.formatwarning)
    redact.install()
    again = (logging.getLogRecordFactory(), sys.excepthook, threading.excepthook, warnings.formatwarning)
    # a record made the way a library may make one, by keywords
    record = logging.getLogRecordFactory()(
        name="lib", level=logging.INFO, pathname="lib.py", lineno=3, msg="token=TOKENVALUE n=%d", args=(2,),
        exc_info=None, func="f", sinfo=None,
    )  # fmt: skip
    assert again == installed and installed[0] is not logging.LogRecord
    assert record.getMessage() == "token=*** n=2" and record.lineno == 3

    e = _secret_error()
    sys.excepthook(type(e), e, e.__traceback__)
    worker = threading.Thread(target=lambda: None, name="worker")
    threading.excepthook(threading.ExceptHookArgs([type(e), e, e.__traceback__, worker]))
    threading.excepthook(threading.ExceptHookArgs([SystemExit, SystemExit(3), None, worker]))  # threading's silence
    err = capsys.readouterr().err
    assert "PASSWORD" not in err and "alice" not in err, err
    assert err.count("RuntimeError: API request to http://***@mlflow:5000/api failed") == 2, err
    assert err.count("Traceback (most recent call last):\n  File ") == 2, err  # the lines as Python writes them
    assert "Exception in thread worker:\nTraceback" in err and "SystemExit" not in err, err
    threading.excepthook(threading.ExceptHookArgs([type(e), e, e.__traceback__, None]))  # a thread already gone
    assert capsys.readouterr().err.startswith(f"Exception in thread {threading.get_ident()}:\nTraceback")

    text = warnings.formatwarning("fetch s3://AKIDX:SECRET@bucket/p", UserWarning, "lib.py", 7, line="call(key)")
    assert text == "lib.py:7: UserWarning: fetch s3://***@bucket/p\n  call(key)\n", text


def test_a_record_whose_arguments_do_not_fit_its_format_is_masked_whole():
    from gcc.redact import redact_record

    record = logging.LogRecord("lib", logging.INFO, "lib.py", 1, "n=%d for %s", ("token=TOKENVALUE",), None)
    redact_record(record)
    assert record.getMessage() == "n=%d for %s ('token=***',)", record.getMessage()


def test_redact_copies_lists_and_tuples_and_keeps_what_is_no_credential():
    tree = {
        "urls": ["http://alice:PASSWORD@h/x", ("token=TOKENVALUE", 3)],
        "api_key": "",  # an empty value: nothing to hide, and its absence stays visible
        "auth_token": None,
        "wandb_key": "KEYVALUE",
    }
    assert redact(tree) == {
        "urls": ["http://***@h/x", ("token=***", 3)],
        "api_key": "",
        "auth_token": None,
        "wandb_key": MASK,
    }


def test_secret_keys_names_each_credential_by_its_dotted_path():
    """gcc/training/entry.py warns with these names; an unset credential (None, "") is not named."""
    from gcc.redact import secret_keys

    tree = {
        "loggers": [{"wandb": {"api_key": "KEYVALUE", "token": ""}}, ("plain", "https://u:PASSWORD@h")],
        "env": {"URL_X": "http://u:PASSWORD@h"},
        "password": None,
        "n": 3,
    }
    assert secret_keys(tree) == ["loggers.0.wandb.api_key", "loggers.1.1", "env.URL_X"]
    assert secret_keys({"a": "token=T"}, "cfg.") == ["cfg.a"] and secret_keys("plain") == []
