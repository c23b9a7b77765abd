"""The batch (docs/design.md §5, "The batch"): what the loader hands the trainer for one step of a rank, made by
`gc_collate` from the loader's samples, cut by `split_batch` into Composer's micro-batches, and sent to the device
from pinned memory on a GPU (`pin_batches`). Its keys, their types and shapes are declared once, `Batch`: the
collate, the model, the objective and the callbacks read it by that type (mypy checks each key). No Streaming here:
a bare PyTorch environment builds batches too (bench/gpu_step.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypedDict, cast

import torch
from torch.utils.data import get_worker_info

from gcc.compat.torch import new_shared_storage
from gcc.data.text_table import stack_prompts


class Batch(TypedDict):
    """A (micro-)batch of B clips. Tensors go to the device; lists stay on the host, so that reading them never
    waits for the device."""

    input_latents: torch.Tensor  # bf16 [B, C, T, h, w]: the clean latents
    context: torch.Tensor  # bf16 [B, P, L, D]: each clip's distinct prompts (P: the batch's most; unused rows zero)
    context_index: torch.Tensor  # int64 [B, T]: each latent frame's prompt among its clip's
    context_ids: torch.Tensor  # int64 [B, T]: each frame's id in the text table (the samples' decoders name it)
    sem_ids: torch.Tensor  # uint8 [B, F, H, W]: the semantic maps, UNKNOWN where masked
    drop_text: torch.Tensor  # bool [B]: the per-sample draws (gcc/data/sample_rng.py), for the step's statistics
    drop_cond: torch.Tensor  # bool [B]
    mask_frac: torch.Tensor  # float32 [B]: the share of the condition masked
    clip_id: list[str]  # the clips' ids
    sample_id: list[int]  # (sample_id, epoch): the key of the sample's draws (the noise and t too)
    epoch: list[int]
    prompts: list[int]  # each clip's prompt count


def new_tensor(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A new uninitialised tensor. Inside a DataLoader worker its storage is shared memory from the start (as
    torch's default_collate does for its batches), so handing the sample or batch to the main process does
    not copy it once more: at v10 a sample's sem ids are 32 MB and a context 88 MB."""
    shape = tuple(int(s) for s in shape)
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    storage = new_shared_storage(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)  # type: ignore[call-overload]  # stride is optional


def _stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """torch.stack; one tensor becomes a [1, ...] view (no copy); in a worker the stack is written straight
    into shared memory (as default_collate does)."""
    if len(tensors) == 1:
        return tensors[0].unsqueeze(0)
    out = new_tensor((len(tensors), *tensors[0].shape), tensors[0].dtype)
    return torch.stack(list(tensors), out=out)


def gc_collate(samples: Sequence[dict[str, Any]]) -> Batch:
    """Stack samples into the batch the model consumes (docs/design.md §5, "The batch"): tensors for the device;
    the samples' identities (`clip_id`, `sample_id`, `epoch`) and prompt counts (`prompts`) as lists, which stay
    on the host, so reading them never waits for the device; `dropped` becomes three flat tensors. A batch of one
    sample holds views of the sample's tensors."""
    context, index = stack_prompts([(s["context"], s["context_index"]) for s in samples], empty=new_tensor)
    return Batch(
        input_latents=_stack([s["input_latents"] for s in samples]),
        context=context,
        context_index=index,
        context_ids=torch.stack([s["context_ids"] for s in samples]),
        sem_ids=_stack([s["sem_ids"] for s in samples]),
        clip_id=[s["clip_id"] for s in samples],
        sample_id=[int(s["sample_id"]) for s in samples],
        epoch=[int(s["epoch"]) for s in samples],
        prompts=[int(s["context"].shape[0]) for s in samples],
        drop_text=torch.tensor([s["dropped"]["text"] for s in samples], dtype=torch.bool),
        drop_cond=torch.tensor([s["dropped"]["cond"] for s in samples], dtype=torch.bool),
        mask_frac=torch.tensor([s["dropped"]["mask"] for s in samples], dtype=torch.float32),
    )


def split_batch(batch: Batch, size: int) -> list[Batch]:
    """A gc_collate batch as Composer's micro-batches of `size` samples (its DataSpec `split_batch`): every tensor
    and list cut along the samples, each micro-batch's context cut to its own most prompts (the rest is padding for
    another sample), so what goes to the device is what the micro-batch uses. Views: no copy, still pinned."""
    n = len(batch["clip_id"])
    micro: list[Batch] = []
    for lo in range(0, n, size):
        part = cast(Batch, {k: cast(Any, v)[lo : lo + size] for k, v in batch.items()})  # the same keys, cut
        part["context"] = part["context"][:, : max(part["prompts"])]
        micro.append(part)
    return micro


def pin_batches() -> bool:
    """Batches go to a GPU from pinned (page-locked) memory, so the copy is asynchronous and at full speed; on a
    CPU run nothing is copied, and pinning would only cost a host copy (docs/performance.md, "The batch")."""
    return torch.cuda.is_available()


def device_bytes(batch: Batch) -> int:
    """The bytes of a (micro-)batch's tensors: what goes to the device (the lists stay on the host)."""
    return sum(v.nbytes for v in batch.values() if isinstance(v, torch.Tensor))
