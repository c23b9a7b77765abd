"""Contract tests of gcc/compat/diffsynth.py against the installed DiffSynth."""

from __future__ import annotations

import pytest
import torch

from gcc.compat.diffsynth import CrossAttention, DiTBlock, use_class


def test_a_blocks_cross_attention_can_take_a_subclass_keeping_its_parameters():
    block = DiTBlock(has_image_input=False, dim=16, num_heads=2, ffn_dim=32)
    assert type(block.cross_attn) is CrossAttention
    before = {k: v for k, v in block.state_dict().items()}

    class Framewise(CrossAttention):
        pass

    use_class(block.cross_attn, Framewise)
    assert type(block.cross_attn) is Framewise
    after = block.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    with pytest.raises(TypeError, match="not a subclass"):
        use_class(block.self_attn, Framewise)
