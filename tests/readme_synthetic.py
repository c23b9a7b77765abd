"""`make synthetic`: the README's "On synthetic data" commands, exactly as written (the fenced block between its
`synthetic-path` markers), run by bash in a scratch folder that holds links to this checkout's `gcc/` and `yamls/`
(so that `gcc/train.py yamls/sft_v10.yaml` resolve as from the checkout), with this environment's commands first on
the PATH. The folder is made anew each time: one that this script did not make is refused, never emptied.

    python tests/readme_synthetic.py [FOLDER]      # default runs/synthetic; exit status: the commands'
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- synthetic-path", "<!-- /synthetic-path -->"
SCRIPT = "commands.sh"  # written into the folder: also the mark of a folder this script made


def commands(readme: Path = ROOT / "README.md") -> str:
    """The README's block, as written."""
    block = readme.read_text().split(START, 1)[1].split(END, 1)[0]
    return block.split("```", 2)[1].split("\n", 1)[1]  # between the fences, the opening fence's line left out


def run(folder: Path) -> int:
    if folder.exists():
        if not (folder / SCRIPT).is_file():
            print(
                f"{folder}: exists and is not this script's scratch folder (no {SCRIPT}); give another", file=sys.stderr
            )
            return 2
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name in ("gcc", "yamls"):
        (folder / name).symlink_to(ROOT / name)
    (folder / SCRIPT).write_text(commands())
    env = dict(os.environ, PATH=os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))))
    return subprocess.run(["bash", "-e", "-x", SCRIPT], cwd=folder, env=env).returncode


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "runs" / "synthetic").resolve()))
