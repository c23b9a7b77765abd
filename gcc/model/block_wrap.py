"""Activation checkpointing and compilation of the DiT blocks (docs/performance.md, "Memory" and "Compiled blocks").

Each block is wrapped in torchtitan's order: the checkpoint wrapper, then torch.compile, then (by Composer, from
`GcDiT.fsdp_wrap_fn`) FSDP2, so that an FSDP unit's all-gather and reshard run around the compiled, checkpointed
block, and the compiler sees the checkpoint (and a selective policy) inside its graph.

* `none`: every activation of the block is kept for backward.
* `block`: only the block's input is kept; backward runs the whole block's forward again (the least memory).
* `selective`: the outputs of the attention kernels are kept too (`SAVED_OPS`): backward recomputes the
  projections, norms and feed-forward but not the attention, the block's costliest op at long sequences, for
  one [tokens, dim] tensor per attention and block.

Compilation is in place (`nn.Module.compile`): the module keeps its class and its parameters their names, so a
compiled run's checkpoints and exports are an eager run's.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

CHECKPOINTING = ("block", "selective", "none")

_aten = torch.ops.aten
# the attention kernels whose outputs `selective` keeps (SDPA's backends; FlashAttention 3's op when installed)
SAVED_OPS = {
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def _flash3_ops() -> set:
    """FlashAttention 3's forward op, where its package registers one with torch (it does in its newer releases)."""
    ns = getattr(torch.ops, "flash_attn_3", None)
    found = set()
    for name in ("_flash_attn_forward", "fwd"):
        try:
            found.add(getattr(ns, name).default)
        except (AttributeError, RuntimeError):
            pass
    return found


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts():
    return create_selective_checkpoint_contexts(_policy)


def wrap_blocks(blocks: nn.ModuleList, checkpointing: str, compile: bool) -> None:
    """Replace each block of `blocks` by its wrapped form (module docstring)."""
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"activation checkpointing {checkpointing!r}: expected one of {', '.join(CHECKPOINTING)}")
    SAVED_OPS.update(_flash3_ops())
    for i, block in enumerate(blocks):
        if checkpointing != "none":
            kwargs = {"context_fn": _selective_contexts} if checkpointing == "selective" else {}
            block = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **kwargs)
        if compile:
            block.compile()
        blocks[i] = block
