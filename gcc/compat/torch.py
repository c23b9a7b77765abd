"""torch 2.7.0: what gcc relies on beyond its documented API (gcc/compat/__init__.py).

- `new_shared_storage`: a storage in shared memory from the start (`UntypedStorage._new_shared`), as torch's own
  default_collate uses in a DataLoader worker.
- `shutdown_loader_workers`: a DataLoader's persistent workers stopped the DataLoader's own way
  (`_iterator._shutdown_workers()`).
- `default_store`: the process group's TCP store (`distributed_c10d._get_default_store`).
- `local_shape_and_offset`: where a DTensor's local shard lies (`torch.distributed.tensor._utils`).
- `unsharded_class`, `bare_copy`: a module's class without FSDP2's, and a copy of a module that owns other
  parameters and no children (fully_shard's generated class is `(FSDP<cls>, FSDPModule, cls, ...)`; a module's
  parameters, children and buffers are the dicts `_parameters`, `_modules`, `_buffers`).
- `add_summary`: one TensorBoard event holding several scalars (`SummaryWriter._get_file_writer()`).
- `DCP_METADATA`: the file that completes a torch.distributed.checkpoint folder (written last, by the
  coordinator).
- `gloo_gradients_as_means`: FSDP2's gradient made a mean over the ranks on gloo, whose reduce-scatter sums where
  FSDP2 asks it to average (FSDP2 leaves the division of fp32/bf16 gradients to the backend:
  `_fsdp_collectives._get_gradient_divide_factors`).
- `peer_gone`: a collective that failed because another rank's process is gone (gloo's transport errors, NCCL's
  abort), told by its message: torch raises a bare RuntimeError (or DistBackendError) naming the socket's error.
"""

from __future__ import annotations

import time

from gcc.compat import require

# checked before the library is imported: a changed library is then named, not met as an ImportError
require("torch", "gcc/compat/torch.py")

import torch
import torch.distributed as tdist
from torch import nn
from torch.distributed.distributed_c10d import _get_default_store
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

DCP_METADATA = ".metadata"


def new_shared_storage(nbytes: int) -> torch.UntypedStorage:
    return torch.UntypedStorage._new_shared(nbytes)


def shutdown_loader_workers(loader) -> None:
    """Stop a DataLoader's persistent workers (a `None` on each index queue, then join); no-op without any."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()


def default_store():
    """The default process group's store (on rank 0, its process keeps the server)."""
    return _get_default_store()


def local_shape_and_offset(t: DTensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)


def unsharded_class(module: nn.Module) -> type:
    cls = type(module)
    return cls.__mro__[2] if issubclass(cls, FSDPModule) else cls


def bare_copy(module: nn.Module, parameters: dict[str, nn.Parameter]) -> nn.Module:
    """An instance of `module`'s unsharded class with its attributes, owning `parameters`, with no children and no
    buffers; its constructor is not run."""
    twin: nn.Module = object.__new__(unsharded_class(module))
    twin.__dict__.update(module.__dict__)
    twin.__dict__["_parameters"] = dict(parameters)
    twin.__dict__["_modules"] = {}
    twin.__dict__["_buffers"] = {}
    return twin


def add_summary(writer, summary, step: int | None) -> None:
    """Write one event holding `summary` (a tensorboard Summary) through a torch SummaryWriter."""
    writer._get_file_writer().add_summary(summary, step, time.time())


def gloo_gradients_as_means(model: nn.Module) -> int:
    """Make FSDP2's reduce-scattered gradient a mean over the ranks on gloo, as it is on NCCL.

    Relies on (verified with torch 2.7.0): FSDP2 reduce-scatters fp32/bf16 gradients with ReduceOp.AVG and no
    division of its own (`_get_gradient_divide_factors` returns (None, None)); NCCL averages natively, but gloo's
    reduce-scatter sums and does not raise (pytorch/pytorch issue 162338). The gradient would scale with the world
    size: Adam hides it within a run, but clipping, the logged norm and optimizer moments resumed on another world
    size would not match. The hook (FSDPModule.set_all_reduce_hook) runs on each unit's reduce-scatter output before
    it becomes the sharded gradient. tests/compat/test_torch.py checks both halves in process (the divide factors,
    and gloo's AVG summing over two ranks); tests/model/test_model_fsdp.py compares the gradient of two gloo ranks
    with a one-process reference, without the hook too, so a torch that fixes gloo (whose gradient this would
    then divide twice) fails there. Returns the number of units hooked (0 when not needed)."""
    if not tdist.is_initialized() or tdist.get_backend() != "gloo" or tdist.get_world_size() == 1:
        return 0
    world = tdist.get_world_size()

    def to_mean(reduce_output: torch.Tensor) -> None:
        reduce_output.div_(world)

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in units:
        m.set_all_reduce_hook(to_mean)
    return len(units)


# how torch 2.7's backends word a collective whose peer process died: gloo's TCP pair (the peer's socket closed or
# reset under a read or write), NCCL's watchdog (the communicator aborted after a peer vanished)
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "NCCL communicator was aborted")


def peer_gone(e: BaseException) -> bool:
    """Whether `e` is a collective that failed because another rank's process is gone (a crash, a kill)."""
    return isinstance(e, RuntimeError) and any(m in str(e) for m in PEER_GONE)
