"""Flow matching on the device (gcc/model/flow.py): the draws are pure functions of (seed, sample, epoch) and of
(seed, clip, timestep), whatever the global RNG; the vectorised noising, target and weights are DiffSynth's
`add_noise`, `training_target` and `training_weight` for every training timestep, to the bit."""

from __future__ import annotations

import pytest
import torch

from gcc.compat.diffsynth import FlowMatchScheduler
from gcc.model.flow import FlowMatching, per_sample_mse, train_draw, val_noise


def test_noise_and_tid_are_pure_functions_of_seed_sample_epoch():
    shape = (48, 3, 4, 4)
    torch.manual_seed(0)
    tid, eps = train_draw(7, 123, 2, shape)
    torch.manual_seed(999)
    torch.randn(1000)  # global RNG state must not matter
    tid2, eps2 = train_draw(7, 123, 2, shape)
    assert torch.equal(tid, tid2) and torch.equal(eps, eps2)
    for other in [(8, 123, 2), (7, 124, 2), (7, 123, 3)]:
        _t3, e3 = train_draw(*other, shape)
        assert not torch.equal(e3, eps)
    tids = {int(train_draw(7, s, 0, (1,))[0]) for s in range(200)}
    assert min(tids) >= 0 and max(tids) <= 999 and len(tids) > 150


def test_val_noise_pure():
    torch.manual_seed(1)
    a = val_noise(0, "clip_a", 952, (2, 3))
    torch.manual_seed(2)
    assert torch.equal(a, val_noise(0, "clip_a", 952, (2, 3)))
    assert not torch.equal(a, val_noise(0, "clip_b", 952, (2, 3)))
    assert not torch.equal(a, val_noise(0, "clip_a", 833, (2, 3)))
    assert not torch.equal(a, val_noise(1, "clip_a", 952, (2, 3)))


def test_noising_target_and_weight_are_diffsynths_for_every_training_timestep():
    sched = FlowMatchScheduler("Wan")  # DiffSynth's own, as its trainer sets it up
    sched.set_timesteps(1000, training=True, shift=5.0)
    flow = FlowMatching(1000, 5.0)
    tid = torch.arange(1000)
    assert torch.equal(flow.timesteps(tid), sched.timesteps)
    g = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(1000, 2, 3, 1, 2, generator=g), torch.randn(1000, 2, 3, 1, 2, generator=g)
    x_t = flow.noisy(x0, eps, tid, first_frame_cond=False)
    for i in range(0, 1000, 37):
        t = sched.timesteps[i]
        assert torch.equal(x_t[i], sched.add_noise(x0[i], eps[i], t)), i
        assert torch.equal(flow.weights(tid[i : i + 1])[0], sched.training_weight(t)), i
    assert torch.equal(flow.target(x0, eps), sched.training_target(x0, eps, None))
    clean = flow.noisy(x0, eps, tid, first_frame_cond=True)
    assert torch.equal(clean[:, :, 0], x0[:, :, 0]) and torch.equal(clean[:, :, 1:], x_t[:, :, 1:])


def test_a_batch_draw_is_each_samples_own_draw():
    flow = FlowMatching()
    tid, eps = flow.draw(3, [10, 11, 10], [0, 0, 1], (2, 3), "cpu")
    for i, (s, e) in enumerate([(10, 0), (11, 0), (10, 1)]):
        t1, e1 = train_draw(3, s, e, (2, 3))
        assert torch.equal(tid[i : i + 1], t1) and torch.equal(eps[i], e1)
    assert not torch.equal(eps[0], eps[2])  # another epoch, another draw


def test_the_loss_leaves_the_clean_first_frame_out():
    pred, target = torch.zeros(2, 1, 3, 1, 1), torch.zeros(2, 1, 3, 1, 1)
    target[:, :, 0] = 100.0
    target[1, :, 2] = 2.0
    assert per_sample_mse(pred, target, True).tolist() == [0.0, 2.0]
    assert per_sample_mse(pred, target, False).tolist() == pytest.approx([10000 / 3, (10000 + 4) / 3], rel=1e-7)


def test_the_tables_are_made_on_the_device_asked_for_once():
    """The "meta" device stands in for an accelerator: a table left on the host would be copied at every step."""
    flow = FlowMatching()
    meta = flow.tables("meta")
    assert {t.device.type for t in (meta.timesteps, meta.sigmas, meta.weights)} == {"meta"}
    assert flow.tables(torch.device("meta")) is meta
    cpu = flow.tables("cpu")
    assert cpu.sigmas.device.type == "cpu" and torch.equal(cpu.sigmas, flow.scheduler.sigmas.float())


@pytest.mark.parametrize("shift", [3.0, 5.0])
def test_a_schedule_of_any_shift_is_diffsynths(shift):
    sched = FlowMatchScheduler("Wan")
    sched.set_timesteps(1000, training=True, shift=shift)
    flow = FlowMatching(1000, shift)
    assert torch.equal(flow.scheduler.sigmas, sched.sigmas) and torch.equal(flow.scheduler.timesteps, sched.timesteps)
    assert flow.num_timesteps == 1000
