"""Secrets never reach a file or a log (docs/training.md, "Trust and safety").

A yaml may carry credentials: a W&B `api_key`, an MLflow `tracking_uri` with a token in its user info
(`https://user:token@host`), a `?sig=...` in a presigned URL. `redact` returns a copy of a config tree with the
values of credential-like keys replaced and the user info and credential query values of every URI masked;
`redact_text` masks them in one string. config.json, run.json, export metadata and every log line go through them.

`install` puts `redact_text` between every line a process logs or a traceback it prints and the stream: every
`logging` record (its message, its traceback and its stack, whatever logger and handler), Python's own traceback
of an uncaught error in the main thread or another, and warnings. Every rank (gcc/training/entry.py) and every
tool (gcc/cli.py `run_tool`) installs it first.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

from gcc.inputs import printable

MASK = "***"
# the words that make a key's value a credential, as one part of the key (api_key, aws.secret, auth_token, ...)
_WORDS = (
    r"api[_-]?key|access[_-]?key([_-]?id)?|secret([_-]?(access[_-]?)?key)?|private[_-]?key|(auth[_-]?)?token|"
    r"password|passwd|pwd|bearer|credentials?|auth"
)
# a key whose value is a credential: one of the words as a part of it, or any key ending in `key` (wandb_key)
SECRET_KEY = re.compile(rf"(^|[_.-])({_WORDS})($|[_.-])|key$", re.I)
# in text and URLs only (a config tree has a run `signature`, which is not a secret): presigned URLs' `sig=`,
# `X-Amz-Signature=`, `X-Amz-Credential=`; a name ending in key or token (wandb_key=, apikey=), not a key path's
# last part alone (`dotted.key=value` in a usage line)
_TEXT_KEY = re.compile(rf"(^|[_.-])({_WORDS}|sig|signature)($|[_.-])|(?<=[A-Za-z0-9_-])(key|token)$", re.I)
# Every pattern is linear in its text: a match starts only where a name can (a lookbehind: at the start of a run of
# the characters it is made of), and what it may scan from there is bounded where it could run on (a scheme, a
# user:password), so that a line of 64 KiB of hostile text costs milliseconds, not minutes (gcc/training/
# output_capture.py masks every line a rank prints).
CREDENTIAL_MAX = 1024  # the longest user:password of a URL that is masked (longer ones are no credential)
# scheme://user[:password]@ -> scheme://***@; a password may hold a '/' (an AWS secret key does): with a ':' in
# the authority, everything up to the '@'
USERINFO = re.compile(
    rf"(\b[A-Za-z][A-Za-z0-9+.-]{{0,31}}://)(?:[^/?#@\s]{{1,{CREDENTIAL_MAX}}}|[^/?#@\s:]{{0,{CREDENTIAL_MAX}}}:"
    rf"[^@\s]{{0,{CREDENTIAL_MAX}}})@"
)
# user:password@host without a scheme (botocore echoes an s3:// URL's bucket so: 'KEY:SECRET@bucket')
BARE_USERINFO = re.compile(
    rf"(?<![\w.~%+:/-])[\w.~%+-]{{1,{CREDENTIAL_MAX}}}:(?!//)[^\s@'\"]{{0,{CREDENTIAL_MAX}}}@(?=[\w-])"
)
# a name and what joins it to its value: name=value, name = value, name: value (a URL's query ?sig=..., free text,
# an environment or a yaml line, --name=value) and --name value (a command line); a credential's value (_TEXT_KEY
# names it) follows, bare or quoted (VALUE)
KEY_VALUE = re.compile(r"(?<![\w.-])-{0,2}(?P<key>[A-Za-z_][\w.-]*)[ \t]*(?:=|:(?!//))[ \t]*")
FLAG_VALUE = re.compile(r"(?<![\w-])--?(?P<key>[A-Za-z][\w-]*)[ \t]+(?=[^\s-])")
VALUE = re.compile(r""""(?P<dq>[^"\n]*)"|'(?P<sq>[^'\n]*)'|(?P<bare>[^\s&#,;'"]+)""")
# 'name': 'value' and "name": "value" (a dict's repr, JSON)
QUOTED_PAIR = re.compile(r"""(['"])([\w.-]+)\1([ \t]*:[ \t]*)(['"])(.*?)\4""")
# an Authorization header's credentials, and a bearer token wherever it is written (the scheme's own spelling,
# so that "the bearer of" stays)
AUTHORIZATION = re.compile(r"""(\bauthorization['"]?\s*[:=]\s*['"]?(?:[A-Za-z][\w-]*\s+)?)[^\s'",}]+""", re.I)
BEARER = re.compile(r"(\b(?:Bearer|BEARER)\s+)[A-Za-z0-9._~+/=-]+")


def is_secret_key(key: object) -> bool:
    return isinstance(key, str) and bool(SECRET_KEY.search(key))


def _named_values(pattern: re.Pattern, text: str) -> Iterator[tuple[int, int]]:
    """The spans of the values that follow a credential's name (`pattern`: KEY_VALUE or FLAG_VALUE). The search goes
    on after each name, not after its value: a value may hold the next name (`argv: --api_key=...`); a name inside a
    value already masked is skipped (so that `token=token=...` is read once)."""
    masked_to = 0
    for m in pattern.finditer(text):
        if m.start() < masked_to or not _TEXT_KEY.search(m["key"]):
            continue
        v = VALUE.match(text, m.end())
        if v is None:
            continue
        group = next(g for g in ("dq", "sq", "bare") if v[g] is not None)
        if v[group] not in ("", MASK):
            yield v.span(group)
            masked_to = v.end()


def secret_spans(text: str) -> list[tuple[int, int]]:
    """The spans of `text` that are credentials (what `redact_text` replaces by MASK), in order, none overlapping:
    every pattern above is matched on the same text, so a span does not depend on what another one masked."""
    found = [(m.end(1), m.end() - 1) for m in USERINFO.finditer(text)]
    found += [(m.start(), m.end() - 1) for m in BARE_USERINFO.finditer(text)]
    found += [*_named_values(KEY_VALUE, text), *_named_values(FLAG_VALUE, text)]
    found += [m.span(5) for m in QUOTED_PAIR.finditer(text) if _TEXT_KEY.search(m[2]) and m[5] not in ("", MASK)]
    found += [(m.end(1), m.end()) for pattern in (AUTHORIZATION, BEARER) for m in pattern.finditer(text)]
    merged: list[tuple[int, int]] = []
    for start, end in sorted(span for span in found if text[span[0] : span[1]] != MASK):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def redact_span(text: str, start: int, end: int) -> str:
    """`text[start:end]` with its credentials masked, found in the whole of `text`: a credential that begins before
    `start` or runs on past `end` is masked in this part too (a long line written in pieces, gcc/training/
    output_capture.py: each piece is masked with the line around it)."""
    out, at = [], start
    for s, e in secret_spans(text):
        if e > start and s < end:
            out += [text[at : max(s, start)], MASK]
            at = min(e, end)
    out.append(text[at:end])
    return "".join(out)


def redact_text(text: str) -> str:
    return redact_span(text, 0, len(text))


def redact(obj: Any) -> Any:
    """A copy of `obj` (dicts, lists, strings, scalars) with credentials masked."""
    if isinstance(obj, dict):
        return {k: (MASK if is_secret_key(k) and v not in (None, "") else redact(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(v) for v in obj)
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def secret_keys(obj: Any, prefix: str = "") -> list[str]:
    """The dotted keys of `obj` whose values `redact` masks (a credential written into a config)."""
    if isinstance(obj, dict):
        return [
            k
            for key, v in obj.items()
            for k in (
                [f"{prefix}{key}"] if is_secret_key(key) and v not in (None, "") else secret_keys(v, f"{prefix}{key}.")
            )
        ]
    if isinstance(obj, (list, tuple)):
        return [k for i, v in enumerate(obj) for k in secret_keys(v, f"{prefix}{i}.")]
    return [prefix.rstrip(".")] if isinstance(obj, str) and redact_text(obj) != obj else []


_TRACEBACKS = logging.Formatter()


def redact_record(record: logging.LogRecord) -> logging.LogRecord:
    """Mask `record` in place: its final message (its arguments included), its traceback and its stack. The
    traceback is formatted here, once, into `exc_text`, and `exc_info` dropped, so that no formatter prints the
    exception unmasked."""
    try:
        message = record.getMessage()
    except Exception:  # arguments that do not fit the format: logging would print both in its error report
        message = f"{record.msg} {record.args}"
    masked = printable(redact_text(message))  # a name from outside cannot rewrite the console's line either
    if masked != message:
        record.msg, record.args = masked, None
    if record.exc_info:
        if not record.exc_text:
            record.exc_text = _TRACEBACKS.formatException(record.exc_info)
        record.exc_info = None
    if record.exc_text:
        record.exc_text = redact_text(record.exc_text)
    if record.stack_info:
        record.stack_info = redact_text(record.stack_info)
    return record


class RedactingFilter(logging.Filter):
    """Masks credentials in a record (`redact_record`) before any handler writes it."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


def _excepthook(exc_type, exc, tb) -> None:
    """Python's report of an uncaught error, masked."""
    sys.stderr.write(redact_text("".join(traceback.format_exception(exc_type, exc, tb))))
    sys.stderr.flush()


def _thread_excepthook(args) -> None:
    """threading's report of a thread's uncaught error (its default's words), masked."""
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else threading.get_ident()
    text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
    sys.stderr.write(redact_text(f"Exception in thread {name}:\n{text}"))
    sys.stderr.flush()


def install() -> None:
    """Mask every line this process logs or reports (module docstring): each logging record as it is made,
    the main thread's and other threads' uncaught errors, warnings. Idempotent."""
    factory = logging.getLogRecordFactory()
    if not getattr(factory, "redacting", False):

        def make_record(*args, **kwargs) -> logging.LogRecord:
            return redact_record(factory(*args, **kwargs))

        make_record.redacting = True  # type: ignore[attr-defined]  # a marker: mypy has no function attributes
        logging.setLogRecordFactory(make_record)
    sys.excepthook = _excepthook
    threading.excepthook = _thread_excepthook
    if not getattr(warnings.formatwarning, "redacting", False):
        formatwarning = warnings.formatwarning

        def masked_warning(*args, **kwargs) -> str:
            return redact_text(formatwarning(*args, **kwargs))

        masked_warning.redacting = True  # type: ignore[attr-defined]  # a marker: mypy has no function attributes
        warnings.formatwarning = masked_warning
