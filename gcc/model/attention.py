"""The attention kernel of every DiT block (docs/performance.md, "Attention"): chosen once per process, by name.

DiffSynth's own attention function picks FlashAttention 3, FlashAttention 2, SageAttention or PyTorch's SDPA by
whatever it can import, silently. gcc calls its own choice instead (`attend`), so that the kernel is stated in the
launch's first lines and the recomputation of a checkpointed block in backward runs the same kernel as its forward:

* `auto` (the default): FlashAttention 3 (`flash_attn_interface`) when it is installed and the device is a Hopper
  GPU, else PyTorch's `scaled_dot_product_attention` with its backends in the order `SDPA_ORDER`: flash
  (FlashAttention 2 inside torch), cuDNN, memory-efficient, math. PyTorch 2.7's own order puts cuDNN after math,
  so it never runs; gcc tries it second. On CPU SDPA has a flash kernel of its own, else math;
* `flash3`: FlashAttention 3, an error when it cannot run;
* `sdpa_cudnn`, `sdpa_flash`, `sdpa_efficient`, `sdpa_math`: SDPA with that backend first, then the others in
  the stated order (a backend that cannot take the inputs is passed over by SDPA itself).

The order is CUDA's: on a CPU, SDPA runs its own flash kernel where it can, whatever the order.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gcc.compat.torch import sdpa_choice, set_sdpa_priority

CHOICES = ("auto", "flash3", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_math")
SDPA_ORDER = ("flash", "cudnn", "efficient", "math")


@dataclass(frozen=True)
class AttentionKernel:
    name: str  # "flash3" or "sdpa"
    order: tuple[str, ...]  # SDPA's backends, first preferred (empty for flash3)

    def describe(self) -> str:
        if self.name == "flash3":
            return "FlashAttention 3 (flash_attn_interface)"
        return f"PyTorch SDPA, backends in order {' > '.join(self.order)}"


_kernel = AttentionKernel("sdpa", SDPA_ORDER)
_flash3 = None  # the flash_attn_interface module, once chosen


def flash3_available(device: torch.device) -> bool:
    """FlashAttention 3 is installed and the device is a Hopper GPU (compute capability 9.x), the one it runs on."""
    return (
        device.type == "cuda"
        and importlib.util.find_spec("flash_attn_interface") is not None
        and torch.cuda.get_device_capability(device)[0] == 9
    )


def select_attention(choice: str, device: torch.device | str) -> AttentionKernel:
    """Make `choice` (one of CHOICES) the kernel of this process's blocks on `device`; returns what was chosen.
    SDPA's backend order is process-wide state (torch's), set here once."""
    global _kernel, _flash3
    if choice not in CHOICES:
        raise ValueError(f"model.attention: {choice!r} is not one of {', '.join(CHOICES)}")
    device = torch.device(device)
    if choice == "flash3" or (choice == "auto" and flash3_available(device)):
        if not flash3_available(device):
            raise ValueError(
                "model.attention: flash3 needs FlashAttention 3 installed (flash_attn_interface) and a Hopper GPU; "
                "use auto or an sdpa_* kernel (docs/performance.md, Attention)"
            )
        _flash3 = importlib.import_module("flash_attn_interface")
        _kernel = AttentionKernel("flash3", ())
        return _kernel
    first = () if choice == "auto" else (choice.removeprefix("sdpa_"),)
    order = first + tuple(b for b in SDPA_ORDER if b not in first)
    set_sdpa_priority(order)
    _kernel = AttentionKernel("sdpa", order)
    return _kernel


def current_kernel() -> AttentionKernel:
    """The kernel `select_attention` chose (SDPA in its stated order until it is called)."""
    return _kernel


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Attention of q [B, S, heads*d] over k, v [B, L, heads*d] (DiffSynth's layout) -> [B, S, heads*d]."""
    if _kernel.name == "flash3":
        out = _flash3.flash_attn_func(*(t.unflatten(-1, (num_heads, -1)) for t in (q, k, v)))  # type: ignore[union-attr]
        out = out[0] if isinstance(out, tuple) else out
        return out.flatten(2)
    q, k, v = (t.unflatten(-1, (num_heads, -1)).transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)


def backends_at(shape_q: tuple[int, ...], shape_kv: tuple[int, ...], dtype: torch.dtype, device) -> str:
    """The SDPA backend that runs for inputs of these shapes ([B, heads, S, d]) under the current order, or the
    FlashAttention 3 name: what the launch line reports for the self- and the cross-attention."""
    if _kernel.name == "flash3":
        return "flash3"
    q = torch.empty(shape_q, dtype=dtype, device=device)
    kv = torch.empty(shape_kv, dtype=dtype, device=device)
    return sdpa_choice(q, kv, kv)
