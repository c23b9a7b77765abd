"""TI2V flow-matching sampling of one clip (docs/design.md §10).

* The clean first frame is latent frame 0 of the clip's `input_latents`; it is put back after every step.
* Noise is a pure function of (seed, clip_id): a CPU generator seeded with `stable_seed("gcc.tools.sample", seed,
  clip_id)`, so a clip gets the same noise whichever other clips are sampled with it.
* Guidance: e = e_c + (cfg - 1)(e_c - e_nulltext) + (sem_cfg - 1)(e_c - e_unknown), where e_c sees the true
  text and ids, e_nulltext NULL_PROMPT in every cell, e_unknown ids all 255. A scale of 1 skips its forward
  (cfg alone reduces to DiffSynth's e_u + cfg (e_c - e_u)); the variants of one step run as one batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gcc.data.text_table import stack_prompts
from gcc.model.config import WAN_SHIFT
from gcc.model.seeds import stable_seed
from gcc.vocab import UNKNOWN


def sync(device) -> None:
    """Wait for the device's queued work (cuda), so a timing covers it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def make_sampling_scheduler(steps: int, shift: float):
    from gcc.compat.diffsynth import FlowMatchScheduler  # heavy (diffsynth, ~4 s): keeps gcc-sample --help fast

    sched = FlowMatchScheduler("Wan")
    sched.set_timesteps(steps, shift=shift)  # inference schedule (training=False)
    return sched


def clip_noise(seed: int, clip_id: str, shape: Sequence[int]) -> torch.Tensor:
    g = torch.Generator().manual_seed(stable_seed("gcc.tools.sample", int(seed), str(clip_id)))
    return torch.randn(tuple(shape), generator=g)


@torch.no_grad()
def sample_latents(
    dit,
    first: torch.Tensor,
    context: torch.Tensor,
    context_index: torch.Tensor,
    null_context: torch.Tensor,
    sem: torch.Tensor,
    noise: torch.Tensor,
    steps: int = 50,
    shift: float = WAN_SHIFT,
    cfg: float = 1.0,
    sem_cfg: float = 1.0,
    on_step: Callable[[], None] | None = None,
) -> torch.Tensor:
    """TI2V flow-matching sampling of one clip. first [C, 1, h, w] clean frame-0 latent; context [P, L, D] (the
    clip's distinct prompts) and context_index [T] (each latent frame's among them: gcc.data.text_table
    `TextTable.prompts`); null_context [L, D] (NULL_PROMPT); sem uint8 [F, H, W] (what the model sees); noise
    [C, T, h, w]. Returns the latents [C, T, h, w] (fp32).

    Guidance (see the module docstring): variants cond, nulltext (cfg != 1), unknown (sem_cfg != 1, and only when
    the ids are not already all UNKNOWN), run as one batch per step. `on_step()` is called after each step
    (progress)."""
    p = next(dit.parameters())
    dev, dt = p.device, p.dtype
    sched = make_sampling_scheduler(steps, shift)
    first = first.to(dev, torch.float32)
    x = noise.to(dev, torch.float32).clone()  # the state stays fp32; the model sees it in its dtype
    x[:, 0:1] = first
    sem = sem.to(dev)
    prompts = [(context, context_index)]
    sems = [sem]
    use_text = cfg != 1.0
    use_sem = sem_cfg != 1.0 and not bool((sem == UNKNOWN).all())
    if use_text:
        prompts.append((null_context.unsqueeze(0), torch.zeros_like(context_index)))
        sems.append(sem)
    if use_sem:
        prompts.append((context, context_index))
        sems.append(torch.full_like(sem, UNKNOWN))
    B = len(prompts)
    ctx_b, index_b = stack_prompts(prompts)
    ctx_b, index_b = ctx_b.to(dev, dt), index_b.to(dev)
    sem_b = torch.stack(sems)
    for t in sched.timesteps:
        ts = t.reshape(1).expand(B).to(dev, torch.float32)
        pred = dit.gc_forward(
            x.to(dt).unsqueeze(0).expand(B, *x.shape), ts, ctx_b, index_b, sem_b, first_frame_cond=True
        ).float()
        e = pred[0]
        k = 1
        if use_text:
            e = e + (cfg - 1.0) * (pred[0] - pred[k])
            k += 1
        if use_sem:
            e = e + (sem_cfg - 1.0) * (pred[0] - pred[k])
        x = sched.step(e, t, x)
        x[:, 0:1] = first
        if on_step is not None:
            on_step()
    return x
