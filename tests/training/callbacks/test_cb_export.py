"""Export (gcc/training/callbacks/export.py): `step-N.safetensors` (the DiT's weights in bf16 with the export metadata
of step N) every `export_every` steps and once more at the end of training, unless the last step was just exported
or the run was preempted or stopped early; with a checkpoint store, each export is also uploaded beside the
checkpoints while this launch owns the prefix (TakenOver otherwise)."""

from __future__ import annotations

import pytest
import torch
from _cbfit import Fit, records
from safetensors.torch import load_file

from gcc import storage
from gcc.model.dit import build_gc_dit
from gcc.model.export import check_gc_ckpt
from gcc.training.builders import export_metadata
from gcc.training.callbacks import Ema, Export, Preemption, StepSync
from gcc.training.checkpoint.store import CheckpointStore, TakenOver
from gcc.training.config import TrainConfig
from gcc.training.run_start import RunStart

LOGGER = "gcc.training.callbacks.export"


@pytest.fixture(scope="module")
def dit():
    cfg = TrainConfig()
    return build_gc_dit("tiny", device="cpu", vocab=cfg.model.vocab, init_seed=cfg.seed)


def metadata(step: int) -> dict[str, str]:
    """The trainer's own export metadata (builders.export_metadata) for a fresh start on data named "unit"."""
    cfg = TrainConfig()
    cfg.data.path = "/data/unit"
    start = RunStart(
        manifest={"name": "unit"},
        lineage={"init_ckpt": ""},
        launch="",
        committed_files=None,
        resumed_from="",
        resumed_step=None,
    )
    return export_metadata(cfg, start, step)


def exports(run_dir) -> list[str]:
    return sorted((p.name for p in run_dir.glob("step-*.safetensors")), key=lambda n: int(n[5:-12]))


def run(export: Export, steps: int, max_steps: int) -> Fit:
    fit = Fit([export], max_steps=max_steps)
    fit.fit_start()
    for _ in range(steps):
        fit.step()
    return fit


def test_every_n_steps_and_at_the_end_with_the_weights_and_metadata_of_the_step(tmp_path, dit):
    export = Export(tmp_path, dit, every=3, max_steps=7, metadata=metadata)
    fit = run(export, 6, 7)
    assert exports(tmp_path) == ["step-3.safetensors", "step-6.safetensors"]
    fit.step()
    assert exports(tmp_path) == ["step-3.safetensors", "step-6.safetensors"]
    fit.fit_end()  # step 7: the end of training
    assert exports(tmp_path) == ["step-3.safetensors", "step-6.safetensors", "step-7.safetensors"]
    summary = check_gc_ckpt(tmp_path / "step-7.safetensors", vocab="parts")
    assert summary["metadata"] == metadata(7) and summary["metadata"]["step"] == "7"
    assert check_gc_ckpt(tmp_path / "step-3.safetensors")["metadata"]["step"] == "3"
    saved = load_file(str(tmp_path / "step-7.safetensors"))
    expected = dit.state_dict()
    assert set(saved) == set(expected)
    for k, v in expected.items():
        assert saved[k].dtype == torch.bfloat16
        torch.testing.assert_close(saved[k], v.to(torch.bfloat16), rtol=0, atol=0)


def test_the_end_does_not_export_the_just_exported_step_again(tmp_path, dit):
    export = Export(tmp_path, dit, every=3, max_steps=6, metadata=metadata)
    fit = run(export, 6, 6)
    with records(LOGGER) as got:
        fit.fit_end()
    assert got == [] and exports(tmp_path) == ["step-3.safetensors", "step-6.safetensors"]


def test_export_every_0_exports_only_at_the_end(tmp_path, dit):
    export = Export(tmp_path, dit, every=0, max_steps=4, metadata=metadata)
    fit = run(export, 4, 4)
    assert exports(tmp_path) == []
    fit.fit_end()
    assert exports(tmp_path) == ["step-4.safetensors"]


def test_no_end_export_after_a_preemption_or_before_max_steps(tmp_path, dit):
    preempted = tmp_path / "preempted"
    preempted.mkdir()
    stopped = Preemption(None, 25.0, StepSync(2))  # type: ignore[arg-type]  # no watchdog: no fit_start here
    stopped.preempted_at = 4
    fit = run(Export(preempted, dit, every=3, max_steps=4, metadata=metadata, preemption=stopped), 4, 4)
    fit.fit_end()  # stopped at max_steps by a preemption: its relaunch exports when the run really ends
    assert exports(preempted) == ["step-3.safetensors"]
    early = tmp_path / "early"
    early.mkdir()
    fit = run(Export(early, dit, every=3, max_steps=10, metadata=metadata), 5, 10)
    fit.fit_end()  # the fit ended at step 5 of 10
    assert exports(early) == ["step-3.safetensors"]


