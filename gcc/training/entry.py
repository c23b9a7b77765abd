"""The first part of every rank's launch (`gcc/train.py`): the command line, the config and what it names, the
console and `train.log`, all before torch and Composer are loaded. A bad config is answered in about a second
(exit 2 naming the key), not after the several seconds those imports take; the run itself is
gcc/training/trainer.py."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn

from gcc import exit_codes, redact
from gcc.cli import ToolParser
from gcc.errors import BadInput, Refusal, StorageUnavailable, launch_verdict
from gcc.redact import secret_keys
from gcc.training import ranks
from gcc.training.config import ConfigError, TrainConfig, check_inputs, describe, load_config, to_dict
from gcc.training.console import configure_logging, open_run_log
from gcc.training.ending import code_of, exit_process, wait_for_rank0
from gcc.training.ranks import rank, world_size

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = ToolParser(
        "gcc/train.py",
        "Train the gc25d teacher (Wan2.2's DiT with a semantic condition) as the yaml says, on every process of\n"
        "`composer -n N gcc/train.py <yaml> [key=value ...]`; relaunched on the same run_dir, it resumes.",
    )
    p.add_argument("yaml", nargs="?", help="run config, e.g. yamls/sft_v10.yaml")
    p.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. optimizer.lr=2e-5")
    p.add_argument(
        "--print_config",
        action="store_true",
        help="print every config key (type, default, meaning) and exit; with a yaml, its resolved values too",
    )
    p.add_argument("--all", action="store_true", help="with --print_config: the test-only faults.* keys too")
    return p


def checked_config(yaml: str, overrides: list[str], world: int | None) -> TrainConfig:
    """The config of a launch of `world` ranks (None: not known yet) and what it names, checked before any work
    (raises ConfigError, BadInput, StorageUnavailable or Refusal): every rank's check, and gcc-launch's before any
    rank starts."""
    cfg = load_config(yaml, overrides)
    if world is not None:
        cfg.per_rank_batch(world)
    check_inputs(cfg)
    return cfg


VERDICTS = (ConfigError, BadInput, StorageUnavailable, Refusal)  # the config's verdicts (BadInput: a setting such
# as AWS_MAX_ATTEMPTS): each is one line and its exit code (gcc.errors.launch_verdict)


def prepare(argv: list[str] | None, capture_output: bool = False) -> TrainConfig | int:
    """The command line and the config checked, on every rank alike (nothing has started yet), then the console at
    the config's level and this rank's share of `<run_dir>/train.log` (with `capture_output`, the process's: all it
    prints from then on, gcc/training/output_capture.py). The config, or the exit code of the verdict (already
    logged)."""
    redact.install()  # every line this rank logs or reports, tracebacks included, masked from here on
    try:  # the launcher's environment first: everything after reads it (as torch and Composer will)
        ranks.check()
    except BadInput as e:
        configure_logging("INFO", 0)
        code, line = launch_verdict(e)
        logger.error(line)
        return code
    configure_logging("INFO", rank())
    p = build_parser()
    args = p.parse_args(argv)
    if args.yaml is None and not args.print_config:
        p.error("the yaml is required (or --print_config)")
    try:  # every rank checks the config and what it names before any work: the same verdict everywhere
        if args.print_config:  # what the config says, nothing it names checked: no run starts
            cfg = load_config(args.yaml, args.overrides)
            print("\n".join(describe(cfg if args.yaml is not None else None, test_only=args.all)))
            return exit_codes.OK
        cfg = checked_config(args.yaml, args.overrides, world_size())
        configure_logging(cfg.log_level, rank())
        # every rank: rank 0's lines, each rank's own warnings and, in a launch's process, everything else each
        # rank prints, from here on (docs/training.md, "The run folder")
        open_run_log(cfg.run_dir, rank(), world_size(), capture_output)
    except VERDICTS as e:
        code, line = launch_verdict(e)
        logger.error(line)
        return code
    for key in secret_keys(to_dict(cfg)):
        logger.warning(
            f"{key} holds a credential, which gcc masks in its own files and logs; the yaml or the "
            f"command line, and the library it is passed to, may keep it. Set it through the "
            f'environment instead (docs/training.md, "Trust and safety")'
        )
    return cfg


def main(argv: list[str] | None = None, capture_output: bool = False) -> int:
    cfg = prepare(argv, capture_output)
    if isinstance(cfg, TrainConfig):
        # heavy (torch, Composer, DiffSynth: seconds): loaded only for a config that passed, so a bad one is
        # answered at once. Composer first through its adapter, which keeps the parts a run never uses out.
        import gcc.compat.composer  # noqa: F401
        from gcc.training.trainer import launch

        code = launch(cfg)
    else:
        code = cfg
    wait_for_rank0(code)  # on 2-4: the launcher reports rank 0's code
    return code


def run(argv: list[str]) -> NoReturn:
    """`main`, then the process's exit with its code through `exit_process` (the exit handlers, then `os._exit`),
    whatever way `main` ended: a `SystemExit` (Composer's SIGTERM handler, the launcher's SIGTERM while waiting for
    rank 0) with its code, an error with Python's own traceback and 1. The process's own output is captured into
    train.log (`capture_output`); a test that calls `main` in its own process keeps its output."""
    try:
        code = main(argv, capture_output=True)
    except SystemExit as e:
        code = code_of(e)
    except KeyboardInterrupt:  # Ctrl-C before the run took it over (a preemption then): nothing started to save
        code = exit_codes.INTERRUPTED
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    exit_process(code)


if __name__ == "__main__":  # `python -m gcc.training.entry --print_config`
    run(sys.argv[1:])
