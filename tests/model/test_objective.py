"""The ComposerModel objective, validation variants, param groups and warmup (docs/design.md §7, §9.8)."""

from __future__ import annotations

import hashlib

import pytest
import torch
from _gc_helpers import make_batch, make_samples, null_embedding, randomize_cond, tiny_dit
from torch.utils.data import DataLoader, Dataset

from gcc.compat.diffsynth import FlowMatchScheduler
from gcc.data.batch import gc_collate
from gcc.model.config import TRAIN_STATS, VAL_ROW_FIELDS, ModelConfig, OptimizerConfig
from gcc.model.flow import make_scheduler
from gcc.model.objective import GcTrainModel, GcValMSE, resolve_timesteps
from gcc.model.optim import build_optimizer, param_groups
from gcc.training.schedule import composer_scheduler, trainer_schedule_kwargs
from gcc.training.sections import SchedulerConfig


def _model(seed=0, dit_seed=0, **kw):
    return GcTrainModel(tiny_dit(seed=dit_seed), seed=seed, null_context=null_embedding(), **kw)


def _generator(*parts) -> torch.Generator:
    """docs/design.md §7's draws written out here, not gcc's: a CPU generator seeded by the blake2b (8 bytes, little
    endian, 63 bits) of the parts joined by \\x1f."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))


def _train_draw(seed, sample_id, epoch, shape):
    """(tid ~ U{0..999}, then eps ~ N(0, 1)) of one training sample: from `_generator("gcc.train", ...)`."""
    g = _generator("gcc.train", seed, sample_id, epoch)
    return torch.randint(0, 1000, (1,), generator=g), torch.randn(tuple(shape), generator=g)


def _val_noise(seed, clip_id, tid, shape):
    return torch.randn(tuple(shape), generator=_generator("gcc.val", seed, clip_id, tid))


def test_loss_equals_hand_computation():
    model = _model(seed=42)
    randomize_cond(model.dit)
    b = make_batch(B=2, sample_ids=[17, 5], epochs=[0, 3])
    out = model(b)
    loss = model.loss(out, b)

    # DiffSynth's own scheduler calls, per sample, on the draws of (seed, sample id, epoch)
    sched = FlowMatchScheduler("Wan")
    sched.set_timesteps(1000, training=True, shift=5.0)
    x0 = b["input_latents"].float()
    expect = []
    for i in range(2):
        tid, eps = _train_draw(42, b["sample_id"][i], b["epoch"][i], x0.shape[1:])
        t = sched.timesteps[int(tid)]
        x_t = sched.add_noise(x0[i], eps, t)
        x_t[:, 0] = x0[i, :, 0]  # clean first frame
        with torch.no_grad():
            pred = model.dit.gc_forward(
                x_t[None],
                t[None],
                b["context"][i : i + 1, : b["prompts"][i]],
                b["context_index"][i : i + 1],
                b["sem_ids"][i : i + 1],
            )[0]
        # the prediction itself, frame 0 included (the loss alone barely moves when frame 0 is noised)
        torch.testing.assert_close(out["pred"][i].detach(), pred, rtol=1e-5, atol=1e-5)
        target = sched.training_target(x0[i], eps, t)
        mse = (pred[:, 1:] - target[:, 1:]).pow(2).mean()
        expect.append(mse * sched.training_weight(t))
    torch.testing.assert_close(loss.detach(), torch.stack(expect).mean(), rtol=1e-5, atol=1e-6)


def test_the_loss_reports_the_statistics_declared_in_the_model_config_as_detached_scalars():
    model = _model()
    b = make_batch(B=2)
    out = model(b)
    model.loss(out, b)
    assert list(out["stats"]) == [s.name for s in TRAIN_STATS]
    assert all(v.shape == () and not v.requires_grad for v in out["stats"].values())


def test_frame0_excluded_from_loss():
    model = _model()
    b = make_batch(B=2)
    out = model(b)
    loss = model.loss(out, b).item()
    out["target"][:, :, 0] += 100.0
    assert model.loss(out, b).item() == loss
    out["target"][:, :, 1] += 1.0
    assert model.loss(out, b).item() != loss


def test_training_draws_do_not_depend_on_batch_composition_or_rng():
    # same sample in a micro-batch of 2 or alone, global RNG disturbed: the same (t, eps) and the same loss term
    model = _model(seed=3)
    b = make_batch(B=2, sample_ids=[10, 11], epochs=[1, 1], seed=4)
    out2 = model(b)
    torch.manual_seed(12345)
    single = {k: v[1:] for k, v in b.items()}
    out1 = model(single)
    assert out2["tid"][1] == out1["tid"][0]
    torch.testing.assert_close(out2["target"][1:], out1["target"])
    torch.testing.assert_close(out2["pred"][1:], out1["pred"], rtol=1e-4, atol=1e-5)


def test_sem_rms_zero_at_init_and_grows_after_one_step():
    model = _model()
    b = make_batch(B=2)
    model.train()
    out = model(b)
    assert out["sem_rms"].item() == 0.0
    opt = build_optimizer(model, OptimizerConfig(lr=1e-4, cond_lr=1e-2))
    model.loss(out, b).backward()
    opt.step()
    opt.zero_grad()
    assert model(b)["sem_rms"].item() > 0.0


def test_param_groups():
    model = _model()
    groups = param_groups(model, lr=1e-5, cond_lr=1e-4, weight_decay=0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert [g["lr"] for g in groups] == [1e-5, 1e-4]
    assert all(names[id(p)].startswith("dit.gc_sem_cond.") for p in groups[1]["params"])
    assert not any("gc_sem_cond" in names[id(p)] for p in groups[0]["params"])
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == len(names) and len(groups[1]["params"]) == 6
    opt = build_optimizer(model, OptimizerConfig(lr=1e-5, cond_lr=1e-4))
    assert isinstance(opt, torch.optim.AdamW)
    assert all(g["betas"] == (0.9, 0.999) and g["weight_decay"] == 0.01 for g in opt.param_groups)


class _Batches(Dataset):
    """Samples as the loader makes them; a DataLoader over it collates them with gc_collate (`_loader`)."""

    def __init__(self, n):
        self.items = [make_samples(B=1, seed=i, sample_ids=[i])[0] for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _loader(n, batch_size):
    return DataLoader(_Batches(n), batch_size=batch_size, collate_fn=gc_collate)


def test_warmup_lr_applied_by_a_real_composer_trainer(tmp_path, monkeypatch):
    from composer import Trainer

    monkeypatch.chdir(tmp_path)
    model = _model()
    lr, cond_lr, warmup = 1e-3, 1e-2, 4
    opt = build_optimizer(model, OptimizerConfig(lr=lr, cond_lr=cond_lr))
    applied = []  # the lr of each group when an update was actually taken
    opt.register_step_post_hook(lambda o, args, kwargs: applied.append([g["lr"] for g in o.param_groups]))
    trainer = Trainer(
        model=model,
        train_dataloader=_loader(6, 2),
        eval_dataloader=_loader(3, 2),
        eval_interval="3ba",
        max_duration="3ba",
        optimizers=opt,
        **trainer_schedule_kwargs(opt, composer_scheduler(SchedulerConfig(t_warmup=warmup)), 3),
        device="cpu",
        progress_bar=False,
        log_to_console=False,
        loggers=[],
        save_folder=None,
        run_name="warmup_test",
    )
    trainer.fit()
    expect = [[lr * s / warmup, cond_lr * s / warmup] for s in (1, 2, 3)]
    assert len(applied) == 3
    for got, want in zip(applied, expect):
        assert got == pytest.approx(want, rel=1e-9)
    # validation ran through Composer: per timestep, 3 val clips
    metric = trainer.state.eval_metrics["eval"]["val_mse"]
    rows = metric.rows()
    assert [round(r["timestep"], 1) for r in rows] == [201.3, 500.6, 799.7]
    assert all(r["n"] == 3 for r in rows)
    trainer.close()


def test_micro_batches_are_not_deep_copied(tmp_path, monkeypatch):
    """Composer deep-copies each micro-batch for train metrics; the model has none, so MicroBatch skips the copy."""
    import composer.trainer.trainer as composer_trainer
    from composer import Trainer
    from composer.core import DataSpec

    from gcc.compat.composer import MicroBatch

    monkeypatch.chdir(tmp_path)
    model = _model()
    assert model.get_metrics(is_train=True) == {}  # nothing would ever read the copy
    copies = []
    real = composer_trainer.deepcopy
    monkeypatch.setattr(
        composer_trainer, "deepcopy", lambda x, *a: copies.append((type(x), (y := real(x, *a)) is x)) or y
    )
    opt = build_optimizer(model, OptimizerConfig(lr=1e-3, cond_lr=1e-3))
    trainer = Trainer(
        model=model,
        train_dataloader=DataSpec(_loader(4, 4), microbatch_transforms=MicroBatch),
        device_train_microbatch_size=2,
        max_duration="1ba",
        optimizers=opt,
        device="cpu",
        progress_bar=False,
        log_to_console=False,
        loggers=[],
        save_folder=None,
        run_name="copy_test",
    )
    trainer.fit()
    trainer.close()
    assert [c for c in copies if c[0] is MicroBatch] == [(MicroBatch, True)] * 2  # two micro-batches, same objects


def test_tensorboard_one_event_file_per_launch(tmp_path, monkeypatch):
    """Composer's logger starts a new event file at every flush; ours keeps one file, holding every step."""
    from composer import Trainer
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gcc.compat.composer import LocalTensorboardLogger

    monkeypatch.chdir(tmp_path)
    model = _model()
    opt = build_optimizer(model, OptimizerConfig(lr=1e-3, cond_lr=1e-3))
    trainer = Trainer(
        model=model,
        train_dataloader=_loader(4, 2),
        max_duration="4ba",
        optimizers=opt,
        device="cpu",
        progress_bar=False,
        log_to_console=False,
        save_folder=None,
        loggers=[LocalTensorboardLogger(log_dir=str(tmp_path / "tb"), flush_interval=1)],
        run_name="tb_test",
    )  # 2 batches per epoch: flushes at every step and epoch end
    trainer.fit()
    trainer.close()
    files = list((tmp_path / "tb" / "tb_test").glob("events.out.tfevents.*"))
    assert len(files) == 1, files
    acc = EventAccumulator(str(files[0]))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss/train/total")] == [0, 1, 2, 3]  # Composer logs the 0-based batch


