"""TI2V flow-matching sampling of one clip (gcc/sampling/sampler.py, docs/design.md §10) on the real tiny DiT
(DiffSynth's WanModel through gcc.model) and DiffSynth's FlowMatchScheduler: the noise is a pure function of
(seed, clip_id), the schedule is Wan's shifted one, a sample is a pure function of its inputs, and frame 0 is the
clean latent. The guidance arithmetic and the skipped forwards are tested in tests/tools/test_sample.py."""

from __future__ import annotations

import pytest
import torch
from _gc_helpers import make_batch, randomize_cond, tiny_dit

from gcc.model.config import WAN_SHIFT
from gcc.sampling.sampler import clip_noise, make_sampling_scheduler, sample_latents
from gcc.vocab import UNKNOWN

SHAPE = (48, 3, 4, 4)  # [C, T, h, w] of make_batch's tiny clip


def test_clip_noise_is_a_pure_function_of_seed_and_clip_id():
    a = clip_noise(0, "clip00001", SHAPE)
    torch.manual_seed(123)  # the global generator is not what it draws from
    torch.randn(7)
    assert torch.equal(a, clip_noise(0, "clip00001", SHAPE))
    assert not torch.equal(a, clip_noise(1, "clip00001", SHAPE))
    assert not torch.equal(a, clip_noise(0, "clip00002", SHAPE))
    assert a.shape == SHAPE and abs(float(a.std()) - 1.0) < 0.1  # standard normal


@pytest.mark.parametrize("steps", [1, 4, 10])
def test_the_schedule_has_steps_timesteps_on_wans_shifted_sigmas(steps):
    sched = make_sampling_scheduler(steps, WAN_SHIFT)
    assert len(sched.timesteps) == steps
    # sigmas evenly spaced from 1 towards 0, shifted: s' = shift·s / (1 + (shift − 1)·s); timestep = 1000·s'
    s = torch.linspace(1.0, 0.0, steps + 1)[:-1]
    want = WAN_SHIFT * s / (1 + (WAN_SHIFT - 1) * s)
    torch.testing.assert_close(sched.sigmas[:steps].float(), want, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(sched.timesteps.float(), 1000 * want, rtol=1e-3, atol=0.5)


@pytest.fixture(scope="module")
def clip():
    dit = tiny_dit(seed=3)
    randomize_cond(dit)
    b = make_batch(B=1, seed=4)
    kw = dict(
        first=b["input_latents"][0, :, :1].float(),
        context=b["context"][0],
        context_index=b["context_index"][0],
        null_context=torch.zeros_like(b["context"][0, 0]),
        sem=b["sem_ids"][0],
        steps=3,
    )
    return dit, kw


def test_a_sample_is_a_pure_function_of_its_noise_and_frame0_is_the_clean_latent(clip):
    dit, kw = clip
    steps = []
    x = sample_latents(dit, **kw, noise=clip_noise(0, "c", SHAPE), on_step=lambda: steps.append(1))
    assert len(steps) == kw["steps"]  # on_step once per step
    assert x.dtype == torch.float32 and x.shape == SHAPE
    assert torch.equal(x[:, :1], kw["first"])  # put back after every step: exactly the clean frame
    assert torch.equal(x, sample_latents(dit, **kw, noise=clip_noise(0, "c", SHAPE)))  # same seed and clip
    other = sample_latents(dit, **kw, noise=clip_noise(1, "c", SHAPE))
    assert (other[:, 1:] - x[:, 1:]).abs().mean() > 0.05  # another seed, another sample
    assert torch.isfinite(x).all()


@torch.no_grad()
def test_the_semantic_condition_reaches_the_sample(clip):
    """One step from noise (σ 1 to 0: Wan's shifted schedule keeps σ = 1, timestep 1000) is x − v, v the model's
    prediction for the clip's sem ids, frame 0 the clean latent: computed here from the model itself, for the ids
    and for none known (all UNKNOWN), whose predictions differ; the sampler gives each."""
    dit, kw = clip
    noise = clip_noise(0, "c", SHAPE)
    wants = []
    for sem in (kw["sem"], torch.full_like(kw["sem"], UNKNOWN)):
        x = noise.clone()
        x[:, :1] = kw["first"]
        v = dit.gc_forward(
            x.unsqueeze(0),
            torch.tensor([1000.0]),
            kw["context"].unsqueeze(0),
            kw["context_index"].unsqueeze(0),
            sem.unsqueeze(0),
            first_frame_cond=True,
        )[0].float()
        want = x - v
        want[:, :1] = kw["first"]
        torch.testing.assert_close(sample_latents(dit, **{**kw, "sem": sem, "steps": 1}, noise=noise), want)
        wants.append(want)
    assert (wants[0][:, 1:] - wants[1][:, 1:]).abs().mean() > 0.01
