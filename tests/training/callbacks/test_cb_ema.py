"""Ema (gcc/training/callbacks/ema.py): the EMA of the trainable weights (`algorithms.ema`), Composer's decay from the
half life, the start and the update interval, and its state in a checkpoint restored exactly."""

from __future__ import annotations

import io
import math

import pytest
import torch
from _cbfit import Fit, records

from gcc.training.callbacks.ema import Ema, build_ema, checkpoint_holds_ema, smoothing
from gcc.training.config import ConfigError, load_config


def _to_step(fit: Fit, step: int) -> None:
    while int(fit.state.timestamp.batch) < step:
        fit.state.timestamp = fit.state.timestamp.to_next_batch(samples=2)


def _set(module: torch.nn.Module, value: float) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(value)


def test_smoothing_is_composers_and_halves_an_old_weights_share_every_half_life():
    assert smoothing(1000, 1) == 2 ** (-1 / 1000)
    assert smoothing(10, 5) == pytest.approx(math.sqrt(0.5))
    assert smoothing(8, 1) ** 8 == pytest.approx(0.5)


def test_with_constant_weights_the_average_approaches_them_in_closed_form():
    """From the starting weights w0, k updates towards constant weights c: c + (w0 - c) * s**k."""
    module = torch.nn.Linear(3, 2)
    ema = Ema(module, half_life=4)
    fit = Fit()
    _set(module, 1.0)
    ema.before_load(fit.state, fit.logger)
    ema.fit_start(fit.state, fit.logger)  # the average starts as the weights: 1.0
    _set(module, 3.0)
    s = smoothing(4, 1)
    for k in range(1, 13):
        _to_step(fit, k)
        ema.batch_end(fit.state, fit.logger)
        for a in ema.averages.values():
            assert a.dtype == torch.float32
            assert torch.allclose(a, torch.full_like(a, 3.0 + (1.0 - 3.0) * s**k), rtol=0, atol=1e-6), k
    assert set(ema.averages) == {"weight", "bias"}


def test_a_known_sequence_with_a_start_and_an_interval():
    """Until ema_start the average is the weights; then every update_interval-th step it averages (float64
    reference loop over the weights the steps leave)."""
    module = torch.nn.Linear(1, 1, bias=False)
    ema = Ema(module, half_life=3, update_interval=2, start=3)
    fit = Fit()
    ema.before_load(fit.state, fit.logger)
    ema.fit_start(fit.state, fit.logger)
    s, want = smoothing(3, 2), None
    weights = [0.5, -1.0, 2.0, 4.0, 1.0, -3.0, 0.25, 8.0, 2.0]  # the weights after steps 1..9
    for step, w in enumerate(weights, 1):
        _set(module, w)
        _to_step(fit, step)
        ema.batch_end(fit.state, fit.logger)
        if step <= 3:
            want = w
        elif step % 2 == 0:
            want = s * want + (1 - s) * w
        assert float(ema.averages["weight"]) == pytest.approx(want, rel=1e-6), step
    assert float(ema.averages["weight"]) != pytest.approx(weights[-1])  # it averages: not the last weights


def test_frozen_parameters_and_buffers_are_not_averaged():
    module = torch.nn.BatchNorm1d(2)  # weight, bias (trainable), running stats (buffers)
    module.bias.requires_grad_(False)
    ema = Ema(module, half_life=2)
    fit = Fit()
    ema.before_load(fit.state, fit.logger)
    assert set(ema.averages) == {"weight"}


def test_a_checkpoint_round_trip_restores_the_averages_exactly_and_the_run_continues_the_same():
    """Two runs from the same weights, one saved after step 3 (torch.save, as Composer saves a DDP checkpoint's
    callback state) and continued by a new Ema loaded from it: bit for bit the same averages at every later step."""

    def run(steps, ema=None, module=None):
        module = module or torch.nn.Linear(3, 2)
        ema = ema or Ema(module, half_life=5)
        fit = Fit()
        ema.before_load(fit.state, fit.logger)
        return module, ema, fit

    torch.manual_seed(0)
    weights = [torch.randn(2, 3) for _ in range(6)]

    def step(module, ema, fit, k):
        with torch.no_grad():
            module.weight.copy_(weights[k - 1])
            module.bias.copy_(weights[k - 1][:, 0])
        _to_step(fit, k)
        ema.batch_end(fit.state, fit.logger)

    module, ema, fit = run(6)
    ema.fit_start(fit.state, fit.logger)
    for k in range(1, 4):
        step(module, ema, fit, k)
    buf = io.BytesIO()
    torch.save(ema.state_dict(), buf)
    for k in range(4, 7):
        step(module, ema, fit, k)

    module2 = torch.nn.Linear(3, 2)
    with torch.no_grad():
        module2.weight.copy_(weights[2])
        module2.bias.copy_(weights[2][:, 0])
    resumed = Ema(module2, half_life=5)
    fit2 = Fit()
    resumed.before_load(fit2.state, fit2.logger)
    buf.seek(0)
    resumed.load_state_dict(torch.load(buf))
    _to_step(fit2, 3)
    resumed.fit_start(fit2.state, fit2.logger)  # restored: not reset to the weights
    for k in range(4, 7):
        step(module2, resumed, fit2, k)
    assert all(torch.equal(ema.averages[k], resumed.averages[k]) for k in ema.averages)
    assert not torch.equal(resumed.averages["weight"], module2.weight)


