"""The DiT's model FLOPs for one training step, from its config and the batch's shapes: what Composer's SpeedMonitor
turns into `throughput/flops_per_sec` and MFU (`GcTrainModel.flops_per_batch`; docs/performance.md, "FLOPs and MFU").

Counted as MFU counts them: the matrix products of the forward and of its backward, 2 FLOPs per multiply-add. The
backward of a product is two products (the gradients of its input and of its weight), except in the first layer of
each input path (the patch embedding, the condition's first layer, the time and the text embeddings' first layers),
whose input needs no gradient: one. Elementwise work (norms, RoPE, softmax, modulation) and the recomputation of
activation checkpointing are not counted. tests/model/test_flops.py checks the count against torch's own FLOP
counter on a real forward and backward.
"""

from __future__ import annotations

from gcc.model.dit import DiTConfig
from gcc.vocab import num_classes


def train_flops(
    cfg: DiTConfig, *, samples: int, frames: int, height: int, width: int, text_len: int, prompts: int
) -> int:
    """Model FLOPs of one forward and backward of `samples` clips of latents [C, frames, height, width] whose
    text cells hold `prompts` distinct prompts of `text_len` rows in all (each prompt is embedded, and its keys and
    values projected, once: gcc/model/dit.py `FramewiseCrossAttention`)."""
    pt, ph, pw = cfg.patch_size
    d, patch = cfg.dim, pt * ph * pw  # a token's latent cells
    f = frames // pt
    tokens = f * (height // ph) * (width // pw)  # a clip's patch tokens: its self-attention sequence
    rows = prompts * text_len  # embedded text rows, all clips together
    # multiply-adds of the first layers, whose input needs no gradient, for all clips
    first = (
        samples * tokens * cfg.in_dim * patch * d  # patch embedding
        + samples * tokens * num_classes(cfg.vocab) * cfg.cond_hidden  # gc_sem_cond.proj_in
        + samples * f * cfg.freq_dim * d  # time_embedding[0]: one timestep per latent frame
        + rows * cfg.text_dim * d  # text_embedding[0]
    )
    block = (
        6 * tokens * d * d  # self-attention q, k, v, o and cross-attention q, o
        + 2 * tokens * tokens * d  # self-attention: scores and their weighted sum
        + 2 * tokens * text_len * d  # cross-attention: each frame's tokens to its prompt's rows
        + 2 * tokens * d * cfg.ffn_dim  # feed-forward
    )
    rest = (
        samples * cfg.num_layers * block
        + cfg.num_layers * rows * 2 * d * d  # cross-attention k, v of each prompt
        + samples * tokens * (cfg.cond_hidden * d + d * d)  # gc_sem_cond.proj_mid, proj_out
        + samples * f * 7 * d * d  # time_embedding[2], time_projection (to 6 × dim)
        + rows * d * d  # text_embedding[2]
        + samples * tokens * d * cfg.out_dim * patch  # head
    )
    # forward 1×, backward 2× (1× for the first layers), 2 FLOPs per multiply-add
    return 2 * (2 * first + 3 * rest)
