"""The training objective (docs/design.md §7) and validation (docs/design.md §9.8) as a Composer model.

Flow matching with DiffSynth's `FlowMatchScheduler("Wan")` (1000 training steps, shift 5), TI2V style: latent
frame 0 is the clean first frame and is excluded from the loss. Randomness never comes from global RNG state:
a training sample's (tid, eps) is a pure function of (seed, sample_id, epoch) and a validation clip's noise of
(seed, clip_id, t), so a resumed run, any rank count and any worker count repeat the same draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from composer.models import ComposerModel
from torchmetrics import Metric

from gcc.compat.diffsynth import FlowMatchScheduler
from gcc.data.batch import Batch
from gcc.model.config import ModelConfig
from gcc.model.dit import GcDiT
from gcc.model.flops import train_flops
from gcc.model.flow import (
    FlowMatching,
    model_text,
    per_sample_mse,
    training_loss,
    training_outputs,
    val_noise,
)
from gcc.vocab import UNKNOWN

VAL_VARIANTS = ("cond", "uncond", "nulltext")


def resolve_timesteps(sched: FlowMatchScheduler, requested: Sequence[float]) -> list[tuple[int, float]]:
    """Requested timesteps -> (index, value) of the nearest scheduler timestep (200 -> 201.3 with Wan/shift 5)."""
    out = []
    for t in requested:
        tid = int(torch.argmin((sched.timesteps - float(t)).abs()))
        out.append((tid, float(sched.timesteps[tid])))
    return out


class GcValMSE(Metric):
    """Per-timestep sums of the three variants' MSE; `compute()` = mean cond MSE over timesteps (a scalar, so
    Composer's loggers can take it); `rows()` gives the val_log.csv rows, synced across ranks."""

    full_state_update = False

    def __init__(self, timesteps: Sequence[float], **kwargs):
        super().__init__(**kwargs)
        self.timesteps = [float(t) for t in timesteps]
        nt = len(self.timesteps)
        self.add_state("sums", default=torch.zeros(len(VAL_VARIANTS), nt, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros(nt, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, mse: torch.Tensor, mse_uncond: torch.Tensor, mse_nulltext: torch.Tensor) -> None:
        """Each [n_timesteps, B]: one value per (timestep, clip)."""
        for i, v in enumerate((mse, mse_uncond, mse_nulltext)):
            self.sums[i] += v.detach().to(self.sums.device, torch.float64).sum(1)
        self.count += mse.shape[1]

    def compute(self) -> torch.Tensor:
        return (self.sums[0] / self.count).mean().float()

    def _rows_local(self) -> list[dict]:
        # the fields declared in gcc/model/config.py VAL_ROW_FIELDS
        means = (self.sums / self.count.clamp(min=1)).tolist()
        rows = []
        for j, t in enumerate(self.timesteps):
            m, mu, mn = means[0][j], means[1][j], means[2][j]
            rows.append(
                dict(
                    timestep=t,
                    mse=m,
                    mse_uncond=mu,
                    mse_nulltext=mn,
                    gap_uncond=mu - m,
                    gap_nulltext=mn - m,
                    n=int(self.count[j]),
                )
            )
        return rows

    def rows(self) -> list[dict]:
        with self.sync_context():
            return self._rows_local()


class GcTrainModel(ComposerModel):
    """ComposerModel around a GcDiT (attribute `dit`, the one child Composer wraps with FSDP).

    null_context [L, D] is the NULL_PROMPT embedding (the nulltext variant); it is a constructor input so the
    model never reads files. `config`: the `model:` section, whole (its objective settings read here).

    Nothing in `forward` or `loss` reads a value back from the device (docs/performance.md, "Host reads"): the
    batch's identities and prompt counts are host lists (gcc.data.dataset.gc_collate), the draws are made on the
    device (gcc/model/flow.py), and the statistics stay tensors until StepSync reads the step's once.
    """

    def __init__(
        self,
        dit: GcDiT,
        *,
        seed: int,
        null_context: torch.Tensor,
        val_timesteps: Sequence[float] = (200, 500, 800),
        config: ModelConfig = ModelConfig(),  # noqa: B008  (read only)
    ):
        super().__init__()
        self.dit = dit
        self.seed = int(seed)
        self.config = config
        self.flow = FlowMatching()  # DiffSynth's Wan schedule: 1000 steps, shift 5
        self.scheduler = self.flow.scheduler
        self.val_steps = resolve_timesteps(self.scheduler, val_timesteps)
        # data, not weights: kept out of checkpoints, moved with the model
        self.register_buffer("null_context", null_context.detach().clone(), persistent=False)

    # -- helpers
    def _dtype(self) -> torch.dtype:
        return next(self.dit.parameters()).dtype

    def _run(self, x_t, timesteps, batch, text=None, sem_ids=None):
        context, index = model_text(batch) if text is None else text
        sem = batch["sem_ids"] if sem_ids is None else sem_ids
        return self.dit.gc_forward(x_t, timesteps, context, index, sem, self.config.first_frame_cond)

    # -- training (gcc/model/flow.py: what bench/gpu_step.py runs without Composer)
    def forward(self, batch: Batch) -> dict:
        return training_outputs(self.flow, self.dit, batch, self.seed, self.config.first_frame_cond)

    def loss(self, outputs: dict, batch: Batch) -> torch.Tensor:
        loss, mse = training_loss(outputs, self.config.first_frame_cond)
        # the statistics declared in gcc/model/config.py TRAIN_STATS, by name
        outputs["stats"] = {
            "mse": mse.detach().mean(),
            "timestep": outputs["timestep"].float().mean(),
            "sem_rms": outputs["sem_rms"],
            "x_rms": outputs["x_rms"],
        }
        return loss

    def flops_per_batch(self, batch: Batch) -> int:
        """The model FLOPs of training on `batch` (forward and backward: gcc/model/flops.py), which Composer's
        SpeedMonitor reads for `throughput/flops_per_sec` and MFU. Each clip's distinct prompts are counted
        (`prompts`, a host list: no read from the device)."""
        samples, _, frames, height, width = batch["input_latents"].shape
        return train_flops(
            self.dit.config,
            samples=samples,
            frames=frames,
            height=height,
            width=width,
            text_len=batch["context"].shape[2],
            prompts=sum(batch["prompts"]),
        )

    # -- validation
    @torch.no_grad()
    def eval_forward(self, batch: Batch, outputs: Any | None = None) -> dict:
        if outputs is not None:  # Composer's train-metrics path; we define no train metrics
            return outputs
        x0 = batch["input_latents"].to(self._dtype())
        B, dev = x0.shape[0], x0.device
        uncond_ids = torch.full_like(batch["sem_ids"], UNKNOWN)
        null_ctx = self.null_context.to(dev, x0.dtype).expand(B, 1, *self.null_context.shape)
        null_index = torch.zeros_like(batch["context_index"])
        res: dict[str, list[torch.Tensor]] = {v: [] for v in VAL_VARIANTS}
        for tid, _ in self.val_steps:
            eps = torch.stack([val_noise(self.seed, c, tid, x0.shape[1:], dev) for c in batch["clip_id"]])
            tids = torch.full((B,), tid, dtype=torch.int64, device=dev)
            x_t = self.flow.noisy(x0, eps.to(x0.dtype), tids, self.config.first_frame_cond)
            target = self.flow.target(x0, eps.to(x0.dtype))
            timesteps = self.flow.timesteps(tids)
            preds = {
                "cond": self._run(x_t, timesteps, batch),
                "uncond": self._run(x_t, timesteps, batch, sem_ids=uncond_ids),
                "nulltext": self._run(x_t, timesteps, batch, text=(null_ctx, null_index)),
            }
            for v in VAL_VARIANTS:
                res[v].append(per_sample_mse(preds[v], target, self.config.first_frame_cond))
        stacked = {v: torch.stack(res[v]) for v in VAL_VARIANTS}  # [n_t, B]
        return {
            "timestep": torch.tensor([t for _, t in self.val_steps]),
            "mse": stacked["cond"],
            "mse_uncond": stacked["uncond"],
            "mse_nulltext": stacked["nulltext"],
        }

    def get_metrics(self, is_train: bool = False) -> dict[str, Metric]:
        return {} if is_train else {"val_mse": GcValMSE([t for _, t in self.val_steps])}

    def update_metric(self, batch: Any, outputs: Any, metric: Metric) -> None:
        metric.update(outputs["mse"], outputs["mse_uncond"], outputs["mse_nulltext"])
