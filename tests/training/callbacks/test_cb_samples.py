"""TrainingSamples (gcc/training/callbacks/samples.py): at the due validations (every `every_steps` and the last
step) the fixed val clips are sampled with their condition and without it, from noise that depends only on
(seed, clip); `samples/step-N/` is written whole and rotated; the scores reach the loggers and the media reach
TensorBoard; sampling runs under the validation's deadline (StepDeadline after it), not the step deadline."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import numpy as np
import pytest
from _cbfit import Fit
from _gc_helpers import randomize_cond, tiny_dit
from composer.core import Event
from PIL import Image

from gcc.data.config import DataConfig
from gcc.data.dataset import GcStreamingDataset
from gcc.model.objective import GcTrainModel
from gcc.sampling.decoders import SynthDecoder
from gcc.training.builders import select_val_ids
from gcc.training.callbacks import StepDeadline
from gcc.training.callbacks.samples import (
    ClipSample,
    SampleSettings,
    TrainingSamples,
    _sheet,
    rotate_samples,
    step_folder,
)
from gcc.training.callbacks.step_deadline import WARMUP
from gcc.training.loggers import SampleTensorboardLogger
from gcc.training.watchdog import StallWatchdog


@pytest.fixture(scope="module")
def val(shards, tmp_path_factory):
    """The val split of the loader tests' shards, read by a real GcStreamingDataset (its own cache folder)."""
    return GcStreamingDataset(
        DataConfig(str(shards)), "val", tmp_path_factory.mktemp("cache"), batch_size=1, shuffle=False
    )


def model(val) -> GcTrainModel:
    dit = tiny_dit()
    randomize_cond(dit)  # so the condition changes what is sampled
    return GcTrainModel(dit, seed=0, null_context=val.text.row(val.text.null_id))


def settings(**kw) -> SampleSettings:
    return SampleSettings(
        **{
            "every_steps": 4,
            "max_steps": 6,
            "steps": 3,
            "shift": 5.0,
            "sem_cfg": 1.0,
            "seed": 0,
            "fps": 8,
            "keep": 0,
            **kw,
        }
    )


def samples(run_dir, val, **kw) -> TrainingSamples:
    return TrainingSamples(
        run_dir,
        model(val),
        val.get_item,
        select_val_ids(val.manifest, 2),
        SynthDecoder(val.text.keys, "parts"),
        settings(**kw),
        "parts",
    )


def validate(fit: Fit) -> None:
    fit.event(Event.EVAL_START)
    fit.event(Event.EVAL_END)


def test_due_validations_write_the_step_folder_and_log_scores_and_media(tmp_path, val):
    cb = samples(tmp_path, val)
    fit = Fit([cb], max_steps=6)
    tb = SampleTensorboardLogger(log_dir=str(tmp_path / "tensorboard"), flush_interval=1)
    fit.logger.destinations = (fit.memory, tb)
    tb.init(fit.state, fit.logger)
    fit.fit_start()
    validate(fit)  # step 0: due
    for _ in range(2):
        fit.step()
    validate(fit)  # step 2: not due
    for _ in range(2):
        fit.step()
    validate(fit)  # step 4: due
    fit.step()
    fit.step()
    validate(fit)  # step 6, the last: due
    tb.close(fit.state, fit.logger)

    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == ["step-0", "step-4", "step-6"]
    info = json.loads((step_folder(tmp_path, 4) / "samples.json").read_text())
    clips = sorted(info["clips"])
    assert clips == sorted(val.manifest["splits"]["val"]["clip_ids"][i] for i in select_val_ids(val.manifest, 2))
    assert info["decoder"].startswith("synthetic") and info["score"] == "agreement"
    names = {p.name for p in step_folder(tmp_path, 4).iterdir()}
    assert names == {f"{c}.{v}" for c in clips for v in ("cond.mp4", "uncond.mp4", "png")} | {"samples.json"}
    for c in clips:  # the condition steers the sample: the two variants differ
        cond, uncond = (step_folder(tmp_path, 4) / f"{c}.{v}.mp4" for v in ("cond", "uncond"))
        assert cond.read_bytes() != uncond.read_bytes()
        assert 0.0 <= info["clips"][c]["cond"] <= 1.0 and 0.0 <= info["clips"][c]["uncond"] <= 1.0
    steps_logged = [int(ts.batch) for ts, _ in fit.memory.data["sample/agreement_cond"]]
    assert steps_logged == [0, 4, 6]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = list((tmp_path / "tensorboard").iterdir())
    acc = EventAccumulator(str(runs[0]), size_guidance={"images": 0}).Reload()
    assert set(acc.Tags()["images"]) == {f"samples/{c}/{v}" for c in clips for v in ("cond", "uncond", "sheet")}
    gif = acc.Images(f"samples/{clips[0]}/cond")
    assert [g.step for g in gif] == [0, 4, 6] and gif[0].encoded_image_string.startswith(b"GIF89a")


