"""GcDiT: forward/backward, the cond's token footprint, separated timestep, framewise text, hooks, presets, base
weights (docs/design.md §7)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _gc_helpers import gc_forward_inputs, make_batch, randomize_cond, tiny_dit

from gcc.compat.diffsynth import DiTBlock, sinusoidal_embedding_1d
from gcc.model.dit import build_gc_dit, class_fractions, cond_keys, count_params, load_wan_base, wan_keys
from gcc.synth.wan_layout import write_wan_dit
from gcc.vocab import CHANNEL_LUT, UNKNOWN, num_classes


def test_tiny_forward_backward():
    dit = tiny_dit()
    randomize_cond(dit)
    b = make_batch(B=2)
    out, aux = dit.gc_forward(*gc_forward_inputs(b), aux=True)
    assert out.shape == b["input_latents"].shape and torch.isfinite(out).all()
    assert aux["sem_rms"] > 0 and aux["x_rms"] > 0
    out.square().mean().backward()
    no_grad = [n for n, p in dit.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert no_grad == []


def _fractions_reference(sem: np.ndarray, vocab: str) -> np.ndarray:
    """Loop-by-loop: latent frame k covers pixel frames {0} or 4k-3..4k, a token 32x32 pixels."""
    B, F, H, W = sem.shape
    T, V = (F - 1) // 4 + 1, num_classes(vocab)
    out = np.zeros((B, T, H // 32, W // 32, V))
    for b in range(B):
        for k in range(T):
            frames = [0] if k == 0 else list(range(4 * k - 3, 4 * k + 1))
            for i in range(H // 32):
                for j in range(W // 32):
                    cell = sem[b, frames, 32 * i : 32 * i + 32, 32 * j : 32 * j + 32].ravel()
                    ch = CHANNEL_LUT[vocab][cell]
                    out[b, k, i, j] = np.bincount(ch, minlength=V) / cell.size
    return out.reshape(B, -1, V)


@pytest.mark.parametrize("vocab", ["parts", "ids"])
def test_class_fractions_match_footprint(vocab):
    sem = make_batch(B=2, T=3, h=4, w=6, vocab=vocab, seed=3)["sem_ids"]
    sem[0, 1:5, :32, :32] = UNKNOWN  # latent frame 1, token (0, 0): all unknown
    frac = class_fractions(sem, vocab)
    np.testing.assert_allclose(frac.numpy(), _fractions_reference(sem.numpy(), vocab), atol=1e-6)
    assert frac[0, 1 * 2 * 3 + 0, num_classes(vocab) - 1] == 1.0  # UNKNOWN is the last channel
    # a value outside the vocabulary counts for no class (the loader refuses such ids: tests/data): its token's
    # fractions sum to 1 - 1/(its pixels), every other token's to 1
    bad = sem.clone()
    bad[1, 5, 3, 3] = 8  # latent frame 2 (pixel frames 5..8), token (0, 0)
    sums = class_fractions(bad, vocab).sum(-1)
    token = 2 * 2 * 3 + 0
    assert sums[1, token].item() == pytest.approx(1 - 1 / (4 * 32 * 32))
    sums[1, token] = 1.0
    torch.testing.assert_close(sums, torch.ones_like(sums))


def test_sem_ids_must_cover_the_latents():
    dit = tiny_dit()
    x, ts, ctx, ids, sem = gc_forward_inputs(make_batch(B=2, T=3, h=4, w=4))
    with pytest.raises(ValueError, match="do not cover"):
        dit.gc_forward(x, ts, ctx, ids, sem[:, :, :, :32])
    with pytest.raises(ValueError, match="do not cover"):
        dit.gc_forward(x, ts, ctx, ids, sem[:, :5])  # frames of 2 latent frames for 3


def test_separated_timestep_frame0_at_zero():
    dit = tiny_dit()
    b = make_batch(B=2)
    seen = {}
    dit.head.register_forward_pre_hook(lambda m, args: seen.__setitem__("t", args[1].detach()))
    x, ts, ctx, ids, sem = gc_forward_inputs(b)
    with torch.no_grad():
        dit.gc_forward(x, ts, ctx, ids, sem)

        def emb(v):
            return dit.time_embedding(sinusoidal_embedding_1d(dit.freq_dim, torch.tensor([float(v)])))[0]

        t = seen["t"]  # [B, latent frames, dim]: one time embedding per latent frame, for its tokens
        assert t.shape == (2, 3, dit.dim)
        for i, tv in enumerate(ts.tolist()):
            torch.testing.assert_close(t[i, 0], emb(0))
            torch.testing.assert_close(t[i, 1:], emb(tv).expand(2, -1))
        dit.gc_forward(x, ts, ctx, ids, sem, first_frame_cond=False)
        torch.testing.assert_close(seen["t"][0, 0], emb(ts[0]))


def test_text_cell_reaches_only_its_frame():
    # one block: self-attention runs before cross-attention and everything after is per token, so a changed
    # text cell may only move the prediction of its own latent frame
    dit = tiny_dit(num_layers=1)
    b = make_batch(B=1, T=3)
    x, _, ctx, ids, sem = gc_forward_inputs(b)
    ts = torch.tensor([600.0])
    with torch.no_grad():
        base = dit.gc_forward(x, ts, ctx, ids, sem)
        for k in range(3):  # frame k gets a prompt of its own
            ctx2 = torch.cat([ctx, torch.randn_like(ctx[:, :1])], dim=1)
            ids2 = ids.clone()
            ids2[0, k] = ctx.shape[1]
            out = dit.gc_forward(x, ts, ctx2, ids2, sem)
            changed = [(out[:, :, j] - base[:, :, j]).abs().max().item() > 1e-6 for j in range(3)]
            assert changed == [j == k for j in range(3)]


def test_text_embedding_once_per_prompt_equals_per_cell():
    dit = tiny_dit()
    b = make_batch(B=2, T=3)
    prompts = torch.randn(2, 2, *b["context"].shape[2:])  # each clip's two distinct prompts
    index = torch.tensor([[1, 0, 1], [0, 0, 1]])  # each latent frame's prompt among its clip's
    per_cell_ctx = prompts[torch.arange(2)[:, None], index]  # [2, 3, L, D]: the prompt of every cell, repeated
    calls = []
    h = dit.text_embedding.register_forward_hook(lambda m, a, o: calls.append(a[0].shape[0]))
    with torch.no_grad():
        got = dit.embed_context(prompts, index)
        h.remove()
        assert calls == [4]  # the four prompts, not the six cells
        per_cell = dit.text_embedding(per_cell_ctx.reshape(6, *per_cell_ctx.shape[2:]))
        torch.testing.assert_close(got.emb[got.index], per_cell)
        # the cross-attention projects each distinct prompt once and gives what per-frame rows give
        blk = dit.blocks[0].cross_attn
        tokens = torch.randn(2, 3 * 4, dit.dim)
        k_rows = []
        hk = blk.k.register_forward_hook(lambda m, a, o: k_rows.append(a[0].shape[0]))
        framewise = blk(tokens, got)
        hk.remove()
        assert k_rows == [4]  # keys for the four prompts, not the six frames
        q = blk.norm_q(blk.q(tokens.reshape(6, 4, dit.dim)))
        k, v = blk.norm_k(blk.k(per_cell)), blk.v(per_cell)
        attn = torch.softmax(
            q.view(6, 4, 2, -1).transpose(1, 2) @ k.view(6, -1, 2, 32).permute(0, 2, 3, 1) / 32**0.5, -1
        )
        want = blk.o((attn @ v.view(6, -1, 2, 32).transpose(1, 2)).transpose(1, 2).reshape(6, 4, -1))
        torch.testing.assert_close(framewise, want.reshape(2, 12, dit.dim), rtol=1e-5, atol=1e-6)
        # the whole model: distinct prompts + index == every cell its own prompt
        x, ts, _, _, sem = gc_forward_inputs(b)
        own = torch.arange(3).expand(2, 3)
        torch.testing.assert_close(
            dit.gc_forward(x, ts, prompts, index, sem), dit.gc_forward(x, ts, per_cell_ctx, own, sem)
        )


def test_fsdp_hook_selects_exactly_the_blocks_as_wrapped():
    from _gc_helpers import null_embedding

    from gcc.model.objective import GcTrainModel

    for mode in ("none", "block"):
        dit = tiny_dit(num_layers=3)
        model = GcTrainModel(dit, seed=0, null_context=null_embedding())
        # Composer wraps each direct child of the ComposerModel, asking the child's hook about every submodule
        assert [n for n, _ in model.named_children()] == ["dit"]
        b = make_batch(B=1)
        ref = dit.gc_forward(*gc_forward_inputs(b))
        dit.wrap_blocks(mode)
        units = [m for m in dit.modules() if dit.fsdp_wrap_fn(m)]
        assert units == list(dit.blocks) and len(units) == 3
        assert all((type(u).__name__ == "CheckpointWrapper") == (mode == "block") for u in units)
        inner = [u._checkpoint_wrapped_module if mode == "block" else u for u in units]
        assert all(isinstance(m, DiTBlock) for m in inner)
        torch.testing.assert_close(dit.gc_forward(*gc_forward_inputs(b)), ref)


def test_param_init_fn_materialises_a_meta_model():
    # what Composer's FSDP meta init does: to_empty per module, then the child's param_init_fn
    dit = build_gc_dit("tiny", device="meta")
    for m in dit.modules():
        if any(p.is_meta for p in m.parameters(recurse=False)):
            m.to_empty(device="cpu", recurse=False)
            dit.param_init_fn(m)
    params = dict(dit.named_parameters())
    assert not any(p.is_meta for p in params.values())
    assert all(torch.isfinite(p).all() for p in params.values())
    assert torch.equal(params["blocks.0.self_attn.norm_q.weight"], torch.ones(64))
    assert params["blocks.1.modulation"].std() > 0 and params["head.modulation"].std() > 0
    assert (params["gc_sem_cond.proj_out.weight"] == 0).all() and (params["gc_sem_cond.proj_out.bias"] == 0).all()
    b = make_batch(B=1)
    out, aux = dit.gc_forward(*gc_forward_inputs(b), aux=True)
    assert torch.isfinite(out).all() and aux["sem_rms"] == 0


def test_ti2v_5b_on_meta_has_831_keys_and_5b_params():
    dit = build_gc_dit("ti2v-5b", device="meta")
    assert all(p.is_meta for p in dit.parameters())
    assert len(dit.state_dict()) == 831
    assert (len(wan_keys(dit)), len(cond_keys(dit))) == (825, 6)
    n = count_params(dit)
    assert 4.95e9 < n < 5.05e9
    cfg = dit.config
    assert (
        cfg.dim,
        cfg.ffn_dim,
        cfg.num_heads,
        cfg.num_layers,
        cfg.in_dim,
        cfg.out_dim,
        tuple(cfg.patch_size),
        cfg.text_dim,
        cfg.freq_dim,
    ) == (3072, 14336, 24, 30, 48, 48, (1, 2, 2), 4096, 256)
    assert dit.seperated_timestep and dit.fuse_vae_embedding_in_latents
    assert not dit.require_vae_embedding and not dit.require_clip_embedding
    assert dit.gc_sem_cond.proj_in.in_features == num_classes("parts")


def test_load_sharded_base_weights(tmp_path):
    sd = write_wan_dit(tmp_path)
    dit = tiny_dit(seed=3)
    cond_before = {k: v.clone() for k, v in dit.state_dict().items() if k.startswith("gc_sem_cond.")}
    load_wan_base(dit, tmp_path)
    got = dit.state_dict()
    assert set(sd) == set(wan_keys(dit))
    for k, v in sd.items():
        torch.testing.assert_close(got[k], v, msg=k)
    for k, v in cond_before.items():
        torch.testing.assert_close(got[k], v)


def test_load_base_weights_errors(tmp_path):
    write_wan_dit(tmp_path)
    (tmp_path / "diffusion_pytorch_model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="00002-of-00002"):
        load_wan_base(tiny_dit(), tmp_path)
    other = tmp_path / "wide"
    other.mkdir()
    write_wan_dit(other, dim=128)
    with pytest.raises(ValueError, match="shape"):
        load_wan_base(tiny_dit(), other)
    with pytest.raises(FileNotFoundError, match="index"):
        load_wan_base(tiny_dit(), tmp_path / "nothing")
