"""The attention kernel (gcc/model/attention.py): chosen by name once per process, SDPA's backends tried in the
stated order, the choice stated for the launch's first lines; `attend` computes attention as DiffSynth's own
function does."""

from __future__ import annotations

import pytest
import torch

from gcc.compat.torch import sdpa_order
from gcc.model import attention
from gcc.model.attention import SDPA_ORDER, attend, backends_at, current_kernel, select_attention


@pytest.fixture(autouse=True)
def default_kernel():
    yield
    select_attention("auto", "cpu")  # the process-wide default again, for the tests after


def test_auto_on_a_cpu_is_sdpa_with_the_backends_in_the_stated_order():
    kernel = select_attention("auto", "cpu")
    assert kernel == current_kernel() and kernel.name == "sdpa" and kernel.order == SDPA_ORDER
    assert sdpa_order() == list(SDPA_ORDER)
    assert kernel.describe() == "PyTorch SDPA, backends in order flash > cudnn > efficient > math"
    assert backends_at((1, 2, 64, 32), (1, 2, 16, 32), torch.float32, "cpu") == "flash"  # SDPA's CPU kernel


def test_a_named_backend_goes_first_and_the_rest_keep_their_order():
    kernel = select_attention("sdpa_efficient", "cpu")
    assert kernel.order == ("efficient", "flash", "cudnn", "math") and sdpa_order() == list(kernel.order)
    # the order is CUDA's: on a CPU, SDPA runs its flash kernel where it can, whatever the order
    assert backends_at((1, 2, 64, 32), (1, 2, 16, 32), torch.float32, "cpu") == "flash"


@pytest.mark.parametrize(
    "choice, message",
    [("flash3", "flash3 needs FlashAttention 3 installed"), ("xformers", "'xformers' is not one of auto, flash3")],
)
def test_a_kernel_that_cannot_run_here_is_refused_naming_it(choice, message):
    before = current_kernel()
    with pytest.raises(ValueError, match=message):
        select_attention(choice, "cpu")
    assert current_kernel() == before


@pytest.mark.parametrize("choice", ["auto", "sdpa_math"])
def test_attend_is_diffsynths_attention_and_softmax_attention(choice):
    from diffsynth.models.wan_video_dit import flash_attention

    select_attention(choice, "cpu")
    g = torch.Generator().manual_seed(0)
    heads, d = 3, 16
    q = torch.randn(2, 7, heads * d, generator=g)
    k, v = torch.randn(2, 5, heads * d, generator=g), torch.randn(2, 5, heads * d, generator=g)
    got = attend(q, k, v, heads)
    torch.testing.assert_close(got, flash_attention(q, k, v, heads), rtol=1e-5, atol=1e-6)
    qh, kh, vh = (t.double().view(2, -1, heads, d).transpose(1, 2) for t in (q, k, v))
    ref = (torch.softmax(qh @ kh.transpose(-1, -2) / d**0.5, -1) @ vh).transpose(1, 2).reshape(2, 7, -1)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)


def test_the_choices_are_the_ones_the_module_knows():
    assert attention.CHOICES[0] == "auto" and {"flash3", "sdpa_cudnn", "sdpa_flash"} <= set(attention.CHOICES)
    assert all(c.removeprefix("sdpa_") in SDPA_ORDER for c in attention.CHOICES if c.startswith("sdpa_"))