def test_the_frames_depend_only_on_seed_clip_and_weights(tmp_path, val):
    def sheet_and_scores(folder, **kw):
        cb = samples(folder, val, **kw)
        fit = Fit([cb], max_steps=6)
        fit.fit_start()
        validate(fit)
        out = step_folder(folder, 0)
        return {p.name: p.read_bytes() for p in out.glob("*.png")}, json.loads((out / "samples.json").read_text())

    a, info_a = sheet_and_scores(tmp_path / "a")
    b, info_b = sheet_and_scores(tmp_path / "b")
    assert a == b and info_a["clips"] == info_b["clips"]  # a fresh callback (a resumed launch) samples the same
    c, _ = sheet_and_scores(tmp_path / "c", seed=1)
    assert a.keys() == c.keys() and all(a[k] != c[k] for k in a)  # another seed: other noise


def test_sampling_runs_under_the_validations_deadline_not_the_step_deadline(tmp_path, val):
    watchdog = StallWatchdog(tmp_path, 0, poll_s=3600)  # its thread never checks: the test reads what is armed
    try:
        deadline = StepDeadline(watchdog, timeout_s=900, floor_s=60)
        seen = []

        def load(sample_id):
            seen.append(watchdog._due["step"][0] - time.monotonic())
            return val.get_item(sample_id)

        cb = samples(tmp_path, val, every_steps=WARMUP + 1, max_steps=100)
        cb.load_clip = load
        fit = Fit([cb, deadline], max_steps=100)  # the builder's order: the samples before the deadline
        fit.fit_start()
        for _ in range(WARMUP + 1):
            fit.step()
        assert watchdog._due["step"][0] - time.monotonic() <= 60  # quick steps: the floor
        validate(fit)
        assert len(seen) == 2 and min(seen) > 900 - 5
        assert watchdog._due["step"][0] - time.monotonic() <= 60  # and the step deadline again after it
    finally:
        assert watchdog.stop(10)


def test_rotation_keeps_the_newest_step_folders(tmp_path):
    for s in (0, 4, 12, 8):
        step_folder(tmp_path, s).mkdir(parents=True)
    (tmp_path / "samples" / "notes").mkdir()
    assert rotate_samples(tmp_path, 0) == []
    removed = rotate_samples(tmp_path, 2)
    assert sorted(p.name for p in removed) == ["step-0", "step-4"]
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == ["notes", "step-12", "step-8"]


def _where(pixels: np.ndarray, panel: np.ndarray) -> tuple[int, int]:
    """The one place (y, x) where `panel`, upscaled by an integer factor (nearest), is in the picture."""
    H, W = panel.shape[:2]
    s = next(k for k in range(1, 65) if W * k >= 192)  # at least 192 pixels wide (the sheet's readable size)
    block = np.repeat(np.repeat(panel, s, 0), s, 1)
    found = [
        (int(y), int(x))
        for y, x in np.argwhere((pixels == block[0, 0]).all(-1))
        if np.array_equal(pixels[y : y + H * s, x : x + W * s], block)
    ]
    assert len(found) == 1, found
    return found[0]


def test_the_contact_sheet_has_a_row_per_latent_frame_labelled_as_gcc_samples(tmp_path):
    """9 pixel frames = 3 latent frames: 3 rows (pixel frames 0, 4, 8: each latent frame's last), in each the GT,
    the conditioned and unconditioned samples and the condition, left to right: each found in the picture. (Their
    labels are gcc-sample's, one function for both: tests/sampling/test_media.py.)"""
    rng = np.random.default_rng(0)
    video = [rng.integers(0, 255, size=(9, 4, 6, 3), dtype=np.uint8) for _ in range(4)]
    clip = ClipSample(0, "clip00001", video[0], {"cond": video[1], "uncond": video[2]}, video[3], np.array([0]), {})
    _sheet(tmp_path / "got.png", clip, 7, SimpleNamespace(score_name=""), "parts")
    pixels = np.asarray(Image.open(tmp_path / "got.png").convert("RGB"))
    at = [[_where(pixels, v[p]) for v in video] for p in (0, 4, 8)]
    ys = [[y for y, _ in row] for row in at]
    xs = [[x for _, x in row] for row in at]
    assert all(len(set(row)) == 1 for row in ys) and ys[0][0] < ys[1][0] < ys[2][0], at  # rows top to bottom
    assert xs[0] == xs[1] == xs[2] and xs[0] == sorted(set(xs[0])), at  # panels left to right, in columns
