"""Contract tests of gcc/compat/torch.py against the installed torch."""

from __future__ import annotations

import datetime
import os
import threading

import pytest
import torch
import torch.distributed as tdist
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import _get_gradient_divide_factors
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
from torch.utils.data import DataLoader

from gcc.compat.torch import (
    add_summary,
    bare_copy,
    default_store,
    gloo_gradients_as_means,
    local_shape_and_offset,
    new_shared_storage,
    shutdown_loader_workers,
    unsharded_class,
)


def test_new_shared_storage_is_shared_memory():
    s = new_shared_storage(64)
    assert s.nbytes() == 64 and s.is_shared()


def test_shutdown_loader_workers_stops_persistent_workers():
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=1, persistent_workers=True)
    assert sum(len(b) for b in loader) == 8
    workers = list(loader._iterator._workers)
    assert workers and all(w.is_alive() for w in workers)
    shutdown_loader_workers(loader)
    assert not any(w.is_alive() for w in workers)
    shutdown_loader_workers(DataLoader([1]))  # none started: nothing to do


@pytest.fixture
def one_rank_group():
    store = tdist.TCPStore("127.0.0.1", 0, 1, is_master=True)  # port 0: the system gives a free one
    tdist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        tdist.destroy_process_group()


def test_the_default_store_is_the_process_groups(one_rank_group):
    store = default_store()
    store.set("gcc/compat", "1")
    assert store.get("gcc/compat") == b"1"


def test_a_shard_shape_and_offset_and_the_unsharded_class(one_rank_group):
    mesh = init_device_mesh("cpu", (1,))
    t = distribute_tensor(torch.zeros(6, 4), mesh, [Shard(0)])
    assert local_shape_and_offset(t) == ((6, 4), (0, 0))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    fully_shard(model, mesh=mesh)
    assert type(model) is not torch.nn.Sequential and unsharded_class(model) is torch.nn.Sequential
    assert unsharded_class(torch.nn.Linear(2, 2)) is torch.nn.Linear
    w = torch.nn.Parameter(torch.ones(2))
    twin = bare_copy(model, {"w": w})
    assert type(twin) is torch.nn.Sequential and dict(twin.named_parameters()) == {"w": w}
    assert list(twin.children()) == [] and list(twin.buffers()) == []


def test_add_summary_writes_one_event_with_every_value(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.proto.summary_pb2 import Summary
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    add_summary(
        writer, Summary(value=[Summary.Value(tag="a", simple_value=1.5), Summary.Value(tag="b", simple_value=2)]), 7
    )
    writer.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["a", "b"]
    assert [(e.step, e.value) for e in acc.Scalars("a")] == [(7, 1.5)]
    assert os.listdir(tmp_path)


def test_fsdp2_leaves_the_mean_of_fp32_and_bf16_gradients_to_the_backend():
    """What `gloo_gradients_as_means` relies on: no division of FSDP2's own (its reduce-scatter asks for AVG)."""
    for dtype in (torch.float32, torch.bfloat16):
        assert _get_gradient_divide_factors(None, None, dtype, "cpu") == (None, None)


def test_gloo_reduce_scatter_sums_where_it_is_asked_to_average():
    """Two gloo ranks in this process (a thread each, over one store): ReduceOp.AVG, FSDP2's op, gives the sum."""
    store, out = tdist.HashStore(), {}

    def rank(r: int) -> None:
        group = tdist.ProcessGroupGloo(store, r, 2, datetime.timedelta(seconds=60))
        reduced = torch.empty(2)
        tdist.reduce_scatter_tensor(reduced, torch.tensor([1.0, 2.0, 3.0, 4.0]) * (r + 1), tdist.ReduceOp.AVG, group)
        out[r] = reduced.tolist()

    ranks = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in ranks:
        t.start()
    for t in ranks:
        t.join(60)
    assert out == {0: [3.0, 6.0], 1: [9.0, 12.0]}  # the mean would be [1.5, 3.0] and [4.5, 6.0]


def test_gradients_need_no_hook_on_one_rank(one_rank_group):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    assert gloo_gradients_as_means(model) == 0


def test_a_failed_collective_is_told_from_a_failed_write(tmp_path, monkeypatch):
    """torch's own type for a collective's failure, and gloo's plain RuntimeErrors by their words; a write's error
    is none of them, so that on a nearly full disk it is a disk-full (gcc/errors.py) and a dead peer is not."""
    from gcc import errors
    from gcc.compat.torch import collective_failed

    assert issubclass(tdist.DistBackendError, tdist.DistError)  # NCCL's (and the store's) errors are typed
    assert collective_failed(tdist.DistBackendError("NCCL error in: ..., unhandled system error"))
    assert collective_failed(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]"))
    assert not collective_failed(RuntimeError("PytorchStreamWriter failed writing file data/3: file write failed"))
    assert not collective_failed(ValueError("gloo"))
    monkeypatch.setattr(errors, "NEARLY_FULL_BYTES", 1 << 62)  # every disk is nearly full now
    write = RuntimeError("PytorchStreamWriter failed writing file data/3: file write failed")
    assert isinstance(errors.disk_full(write, tmp_path, "here"), errors.DiskFull)
    peer = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]")
    assert errors.disk_full(peer, tmp_path, "here") is None
