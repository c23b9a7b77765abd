"""Memory bounded by what was checked, not by what a file declares or by how many rows it holds (docs/training.md,
"Trust and safety"). Each reader runs as a process (its peak resident set measured, tests/hostile.py `peak_rss`)
on a generated large input, and on a small one of the same kind: the difference is at most a stated multiple of
the large input's size (`MULTIPLE`). Before, gcc-plot and gcc-compare held every CSV row as a dict of strings
(35-45x the file), convert_data kept a message per bad line of clips.jsonl, and torch inflated a `.pth` record to
the size it declares."""

from __future__ import annotations

import json
import random
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from hostile import peak_rss, write_logs

BIN = Path(sys.executable).parent
MiB = 1 << 20
# the most a reader may hold above its start, as a multiple of its input's size: gcc-plot its two logs' numbers
# (8 bytes a cell) and matplotlib's lines; gcc-compare one string a row of both folders; convert_data the rows of
# clips.jsonl it keeps
MULTIPLE = {"gcc-plot": 5, "gcc-compare": 3, "convert_data": 4}


def growth(argv_small: list[str], argv_large: list[str], want: int) -> int:
    """How much more the reader held on the large input than on the small one (both ending with `want`)."""
    code, err, small = peak_rss(argv_small)
    assert code == want, err[-2000:]
    code, err, large = peak_rss(argv_large)
    assert code == want and "Traceback" not in err, err[-2000:]
    return large - small


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["gcc-plot", "gcc-compare"])
def test_the_csv_tools_hold_a_multiple_of_a_log_not_of_its_rows(tool, tmp_path):
    size = write_logs(tmp_path / "large", 45_000, seed=1)  # ~16 MB
    write_logs(tmp_path / "small", 20, seed=1)
    if tool == "gcc-compare":
        shutil.copytree(tmp_path / "large", tmp_path / "large2")
        shutil.copytree(tmp_path / "small", tmp_path / "small2")
        size *= 2
    args = {"gcc-plot": lambda run: [run, "--out", f"{run}.png"], "gcc-compare": lambda run: [run, f"{run}2"]}[tool]
    grew = growth(
        [str(BIN / tool), *args(str(tmp_path / "small"))], [str(BIN / tool), *args(str(tmp_path / "large"))], 0
    )
    assert grew <= MULTIPLE[tool] * size, f"{tool}: {grew / MiB:.0f} MB more for {size / MiB:.0f} MB of logs"


def _index(prepared: Path, lines) -> int:
    path = prepared / "index" / "clips.jsonl"
    with open(path, "w") as f:
        f.writelines(lines)
    return path.stat().st_size


@pytest.mark.slow
@pytest.mark.parametrize("rows", ["clips whose files are missing", "empty objects"])
def test_convert_data_holds_the_rows_it_keeps_never_the_file_nor_a_message_a_line(rows, tmp_path):
    """clips.jsonl of ~12 MB: rows that pass (kept, then their missing latents refused: exit 2), or `{}` lines
    (refused at the first MAX_ERRORS of their errors, the rest never read)."""
    from gcc.synth.world import make_prepared

    src = make_prepared(tmp_path / "small", clips=2, seed=4)
    large = tmp_path / "large"
    shutil.copytree(src, large)
    row = json.loads((src / "index" / "clips.jsonl").read_text().splitlines()[0])
    rng = random.Random(2)

    def clip(i: int) -> str:  # an unseen clip: its own id, run and text keys
        keys = [f"k{rng.getrandbits(40):x}" for _ in row["context_keys"]]
        return json.dumps({**row, "clip_id": f"c{i:07d}", "run": f"r{i % 500}", "context_keys": keys}) + "\n"

    if rows == "empty objects":
        size = _index(large, ["{}\n"] * 4_000_000)
        _index(src, ["{}\n"] * 2)
    else:
        size = _index(large, (clip(i) for i in range(80_000)))
        _index(src, (clip(i) for i in range(2)))
    argv = [str(BIN / "convert_data"), "--out", str(tmp_path / "out"), "--data"]
    grew = growth([*argv, str(src)], [*argv, str(large)], 2)
    assert grew <= MULTIPLE["convert_data"] * size, f"{grew / MiB:.0f} MB more for {size / MiB:.0f} MB of index"


@pytest.mark.slow
def test_a_pth_whose_record_declares_more_than_it_holds_is_refused_unread(tmp_path):
    """A `.pth` (the VAE's format) whose record, deflated, declares 256 MB: refused naming the record, before torch's
    loader would inflate it; the reader holds no more than it does on a small file."""
    import torch

    torch.save({"w": torch.zeros(4)}, tmp_path / "small.pth")
    with zipfile.ZipFile(tmp_path / "small.pth") as z, zipfile.ZipFile(tmp_path / "bomb.pth", "w") as out:
        for info in z.infolist():
            if info.filename.endswith("/data/0"):
                out.writestr(info.filename, bytes(256 * MiB), compress_type=zipfile.ZIP_DEFLATED)
            else:
                out.writestr(info, z.read(info))
    load = "import sys; from gcc.sampling.vae import load_vae; load_vae(sys.argv[1])"
    code, err, small = peak_rss([sys.executable, "-c", load, str(tmp_path / "small.pth")])
    assert code == 1 and "not a Wan2.2 VAE state dict" in err, err[-2000:]
    code, err, bomb = peak_rss([sys.executable, "-c", load, str(tmp_path / "bomb.pth")])
    assert code == 1 and "bomb.pth: record" in err and "compressed" in err, err[-2000:]
    assert bomb - small < 32 * MiB, f"{(bomb - small) / MiB:.0f} MB more for the bomb"
