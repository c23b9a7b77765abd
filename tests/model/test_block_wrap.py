"""Activation checkpointing and compilation of the DiT blocks (gcc/model/block_wrap.py): the same output and the
same gradients as the blocks unwrapped, fewer activations kept; `selective` keeps the attention kernels' outputs
and recomputes the rest; compiled blocks (inductor, on CPU) compute what the eager ones do. FSDP2 over two ranks
with each of these: tests/model/test_model_fsdp.py."""

from __future__ import annotations

import pytest
import torch
from _gc_helpers import gc_forward_inputs, make_batch, randomize_cond, tiny_dit

from gcc.model.block_wrap import wrap_blocks


def _step(dit, batch):
    """Output and gradients (by state-dict name) of one forward and backward."""
    out = dit.gc_forward(*gc_forward_inputs(batch))
    out.square().mean().backward()
    grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad.clone() for n, p in dit.named_parameters()}
    return out.detach(), grads


@pytest.mark.parametrize("checkpointing", ["block", "selective"])
def test_activation_checkpointing_same_result_and_grads(checkpointing):
    b = make_batch(B=1)
    grads, saved, keys = [], [], []
    for mode in ("none", checkpointing):
        dit = tiny_dit(seed=5)
        randomize_cond(dit)
        dit.wrap_blocks(mode)
        keys.append(list(dit.state_dict()))

        def pack(t, mode=mode):
            saved.append((mode, t.numel()))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = dit.gc_forward(*gc_forward_inputs(b))
        out.square().mean().backward()
        grads.append({n.replace("_checkpoint_wrapped_module.", ""): p.grad.clone() for n, p in dit.named_parameters()})
    assert keys[0] == keys[1]  # the wrappers rename no key of the state dict (checkpoints, exports)
    assert set(grads[0]) == set(grads[1])
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], msg=n)
    kept = {m: sum(n for mm, n in saved if mm == m) for m in ("none", checkpointing)}
    assert kept[checkpointing] < kept["none"]  # fewer activations saved for backward


def test_selective_checkpointing_keeps_the_attention_outputs_and_recomputes_the_rest():
    from gcc.model.block_wrap import SAVED_OPS

    b = make_batch(B=1)
    ran = {"block": [], "selective": []}

    class Count(torch.utils._python_dispatch.TorchDispatchMode):
        def __init__(self, into):
            super().__init__()
            self.into = into

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.into.append(func)
            return func(*args, **(kwargs or {}))

    for mode in ran:
        dit = tiny_dit(seed=5, num_layers=1)
        dit.wrap_blocks(mode)
        out = dit.gc_forward(*gc_forward_inputs(b))
        with Count(ran[mode]):
            out.square().mean().backward()
    attention = [f for f in ran["block"] if f in SAVED_OPS]
    assert len(attention) == 2  # the block's recomputation runs its self- and cross-attention again
    assert not [f for f in ran["selective"] if f in SAVED_OPS]  # kept from the forward
    linear = torch.ops.aten.addmm.default
    assert ran["selective"].count(linear) == ran["block"].count(linear) > 0  # the projections are recomputed


def test_an_unknown_checkpointing_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="'all': expected one of block, selective, none"):
        wrap_blocks(tiny_dit().blocks, "all", False)


@pytest.mark.slow  # inductor compiles the block on the CPU: ~20-50 s
@pytest.mark.parametrize("checkpointing", ["selective"])
def test_compiled_blocks_compute_what_eager_blocks_compute(checkpointing):
    b = make_batch(B=2, seed=3)
    results = []
    for compiled in (False, True):
        dit = tiny_dit(seed=5)
        randomize_cond(dit)
        dit.wrap_blocks(checkpointing, compile=compiled)
        results.append([_step(dit, b), _step(dit, make_batch(B=2, seed=4))])  # the second: another prompt count
        assert list(dit.state_dict()) == list(tiny_dit().state_dict())  # compiled in place: the same keys
    for (out_e, grads_e), (out_c, grads_c) in zip(*results):
        torch.testing.assert_close(out_c, out_e, rtol=1e-4, atol=1e-5)
        for n in grads_e:
            torch.testing.assert_close(grads_c[n], grads_e[n], rtol=1e-3, atol=1e-6, msg=n)