def test_a_resume_from_a_checkpoint_without_an_average_starts_from_the_resumed_weights():
    module = torch.nn.Linear(3, 2)
    ema = Ema(module, half_life=5)
    fit = Fit()
    ema.before_load(fit.state, fit.logger)
    ema.load_state_dict({})  # what a checkpoint without an EMA gives (or none at all: Composer skips the call)
    _to_step(fit, 7)
    with records("gcc.training.callbacks.ema") as got:
        ema.fit_start(fit.state, fit.logger)
    assert torch.equal(ema.averages["weight"], module.weight.detach())
    assert any("holds no average" in r.getMessage() and "step 7" in r.getMessage() for r in got)


def test_a_checkpoint_of_another_model_is_refused_naming_the_keys():
    ema = Ema(torch.nn.Linear(3, 2), half_life=5)
    fit = Fit()
    ema.before_load(fit.state, fit.logger)
    with pytest.raises(ValueError, match="missing \\['bias'\\]"):
        ema.load_state_dict({"averages": {"weight": torch.zeros(2, 3)}})


def test_the_config_keys_are_composers_and_off_by_default():
    assert build_ema(load_config(None), torch.nn.Linear(1, 1), "") is None
    cfg = load_config(None, ["algorithms.ema.half_life=8ba", "algorithms.ema.update_interval=2ba"])
    ema = build_ema(cfg, torch.nn.Linear(1, 1), "")
    assert ema is not None and ema.smoothing == smoothing(8, 2) and ema.start == 0
    assert build_ema(load_config(None, ["algorithms.ema={}"]), torch.nn.Linear(1, 1), "").smoothing == smoothing(
        1000, 1
    )
    for bad, key in (
        ("algorithms.ema.half_life=0ba", "half_life"),
        ("algorithms.ema.half_life=2ep", "half_life"),
        ("algorithms.ema.update_interval=0ba", "update_interval"),
        ("algorithms.ema.ema_start=-1ba", "ema_start"),
    ):
        with pytest.raises(ConfigError, match=f"algorithms.ema.{key}: "):
            load_config(None, [bad])


def test_whether_a_sharded_checkpoint_holds_an_average_is_read_from_its_metadata(tmp_path):
    """A sharded (DCP) checkpoint is loaded into what the run asks for, so a launch that turns the EMA on at a resume
    asks for none from a checkpoint written without it (the average then starts from the resumed weights). A DDP
    checkpoint file is read whole: Composer skips a callback it holds nothing of."""
    import warnings

    import torch.distributed.checkpoint as dcp

    model = {"weight": torch.zeros(2, 3)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP in one process, without a process group: it says so
        dcp.save({"state": {"model": model, "callbacks": {"Ema": {"averages": model}}}}, checkpoint_id=tmp_path / "a")
        dcp.save(
            {"state": {"model": model, "callbacks": {"Other": {"x": torch.ones(1)}}}}, checkpoint_id=tmp_path / "b"
        )
    assert checkpoint_holds_ema(str(tmp_path / "a")) is True
    assert checkpoint_holds_ema(str(tmp_path / "b")) is False
    assert checkpoint_holds_ema(str(tmp_path / "ep0-ba4-rank0.pt")) is True  # a DDP file: the load tells
    assert checkpoint_holds_ema("") is True  # no resume

    cfg = load_config(None, ["algorithms.ema.half_life=8ba"])
    ema = build_ema(cfg, torch.nn.Linear(3, 2), str(tmp_path / "b"))
    assert ema is not None and ema.state_dict() == {}  # the load asks for no average
    ema.fit_start(Fit().state, None)
    assert set(ema.state_dict()["averages"]) == {"weight", "bias"}  # every save holds it
