"""examples/slurm/sft_v10.sbatch (README.md "Several nodes"): run as Slurm would run it, with `scontrol`, `srun` and
`composer` replaced by stubs on PATH, and each node's `composer` command line read by Composer's own launcher parser:
world size, node rank, master address and port, the yaml, the overrides; its `#SBATCH` lines ask for one task per
node and a SIGTERM early enough for the preemption grace of docs/training.md "Slurm"."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "slurm" / "sft_v10.sbatch"

STUBS = {
    # the job's node list as hostnames, one a line, the second a moment later: a reader that stops after the first
    # line (`head -n 1`) ends it with SIGPIPE, which `set -o pipefail` makes the script's failure
    "scontrol": '[ "$1 $2" = "show hostnames" ] && [ "$3" = "$SLURM_JOB_NODELIST" ] || exit 1\n'
    "echo gpu-a; sleep 0.2; echo gpu-b\n",
    # one task per node: the command once per node id, with that node's SLURM_NODEID (options before it skipped)
    "srun": 'while [[ "$1" == --* ]]; do shift; done\n'
    'for ((i = 0; i < SLURM_JOB_NUM_NODES; i++)); do SLURM_NODEID=$i "$@" || exit $?; done\n',
    # the launcher (gcc-launch: Composer's, its flags): records its argv, NUL-separated, per node
    "gcc-launch": 'printf "%s\\0" "$@" > "$STUB_OUT/composer.node$SLURM_NODEID"\n',
}


def _sbatch_options() -> dict[str, str]:
    return dict(m.groups() for m in re.finditer(r"^#SBATCH --([\w-]+)(?:=(\S+))?", SCRIPT.read_text(), re.M))


def _dry_run(tmp_path: Path, *overrides: str, **env: str) -> list[list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    nodes = int(_sbatch_options()["nodes"])
    environ = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "gpu-[a-b]",
        "SLURM_JOB_NUM_NODES": str(nodes),
        "STUB_OUT": str(tmp_path),
        **env,
    }
    r = subprocess.run(["bash", str(SCRIPT), *overrides], env=environ, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return [(tmp_path / f"composer.node{i}").read_text().split("\0")[:-1] for i in range(nodes)]


def _launcher_args(argv: list[str], monkeypatch):
    """The arguments as Composer's launcher reads them (its own parser and its multi-node checks)."""
    from composer.cli import launcher

    for var in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "BASE_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "argv", ["composer", *argv])
    return launcher._parse_args()


def test_each_node_launches_its_ranks_of_one_world(tmp_path, monkeypatch):
    per_node = _dry_run(tmp_path, "data.path=s3://bucket/gc25d_v10_mds", "run_dir=/shared/runs/my run")
    assert len(per_node) == 2
    for rank, argv in enumerate(per_node):
        a = _launcher_args(argv, monkeypatch)
        assert (a.world_size, a.nproc, a.node_rank, a.base_rank) == (16, 8, rank, 8 * rank)
        assert (a.master_addr, a.master_port) == ("gpu-a", 29500)
        assert a.training_script == "gcc/train.py"
        assert a.training_script_args == [
            "yamls/sft_v10.yaml",
            "data.path=s3://bucket/gc25d_v10_mds",
            "run_dir=/shared/runs/my run",  # one argument, its space kept
        ]
    assert (ROOT / "yamls" / "sft_v10.yaml").is_file()


def test_the_node_size_and_yaml_come_from_the_environment_and_no_override_adds_no_argument(tmp_path, monkeypatch):
    (argv, _) = _dry_run(tmp_path, GPUS_PER_NODE="4", YAML="yamls/mini.yaml", MASTER_PORT="31000")
    a = _launcher_args(argv, monkeypatch)
    assert (a.world_size, a.nproc, a.master_port) == (8, 4, 31000)
    assert a.training_script_args == ["yamls/mini.yaml"]


def test_slurm_asks_for_one_launcher_per_node_and_a_sigterm_before_the_limit():
    opts = _sbatch_options()
    assert opts["ntasks-per-node"] == "1"
    signal = re.fullmatch(r"TERM@(\d+)", opts["signal"])  # SIGTERM to the step's processes (no B:), not SIGUSR1
    assert signal, opts["signal"]
    grace = yaml.safe_load((ROOT / "yamls" / "sft_v10.yaml").read_text())["preemption_grace_s"]
    launcher_kill_s = 30  # the launcher SIGKILLs ranks still running 30 s after it passed SIGTERM on
    assert int(signal[1]) > grace + launcher_kill_s


@pytest.mark.parametrize("missing", ["SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES"])
def test_outside_a_slurm_job_the_script_stops_naming_the_variable(tmp_path, missing):
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_NODELIST": "gpu-[a-b]", "SLURM_JOB_NUM_NODES": "2"}
    del env[missing]
    r = subprocess.run(["bash", str(SCRIPT)], env=env, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and missing in r.stderr
