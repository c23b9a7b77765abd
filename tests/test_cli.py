"""One command-line convention for every tool: console scripts, one flag vocabulary (`gcc.cli.VOCABULARY`),
snake_case flags (the dashed spelling accepted silently, a renamed flag's old spelling with one warning), help
text on every flag with its default, help that stands alone, the `python -m` forms still working, and errors as
`<prog>: error: ...` with exit 2 (docs/training.md, Tools; the cases of bad input: tests/tools/test_bad_input.py)."""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gcc.cli import VOCABULARY, ToolParser

ROOT = Path(__file__).resolve().parents[1]
# gcc-launch is Composer's launcher (gcc/launcher.py): Composer's command line, not one of gcc's tools
SCRIPTS = dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
LAUNCHER = SCRIPTS.pop("gcc-launch")
MODULES = {
    "convert_data": "convert_data",
    "gcc-synth": "gcc.synth.world",
    "gcc-sample": "gcc.tools.sample",
    "gcc-maskstats": "gcc.tools.maskstats",
    "gcc-inspect": "gcc.tools.inspect_ckpt",
    "gcc-plot": "gcc.tools.plot",
    "gcc-compare": "gcc.tools.compare",
}


def _parser(entry: str) -> argparse.ArgumentParser:
    module = importlib.import_module(entry.split(":")[0])
    assert callable(getattr(module, entry.split(":")[1]))
    return module.build_parser()


# every parser with a command line: the console scripts, the demo and the trainer
PARSERS = {
    **SCRIPTS,
    "demo": "gcc.tools.demo:main",
    "train": "gcc.training.entry:main",
}

# Each tool's flags beyond the shared vocabulary. A flag added to a tool fails test_flags_are_the_vocabulary until
# it is listed here: first check that no word of gcc.cli.VOCABULARY already says it (--data, --out, --n, ...).
OWN_FLAGS = {
    "convert_data": {"--name", "--include_dropped", "--chunk_clips", "--size_limit", "--compression"},
    "gcc-synth": {"--geometry", "--overwrite", "--wan_model"},
    "gcc-sample": {
        "--ckpt",
        "--base",
        "--model_dir",
        "--raw_root",
        "--clip_ids",
        "--steps",
        "--shift",
        "--cfg",
        "--sem_cfg",
        "--sem_mode",
        "--no_ssim",
        "--no_recon_ceiling",
        "--device",
        "--dtype",
        "--vae_tiled",
        "--fps",
    },
    "gcc-maskstats": {"--split", "--max_frame_coverage", "--preview"},
    "gcc-inspect": set(),
    "gcc-plot": {"--smoothing"},
    "gcc-compare": {"--from", "--to", "--rtol"},
    "demo": {"--no_train", "--sample_n", "--sample_steps"},
    "train": {"--print_config", "--all"},
}

# the spellings of issue 38's five dialects, each still accepted (with one warning) as the flag it became
OLD_SPELLINGS = {
    "convert_data": {"--src": "--data"},
    "gcc-synth": {"--clips": "--n"},
    "gcc-sample": {"--data_root": "--data", "--out_dir": "--out", "--val_n": "--n"},
    "gcc-maskstats": {"--json": "--out"},
    "demo": {"--clips": "--n", "--gpus": "--nproc"},
}

# the least command line each tool parses (its required flags and positionals), in today's spelling
REQUIRED = {
    "convert_data": {"--data": "d", "--out": "o"},
    "gcc-synth": {"--out": "o"},
    "gcc-sample": {"--ckpt": "c", "--data": "d", "--n": "1", "--out": "o"},
    "gcc-maskstats": {"--data": "d"},
    "gcc-inspect": {},
    "gcc-plot": {"": "run"},
    "gcc-compare": {"": "a b"},
    "demo": {},
    "train": {"": "run.yaml"},
}


def _tool_parser(name: str) -> ToolParser:
    p = _parser(PARSERS[name])
    assert isinstance(p, ToolParser), f"{name}: not built with gcc.cli.ToolParser"
    return p


def _argv(name: str, leave_out: str = "") -> list[str]:
    argv: list[str] = []
    for flag, value in REQUIRED[name].items():
        if flag != leave_out:
            argv += ([flag] if flag else []) + value.split()
    return argv


def _long_flags(p: argparse.ArgumentParser) -> set[str]:
    return {o for a in p._actions for o in a.option_strings if o.startswith("--")} - {"--help"}


