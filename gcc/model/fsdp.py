"""FSDP2 in gcc: Composer's `FSDP2Config` shards the DiT (each block a unit, the rest in the root unit) and its
parameters become DTensors. What gcc adds around that, on GPU and on CPU (gloo) alike:

* every rank fills only the rows it holds: initial values (a pure function of the seed and the parameter's
  module, so any world size starts from the same weights), base Wan weights, warm starts (`fill_local`);
* exports gather one tensor at a time to rank 0 (`full_state_dict`), never the whole fp32 model;
* the global gradient norm and clipping over DTensor gradients (`clip_grad_norm`);
* the gradient is a mean over the global batch on gloo too (gcc/compat/torch.py `gloo_gradients_as_means`, called by
  gcc/training/builders.py);
* Composer's meta-device initialisation on CPU (gcc/compat/composer.py `meta_init_on`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import torch
from torch.distributed.tensor import DTensor

from gcc.compat.torch import local_shape_and_offset


# ---- this rank's part of a tensor -------------------------------------------------------------------------
def local_slices(t: torch.Tensor) -> tuple[slice, ...]:
    """Where this rank's part of `t` lies in the full tensor: all of it for a plain tensor, this rank's shard
    (FSDP2: rows of dim 0) for a DTensor."""
    if isinstance(t, DTensor):
        shape, offset = local_shape_and_offset(t)
        return tuple(slice(o, o + s) for o, s in zip(offset, shape))
    return tuple(slice(0, s) for s in t.shape)


def local_part(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def fill_local(target: torch.Tensor, read: Callable[[tuple[slice, ...]], torch.Tensor]) -> None:
    """Copy into `target` (a plain tensor or this rank's shard of a DTensor) its part of the full value;
    `read(slices)` returns that part only (a file read of just those rows, or a slice of a full tensor)."""
    local_part(target).copy_(read(local_slices(target)))


# ---- gathering -------------------------------------------------------------------------------------------
@torch.no_grad()
def full_state_dict(
    module: torch.nn.Module, dtype: torch.dtype, keep: bool, instead: Mapping[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """`module.state_dict()` with every tensor in full, as `dtype` on the CPU, kept where `keep` (rank 0) and
    dropped elsewhere; a key of `instead` (the EMA's averages, placed as their parameters) is taken from there.
    Gathered one tensor at a time (a collective per DTensor, on every rank), so the peak is the result plus one
    full tensor: a bf16 export of the 5B model never holds its fp32 state."""
    out = {}
    instead = instead or {}
    for k, v in module.state_dict().items():
        v = instead.get(k, v)
        full = v.full_tensor() if isinstance(v, DTensor) else v
        if keep:
            out[k] = full.detach().to("cpu", dtype)
        del full
    return out


# ---- gradients -------------------------------------------------------------------------------------------
@torch.no_grad()
def clip_grad_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """The global L2 norm of the gradients (over every rank's shard for DTensor gradients), then clipping to
    `max_norm` (inf: no clipping). Returns the norm before clipping, a 0-dim tensor on the gradients' device
    (read it once per step: GradClip's rides StepSync's reduce)."""
    params = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
    if isinstance(norm, DTensor):  # partial sums over the shards: reduce them
        norm = norm.full_tensor()
    if math.isfinite(max_norm):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm
