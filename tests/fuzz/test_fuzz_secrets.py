"""Secrets in every form gcc masks (docs/training.md, "Trust and safety"), generated: `name=value`, `name = value`,
`name: value`, quoted or bare, `--name value`, `--name=value`, JSON and Python pairs, URL user info, a presigned
URL's query, an Authorization header; under the usual credential names; at every length; inside a line of any
length, so that train.log's cut at 64 KiB (gcc/training/output_capture.py `LogLines`) runs through the secret at
every offset, the line fed in chunks of any size; and in any tool's own argument errors. No piece of a secret ever
reaches the output.

A secret is drawn from an alphabet (digits, Q Z J V, + / = ~) that neither the filler text nor the names use, so
that any run of 8 of its characters in the output is a piece of it."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest
from hostile import assert_clean, examples, run_entry
from hypothesis import given
from hypothesis import strategies as st

from gcc.redact import MASK, redact_text
from gcc.training.output_capture import CONTEXT, MAX_LINE, LogLines

SECRET_CHARS = "0123456789QZJV+/=~"
NAMES = [
    "AWS_SECRET_ACCESS_KEY",
    "aws_access_key_id",
    "api_key",
    "apikey",
    "x-api-key",
    "WANDB_API_KEY",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_PASSWORD",
    "HF_TOKEN",
    "token",
    "auth_token",
    "password",
    "passwd",
    "pwd",
    "secret",
    "client_secret",
    "private_key",
    "credentials",
]
# each form of a secret `s` under a credential's name `n`
FORMS = [
    "{n}={s}",
    "{n} = {s}",
    "{n}: {s}",
    '{n}: "{s}"',
    "{n}='{s}'",
    "--{n} {s}",
    "--{n}={s}",
    '"{n}": "{s}"',
    "'{n}': '{s}'",
    "export {n}={s}",
    "https://alice:{s}@mlflow.example:5000/api",
    "s3://AKIDEXAMPLE:{s}@bucket/prefix",
    "https://bucket.s3.amazonaws.com/k?X-Amz-Signature={s}&n=2",
    "GET /p?sig={s}&expires=1",
    "Authorization: Bearer {s}",
]
secrets = st.builds(lambda tail: "QZ" + tail, st.text(SECRET_CHARS, min_size=0, max_size=3000))
filler = st.text("abcdefghijklmnopqrstuvwxy ,.()", max_size=80)


def leaked(text: str, secret: str) -> list[str]:
    """The runs of 8 or more secret characters in `text` that are pieces of `secret`."""
    return [run for run in re.findall(rf"[{re.escape(SECRET_CHARS)}]{{8,}}", text) if run in secret]


def line_of(form: str, name: str, secret: str) -> str:
    user_info = "@" in form and "://" in form
    return form.format(n=name, s=secret[:1000] if user_info else secret)  # a URL's user info: at most 1 KiB


@examples(300)
@given(form=st.sampled_from(FORMS), name=st.sampled_from(NAMES), secret=secrets, before=filler, after=filler)
def test_a_secret_in_any_form_and_of_any_length_is_masked(form, name, secret, before, after):
    text = f"{before} {line_of(form, name, secret)} {after}"
    masked = redact_text(text)
    assert not leaked(masked, secret), masked[:500]
    assert redact_text(masked) == masked  # masking what is masked changes nothing


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("secrets")


@examples(150)
@given(
    form=st.sampled_from(FORMS),
    name=st.sampled_from(NAMES),
    secret=secrets,
    # where the line's first cut falls, from before the secret's form to past its end
    offset=st.integers(-80, 3200),
    # a line longer than the writer holds before it cuts (MAX_LINE + CONTEXT), or ended by a newline before
    longer=st.booleans(),
    chunk=st.one_of(st.integers(1, 64), st.integers(4096, 70_000)),
    final=st.booleans(),
)
def test_a_secret_that_train_logs_cut_runs_through_is_masked_on_both_sides(
    scratch, form, name, secret, offset, longer, chunk, final
):
    """A line longer than 64 KiB is written in pieces; the cut falls anywhere in the secret's form (its name, its
    separator, its value), and each piece is masked with the line around it: no piece of the secret is written."""
    pad = MAX_LINE - offset
    tail = "y" * (CONTEXT + MAX_LINE if longer else 10)
    line = "x" * pad + " " + line_of(form, name, secret) + " " + tail
    fd, path = tempfile.mkstemp(dir=scratch)
    lines = LogLines(fd, "rank 0 stdout")
    data = (line + ("" if final else "\n")).encode()
    for i in range(0, len(data), chunk):
        lines.feed(data[i : i + chunk])
    lines.feed(b"", final=True)
    os.close(fd)
    written = Path(path).read_text()
    os.unlink(path)
    assert not leaked(written, secret), [run[:80] for run in leaked(written, secret)]
    pieces = [ln.split(": ", 1)[1] for ln in written.splitlines()]
    assert all(len(p.replace(MASK, "")) <= MAX_LINE for p in pieces), [len(p) for p in pieces]  # cut at 64 KiB
    assert written.count("x") == line.count("x") and written.count("y") == line.count("y")  # the rest, whole


PROGS = [
    "gcc.train",
    "convert_data",
    "gcc-synth",
    "gcc-inspect",
    "gcc-plot",
    "gcc-compare",
    "gcc-maskstats",
    "gcc-sample",
]


@examples(40)
@given(
    prog=st.sampled_from(PROGS),
    form=st.sampled_from(["--{n} {s}", "--{n}={s}", "{n}={s}", "--{n}:{s}"]),
    name=st.sampled_from(NAMES),
    secret=secrets.map(lambda s: s[:200]),
    control=st.sampled_from(["", "\x1b[2J", "\r", "\x07"]),
)
def test_every_tools_argument_errors_are_masked_and_escaped(prog, form, name, secret, control):
    """An argument a tool does not take, quoted back by argparse's own error: one line, masked, escaped."""
    argv = [*line_of(form, name, secret).split(" ", 1), f"x{control}"]
    o = run_entry(prog, argv)
    assert_clean(o)
    assert not leaked(o.out + o.err, secret), o