def test_tensorboard_writes_one_event_per_log_call_with_every_number(tmp_path):
    """One event holds all of a call's scalars (Composer writes one per scalar); non-numbers are skipped."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event

    from gcc.compat.composer import LocalTensorboardLogger

    tb = LocalTensorboardLogger(log_dir=str(tmp_path))
    tb.run_name = "run"
    tb._initialize_summary_writer()
    tb.log_metrics({"a": 1.5, "b": torch.tensor(2.25), "c": "text", "d": torch.ones(2)}, step=3)
    tb.log_metrics({"a": 0.5}, step=4)
    tb.close(None, None)
    events = [
        Event.FromString(r)
        for f in (tmp_path / "run").glob("events.out.tfevents.*")
        for r in RawEventFileLoader(str(f)).Load()
    ]
    events = [e for e in events if e.HasField("summary")]
    assert [(e.step, {v.tag: v.simple_value for v in e.summary.value}) for e in events] == [
        (3, {"a": 1.5, "b": 2.25}),
        (4, {"a": 0.5}),
    ]


def _engine_calls(tmp_path, lean: bool) -> tuple[list, dict]:
    """What a real Trainer's events call on three kinds of callback and a logger, with Composer's engine or
    LeanEngine; and which of them LeanEngine would visit for BEFORE_FORWARD."""
    from composer import Trainer
    from composer.core import Callback, Event
    from composer.loggers import LoggerDestination

    from gcc.compat.composer import use_lean_engine

    calls = []

    class Methods(Callback):  # overrides two event methods
        def after_loss(self, state, logger):
            calls.append(("after_loss", "Methods"))

        def batch_end(self, state, logger):
            calls.append(("batch_end", "Methods"))

    class Everything(Callback):  # overrides run_event: sees every event
        def run_event(self, event, state, logger):
            calls.append((event.value, "Everything"))

    class Log(LoggerDestination):  # loggers run after the other callbacks
        def batch_end(self, state, logger):
            calls.append(("batch_end", "Log"))

    instance = Callback()  # an instance attribute, not a method of its class
    instance.fit_end = lambda state, logger: calls.append(("fit_end", "instance"))
    model = _model()
    trainer = Trainer(
        model=model,
        train_dataloader=_loader(4, 4),
        device_train_microbatch_size=2,
        max_duration="2ba",
        device="cpu",
        optimizers=build_optimizer(model, OptimizerConfig(lr=1e-3, cond_lr=1e-3)),
        progress_bar=False,
        log_to_console=False,
        loggers=[Log()],
        callbacks=[Methods(), Everything(), instance],
        eval_dataloader=_loader(2, 2),  # validation and checkpoint events too
        eval_interval="1ba",
        save_folder=str(tmp_path / ("lean" if lean else "composer")),
        save_interval="1ba",
        run_name="engine_test",
    )
    if lean:
        use_lean_engine(trainer)
    trainer.fit()
    visited = {}
    if lean:
        visited = {
            e: [type(c).__name__ for c in trainer.engine._handlers(e)] for e in (Event.BEFORE_FORWARD, Event.BATCH_END)
        }
    trainer.close()
    return calls, visited


def test_lean_engine_calls_what_composers_engine_calls_and_visits_only_handlers(tmp_path, monkeypatch):
    from composer.core import Event

    monkeypatch.chdir(tmp_path)
    composer_calls, _ = _engine_calls(tmp_path, lean=False)
    lean_calls, visited = _engine_calls(tmp_path, lean=True)
    assert lean_calls == composer_calls
    assert composer_calls.count(("after_loss", "Methods")) == 4  # 2 steps x 2 micro-batches
    assert ("fit_end", "instance") in composer_calls
    seen = {e for e, who in composer_calls if who == "Everything"}
    for event in ("eval_start", "eval_batch_end", "eval_end", "batch_checkpoint", "fit_end"):
        assert event in seen, event
    assert sorted(p.name for p in (tmp_path / "lean").iterdir()) == sorted(
        p.name for p in (tmp_path / "composer").iterdir()
    )
    step_end = [c for c in composer_calls if c[0] == "batch_end"]
    assert step_end[:3] == [("batch_end", "Methods"), ("batch_end", "Everything"), ("batch_end", "Log")]
    assert visited[Event.BEFORE_FORWARD] == ["Everything"]
    # Composer's CheckpointSaver (made from save_folder) is a callback too, and handles BATCH_END
    assert visited[Event.BATCH_END] == ["Methods", "Everything", "CheckpointSaver", "Log"]


def test_val_timesteps_resolve_to_scheduler_timesteps():
    got = resolve_timesteps(make_scheduler(1000, 5.0), [200, 500, 800])
    assert [round(t, 1) for _, t in got] == [201.3, 500.6, 799.7]
    sched = make_scheduler(1000, 5.0)
    assert all(float(sched.timesteps[i]) == t for i, t in got)


def test_val_variants_share_noise_and_differ_as_expected():
    model = _model()
    model.eval()
    b = make_batch(B=2, seed=9)
    out = model.eval_forward(b)
    assert out["mse"].shape == (3, 2)
    # zero-initialised cond: ids cannot matter, so with the same noise uncond == cond exactly
    torch.testing.assert_close(out["mse_uncond"], out["mse"], rtol=0, atol=0)
    assert (out["mse_nulltext"] - out["mse"]).abs().max() > 0
    # nulltext == cond run on a batch whose every cell is NULL_PROMPT
    nb = dict(b, context=null_embedding().expand(2, 1, -1, -1), context_index=torch.zeros(2, 3, dtype=torch.long))
    nb["prompts"] = [1, 1]
    torch.testing.assert_close(model.eval_forward(nb)["mse"], out["mse_nulltext"])
    randomize_cond(model.dit)
    out2 = model.eval_forward(b)
    assert (out2["mse_uncond"] - out2["mse"]).abs().min() > 0
    # the three variants by hand, on noise drawn here as docs/design.md §9.8 says (not by gcc's val_noise): cond,
    # uncond (every sem id UNKNOWN), nulltext (the NULL_PROMPT embedding in every cell, the clip's own sem ids); the
    # same noise for all three, the clean first frame, frames 1.. in the MSE; and the val_log gap is their difference
    sched = make_scheduler(1000, 5.0)
    x0 = b["input_latents"].float()
    null_ctx, null_index = null_embedding().float().expand(1, 1, -1, -1), torch.zeros(1, 3, dtype=torch.long)
    hand = {"mse": torch.zeros(3, 2), "mse_uncond": torch.zeros(3, 2), "mse_nulltext": torch.zeros(3, 2)}
    for j, (tid, t) in enumerate(resolve_timesteps(sched, [200, 500, 800])):
        for i in range(2):
            eps = _val_noise(0, b["clip_id"][i], tid, x0.shape[1:])
            x_t = (1 - sched.sigmas[tid]) * x0[i] + sched.sigmas[tid] * eps
            x_t[:, 0] = x0[i, :, 0]
            clip_text = b["context"][i : i + 1, : b["prompts"][i]], b["context_index"][i : i + 1]
            sem, unknown = b["sem_ids"][i : i + 1], torch.full_like(b["sem_ids"][i : i + 1], 255)
            for name, (ctx, ids), ids_seen in (
                ("mse", clip_text, sem),
                ("mse_uncond", clip_text, unknown),
                ("mse_nulltext", (null_ctx, null_index), sem),
            ):
                with torch.no_grad():
                    pred = model.dit.gc_forward(x_t[None], torch.tensor([t]), ctx, ids, ids_seen)[0]
                hand[name][j, i] = (pred[:, 1:] - (eps - x0[i])[:, 1:]).pow(2).mean()
    for name in hand:
        torch.testing.assert_close(out2[name], hand[name], rtol=1e-5, atol=1e-6)
    metric = GcValMSE([t for _, t in model.val_steps])
    metric.update(out2["mse"], out2["mse_uncond"], out2["mse_nulltext"])
    gaps = [r["gap_nulltext"] for r in metric.rows()]
    assert gaps == pytest.approx((hand["mse_nulltext"] - hand["mse"]).double().mean(1).tolist(), rel=1e-4, abs=1e-6)
    assert min(abs(g) for g in gaps) > 0
    # eval is deterministic (no global RNG), and the same clip gets the same noise in any batch
    torch.manual_seed(77)
    torch.testing.assert_close(model.eval_forward(b)["mse"], out2["mse"])
    single = {k: v[:1] for k, v in b.items()}
    torch.testing.assert_close(model.eval_forward(single)["mse"], out2["mse"][:, :1], rtol=1e-4, atol=1e-6)


def test_without_first_frame_cond_frame_0_is_noised_predicted_and_scored():
    """model.first_frame_cond false (T2V): by hand, with DiffSynth's scheduler, frame 0 noised like the others,
    its timestep the clip's, and in the MSE; validation and training alike. The null prompt embedding is data, not a
    weight: no checkpoint carries it."""
    model = _model(seed=5, config=ModelConfig(first_frame_cond=False))
    randomize_cond(model.dit)
    b = make_batch(B=1, sample_ids=[4], epochs=[2], seed=2)
    sched = FlowMatchScheduler("Wan")
    sched.set_timesteps(1000, training=True, shift=5.0)
    x0 = b["input_latents"][0].float()
    text = b["context"][:, : b["prompts"][0]], b["context_index"]

    def mse(eps, tid):
        t = sched.timesteps[tid]
        with torch.no_grad():
            pred = model.dit.gc_forward(sched.add_noise(x0, eps, t)[None], t[None], *text, b["sem_ids"], False)[0]
        return (pred - sched.training_target(x0, eps, t)).pow(2).mean()

    val = model.eval_forward(b)["mse"][:, 0]
    hand = [mse(_val_noise(5, b["clip_id"][0], tid, x0.shape), tid) for tid, _ in model.val_steps]
    torch.testing.assert_close(val, torch.stack(hand), rtol=1e-5, atol=1e-6)
    tid, eps = _train_draw(5, 4, 2, x0.shape)
    weight = sched.training_weight(sched.timesteps[int(tid)])
    torch.testing.assert_close(model.loss(model(b), b).detach(), mse(eps, int(tid)) * weight, rtol=1e-5, atol=1e-6)
    assert "null_context" not in model.state_dict() and "null_context" in dict(model.named_buffers())


def test_val_metric_rows():
    m = GcValMSE([201.3, 500.6])
    m.update(
        torch.tensor([[1.0, 3.0], [2.0, 2.0]]),
        torch.tensor([[2.0, 4.0], [2.0, 2.0]]),
        torch.tensor([[1.5, 3.5], [1.0, 1.0]]),
    )
    m.update(torch.tensor([[5.0], [2.0]]), torch.tensor([[5.0], [2.0]]), torch.tensor([[5.0], [2.0]]))
    rows = m.rows()
    assert rows[0] == pytest.approx(
        dict(timestep=201.3, mse=3.0, mse_uncond=11 / 3, mse_nulltext=10 / 3, gap_uncond=2 / 3, gap_nulltext=1 / 3, n=3)
    )
    assert rows[1]["gap_nulltext"] == pytest.approx(-2 / 3) and rows[1]["n"] == 3
    assert all(tuple(r) == VAL_ROW_FIELDS for r in rows)  # the declared fields, in the declared order
    assert m.compute().item() == pytest.approx((3.0 + 2.0) / 2)
    # sums in float64: a float32 sum of 2**24 and 1 loses the 1
    exact = GcValMSE([201.3])
    big = torch.tensor([[2.0**24, 1.0]])
    exact.update(big, big, big)
    assert exact.rows()[0]["mse"] == (2**24 + 1) / 2
    one = GcValMSE([201.3])
    one.update(torch.tensor([[2.0]]), torch.tensor([[3.0]]), torch.tensor([[4.0]]))  # a single clip
    assert one.rows() == [dict(timestep=201.3, mse=2.0, mse_uncond=3.0, mse_nulltext=4.0, gap_uncond=1.0,
                               gap_nulltext=2.0, n=1)]  # fmt: skip


# rank 1 of the group (tests/_launch.py `rank_0_here`): its own clips' MSEs, then the synced rows
VAL_RANK1 = """
import json, torch
from gcc.model.objective import GcValMSE

