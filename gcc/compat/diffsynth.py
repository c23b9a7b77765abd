"""DiffSynth 2.1.12, the one place gcc imports it: the parts it uses (Wan DiT modules, the flow-matching scheduler,
the Wan2.2 VAE and its loader), re-exported for the rest of the package, and what gcc relies on beyond its API
(gcc/compat/__init__.py): `use_framewise_cross_attention` (a block's CrossAttention swapped for a subclass in
place: DiTBlock calls `self.cross_attn(norm3(x), context)`, and the subclass keeps its parameters and keys).

`import diffsynth` calls `torch.compile(...)` at import time (its flex-attention wrapper), which makes torch
inductor start a compile-worker pool: a server process plus one worker per usable core (up to 32) and a
reader thread, in every process that imports the model. gcc never compiles, so that pool is only cost (about
1.3 GB RSS per rank here) and its thread makes any later `fork()` of the process unsafe on CPython 3.11.
One compile thread keeps inductor in-process. Inductor reads `TORCHINDUCTOR_COMPILE_THREADS` once, when its
config is first imported (Composer may have done that already), so the config is set too; a value the user
set (to compile something themselves) is kept.

DiffSynth also imports DeepSpeed when it is installed (the `legacy` extra), and DeepSpeed's import sets
`PYTORCH_NVML_BASED_CUDA_CHECK=1` for the whole process. From then on, until CUDA is initialised (never, on a CPU
run), every `torch.cuda.is_available()` loads NVML again: ~55 us a call here, and Composer asks ~11 times a step.
So the variable is removed again after the import unless the user had set it: torch's default check.
"""

import os

import torch._inductor.config as inductor_config

from gcc.compat import require

VERIFIED = "2.1.12"
require("diffsynth", VERIFIED, "gcc/compat/diffsynth.py")

if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # for the processes this one starts
    inductor_config.compile_threads = 1
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
_nvml_check_set_by_user = NVML_CHECK in os.environ

from diffsynth.core.loader.file import load_state_dict
from diffsynth.core.vram.initialization import skip_model_initialization
from diffsynth.diffusion.flow_match import FlowMatchScheduler
from diffsynth.models.wan_video_dit import (
    CrossAttention,
    DiTBlock,
    Head,
    RMSNorm,
    WanModel,
    precompute_freqs_cis_3d,
    sinusoidal_embedding_1d,
)
from diffsynth.models.wan_video_vae import VideoVAE38_, WanVideoVAE38
from diffsynth.utils.state_dict_converters.wan_video_vae import WanVideoVAEStateDictConverter

if not _nvml_check_set_by_user:
    os.environ.pop(NVML_CHECK, None)


def use_framewise_cross_attention(block: DiTBlock, cls: type[CrossAttention]) -> None:
    """Make `block`'s cross-attention an instance of `cls`, a CrossAttention subclass that adds no parameters or
    state: the block keeps its parameters, their keys, and its call."""
    block.cross_attn.__class__ = cls


__all__ = [
    "CrossAttention",
    "DiTBlock",
    "FlowMatchScheduler",
    "Head",
    "RMSNorm",
    "VideoVAE38_",
    "WanModel",
    "WanVideoVAE38",
    "WanVideoVAEStateDictConverter",
    "load_state_dict",
    "precompute_freqs_cis_3d",
    "sinusoidal_embedding_1d",
    "skip_model_initialization",
    "use_framewise_cross_attention",
]
