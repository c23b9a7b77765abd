"""How every entry point answers bad input (docs/training.md, "Tools"): exit 2 and one line
`<prog>: error: <message>` on stderr, argparse's own convention (`parser.error`), that names the input (a file,
a flag, a key) and says what was expected; never a traceback.

Input is checked where it is read, and a failure is converted there into `gcc.errors.BadInput` naming the
file. `run_tool` is the net around a tool's body: an error gets the code and message of `gcc.errors.exit_for`,
the trainer's too (an OSError names its file; a non-UTF-8 or non-JSON input that no reader caught still gives
a message; damaged data exits 6, object storage that does not answer 7 and a full disk 8). Anything else is a
bug and keeps its traceback.

Every tool's command line is a `ToolParser` (docs/training.md, "Tools"): one flag vocabulary (`VOCABULARY`),
defaults shown in `--help`, the vocabulary in every epilog, and a tool's old flag spellings accepted with one
warning line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from gcc import exit_codes, redact
from gcc.errors import BadInput, exit_for
from gcc.inputs import parse_int, printable, shown
from gcc.redact import redact_text
from gcc.storage import userinfo_problem


def fail(prog: str, message: str, code: int = exit_codes.CONFIG) -> int:
    # a URL's credentials masked, a control character from outside escaped
    print(f"{prog}: error: {printable(redact_text(message))}", file=sys.stderr, flush=True)
    return code


def _file_in_the_way(p: Path) -> Path | None:
    """`p` or the nearest existing folder above it, when that is not a folder."""
    for q in (p, *p.parents):
        if q.exists():
            return None if q.is_dir() else q
    return None


def folder_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be (or become) a folder to write into: it, or a folder above it, is a file; it is a URL
    with credentials in it (`gcc.storage.userinfo_problem`, as for each of these checks). None if it can."""
    if problem := userinfo_problem(str(path)):
        return problem
    p = Path(path)
    blocker = _file_in_the_way(p)
    if blocker is None:
        return None
    return "is a file, expected a folder" if blocker == p else f"{blocker} is a file, expected a folder"


def file_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be written as a file: it is a folder, or a folder above it is a file. None if it can."""
    if problem := userinfo_problem(str(path)):
        return problem
    p = Path(path)
    if p.is_dir():
        return "is a folder, expected a file name"
    blocker = _file_in_the_way(p.parent)
    return f"{blocker} is a file, expected a folder" if blocker is not None else None


def input_file_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be read as a file: missing, or a folder. None if it can."""
    if problem := userinfo_problem(str(path)):
        return problem
    p = Path(path)
    if not p.exists():
        return "not found"
    if p.is_dir():
        return "is a folder, expected a file"
    return None


def run_tool(prog: str, body: Callable[[], int]) -> int:
    """`body()`'s exit code, or the code and message of the error it raised (module docstring). Every line the
    tool logs or reports from here on, a traceback included, has its credentials masked (gcc/redact.py)."""
    redact.install()
    try:
        return body()
    except Exception as e:
        verdict = exit_for(e)
        if verdict is None:
            raise
        return fail(prog, verdict[1], verdict[0])


# The words every tool uses for the same thing (docs/training.md, "Tools"; tests/test_cli.py holds every tool to
# them). Words are joined by underscores, as in Composer's launcher (--nproc, --master_port) and llm-foundry's
# scripts (--out_root); the dashed spelling of any flag (--no-progress) is accepted silently.
VOCABULARY = {
    "--data": "the input data: a prepared root or a converted shards folder",
    "--out": "the main output (a folder or a file)",
    "--n": "a count of clips",
    "--seed": "the seed of everything drawn at random (same seed, same result)",
    "--workers": "data processes on this machine",
    "--nproc": "training processes (Composer's launcher's --nproc)",
    "--model": "a model preset (ti2v-5b, wide, tiny, tiny-p1)",
    "--vocab": "the semantic condition's vocabulary (parts, ids)",
    "--no_progress": "no progress bar",
    "--verbose": "a line per item as it is done",
}


def vocabulary_epilog(flags: Sequence[str]) -> str:
    """The closing lines of every --help: the shared words among `flags` (a tool's), then the conventions."""
    shared = [f"  {flag:<15}{VOCABULARY[flag]}" for flag in VOCABULARY if flag in flags]
    return "\n".join(
        [
            *(["flags with the same meaning in every gcc tool:", *shared] if shared else []),
            "Flag words are joined by _ as in Composer's launcher (--no-progress works too). Bad input is exit 2",
            "and one line naming it.",
        ]
    )


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions kept as written; each flag's default after its help, unless it has none (None, or False for a
    switch). A default computed at run time is said in the flag's own help instead."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or action.default is False or action.default == argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)"


def _int(text: str) -> int:
    """A flag's integer (`type=int`), read by `gcc.inputs.parse_int`: ASCII digits only."""
    try:
        return parse_int(text, "value")
    except BadInput:
        raise argparse.ArgumentTypeError(
            f"invalid int value: {shown(repr(text), 60)} (expected ASCII digits)"
        ) from None


def _float(text: str) -> float:
    """A flag's number (`type=float`): written in ASCII (float() alone reads other scripts' digits too)."""
    try:
        if text.isascii():
            return float(text)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"invalid float value: {shown(repr(text), 60)}")


class ToolParser(argparse.ArgumentParser):
    """argparse's parser with the tools' conventions (module docstring). `renamed` maps a tool's old spellings to
    the current flags: an old one parses to the same value, with one line `<prog>: warning: OLD is now NEW` on
    stderr, and is not shown by --help. Its own errors (an unknown flag, a bad value) are one line as `fail`'s:
    masked and escaped, since they quote the command line, which may hold a credential or a control character;
    `type=int` and `type=float` read ASCII numbers only."""

    def __init__(
        self, prog: str, description: str, *, renamed: Mapping[str, str] | None = None, epilog: str = ""
    ) -> None:
        super().__init__(
            prog=prog,
            description=description,
            epilog=epilog or None,
            formatter_class=HelpFormatter,
        )
        self.renamed = dict(renamed or {})
        self.register("type", int, _int)
        self.register("type", float, _float)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(exit_codes.CONFIG, f"{self.prog}: error: {printable(redact_text(message))}\n")

    def format_help(self) -> str:
        # the vocabulary's lines follow the tool's own epilog; computed here, when every flag has been added
        own = self.epilog
        self.epilog = "\n\n".join(filter(None, [own, vocabulary_epilog(list(self._option_string_actions))]))
        try:
            return super().format_help()
        finally:
            self.epilog = own

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        return super().parse_known_args(self.current_spelling(sys.argv[1:] if args is None else args), namespace)

    def current_spelling(self, args: Sequence[str]) -> list[str]:
        """`args` with each old or dashed flag (also as `--flag=value`) spelled as today; up to a `--`, after which
        everything is a value. argparse never takes a token that starts with -- as a value, so neither does this."""
        out: list[str] = []
        warned: set[str] = set()
        for i, token in enumerate(args):
            if token == "--":
                out.extend(args[i:])
                break
            flag, eq, value = token.partition("=")
            if not flag.startswith("--"):
                out.append(token)
                continue
            snake = "--" + flag[2:].replace("-", "_")
            if snake in self.renamed:
                if snake not in warned:  # one line per old flag, however often and however spelled
                    warned.add(snake)
                    print(f"{self.prog}: warning: {flag} is now {self.renamed[snake]}", file=sys.stderr, flush=True)
                flag = self.renamed[snake]
            elif snake in self._option_string_actions:
                flag = snake
            out.append(flag + eq + value)
        return out
