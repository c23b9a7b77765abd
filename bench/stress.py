"""The long loops of the suite's stress tests, for a change to how a launch starts or ends.

    .venv/bin/python bench/stress.py [--rounds 30] [--test TEST]

`make test` runs one round of each (tests/training/test_ending.py: short launches beside a busy process;
tests/training/test_train_e2e.py: two launches on one machine at once). This runs the same tests with
`GCC_STRESS_ROUNDS` rounds, one test at a time, and prints each test's wall time per round. Every launch is
checked for a clean end (tests/_launch.py `assert_clean_end`): exit code, no process left, no shared memory left,
no "terminate called", resource-tracker or traceback line from any rank. A failure is a bug to root-cause: the
test's output names the round and carries every process's stacks on a hang.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/training/test_ending.py::test_short_launches_beside_a_busy_process_all_end_cleanly",
    "tests/training/test_train_e2e.py::test_two_launches_on_one_machine_at_once_both_succeed",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=30, help="rounds of each test (make test runs 1)")
    ap.add_argument("--test", choices=TESTS, action="append", help="only this test (repeatable; default: both)")
    args = ap.parse_args()
    env = dict(os.environ, GCC_STRESS_ROUNDS=str(args.rounds))
    failed = 0
    for test in args.test or TESTS:
        t0 = time.time()
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], cwd=ROOT, env=env)
        took = time.time() - t0
        print(
            f"{test}: {'passed' if r.returncode == 0 else 'FAILED'}, {args.rounds} round(s) in {took:.0f} s "
            f"({took / args.rounds:.1f} s a round)"
        )
        failed += r.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
