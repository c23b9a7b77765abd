"""The model's declarations, beside the model and light (no torch: the tools read them): its config sections
`model:` (the preset, the condition, the objective's settings, checkpointing, compilation, attention; handed whole
to `GcTrainModel`), `optimizer:` (gcc/model/optim.py) and `fsdp:` (gcc/model/fsdp.py), each field's role and range
with it (gcc/settings.py; gcc/training/config.py loads and checks them); and what the objective
(gcc/model/objective.py) reports.

A new loss term with a weight: the weight here in `ModelConfig`, the statistic in `TRAIN_STATS`, the term in
`GcTrainModel.loss` (reading `self.config`); the step's reduction, `train_log.csv`, every logger's `train/<name>`
and, with labels, the console line and gcc-plot follow."""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field
from typing import Literal

from gcc.inputs import shown
from gcc.settings import NON_NEGATIVE, ConfigError, Range, as_float, num_text, role, setting
from gcc.stats import LOSS, MODEL, WEIGHTED, Stat

# the sigma shift of Wan2.2 TI2V's flow-matching schedule: training's (gcc/model/flow.py) and sampling's
# (gcc/sampling/sampler.py, gcc-sample --shift)
WAN_SHIFT = 5.0


@dataclass
class ModelConfig:
    preset: Literal["ti2v-5b", "wide", "tiny", "tiny-p1"] = setting(
        "ti2v-5b",
        identity=True,
        exported=False,
        doc="gcc.model.dit preset: ti2v-5b | wide (its width, 2 blocks) | tiny | tiny-p1 (tiny, one token per latent cell)",
    )
    overrides: dict = field(
        default_factory=dict,
        metadata=role(
            identity=True,
            exported=False,
            doc="preset fields to change (e.g. tiny's text_dim; docs/model.md); signed as sorted JSON",
        ),
    )
    # signed by the sha256 of its index file (so a copy elsewhere is the same run)
    model_dir: str = setting(
        "",
        identity="model.base_weights",
        exported=True,
        path=True,
        doc='base Wan2.2-TI2V-5B weights (sharded safetensors as published); "" = random init (tiny/CPU only)',
    )
    # signed by its digest; its export metadata entry is the lineage's (builders.export_metadata)
    init_ckpt: str = setting(
        "",
        identity="model.init_ckpt",
        exported=False,
        path=True,
        doc="warm start: a gc25d export (same vocab) or a plain Wan export",
    )
    # signed by its real path
    legacy_zero_ckpt: str = setting(
        "",
        identity="model.legacy_zero_ckpt",
        exported=False,
        path=True,
        doc="warm start from a DeepSpeed ZeRO checkpoint folder (needs the `legacy` extra)",
    )
    vae_path: str = setting(
        "",
        identity=False,
        exported=False,
        path=True,
        doc='the Wan2.2 VAE (Wan2.2_VAE.pth) that decodes the samples during training on real data; "" = a latent '
        "preview (gcc-synth data has its own decoder)",
    )
    vocab: Literal["parts", "ids"] = setting(
        "parts", identity=True, exported=True, doc="the semantic condition's vocabulary: parts | ids"
    )
    first_frame_cond: bool = setting(
        True, identity=True, exported=True, doc="condition on the clean first frame (image-to-video)"
    )
    activation_checkpointing: Literal["block", "selective", "none"] = setting(
        "block",
        identity=False,
        exported=False,
        doc="per DiT block: block (recompute it whole in backward) | selective (keep its attention outputs, "
        "recompute the rest) | none (docs/performance.md, Memory)",
    )
    compile: bool = setting(
        False,
        identity=False,
        exported=False,
        doc="torch.compile each DiT block (after activation checkpointing, before FSDP2; docs/performance.md, "
        "Compiled blocks)",
    )
    attention: Literal["auto", "flash3", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_math"] = setting(
        "auto",
        identity=False,
        exported=False,
        doc="the attention kernel: auto (FlashAttention 3 if installed on a Hopper GPU, else PyTorch SDPA's backends "
        "in order flash, cudnn, efficient, math) | flash3 | sdpa_<backend> first (docs/performance.md, Attention)",
    )


