"""Entry point: `composer -n N gcc/train.py <yaml> [dotted.key=value ...]` (see gcc/trainer.py)."""
import os
import sys

# Run as a script, Python puts this folder first on sys.path, where gcc/inspect.py would shadow the stdlib's
# `inspect`; import the package from its parent instead.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
sys.path.insert(0, os.path.dirname(_here))

from gcc.trainer import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
