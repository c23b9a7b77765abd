"""The bugs that went through the suite before docs/mutation.md's work, planted again (`python tests/planted.py`):
each is applied to a scratch copy of the checkout (`runs/planted/<bug>/`, the checkout is never changed) and the
tests that claim the behaviour are run there; every bug must fail at least one of them. Prints, per bug, the tests
that failed. Exit 1 if a bug passes them all. Not part of `make test` (a minute or two)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from mutants import ROOT, copy_checkout

# name: (file, the code as it is, the bug, the tests that claim the behaviour)
PLANTED: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "the text and cond dropout rates swapped where the loader draws (it takes the data: section whole)": (
        "gcc/data/dataset.py",
        "draw_sample(self.seed, epoch, sample_id, d.text_dropout, d.cond_dropout, d.mask_p)",
        "draw_sample(self.seed, epoch, sample_id, d.cond_dropout, d.text_dropout, d.mask_p)",
        (
            *("tests/data/test_data.py", "tests/data/test_sample_rng.py", "tests/training/test_builders.py"),
            *("-m", "not slow"),
        ),
    ),
    "the draws keyed on epoch 0 (no new draw per epoch)": (
        "gcc/data/dataset.py",
        "draw_sample(self.seed, epoch, sample_id,",
        "draw_sample(self.seed, 0, sample_id,",
        ("tests/data/test_data.py", "tests/data/test_sample_rng.py"),
    ),
    "the launch verdict broadcast from rank 1 instead of rank 0": (
        "gcc/training/run_start.py",
        "dist.broadcast_object_list(verdict, src=0)",
        "dist.broadcast_object_list(verdict, src=1)",
        ("tests/training/test_run_start.py", "tests/test_errors.py"),
    ),
}


def plant(name: str, work: Path) -> list[str]:
    """The failed tests' ids with the bug `name` planted in a copy at `work`."""
    file, code, bug, tests = PLANTED[name]
    copy_checkout(work)
    path = work / file
    text = path.read_text()
    if text.count(code) != 1:
        raise SystemExit(f"{file}: the code to change ({code!r}) is no longer there once: update PLANTED")
    path.write_text(text.replace(code, bug))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "-W", "ignore", *tests],
        cwd=work,
        capture_output=True,
        text=True,
    )
    return re.findall(r"^FAILED (\S+)", run.stdout, re.M)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    passed = []
    for i, name in enumerate(PLANTED):
        failed = plant(name, ROOT / "runs" / "planted" / str(i))
        print(f"{name}: {len(failed)} failed", *(f"  {t}" for t in failed), sep="\n", flush=True)
        if not failed:
            passed.append(name)
    print("every planted bug fails a test" if not passed else f"passed every test: {passed}")
    return 1 if passed else 0


if __name__ == "__main__":
    sys.exit(main())
