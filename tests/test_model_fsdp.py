"""GcDiT under real FSDP sharding on CPU (two gloo ranks): what Composer's SHARD_GRAD_OP does with the hooks."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest


_FSDP_RANK = r'''
import json, os, sys, torch, torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp.wrap import CustomPolicy
from gcc.objective import GcTrainModel
from gcc.optim import build_optimizer
from _gc_helpers import make_batch, null_embedding, randomize_cond, tiny_dit

dist.init_process_group("gloo")
dit = tiny_dit()
randomize_cond(dit)
model = GcTrainModel(dit, seed=0, null_context=null_embedding(), null_id=0)
batch = make_batch(B=2)
ref = model.loss(model(batch), batch).item()
ref_val = model.eval_forward(batch)["mse"]
# what Composer does with SHARD_GRAD_OP: wrap the child `dit`, units chosen by its fsdp_wrap_fn
model.dit = FSDP(dit, auto_wrap_policy=CustomPolicy(dit.fsdp_wrap_fn), use_orig_params=True,
                 sharding_strategy=ShardingStrategy.SHARD_GRAD_OP, device_id=torch.device("cpu"))
units = sum(isinstance(m, FSDP) for m in model.dit.modules())
val = model.eval_forward(batch)["mse"]
opt = build_optimizer(model, lr=1e-4, cond_lr=1e-2)
out = model(batch)
loss = model.loss(out, batch)
loss.backward()
opt.step()
after = model(batch)["sem_rms"].item()
json.dump({"units": units, "ref": ref, "loss": loss.item(), "sem_rms0": out["sem_rms"].item(), "after": after,
           "val_close": bool(torch.allclose(val, ref_val, rtol=1e-5, atol=1e-6)),
           "n_groups": [len(g["params"]) for g in opt.param_groups]},
          open(sys.argv[1] + f"/rank{dist.get_rank()}.json", "w"))
dist.destroy_process_group()
'''


@pytest.mark.slow
def test_sharded_fsdp_two_ranks_on_cpu(tmp_path):
    """Two gloo ranks, FSDP SHARD_GRAD_OP with the model's own wrap hook: the sharded model computes the same
    loss and validation as the plain one, and the optimizer's two groups train."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(here), here] + sys.path))
    procs = [subprocess.Popen([sys.executable, "-c", _FSDP_RANK, str(tmp_path)], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(2)]
    outs = [p.communicate(timeout=300)[0].decode()[-3000:] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for r in range(2):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert res["units"] == 1 + 2  # root + one unit per DiT block
        assert res["loss"] == pytest.approx(res["ref"], rel=1e-5)
        assert res["val_close"]
        assert res["sem_rms0"] > 0 and res["after"] != res["sem_rms0"]
        assert res["n_groups"][1] == 6
