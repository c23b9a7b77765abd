"""Secrets never reach a file or a log (docs/training.md, "Trust and safety").

A yaml may carry credentials: a W&B `api_key`, an MLflow `tracking_uri` with a token in its user info
(`https://user:token@host`), a `?token=...` in a URL. `redact` returns a copy of a config tree with the values of
credential-like keys replaced and the user info and credential query values of every URI masked; `redact_text`
masks them in one string. config.json, run.json, export metadata and every log line go through them.
"""

from __future__ import annotations

import logging
import re
from typing import Any

MASK = "***"
# a key whose value is a credential: api_key, access_key_id, secret_access_key, token, password, auth_token, ...
SECRET_KEY = re.compile(
    r"(^|[_.-])(api[_-]?key|access[_-]?key([_-]?id)?|secret([_-]?(access[_-]?)?key)?|"
    r"private[_-]?key|(auth[_-]?)?token|password|passwd|credentials?|auth)($|[_.-])",
    re.I,
)
# scheme://user[:password]@ -> scheme://***@
USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]+@")
# ?token=... / &api_key=... in a URL
SECRET_QUERY = re.compile(r"([?&][^=&\s]*(?:token|key|secret|password|signature|credential)[^=&\s]*=)[^&#\s]+", re.I)


def is_secret_key(key: object) -> bool:
    return isinstance(key, str) and bool(SECRET_KEY.search(key))


def redact_text(text: str) -> str:
    return SECRET_QUERY.sub(rf"\1{MASK}", USERINFO.sub(rf"\1{MASK}@", text))


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


class RedactingFilter(logging.Filter):
    """Masks credentials in a record's final message (its arguments included) before any handler writes it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True
