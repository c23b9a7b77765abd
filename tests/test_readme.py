"""The README as a new user meets it: its first screen, its one word on the virtual environment, the folders its
commands write that git ignores, and its synthetic stand-in for the real-data path run exactly as written (`make
synthetic`: tests/readme_synthetic.py); and the yamls' comments, which must not offer a value their key refuses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_first_screen_is_five_lines_demo_data_train_resume_sample():
    title, rest = README.split("\n", 1)
    assert title.startswith("# gcc") and rest.lstrip().startswith("```")
    lines = rest.lstrip().split("```", 2)[1].strip("\n").splitlines()
    assert len(lines) == 5, lines
    demo, data, train, resume, sample = lines
    assert demo.startswith("make demo ") and data.startswith("convert_data ") and "docs/data_format.md" in data
    assert train.startswith("gcc-launch -n 8 gcc/train.py yamls/sft_v10.yaml ")
    assert resume.split("#")[0] == train.split("#")[0] and "same command" in resume  # resume = the same command
    assert sample.startswith("gcc-sample --ckpt ") and "--model " not in sample


def test_the_virtual_environment_is_activated_once_and_models_and_data_are_ignored(tmp_path):
    assert README.count("source .venv/bin/activate") == 1
    ignored = subprocess.run(
        ["git", "check-ignore", "models/Wan2.2-TI2V-5B/x.safetensors", "data/gc25d_v10/READY"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert ignored.stdout.split() == ["models/Wan2.2-TI2V-5B/x.safetensors", "data/gc25d_v10/READY"]


@pytest.mark.parametrize("yaml", sorted(p.name for p in (ROOT / "yamls").glob("*.yaml")))
def test_a_yaml_comment_offers_no_value_its_key_refuses(yaml):
    """A comment `<key>: ...  # ...; 0 = off` (or `0 = none`) on a key whose range starts above 0 would send a user
    to a config error (sample_steps: 0 is refused; sample_every: 0 is what turns the samples off)."""
    from gcc.training.config import BOUNDS

    for line in (ROOT / "yamls" / yaml).read_text().splitlines():
        m = re.match(r"\s*(\w+):[^#]*#.*?(?<![\w:])0 = (off|none|never)", line)
        if not m:
            continue
        keys = [k for k in BOUNDS if k.rsplit(".", 1)[-1] == m[1]]
        assert keys, (yaml, line)
        assert all(BOUNDS[k].problem(0) is None for k in keys), (yaml, line)


@pytest.mark.slow
def test_the_synthetic_real_data_path_runs_as_written(tmp_path):
    """README "On synthetic data", as `make synthetic` runs it: a random tiny model folder where the yaml's
    model.model_dir is, synthetic data, its conversion, 40 steps on 2 CPU processes through gcc-launch, and
    gcc-sample of the last export without --model (the export says tiny)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from readme_synthetic import run

    folder = tmp_path / "synthetic"
    assert run(folder) == 0
    metrics = json.loads((folder / "runs" / "sft_v10" / "eval" / "metrics.json").read_text())
    assert metrics["model"] == "tiny" and len(metrics["clips"]) == 2 and metrics["failed"] == {}
