"""Entry point: `composer -n N gcc/train.py <yaml> [dotted.key=value ...]` (the run: gcc/train/trainer.py)."""

import sys

from gcc.train.trainer import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
