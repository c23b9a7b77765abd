"""Contract test of gcc/compat/torch_preload.py against the installed torch: where the folder that importing
`torch.distributed.nn` makes in the temp folder goes (tests/test_workers.py proves a stopped forkserver leaves none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SHOW = """
import json, os, sys, tempfile
exec(sys.argv[1])
from gcc.workers import forkserver_tmp
tmp = os.environ["TMPDIR"]
ours = forkserver_tmp(os.getpid())
print(json.dumps({
    "tmp": sorted(os.listdir(tmp)),
    "ours": sorted(os.listdir(ours)) if os.path.isdir(ours) else None,
    "ours_name": os.path.basename(ours),
    "gettempdir": tempfile.gettempdir() == tmp,
}))
"""


def _show(tmp: Path, imports: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", SHOW, imports],
        env=dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_torchs_import_folder_goes_into_the_forkserver_folder_and_the_usual_temp_folder_is_restored(tmp_path):
    plain, preloaded = tmp_path / "plain", tmp_path / "preloaded"
    plain.mkdir()
    preloaded.mkdir()
    # the reliance: the import makes one folder in the temp folder, which its exit handler removes
    seen = _show(plain, "import torch.distributed.nn")
    assert len(seen["tmp"]) == 1 and seen["tmp"][0].startswith("tmp") and seen["ours"] is None, seen
    assert not any(plain.iterdir())
    # through the preload: that folder inside forkserver_tmp(pid), the temp folder as it was for all that follows
    seen = _show(preloaded, "import gcc.compat.torch_preload")
    assert seen["tmp"] == [seen["ours_name"]] and len(seen["ours"]) == 1 and seen["gettempdir"], seen
    assert not any(preloaded.iterdir())  # a forkserver that exits by itself leaves nothing either