def test_exports_are_uploaded_beside_the_checkpoints_while_the_launch_owns_the_prefix(s3_bucket, tmp_path, dit):
    store = CheckpointStore(f"{s3_bucket}/run")
    launch = store.claim()
    export = Export(tmp_path, dit, every=2, max_steps=10, metadata=metadata, store=store, launch=launch)
    fit = run(export, 2, 10)
    remote = f"{store.url}/step-2.safetensors"
    assert storage.exists(remote)
    fetched = tmp_path / "fetched.safetensors"
    storage.download_file(remote, str(fetched))
    assert fetched.read_bytes() == (tmp_path / "step-2.safetensors").read_bytes()
    CheckpointStore(f"{s3_bucket}/run").claim()  # another launch takes the prefix over
    fit.step()
    with pytest.raises(TakenOver, match="another launch claimed this checkpoint prefix"):
        fit.step()
    assert (tmp_path / "step-4.safetensors").is_file()  # written locally, then the launch stops
    assert not storage.exists(f"{store.url}/step-4.safetensors")


def test_with_an_ema_each_export_has_its_average_beside_it_same_keys_and_metadata_but_weights(tmp_path, dit):
    """`algorithms.ema`: step-N.ema.safetensors beside step-N.safetensors, the same key set, dtypes and metadata
    but `weights` (raw | ema); it holds the EMA's averages (here moved off the weights so the two differ)."""
    ema = Ema(dit, half_life=2)
    export = Export(tmp_path, dit, every=2, max_steps=2, metadata=metadata, ema=ema)
    fit = Fit([ema, export], max_steps=2)
    ema.before_load(fit.state, fit.logger)
    fit.fit_start()
    for a in ema.averages.values():
        a.add_(0.5)
    fit.step()
    fit.step()
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-2.ema.safetensors", "step-2.safetensors"]
    raw, avg = (check_gc_ckpt(tmp_path / f"step-2{s}.safetensors", vocab="parts") for s in ("", ".ema"))
    assert raw["metadata"] == metadata(2) and raw["metadata"]["weights"] == "raw"
    assert avg["metadata"] == {**metadata(2), "weights": "ema"}
    a, b = load_file(str(tmp_path / "step-2.safetensors")), load_file(str(tmp_path / "step-2.ema.safetensors"))
    assert set(a) == set(b) == set(dit.state_dict())
    for k, v in dit.state_dict().items():
        want = ema.averages[k] if k in ema.averages else v
        torch.testing.assert_close(b[k], want.to(torch.bfloat16), rtol=0, atol=0)
        assert b[k].dtype == a[k].dtype == torch.bfloat16
    # the average, not the weights: 0.5 above them, shrunk by two updates towards them
    k = next(iter(ema.averages))
    s = ema.smoothing
    torch.testing.assert_close(b[k].float(), (dit.state_dict()[k] + 0.5 * s * s).bfloat16().float())


def test_a_preempted_step_skips_its_export_and_the_relaunch_writes_it_first(tmp_path, dit, watchdog):
    """The export is registered with the launch's Preemption; at step 6 (an export step) the ranks stopped
    on a signal: no export there, and the checkpoint says so; the relaunch from it exports step 6 at FIT_START."""
    preemption = Preemption(watchdog, 25.0, StepSync(2))
    export = Export(tmp_path, dit, every=3, max_steps=10, metadata=metadata, preemption=preemption)
    preemption.skippable("export", export.due)  # as the callbacks' table registers it
    fit = run(export, 5, 10)
    preemption.sync.totals = {"preempt": 1.0}  # step 6's reduction carried a signal
    fit.state.callbacks.insert(0, preemption)  # before the export, as in the callbacks' table (its signals unused)
    fit.step()
    assert preemption.preempted_at == 6 and preemption.skipped == ["export"]
    assert exports(tmp_path) == ["step-3.safetensors"]
    fit.fit_end()
    assert exports(tmp_path) == ["step-3.safetensors"]  # nor at the end: the run did not end
    checkpoint = preemption.state_dict()
    resumed = Preemption(None, 25.0, StepSync(2))  # type: ignore[arg-type]
    resumed.load_state_dict(checkpoint)
    fit = Fit([Export(tmp_path, dit, every=3, max_steps=10, metadata=metadata, preemption=resumed)], max_steps=10)
    fit.state.timestamp = fit.state.timestamp.copy(batch=6)
    fit.fit_start()
    assert exports(tmp_path) == ["step-3.safetensors", "step-6.safetensors"]
    assert check_gc_ckpt(tmp_path / "step-6.safetensors")["metadata"]["step"] == "6"
