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
  abort), told by its message: torch raises a bare RuntimeError (or DistBackendError) naming the socket's error;
  `collective_failed`, any collective's failure (torch's `DistError`, or gloo's words), which gcc/errors.py uses to
  tell a failed collective from a failed write on a nearly full disk.
- `set_sdpa_priority`, `sdpa_order`, `sdpa_choice`: scaled_dot_product_attention's backends tried in a stated order
  process-wide (`torch._C._set_sdp_priority_order`, what `sdpa_kernel(set_priority=True)` sets inside its context)
  and the one it picks for given inputs (`torch._fused_sdp_choice`).
- `HostReads`: counts the host's reads of tensor values (a `TorchDispatchMode`, `torch.utils._python_dispatch`).
- `host_state_like`, `same_layout`, `copy_state_into`: a checkpoint state's host copy made once and refilled, as
  DCP's cached staging does (`torch.distributed._state_dict_utils`).
"""

from __future__ import annotations

import os
import time
import traceback
from typing import Any

from gcc.compat import require
from gcc.errors import COLLECTIVE_FAILURES

# checked before the library is imported: a changed library is then named, not met as an ImportError
require("torch", "gcc/compat/torch.py")

import torch
import torch.distributed as tdist
from torch import nn
from torch.distributed._state_dict_utils import _check_state_dict_similarity, _copy_state_dict, _create_cpu_state_dict
from torch.distributed.distributed_c10d import _get_default_store
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode

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


def collective_failed(e: BaseException) -> bool:
    """Whether `e` is a collective's failure: torch's type for them (`DistError`: NCCL's, the store's), or, where
    gloo raises a plain RuntimeError, its words (a peer gone, or any "gloo"/"NCCL" error text)."""
    return (
        isinstance(e, tdist.DistError)
        or peer_gone(e)
        or (isinstance(e, RuntimeError) and ("gloo" in str(e) or "NCCL" in str(e)))
    )


COLLECTIVE_FAILURES.append(collective_failed)  # gcc.errors tells a failed collective from a failed write by it


# ---- scaled_dot_product_attention's backends (gcc/model/attention.py) ------------------------------------------
SDPA_BACKENDS = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


def set_sdpa_priority(order: tuple[str, ...]) -> None:
    """Every SDPA backend enabled, tried in `order` (names of SDPA_BACKENDS): process-wide, as the public
    `sdpa_kernel(..., set_priority=True)` does inside its context (`torch._C._set_sdp_priority_order`)."""
    for enable in (
        torch.backends.cuda.enable_flash_sdp,
        torch.backends.cuda.enable_mem_efficient_sdp,
        torch.backends.cuda.enable_cudnn_sdp,
        torch.backends.cuda.enable_math_sdp,
    ):
        enable(True)
    first = [int(SDPA_BACKENDS[b].value) for b in order]
    torch._C._set_sdp_priority_order(first + [b for b in torch._C._get_sdp_priority_order() if b not in first])


def sdpa_order() -> list[str]:
    """The backends in SDPA's current priority order (by name)."""
    names = {int(v.value): k for k, v in SDPA_BACKENDS.items()}
    return list(dict.fromkeys(names[b] for b in torch._C._get_sdp_priority_order() if b in names))


def sdpa_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """The backend SDPA would run for these inputs ([B, heads, S, d]) now (`torch._fused_sdp_choice`)."""
    names = {int(v.value): k for k, v in SDPA_BACKENDS.items()}
    return names.get(int(torch._fused_sdp_choice(q, k, v)), "unknown")


# ---- reads of a tensor's values by the host (tests/model/test_host_reads.py, bench/gpu_step.py) ----------------
_aten = torch.ops.aten
# ops that give the host a tensor's value, or whose output's shape depends on the values: on a GPU each waits for
# the device (item(), bool(), int(), float() are `_local_scalar_dense`)
HOST_READ_OPS = {
    _aten._local_scalar_dense.default,
    _aten.nonzero.default,
    _aten._unique2.default,
    _aten.unique_dim.default,
    _aten.unique_consecutive.default,
    _aten.bincount.default,
    _aten.masked_select.default,
    _aten.histc.default,
    _aten.equal.default,
}


class HostReads(TorchDispatchMode):
    """While active, records each read of a tensor's values by the host, with the innermost frame outside torch
    that made it: the ops of HOST_READ_OPS, indexing with a boolean mask (a hidden `nonzero`), `repeat_interleave`
    without its output size, and `Tensor.tolist()` / `.numpy()` (which read without dispatching an op). Entered as
    a context manager; `reads` lists (op, "file:line function") in order. A torch dispatch mode and patched methods
    (`torch.utils._python_dispatch`): for tests and benches, never in a run."""

    def __init__(self):
        super().__init__()
        self.reads: list[tuple[str, str]] = []
        self._patched: dict[str, Any] = {}

    @staticmethod
    def _where() -> str:
        torch_dir = os.path.dirname(torch.__file__)
        for f in reversed(traceback.extract_stack()):
            if not f.filename.startswith(torch_dir) and f.filename != __file__:
                return f"{f.filename}:{f.lineno} {f.name}"
        return "?"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        read = func in HOST_READ_OPS
        if func in (_aten.index.Tensor, _aten.index_put_.default, _aten.index_put.default):
            read = any(
                isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] if i is not None
            )
        elif func is _aten.repeat_interleave.Tensor or func is _aten.repeat_interleave.self_Tensor:
            read = kwargs.get("output_size") is None
        if read:
            self.reads.append((str(func), self._where()))
        return func(*args, **kwargs)

    def __enter__(self):
        for name in ("tolist", "numpy"):
            real = getattr(torch.Tensor, name)
            self._patched[name] = real

            def counted(t, *a, _real=real, _name=name, **k):
                self.reads.append((f"Tensor.{_name}", self._where()))
                return _real(t, *a, **k)

            setattr(torch.Tensor, name, counted)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, real in self._patched.items():
            setattr(torch.Tensor, name, real)
        self._patched.clear()
        return super().__exit__(*exc)


# ---- host memory for checkpoint states (gcc/training/checkpoint/background.py HostStaging) -------------------------------
def host_state_like(state: Any, pin: bool) -> Any:
    """New host tensors shaped as every tensor (a DTensor: its local shard) of `state`, pinned when `pin`; the rest
    copied (`torch.distributed._state_dict_utils._create_cpu_state_dict`, DCP's own cached staging)."""
    return _create_cpu_state_dict(state, pin_memory=pin)


def same_layout(state: Any, host: Any) -> bool:
    """`host` (from host_state_like) has `state`'s structure, tensor shapes and dtypes."""
    return _check_state_dict_similarity(state, host)


def copy_state_into(state: Any, host: Any, non_blocking: bool) -> Any:
    """`state` copied into `host`'s tensors (same layout); returns the copy: `host`'s tensors and the rest of
    `state` deep-copied (`_copy_state_dict`)."""
    return _copy_state_dict(state, host, non_blocking=non_blocking, type_check=False)
