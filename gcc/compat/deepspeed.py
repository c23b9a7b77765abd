"""DeepSpeed, the optional `legacy` extra, loaded only to read a legacy accelerate + DeepSpeed ZeRO checkpoint
(`model.legacy_zero_ckpt`, gcc/model/export.py): its import costs about a second and prints an accelerator
warning, so no other process loads it (DiffSynth's own import of it is hidden: gcc/compat/diffsynth.py).

DeepSpeed's import sets `PYTORCH_NVML_BASED_CUDA_CHECK=1` for the whole process. From then on, until CUDA is
initialised (never, on a CPU run), every `torch.cuda.is_available()` loads NVML again: ~55 us a call here, and
Composer asks ~11 times a step. So the variable is removed again after the import unless the user had set it:
torch's default check."""

from __future__ import annotations

import os
from collections.abc import Callable

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def zero_to_fp32() -> Callable:
    """DeepSpeed's `get_fp32_state_dict_from_zero_checkpoint` (its public zero_to_fp32 consolidation). Raises
    ImportError when DeepSpeed is not installed."""
    set_by_user = NVML_CHECK in os.environ
    try:
        # optional: deepspeed is the `legacy` extra, needed only for a ZeRO warm start
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    finally:
        if not set_by_user:
            os.environ.pop(NVML_CHECK, None)
    return get_fp32_state_dict_from_zero_checkpoint
