"""Flow matching of Wan2.2 TI2V (docs/design.md §7) with DiffSynth's `FlowMatchScheduler("Wan")`, on the device,
without Composer: what the training model (gcc/model/objective.py) and bench/gpu_step.py share.

* The per-sample draws (tid ~ U{0..N-1}, then eps ~ N(0, 1)) come from a generator of the batch's device seeded by
  (seed, sample id, epoch): a pure function of them, made where they are used, with nothing read back to the host.
  On the CPU this is the same generator as before (PyTorch's CPU generator), so CPU runs draw what they drew. On a
  GPU it is CUDA's Philox generator, whose values depend on the GPU's number of multiprocessors: a run resumed on
  a GPU of another kind draws other noise (not other data).
* The scheduler's tables (timesteps, sigmas, training weights) are copied to the device once; a sample's entries
  are indexed by its tid there. DiffSynth's `add_noise` and `training_weight` look the index up again from the
  timestep (an argmin over the table, after a copy to the host); the Wan table's timesteps are distinct, so the
  index is the tid and the values are the same (tests/model/test_objective.py checks both against DiffSynth's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gcc.compat.diffsynth import FlowMatchScheduler
from gcc.data.batch import Batch
from gcc.model.config import WAN_SHIFT
from gcc.model.seeds import stable_seed


def make_scheduler(num_train_timesteps: int = 1000, shift: float = WAN_SHIFT) -> FlowMatchScheduler:
    sched = FlowMatchScheduler("Wan")
    sched.set_timesteps(num_train_timesteps, training=True, shift=shift)
    return sched


def keyed_generator(device: torch.device | str, *key) -> torch.Generator:
    """A generator of `device`'s kind seeded by `key` (gcc.model.seeds.stable_seed)."""
    return torch.Generator(torch.device(device)).manual_seed(stable_seed(*key))


def train_draw(
    seed: int, sample_id: int, epoch: int, shape: Sequence[int], num_timesteps: int = 1000, device="cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tid [1] int64 ~ U{0..num_timesteps-1}, eps float32 ~ N(0, 1) of `shape`) of one training sample, on
    `device`, in that order from one generator."""
    g = keyed_generator(device, "gcc.train", int(seed), int(sample_id), int(epoch))
    tid = torch.randint(0, num_timesteps, (1,), generator=g, device=device)
    return tid, torch.randn(tuple(shape), generator=g, device=device)


def val_noise(seed: int, clip_id: str, tid: int, shape: Sequence[int], device="cpu") -> torch.Tensor:
    """Validation noise for (clip, scheduler timestep index): shared by the cond/uncond/nulltext variants."""
    return torch.randn(tuple(shape), generator=keyed_generator(device, "gcc.val", int(seed), str(clip_id), int(tid)))


@dataclass
class Tables:
    timesteps: torch.Tensor  # [N] float32, scheduler units
    sigmas: torch.Tensor  # [N] float32
    weights: torch.Tensor  # [N] float32: the training weight of each timestep


class FlowMatching:
    """The schedule of training and validation: DiffSynth's scheduler, its tables on each device used."""

    def __init__(self, num_train_timesteps: int = 1000, shift: float = WAN_SHIFT):
        self.scheduler = make_scheduler(num_train_timesteps, shift)
        self._tables: dict[torch.device, Tables] = {}

    @property
    def num_timesteps(self) -> int:
        return len(self.scheduler.timesteps)

    def tables(self, device: torch.device) -> Tables:
        """The tables on `device`, copied there once per process (a copy from host memory waits for the device)."""
        device = torch.device(device)
        if device not in self._tables:
            s = self.scheduler
            self._tables[device] = Tables(
                *(t.to(device, torch.float32) for t in (s.timesteps, s.sigmas, s.linear_timesteps_weights))
            )
        return self._tables[device]

    def draw(
        self, seed: int, sample_ids: Sequence[int], epochs: Sequence[int], shape: Sequence[int], device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each sample's (tid, eps) (`train_draw`), stacked: tid [B] int64 and eps [B, *shape] on `device`."""
        draws = [train_draw(seed, s, e, shape, self.num_timesteps, device) for s, e in zip(sample_ids, epochs)]
        return torch.cat([d[0] for d in draws]), torch.stack([d[1] for d in draws])

    def noisy(self, x0: torch.Tensor, eps: torch.Tensor, tid: torch.Tensor, first_frame_cond: bool) -> torch.Tensor:
        """x_t = (1 - sigma) x0 + sigma eps per sample (DiffSynth's add_noise); with first_frame_cond latent frame 0
        is the clean x0 (TI2V)."""
        sigma = self.tables(x0.device).sigmas[tid].view(-1, *([1] * (x0.dim() - 1)))
        x_t = (1 - sigma) * x0 + sigma * eps
        if first_frame_cond:
            x_t[:, :, 0] = x0[:, :, 0]
        return x_t

    @staticmethod
    def target(x0: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """What the model predicts: eps - x0 (DiffSynth's training_target)."""
        return eps - x0

    def timesteps(self, tid: torch.Tensor) -> torch.Tensor:
        return self.tables(tid.device).timesteps[tid]

    def weights(self, tid: torch.Tensor) -> torch.Tensor:
        return self.tables(tid.device).weights[tid]


def model_text(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's prompts, cut to its micro-batch's most (the rest is padding for other clips: no need to embed
    it), and each latent frame's index among them (gcc.data.dataset.gc_collate). `prompts` is a host list."""
    return batch["context"][:, : max(batch["prompts"])], batch["context_index"]


def training_outputs(flow: FlowMatching, dit, batch: Batch, seed: int, first_frame_cond: bool) -> dict:
    """One training forward of `dit` (a GcDiT) on `batch`: the per-sample draws on the batch's device, the noisy
    latents, the prediction and what the loss needs (`training_loss`). Nothing read back to the host."""
    x0 = batch["input_latents"].to(next(dit.parameters()).dtype)
    tid, eps = flow.draw(seed, batch["sample_id"], batch["epoch"], x0.shape[1:], x0.device)
    eps = eps.to(x0.dtype)
    timesteps = flow.timesteps(tid)
    x_t = flow.noisy(x0, eps, tid, first_frame_cond)
    pred, aux = dit.gc_forward(x_t, timesteps, *model_text(batch), batch["sem_ids"], first_frame_cond, aux=True)
    return {
        "pred": pred,
        "target": flow.target(x0, eps),
        "weight": flow.weights(tid),
        "tid": tid,
        "timestep": timesteps,
        **aux,
    }


def training_loss(outputs: dict, first_frame_cond: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, per-sample MSE): the weighted flow-matching MSE, a mean over the micro-batch (Composer scales each
    micro-batch's loss by its share of the batch)."""
    mse = per_sample_mse(outputs["pred"], outputs["target"], first_frame_cond)
    return (mse * outputs["weight"].float()).mean(), mse


def per_sample_mse(pred: torch.Tensor, target: torch.Tensor, first_frame_cond: bool) -> torch.Tensor:
    """[B] MSE in fp32; latent frame 0 is excluded when it is the given clean first frame."""
    if first_frame_cond:
        pred, target = pred[:, :, 1:], target[:, :, 1:]
    return (pred.float() - target.float()).pow(2).flatten(1).mean(1)
