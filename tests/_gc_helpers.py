"""Tiny models and synthetic batches for the model/objective/export tests (the loader's batch contract)."""

from __future__ import annotations

import torch

from gcc.geometry import Geometry
from gcc.model.dit import build_gc_dit
from gcc.vocab import VOCAB_VALUES

L_TXT, D_TXT = 16, 64  # tiny synthetic text: L tokens of width D


def export_metadata(**fields) -> dict:
    """A gc25d export's metadata for tests: sft_v10's hyperparameters, a synthetic dataset, `fields` on top."""
    from gcc.model.export import gc_metadata

    base = dict(
        vocab="parts",
        data="synth",
        data_root="",
        step=1,
        text_dropout=0.1,
        cond_dropout=0.05,
        mask_p=0.5,
        lr=1e-5,
        cond_lr=1e-4,
        weight_decay=0.01,
        warmup_steps=500,
        first_frame_cond=True,
        seed=0,
        init_ckpt="",
        model_dir="",
    )
    return gc_metadata(**{**base, **fields})


def tiny_dit(vocab: str = "parts", seed: int = 0, **overrides):
    return build_gc_dit("tiny", vocab=vocab, init_seed=seed, **overrides)


def randomize_cond(dit, seed: int = 1, scale: float = 0.5):
    """Give the zero-initialised proj_out real weights, so the condition has an effect."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in dit.gc_sem_cond.proj_out.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)


def make_batch(
    B: int = 2,
    T: int = 3,
    h: int = 4,
    w: int = 4,
    seed: int = 0,
    vocab: str = "parts",
    sample_ids=None,
    epochs=None,
    clip_ids=None,
) -> dict:
    g = torch.Generator().manual_seed(seed)
    F, H, W = Geometry(T=T, h=h, w=w, text_L=L_TXT, text_D=D_TXT).sem_shape
    values = torch.tensor(VOCAB_VALUES[vocab], dtype=torch.uint8)
    ids = torch.randint(0, 5, (B, T), generator=g)
    table = torch.randn(5, L_TXT, D_TXT, generator=g)
    return {
        "input_latents": torch.randn(B, 48, T, h, w, generator=g).to(torch.bfloat16),
        "context": table[ids].to(torch.bfloat16),
        "context_ids": ids,
        "sem_ids": values[torch.randint(0, len(values), (B, F, H, W), generator=g)],
        "clip_id": list(clip_ids) if clip_ids is not None else [f"clip_{seed}_{i}" for i in range(B)],
        "sample_id": torch.tensor(sample_ids if sample_ids is not None else [seed * 100 + i for i in range(B)]),
        "epoch": torch.tensor(epochs if epochs is not None else [0] * B),
        "drop_text": torch.zeros(B, dtype=torch.bool),
        "drop_cond": torch.zeros(B, dtype=torch.bool),
        "mask_frac": torch.zeros(B, dtype=torch.float32),
    }


def null_embedding(seed: int = 7) -> torch.Tensor:
    return torch.randn(L_TXT, D_TXT, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