def test_every_tool_is_a_console_script():
    assert set(SCRIPTS) == set(MODULES) and LAUNCHER == "gcc.launcher:main"


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_flags_are_the_vocabulary(name):
    """A tool's flags are the shared words and its own listed ones; its old spellings name flags it has."""
    p = _tool_parser(name)
    flags = _long_flags(p)
    assert flags - set(VOCABULARY) == OWN_FLAGS[name], f"{name}: a flag outside the vocabulary and OWN_FLAGS"
    assert not OWN_FLAGS[name] & set(VOCABULARY)
    for old, new in p.renamed.items():
        assert new in flags and old not in flags and "-" not in old[2:], (name, old, new)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_flags_are_snake_case_with_help(name):
    p = _tool_parser(name)
    for action in p._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{name}: {action.option_strings or action.dest} has no help text"
        longs = [o for o in action.option_strings if o.startswith("--")]
        assert len(longs) <= 1, f"{name}: {longs}: one spelling each (old ones go in ToolParser's renamed)"
        assert all(re.fullmatch(r"--[a-z0-9]+(_[a-z0-9]+)*", o) for o in longs), f"{name}: {longs} is not snake_case"


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_the_old_spellings_are_these(name):
    assert _tool_parser(name).renamed == OLD_SPELLINGS.get(name, {})


@pytest.mark.parametrize("name, old", sorted((name, old) for name in OLD_SPELLINGS for old in OLD_SPELLINGS[name]))
def test_an_old_spelling_parses_to_the_same_value_with_one_warning(name, old, capsys):
    p = _tool_parser(name)
    new = OLD_SPELLINGS[name][old]
    action = p._option_string_actions[new]
    value = "3" if action.type is int else "x"
    base = _argv(name, leave_out=new)
    want = p.parse_args([*base, new, value])
    assert capsys.readouterr().err == ""
    line = f"{p.prog}: warning: {old} is now {new}\n"
    assert p.parse_args([*base, old, value]) == want
    assert capsys.readouterr().err == line
    # twice, and as --flag=value: still one line; its value is the last one given, as for any flag
    assert p.parse_args([*base, old, "1", f"{old}={value}"]) == want
    assert capsys.readouterr().err == line


def test_dashed_spellings_parse_the_same_silently(capsys):
    p = _tool_parser("convert_data")
    old = p.parse_args(
        ["--data", "a", "--out", "b", "--include-dropped", "--chunk-clips", "3", "--size-limit=9", "--no-progress"]
    )
    new = p.parse_args(
        ["--data", "a", "--out", "b", "--include_dropped", "--chunk_clips", "3", "--size_limit", "9", "--no_progress"]
    )
    assert vars(old) == vars(new) and new.chunk_clips == 3 and new.size_limit == 9 and new.include_dropped
    assert capsys.readouterr().err == ""
    # after `--` every token is a value: a positional that looks like an old flag is left as it is
    assert _tool_parser("gcc-compare").parse_args(["--", "--src", "--no-progress"]).run_b == "--no-progress"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_help_shows_every_default_and_stands_alone(name):
    p = _tool_parser(name)
    text = p.format_help()
    flat = " ".join(text.split())
    for action in p._actions:
        if action.option_strings and action.default is not None and action.default is not False:
            if action.default != argparse.SUPPRESS:
                assert f"(default: {action.default})" in flat, f"{name}: {action.option_strings} default not shown"
    # nothing an installed script's user cannot open: no section pointers, no source files
    assert "§" not in text and "docs/" not in text, f"{name}: --help points to a file an installed script lacks"
    assert p.description and p.description.rstrip()[-1] in ".?", f"{name}: the description is cut mid-sentence"
    for flag in _long_flags(p) & set(VOCABULARY):  # the shared words it uses, with their meaning
        assert f"{flag} {VOCABULARY[flag]}" in flat, f"{name}: {flag} is not explained in the epilog"


def test_the_docs_table_is_the_vocabulary():
    text = (ROOT / "docs" / "training.md").read_text()
    for flag, meaning in VOCABULARY.items():
        assert f"| `{flag}` | {meaning} |" in text, flag


@pytest.mark.parametrize("name", sorted(MODULES))
def test_console_script_and_python_m_forms_answer_help(name):
    exe = Path(sys.executable).with_name(name)
    assert exe.exists(), f"{exe}: not installed (pip install -e .)"
    for cmd in ([str(exe), "--help"], [sys.executable, "-m", MODULES[name], "--help"]):
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert r.returncode == 0 and "usage:" in r.stdout, (cmd, r.stdout[-500:], r.stderr[-2000:])


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_usage_error_is_prog_error_and_exit_2(name):
    """argparse's convention, which every tool's own input errors follow too (gcc/cli.py)."""
    r = subprocess.run(
        [str(Path(sys.executable).with_name(name)), "--no_such_flag"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.splitlines()[-1].startswith(f"{name}: error: "), r.stderr[-2000:]
