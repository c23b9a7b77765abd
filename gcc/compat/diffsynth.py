"""DiffSynth 2.1.12, the one place gcc imports it: the parts it uses (Wan DiT modules, the flow-matching scheduler,
the Wan2.2 VAE and its loader), re-exported for the rest of the package, and what gcc relies on beyond its API
(gcc/compat/__init__.py): `use_class` (a module's class swapped in place for a subclass that adds no parameters or
state: WanModel and DiTBlock call their children by attribute, `self.cross_attn(norm3(x), context)`, and the
subclass keeps the parameters and their keys).

DiffSynth's package loads, every time, parts that gcc never uses (`stand_ins`, gcc/compat/__init__.py). Together
about 4 s in every process that builds the model:
- its flex-attention wrapper: `torch.compile(flex_attention)` at import, which loads torch inductor (~1.8 s) and
  starts inductor's compile-worker pool (a server process, one worker per core and a reader thread: ~1.3 GB RSS
  per rank, and a thread that makes any later `fork()` unsafe on CPython 3.11). DiffSynth never picks flex
  attention by itself (flash, sage, xformers, else torch's SDPA, which gcc runs), so flex attention is absent while
  DiffSynth loads and the wrapper is never made. Should anything compile later, one compile thread keeps inductor
  in-process: `TORCHINDUCTOR_COMPILE_THREADS` (read once, when inductor's config is first imported), and the config
  itself; a value the user set (to compile something themselves) is kept;
- its training datasets (`diffsynth.core.data`: pandas, image and video readers): a stand-in;
- DeepSpeed when it is installed (the `legacy` extra: gcc needs it only to read a legacy ZeRO checkpoint,
  gcc/compat/deepspeed.py), for gradient checkpointing through `deepspeed.checkpointing` once configured, which gcc
  never does; it also prints an accelerator warning: absent (DiffSynth catches its ModuleNotFoundError).
Each loads normally afterwards when asked for.
"""

import os

import torch
import torch._inductor.config as inductor_config

from gcc.compat import require, stand_ins

require("diffsynth", "gcc/compat/diffsynth.py")

if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # for the processes this one starts
    inductor_config.compile_threads = 1
_UNUSED = [
    "diffsynth.core.data",  # training datasets
    "diffsynth.core.loader.config",  # model configs, downloads (modelscope)
    "diffsynth.core.loader.model",  # its model loader (transformers' DeepSpeed integration)
    # its own trainer: training module, logger and runner (accelerate), parsers, losses, DMD2
    *(f"diffsynth.diffusion.{m}" for m in ("training_module", "logger", "runner", "parsers", "loss", "dmd2")),
]
with stand_ins(_UNUSED, absent=["deepspeed", "torch.nn.attention.flex_attention"]):
    from diffsynth.core.loader.file import load_state_dict
    from diffsynth.core.vram.initialization import skip_model_initialization
    from diffsynth.diffusion.flow_match import FlowMatchScheduler
    from diffsynth.models.wan_video_dit import (
        CrossAttention,
        DiTBlock,
        Head,
        RMSNorm,
        SelfAttention,
        WanModel,
        precompute_freqs_cis_3d,
        sinusoidal_embedding_1d,
    )
    from diffsynth.models.wan_video_vae import VideoVAE38_, WanVideoVAE38
    from diffsynth.utils.state_dict_converters.wan_video_vae import WanVideoVAEStateDictConverter


def use_class(module: torch.nn.Module, cls: type) -> None:
    """Make `module` an instance of `cls`, a subclass of its class that adds no parameters or state: the module
    keeps its parameters, their keys, and how its parent calls it."""
    if not issubclass(cls, type(module)):
        raise TypeError(f"{cls.__name__} is not a subclass of {type(module).__name__}")
    module.__class__ = cls


__all__ = [
    "CrossAttention",
    "DiTBlock",
    "FlowMatchScheduler",
    "Head",
    "RMSNorm",
    "SelfAttention",
    "VideoVAE38_",
    "WanModel",
    "WanVideoVAE38",
    "WanVideoVAEStateDictConverter",
    "load_state_dict",
    "precompute_freqs_cis_3d",
    "sinusoidal_embedding_1d",
    "skip_model_initialization",
    "use_class",
]
