"""Wan's DiT block as gcc runs it (docs/design.md §7): DiffSynth's modules and parameters, in a form that costs less
memory traffic and that torch.compile takes whole (docs/performance.md, "The block").

Each class subclasses DiffSynth's and adds no parameter or buffer: a built `WanModel` has its modules' classes
swapped in place (`gcc.compat.diffsynth.use_class`), so its state dict, keys and initialisation stay Wan's. The
forwards compute what DiffSynth's compute (tests/model/test_blocks.py checks each against DiffSynth's own, in fp32)
with three changes of form:

* the timestep modulation is held per latent frame ([B, f, 6, dim]) and broadcast over the frame's tokens, where
  DiffSynth expands it per token ([B, f·n, 6, dim]: ≈ 300 MB at v10 per block, read and written in forward and
  backward); `modulate` and the gates are one fused multiply-add each;
* RoPE rotates real pairs with cos/sin tables in float32 (`rope_tables`), where DiffSynth multiplies complex128
  numbers: complex dtypes are not compiled, and the tables are made on the device, with no copy from the host;
* the cross-attention's keys and values are projected once per distinct prompt and indexed per frame
  (`FramewiseCrossAttention`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gcc.compat.diffsynth import CrossAttention, DiTBlock, Head, SelfAttention
from gcc.model.attention import attend


@dataclass
class FrameContext:
    """A batch's text context, one prompt per latent frame, held once per distinct prompt: `emb` [U, L, dim]
    (the embedded prompts), `index` [B*T] (each frame's prompt, frames of a sample consecutive). A clip repeats
    few prompts over its frames, and a prompt's keys and values do not depend on the frame."""

    emb: torch.Tensor
    index: torch.Tensor


@dataclass
class Rope:
    """3D RoPE tables of a clip's tokens: cos and sin [f·h·w, 1, head_dim / 2], float32."""

    cos: torch.Tensor
    sin: torch.Tensor


def rope_tables(head_dim: int, grid: tuple[int, int, int], device) -> Rope:
    """The angles of DiffSynth's `precompute_freqs_cis_3d` (theta 10000; the head's dimensions split frames /
    height / width as head_dim - 2·(head_dim // 3), head_dim // 3, head_dim // 3) for a [f, h, w] token grid, in
    float64 as there, made on `device`."""
    parts = (head_dim - 2 * (head_dim // 3), head_dim // 3, head_dim // 3)
    angles = []
    for axis, (size, d) in enumerate(zip(grid, parts)):
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=device)[: d // 2].double() / d))
        a = torch.outer(torch.arange(size, device=device), inv)  # [size, d/2]
        view = [1, 1, 1, d // 2]
        view[axis] = size
        angles.append(a.view(view).expand(*grid, d // 2))
    ang = torch.cat(angles, dim=-1).reshape(-1, 1, head_dim // 2)
    return Rope(ang.cos().float(), ang.sin().float())


def rope(x: torch.Tensor, tables: Rope, num_heads: int) -> torch.Tensor:
    """x [B, S, heads·d] with each head's dimensions as (re, im) pairs, rotated by the tables' angles."""
    B, S, _ = x.shape
    re, im = x.float().reshape(B, S, num_heads, -1, 2).unbind(-1)
    c, s = tables.cos, tables.sin
    out = torch.stack((re * c - im * s, re * s + im * c), dim=-1)
    return out.flatten(2).to(x.dtype)


class GcSelfAttention(SelfAttention):
    """DiffSynth's SelfAttention with real-valued RoPE (`rope`) and gcc's attention kernel."""

    def forward(self, x: torch.Tensor, freqs: Rope) -> torch.Tensor:
        q = rope(self.norm_q(self.q(x)), freqs, self.num_heads)
        k = rope(self.norm_k(self.k(x)), freqs, self.num_heads)
        return self.o(attend(q, k, self.v(x), self.num_heads))


class FramewiseCrossAttention(CrossAttention):
    """Wan's CrossAttention (same parameters, same keys); given a FrameContext, each frame's n tokens attend only
    to their frame's prompt.

    The keys and values are projected once per distinct prompt, then indexed per frame: projecting them per
    frame would cost T× the work in every block (at v10, 21 latent frames × 512 text rows). The tokens are
    reshaped to [B*T, n, dim], which is exact and cheaper than a block-diagonal attention mask. When every clip
    has one prompt (the context's shape says so: no value is read), each clip's tokens attend to it directly, as
    in Wan, with no per-frame copy of the keys and values. A plain context tensor takes Wan's own path.
    """

    def forward(self, x: torch.Tensor, y: torch.Tensor | FrameContext):
        if not isinstance(y, FrameContext):
            return super().forward(x, y)
        B, S, D = x.shape
        T = y.index.numel() // B
        if T * B != y.index.numel() or S % T or self.has_image_input:
            raise ValueError(
                f"context of {y.index.numel()} frames does not split tokens {tuple(x.shape)} into "
                f"frames (or the model has image input)"
            )
        if y.emb.shape[0] == B:  # one prompt per clip: every index points at it
            q, k, v = self.norm_q(self.q(x)), self.norm_k(self.k(y.emb)), self.v(y.emb)
            return self.o(attend(q, k, v, self.num_heads))
        q = self.norm_q(self.q(x.reshape(B * T, S // T, D)))
        k = self.norm_k(self.k(y.emb))[y.index]
        v = self.v(y.emb)[y.index]
        return self.o(attend(q, k, v, self.num_heads)).reshape(B, S, D)


def _frames(x: torch.Tensor, f: int) -> torch.Tensor:
    """[B, f·n, D] -> [B, f, n, D] (a view)."""
    return x.unflatten(1, (f, -1))


class GcDiTBlock(DiTBlock):
    """DiffSynth's DiTBlock with the modulation per latent frame: t_mod [B, f, 6, dim] (DiffSynth's takes it per
    token, [B, f·n, 6, dim], or one per sample)."""

    def forward(self, x, context, t_mod, freqs):
        B, S, D = x.shape
        f = t_mod.shape[1]
        mod = (self.modulation.to(dtype=t_mod.dtype, device=t_mod.device) + t_mod).unsqueeze(2)  # [B, f, 1, 6, D]
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod.unbind(3)  # each [B, f, 1, D]
        h = torch.addcmul(shift_msa, _frames(self.norm1(x), f), 1 + scale_msa).reshape(B, S, D)
        x = torch.addcmul(_frames(x, f), gate_msa, _frames(self.self_attn(h, freqs), f)).reshape(B, S, D)
        x = x + self.cross_attn(self.norm3(x), context)
        h = torch.addcmul(shift_mlp, _frames(self.norm2(x), f), 1 + scale_mlp).reshape(B, S, D)
        return torch.addcmul(_frames(x, f), gate_mlp, _frames(self.ffn(h), f)).reshape(B, S, D)


class GcHead(Head):
    """DiffSynth's Head with the time embedding per latent frame: t [B, f, dim]."""

    def forward(self, x, t_mod):
        B, S, D = x.shape
        f = t_mod.shape[1]
        mod = self.modulation.unsqueeze(0).to(dtype=t_mod.dtype, device=t_mod.device) + t_mod.unsqueeze(2)
        shift, scale = mod.unsqueeze(2).unbind(3)  # each [B, f, 1, D]
        return self.head(torch.addcmul(shift, _frames(self.norm(x), f), 1 + scale).reshape(B, S, D))


# DiffSynth's class -> gcc's: what `GcDiT` swaps in its modules
BLOCK_CLASSES = {
    SelfAttention: GcSelfAttention,
    CrossAttention: FramewiseCrossAttention,
    DiTBlock: GcDiTBlock,
    Head: GcHead,
}
