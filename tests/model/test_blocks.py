"""gcc's forms of Wan's modules (gcc/model/blocks.py) compute what DiffSynth's own modules compute, in fp32, with the
same parameters: the block with its modulation per latent frame against DiffSynth's DiTBlock with it per token, the
head likewise, RoPE on real cos/sin tables against DiffSynth's complex128 `rope_apply`, and the tables against its
`precompute_freqs_cis_3d`. Gradients too: the backward is autograd's of these forwards."""

from __future__ import annotations

import copy

import pytest
import torch

from gcc.compat.diffsynth import DiTBlock, Head, precompute_freqs_cis_3d, use_class
from gcc.model.blocks import BLOCK_CLASSES, FrameContext, GcDiTBlock, GcHead, rope, rope_tables
from gcc.model.dit import build_gc_dit

DIM, HEADS, FFN = 64, 2, 96  # head dim 32: its RoPE split 12 / 10 / 10 as in the tiny preset
GRID = (3, 2, 4)  # latent frames, token rows, token columns
S = GRID[0] * GRID[1] * GRID[2]


def diffsynth_freqs(head_dim: int, grid: tuple[int, int, int]) -> torch.Tensor:
    """DiffSynth's RoPE table of a token grid, as its WanModel.forward builds it: complex128 [S, 1, head_dim/2]."""
    f, h, w = grid
    tabs = precompute_freqs_cis_3d(head_dim)
    return torch.cat(
        [
            tabs[0][:f].view(f, 1, 1, -1).expand(f, h, w, -1),
            tabs[1][:h].view(1, h, 1, -1).expand(f, h, w, -1),
            tabs[2][:w].view(1, 1, w, -1).expand(f, h, w, -1),
        ],
        dim=-1,
    ).reshape(f * h * w, 1, -1)


def gc_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of a DiffSynth module with gcc's classes swapped in, as GcDiT does."""
    twin = copy.deepcopy(module)
    for m in twin.modules():
        if type(m) in BLOCK_CLASSES:
            use_class(m, BLOCK_CLASSES[type(m)])
    return twin


def test_the_rope_tables_are_diffsynths_angles_and_the_rotation_its_complex_product():
    head_dim = 48  # split 16 / 16 / 16: every axis its own part
    ref = diffsynth_freqs(head_dim, GRID)
    tables = rope_tables(head_dim, GRID, "cpu")
    assert tables.cos.dtype == torch.float32 and tables.cos.shape == (S, 1, head_dim // 2)
    torch.testing.assert_close(tables.cos, ref.real.float(), rtol=0, atol=1e-7)
    torch.testing.assert_close(tables.sin, ref.imag.float(), rtol=0, atol=1e-7)
    from diffsynth.models.wan_video_dit import rope_apply

    x = torch.randn(2, S, 3 * head_dim)
    torch.testing.assert_close(rope(x, tables, 3), rope_apply(x, ref, 3), rtol=1e-6, atol=1e-6)


def _block_inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    B, L = 2, 5
    x = torch.randn(B, S, DIM, generator=g)
    context = torch.randn(B, L, DIM, generator=g)  # one prompt per clip: DiffSynth's cross-attention takes it
    t_mod = torch.randn(B, GRID[0], 6, DIM, generator=g) * 0.3  # per latent frame
    return x, context, t_mod


def test_the_block_is_diffsynths_block_with_the_modulation_per_frame():
    torch.manual_seed(0)
    ref = DiTBlock(False, DIM, HEADS, FFN, eps=1e-6)
    gc = gc_copy(ref)
    assert type(gc) is GcDiTBlock and list(gc.state_dict()) == list(ref.state_dict())
    x, context, t_mod = _block_inputs(1)
    B, f = x.shape[0], GRID[0]
    per_token = t_mod[:, :, None].expand(B, f, S // f, 6, DIM).reshape(B, S, 6, DIM)  # DiffSynth's input form
    xr, xg = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = ref(xr, context, per_token, diffsynth_freqs(DIM // HEADS, GRID))
    frames = FrameContext(context, torch.arange(B).repeat_interleave(f))  # every frame of a clip: its prompt
    got = gc(xg, frames, t_mod, rope_tables(DIM // HEADS, GRID, "cpu"))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    w = torch.randn_like(want)
    (want * w).sum().backward()
    (got * w).sum().backward()
    torch.testing.assert_close(xg.grad, xr.grad, rtol=1e-4, atol=1e-5)
    for (name, pr), pg in zip(ref.named_parameters(), gc.parameters()):
        torch.testing.assert_close(pg.grad, pr.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_the_head_is_diffsynths_head_with_the_time_embedding_per_frame():
    torch.manual_seed(0)
    ref = Head(DIM, 48, (1, 2, 2), eps=1e-6)
    gc = gc_copy(ref)
    assert type(gc) is GcHead
    x, _, t_mod = _block_inputs(2)
    t = t_mod[:, :, 0]  # [B, f, dim]
    per_token = t[:, :, None].expand(-1, -1, S // GRID[0], -1).reshape(x.shape)
    torch.testing.assert_close(gc(x, t), ref(x, per_token), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vocab", ["parts", "ids"])
def test_every_diffsynth_module_of_the_model_runs_in_gccs_form_and_keeps_its_keys(vocab):
    dit = build_gc_dit("tiny", vocab=vocab)
    plain_keys = set(DiTBlock(False, 64, 2, 128).state_dict())
    for block in dit.blocks:
        assert type(block) is GcDiTBlock and set(block.state_dict()) == plain_keys
    assert not [m for m in dit.modules() if type(m) in BLOCK_CLASSES]  # no DiffSynth form left


def test_one_prompt_per_clip_attends_directly_as_the_framewise_path_does():
    """A context of one prompt per clip (its shape says so) skips the per-frame copy of the keys and values: the
    same result as the framewise path, which a second, unused prompt per clip forces."""
    torch.manual_seed(0)
    cross = gc_copy(DiTBlock(False, DIM, HEADS, FFN)).cross_attn
    B, f, L = 2, GRID[0], 5
    x = torch.randn(B, S, DIM)
    emb = torch.randn(B, L, DIM)
    rows = []
    hook = cross.k.register_forward_hook(lambda m, a, o: rows.append(a[0].shape[0]))
    direct = cross(x, FrameContext(emb, torch.arange(B).repeat_interleave(f)))
    two = torch.stack([emb, torch.randn(B, L, DIM)], dim=1).reshape(2 * B, L, DIM)  # prompt 2b is clip b's
    framewise = cross(x, FrameContext(two, (2 * torch.arange(B)).repeat_interleave(f)))
    hook.remove()
    assert rows == [B, 2 * B]
    torch.testing.assert_close(direct, framewise, rtol=1e-5, atol=1e-6)