@dataclass
class OptimizerConfig:
    """Composer's `optimizer:` section: AdamW with two parameter groups, the DiT at `lr` and gc_sem_cond at
    `cond_lr` (gcc/model/optim.py). Signed under the keys runs recorded before the section had this name."""

    name: Literal["adamw"] = setting(
        "adamw", identity=True, sign_default=False, exported=False, doc="adamw (the only one gcc trains with)"
    )
    lr: float = setting(
        1e-5, identity="optim.lr", exported=True, bounds=NON_NEGATIVE, doc="learning rate of the DiT's parameters"
    )
    cond_lr: float = setting(
        1e-4,
        identity="optim.cond_lr",
        exported=True,
        bounds=NON_NEGATIVE,
        doc="learning rate of the gc_sem_cond parameters (the condition path, zero-initialised)",
    )
    weight_decay: float = setting(
        0.01, identity="optim.weight_decay", exported=True, bounds=NON_NEGATIVE, doc="AdamW's weight decay"
    )
    betas: list = field(
        default_factory=lambda: [0.9, 0.999],
        metadata=role(identity="optim.betas", exported=False, doc="AdamW's betas: two numbers in [0, 1)"),
    )
    eps: float = setting(
        1e-8,
        identity=True,
        sign_default=False,
        exported=False,
        bounds=Range(0.0, 1.0, exclusive=True),
        doc="AdamW's eps",
    )


@dataclass
class FsdpConfig:
    # docs/performance.md has both
    reshard_after_forward: bool = setting(
        True,
        identity=False,
        exported=False,
        doc="true: ZeRO-3-like (a block's parameters are gathered again for its backward: ~8 GB less per GPU at 5B, "
        "one more all-gather per block); false: ZeRO-2-like (they stay gathered from forward to backward)",
    )


# ---- what the objective reports (docs/model.md)
# outputs["stats"] of each micro-batch, detached scalars; in this order in their column groups
TRAIN_STATS = (
    Stat("mse", WEIGHTED, LOSS),
    Stat("timestep", WEIGHTED, LOSS),
    Stat("sem_rms", WEIGHTED, MODEL, console=".4f", plot="sem_rms (condition)"),
    Stat("x_rms", WEIGHTED, MODEL, plot="x_rms (latent stream)"),
)
# TensorBoard scalars `train/<name>` computed from a train_log row: numerator / denominator (nan when it is 0)
RATIOS = {"sem_over_x": ("sem_rms", "x_rms")}

# a validation row's measured values (each logged per timestep and as the mean over timesteps), then its row
VAL_VALUES = ("mse", "mse_uncond", "mse_nulltext", "gap_uncond", "gap_nulltext")
VAL_ROW_FIELDS = ("timestep", *VAL_VALUES, "n")


# model.overrides: the largest value of each field of DiTConfig a config may set (what sizes work: checked before
# anything is built; a field not named here is bounded by 65,536)
MODEL_BOUNDS = {
    "num_layers": 256,
    "dim": 1 << 16,
    "ffn_dim": 1 << 18,
    "num_heads": 1024,
    "in_dim": 4096,
    "out_dim": 4096,
    "patch_size": 64,
    "text_dim": 1 << 16,
    "freq_dim": 1 << 16,
    "cond_hidden": 1 << 16,
    "eps": 1.0,
}


def check_model_overrides(overrides: dict) -> None:
    """model.overrides: fields of the preset's DiTConfig (docs/model.md), each of its type and within MODEL_BOUNDS;
    the vocab is model.vocab."""
    if not overrides:
        return
    from gcc.model.dit import DiTConfig  # heavy (torch, diffsynth): loaded only for overrides

    hints = typing.get_type_hints(DiTConfig)
    for k, v in overrides.items():
        if k not in hints or k == "vocab":
            hint = " (set model.vocab instead)" if k == "vocab" else ""
            raise ConfigError(
                f"model.overrides.{shown(k, 60)}: not a field of the model config{hint}; "
                f"known: {sorted(set(hints) - {'vocab'})}"
            )
        typ, high = hints[k], MODEL_BOUNDS.get(k, 1 << 16)
        if typing.get_origin(typ) is tuple:
            ok = (
                isinstance(v, list)
                and len(v) == len(typing.get_args(typ))
                and all(isinstance(x, int) and not isinstance(x, bool) and 0 < x <= high for x in v)
            )
            want = f"a list of {len(typing.get_args(typ))} integers in [1, {num_text(high)}]"
        elif typ is float:
            ok = (x := as_float(v)) is not None and math.isfinite(x) and 0 < x <= high
            want = f"a number in (0, {num_text(high)}]"
        else:
            ok = isinstance(v, int) and not isinstance(v, bool) and 0 < v <= high
            want = f"a positive integer, at most {num_text(high)}"
        if not ok:
            raise ConfigError(f"model.overrides.{k}: expected {want}, got {shown(repr(v))}")
