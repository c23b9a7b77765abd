"""Entry point: `composer -n N gcc/train.py <yaml> [dotted.key=value ...]` (the config: gcc/training/entry.py; the
run: gcc/training/trainer.py).

Python puts a script's own folder first on `sys.path`; for this file that is `gcc/`, which would make `data`,
`model`, `tools` and `training` importable as top-level names in every rank. It is swapped for the folder that
holds `gcc`, so that only `gcc` is (and a checkout runs without an install)."""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _here:
    sys.path[0] = os.path.dirname(_here)

from gcc.training.entry import run  # noqa: E402  (after the path fix above)

if __name__ == "__main__":
    run(sys.argv[1:])