m = GcValMSE([201.3, 500.6])
m.update(torch.tensor([[5.0], [1.0]]), torch.tensor([[6.0], [1.0]]), torch.tensor([[5.0], [4.0]]))
print(json.dumps(m.rows()), flush=True)
"""


@pytest.mark.slow  # starts rank 1's process
def test_val_rows_are_the_mean_over_every_ranks_clips():
    """In a real 2-process gloo group, each rank's clips' MSEs: both ranks' val_log rows are the means over all
    three clips (computed here by hand)."""
    import json

    from _launch import rank_0_here

    with rank_0_here(VAL_RANK1) as rank1:
        m = GcValMSE([201.3, 500.6])
        m.update(
            torch.tensor([[1.0, 3.0], [2.0, 2.0]]),
            torch.tensor([[2.0, 4.0], [2.0, 2.0]]),
            torch.tensor([[1.5, 3.5], [1.0, 1.0]]),
        )
        rows = m.rows()
        out, err = rank1.communicate(timeout=120)
    assert rank1.returncode == 0, err[-3000:]
    want = [
        dict(timestep=201.3, mse=3.0, mse_uncond=4.0, mse_nulltext=10 / 3, gap_uncond=1.0, gap_nulltext=1 / 3, n=3),
        dict(timestep=500.6, mse=5 / 3, mse_uncond=5 / 3, mse_nulltext=2.0, gap_uncond=0.0, gap_nulltext=1 / 3, n=3),
    ]
    for got in (rows, json.loads(out)):
        assert got == [pytest.approx(w) for w in want]
