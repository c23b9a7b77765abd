"""The DiT's model FLOPs (gcc/model/flops.py, GcTrainModel.flops_per_batch), which Composer's SpeedMonitor turns into
FLOP/s and MFU, against torch's own FLOP counter on a real forward and backward of the objective."""

from __future__ import annotations

import pytest
import torch
from _gc_helpers import D_TXT, L_TXT, make_batch, null_embedding, tiny_dit
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from gcc.data.batch import split_batch
from gcc.data.text_table import distinct_in_order, stack_prompts
from gcc.model.objective import GcTrainModel


def measured_flops(model: GcTrainModel, batch: dict) -> int:
    """torch's count of one training forward and backward of each clip of `batch`, as the trainer runs it (micro-
    batches of one: gcc.data.dataset.split_batch). Attention runs as plain matrix products (torch's CPU attention
    kernel is not in its counter's table), without a recomputation in the backward: model FLOPs."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        for micro in split_batch(batch, 1):
            model.loss(model(micro), micro).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize(
    ("overrides", "shape", "context_ids"),
    [
        ({}, dict(T=3, h=4, w=6), [[0, 1, 1], [2, 3, 4]]),  # the tiny preset; 2 + 3 distinct prompts
        # wider, deeper, another patch and another vocabulary; one clip, a prompt repeated over its frames
        (
            dict(dim=96, num_heads=3, ffn_dim=160, num_layers=3, patch_size=[1, 1, 2], vocab="ids"),
            dict(T=2, h=2, w=4),
            [[3, 3]],
        ),
    ],
)
def test_the_count_is_torchs_count_of_a_training_step(overrides, shape, context_ids):
    dit = tiny_dit(**{k: tuple(v) if k == "patch_size" else v for k, v in overrides.items()})
    model = GcTrainModel(dit, seed=0, null_context=null_embedding())
    ids = torch.tensor(context_ids)
    batch = make_batch(B=ids.shape[0], vocab=dit.config.vocab, **shape)
    table = torch.randn(5, L_TXT, D_TXT, generator=torch.Generator().manual_seed(1))
    prompts = [distinct_in_order(row) for row in context_ids]
    batch["context"], batch["context_index"] = stack_prompts([(table[d], torch.tensor(i)) for d, i in prompts])
    batch["context_ids"], batch["prompts"] = ids, [len(d) for d, _ in prompts]
    # exact: every matrix product of the step is in the count, once
    assert model.flops_per_batch(batch) == measured_flops(model, batch)
