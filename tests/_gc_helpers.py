"""Tiny models and synthetic batches for the model/objective/export tests (the loader's batch contract)."""

from __future__ import annotations

import torch

from gcc.data.batch import gc_collate
from gcc.data.text_table import distinct_in_order
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


def make_samples(
    B: int = 2,
    T: int = 3,
    h: int = 4,
    w: int = 4,
    seed: int = 0,
    vocab: str = "parts",
    sample_ids=None,
    epochs=None,
    clip_ids=None,
) -> list[dict]:
    """B samples as the loader makes them (GcStreamingDataset.make_sample), from a random text table of 5 prompts:
    each clip's T cells drawn from them, its distinct prompts and each cell's index among them."""
    g = torch.Generator().manual_seed(seed)
    F, H, W = Geometry(T=T, h=h, w=w, text_L=L_TXT, text_D=D_TXT).sem_shape
    values = torch.tensor(VOCAB_VALUES[vocab], dtype=torch.uint8)
    ids = torch.randint(0, 5, (B, T), generator=g)
    table = torch.randn(5, L_TXT, D_TXT, generator=g).to(torch.bfloat16)
    latents = torch.randn(B, 48, T, h, w, generator=g).to(torch.bfloat16)
    sem = values[torch.randint(0, len(values), (B, F, H, W), generator=g)]
    samples = []
    for i, row in enumerate(ids.tolist()):
        distinct, index = distinct_in_order(row)
        samples.append(
            {
                "input_latents": latents[i],
                "context": table[distinct],
                "context_index": torch.tensor(index),
                "context_ids": ids[i],
                "sem_ids": sem[i],
                "clip_id": clip_ids[i] if clip_ids is not None else f"clip_{seed}_{i}",
                "sample_id": sample_ids[i] if sample_ids is not None else seed * 100 + i,
                "epoch": epochs[i] if epochs is not None else 0,
                "dropped": {"text": False, "cond": False, "mask": 0.0},
            }
        )
    return samples


def make_batch(*args, **kwargs) -> dict:
    """`make_samples` collated as the loader collates them (gcc.data.dataset.gc_collate)."""
    return gc_collate(make_samples(*args, **kwargs))


def gc_forward_inputs(batch) -> tuple:
    """`GcDiT.gc_forward`'s positional inputs from a `make_batch` batch: fp32 latents, a timestep per clip (500,
    200), fp32 prompts, each frame's prompt index and the sem ids."""
    return (
        batch["input_latents"].float(),
        torch.tensor([500.0, 200.0][: batch["context"].shape[0]]),
        batch["context"].float(),
        batch["context_index"],
        batch["sem_ids"],
    )


def null_embedding(seed: int = 7) -> torch.Tensor:
    return torch.randn(L_TXT, D_TXT, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
