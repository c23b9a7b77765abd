"""What a rank loads (gcc/compat/__init__.py `stand_ins`, used by gcc/compat/composer.py, diffsynth.py and
streaming.py; gcc/compat/deepspeed.py): the parts of its libraries that gcc never uses are kept out of its processes
(each costs every rank, loader forkserver and tool start time), and each still loads when asked for afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gcc.compat import Unavailable, stand_ins
from gcc.compat.deepspeed import NVML_CHECK, zero_to_fp32

ROOT = Path(__file__).resolve().parents[2]

# what a rank imports (gcc/training/entry.py: Composer through its adapter first) and the tools that load the model
# (gcc-inspect, gcc-sample), then what they must not have loaded (DeepSpeed: the `legacy` extra, whose import prints
# an accelerator warning, is loaded only by the legacy ZeRO import, gcc/compat/deepspeed.py)
PROBE = """
import json, os, sys
from gcc.compat.deepspeed import NVML_CHECK, zero_to_fp32
import gcc.compat.composer, gcc.training.trainer, gcc.data.dataset
import gcc.tools.inspect_ckpt, gcc.tools.sample.cli, gcc.tools.sample.dit, gcc.model.export  # and the tools'
kept_out = [m for m in sys.argv[1:] if m in sys.modules]
from streaming.text import StreamingC4
from torchmetrics.text import BLEUScore
from torchmetrics.utilities.plot import plot_single_or_multi_val
from diffsynth.core.data import UnifiedDataset
from torch.nn.attention.flex_attention import flex_attention
import peft, mcli, pandas
zero_to_fp32()  # DeepSpeed's import sets PYTORCH_NVML_BASED_CUDA_CHECK=1 for the process
loaded = [c.__module__ for c in (StreamingC4, BLEUScore, plot_single_or_multi_val, UnifiedDataset)]
loaded += ["matplotlib" in sys.modules, "deepspeed" in sys.modules]
print(json.dumps([kept_out, loaded, os.environ.get(NVML_CHECK)]))
"""
KEPT_OUT = [
    "deepspeed",
    "diffsynth.core.data",
    "matplotlib",
    "mcli",
    "pandas",
    "peft",
    "streaming.multimodal",
    "streaming.text",
    "streaming.vision",
    "torch._inductor.compile_fx",
    "torchmetrics.audio",
    "torchmetrics.functional.text",
    "torchmetrics.text",
]


@pytest.mark.slow
def test_a_rank_keeps_the_unused_parts_of_its_libraries_out_and_each_loads_on_demand():
    """In a fresh process (this one has loaded everything)."""
    env = {k: v for k, v in os.environ.items() if k not in (NVML_CHECK, "MOSAICML_PLATFORM")}
    r = subprocess.run(
        [sys.executable, "-c", PROBE, *KEPT_OUT],
        env=dict(env, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    kept_out, loaded, nvml = json.loads(r.stdout.splitlines()[-1])
    assert kept_out == []
    assert loaded == [
        "streaming.text.c4",
        "torchmetrics.text.bleu",
        "torchmetrics.utilities.plot",
        "diffsynth.core.data.unified_dataset",
        True,
        True,
    ]
    assert nvml is None  # DeepSpeed's setting undone: torch's default check


def test_a_users_own_nvml_setting_is_kept(monkeypatch):
    monkeypatch.setenv(NVML_CHECK, "1")
    assert callable(zero_to_fp32())
    assert os.environ[NVML_CHECK] == "1"


def test_a_stand_in_gives_placeholders_that_refuse_use_and_goes_away_afterwards():
    name = "gcc_test_no_such_library.part"
    with stand_ins([name], absent=["gcc_test_absent"]):
        module = __import__(name, fromlist=["Anything"])
        assert module.Anything is Unavailable
        with pytest.raises(ImportError, match="gcc never uses"):
            module.Anything()
        with pytest.raises(ModuleNotFoundError):
            __import__("gcc_test_absent")
    assert name not in sys.modules and "gcc_test_absent" not in sys.modules
    with stand_ins(["json"]):  # already loaded: left as it is
        assert sys.modules["json"] is json
