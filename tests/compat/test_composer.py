"""Contract tests of gcc/compat/composer.py against the installed Composer (the LeanEngine's parity with Composer's
engine, with validation, checkpoint and FIT_END events: tests/model/test_objective.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from composer import Trainer
from composer.callbacks import CheckpointSaver
from composer.core import Callback
from composer.distributed import prepare_distributed
from composer.models import ComposerClassifier
from torch.utils.data import DataLoader, TensorDataset

from gcc.compat.composer import (
    CHECKPOINT_RE,
    LATEST_LINK,
    MicroBatch,
    forget_saved_rng,
    meta_init_on,
    run_after_checkpoint_saver,
)


def _trainer(tmp_path, **kw) -> Trainer:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
    return Trainer(
        model=ComposerClassifier(torch.nn.Linear(4, 2), num_classes=2),
        train_dataloader=DataLoader(data, batch_size=4),
        max_duration="2ba",
        device="cpu",
        progress_bar=False,
        log_to_console=False,
        run_name="compat",
        **kw,
    )


def test_checkpoint_names_are_the_ones_gcc_parses_and_the_saver_is_last(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer = _trainer(tmp_path, save_folder=str(tmp_path / "ckpt"), save_interval="1ba")
    assert isinstance(trainer.state.callbacks[-1], CheckpointSaver)  # what run_after_checkpoint_saver relies on
    order = []

    class After(Callback):
        def batch_checkpoint(self, state, logger):
            order.append(sorted(p.name for p in (tmp_path / "ckpt").iterdir() if CHECKPOINT_RE.match(p.name)))

    run_after_checkpoint_saver(trainer, [After()])
    trainer.fit()
    trainer.close()
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert LATEST_LINK in names and (tmp_path / "ckpt" / LATEST_LINK).is_symlink()
    saved = [n for n in names if n != LATEST_LINK]
    assert saved and all(CHECKPOINT_RE.match(n) for n in saved), names
    assert [int(CHECKPOINT_RE.match(n).group(2)) for n in saved] == [1, 2]
    assert order == [["ep0-ba1-rank0.pt"], ["ep0-ba1-rank0.pt", "ep0-ba2-rank0.pt"]]  # each save seen after it


def test_run_after_checkpoint_saver_refuses_a_trainer_without_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer = _trainer(tmp_path)
    with pytest.raises(RuntimeError, match="CheckpointSaver"):
        run_after_checkpoint_saver(trainer, [Callback()])
    trainer.close()


def test_the_saved_rng_the_trainer_keeps_can_be_forgotten(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer = _trainer(tmp_path)
    assert hasattr(trainer, "_rng_state")  # the attribute Composer restores at fit start
    trainer._rng_state = [{"python": 1}]
    forget_saved_rng(trainer)
    assert trainer._rng_state is None
    trainer.close()


def test_a_micro_batch_is_not_deep_copied():
    mb = MicroBatch(x=torch.zeros(3))
    assert copy.deepcopy(mb) is mb
    assert copy.deepcopy(dict(mb)) is not mb


def test_meta_init_is_swapped_only_while_the_trainer_is_built():
    original = prepare_distributed.meta_init
    with meta_init_on("cpu"):
        assert prepare_distributed.meta_init is not original
        with torch.device("meta"):
            lin = torch.nn.Linear(3, 2)
        prepare_distributed.meta_init(lin)
        assert not lin.weight.is_meta and lin.weight.device.type == "cpu"
    assert prepare_distributed.meta_init is original


def test_a_sharded_checkpoint_without_a_callbacks_state_still_loads(tmp_path):
    """A DCP checkpoint of an earlier gcc has no state of a callback that keeps one since (Preemption's record): it
    loads, that callback starting afresh; a missing model key is still refused."""
    import torch.distributed.checkpoint as dcp
    from composer.utils import checkpoint

    dcp.save({"state": {"model": {"w": torch.ones(2)}, "callbacks": {"Old": {"n": 3}}}}, checkpoint_id=str(tmp_path))
    template = {"state": {"model": {"w": torch.zeros(2)}, "callbacks": {"Old": {"n": 0}, "Preemption": {"step": 0}}}}
    checkpoint.dist_cp_load(template, dcp.FileSystemReader(str(tmp_path)))
    assert torch.equal(template["state"]["model"]["w"], torch.ones(2)) and template["state"]["callbacks"] == {
        "Old": {"n": 3}
    }
    with pytest.raises(dcp.api.CheckpointException) as refused:
        checkpoint.dist_cp_load({"state": {"model": {"v": torch.zeros(2)}}}, dcp.FileSystemReader(str(tmp_path)))
    assert "Missing key in checkpoint state_dict: state.model.v" in "".join(map(str, refused.value.failures.values()))


def test_a_deferring_saver_writes_what_composer_writes_under_composers_name(tmp_path, monkeypatch):
    """`checkpoint_state` is what Composer's own save builds before it writes (the same file name, the same keys of
    the same state); every save goes through `save`; the subclass's state is keyed by Composer's name."""
    from gcc.compat.composer import DeferringCheckpointSaver, checkpoint_state, use_checkpoint_saver

    seen = []

    class Recording(DeferringCheckpointSaver):
        def save(self, state, logger):
            name, state_dict = checkpoint_state(self, state)
            seen.append((name, state_dict, int(self.last_checkpoint_batch)))
            self.composer_save(state, logger)

    monkeypatch.chdir(tmp_path)
    trainer = _trainer(tmp_path, save_folder=str(tmp_path / "ckpt"), save_interval="1ba")
    use_checkpoint_saver(trainer, Recording)
    assert Recording.__qualname__ == CheckpointSaver.__qualname__
    assert CheckpointSaver.__qualname__ in trainer.state.state_dict()["callbacks"]
    trainer.fit()
    trainer.close()
    assert [(b, Path(n).name) for n, _, b in seen] == [(1, "ep0-ba1-rank0.pt"), (2, "ep0-ba2-rank0.pt")]
    for name, state_dict, _ in seen:
        written = torch.load(name, map_location="cpu", weights_only=False)
        assert set(written) == set(state_dict) == {"state", "rng"}
        assert set(written["state"]) == set(state_dict["state"])
        assert written["state"]["timestamp"] == state_dict["state"]["timestamp"]


@pytest.mark.parametrize(
    "module, name",
    [
        ("composer.optim.scheduler", "ZERO_WARMUP"),
        ("composer.trainer.trainer", "NO_BATCHES"),
        ("composer.core.state", "NOT_IN_STATE"),
    ],
)
def test_the_warnings_gcc_turns_off_are_still_composers(module, name):
    """Each text gcc turns a warning of Composer's off by is still in the module that warns it (a changed text
    would let the warning through: noisy, not wrong), and `ignore_warning` turns off that warning and no other."""
    import importlib
    import inspect
    import warnings

    from gcc.compat import composer as adapter

    text = getattr(adapter, name)
    said = text.split("{}")[-1].strip()
    assert said in " ".join(inspect.getsource(importlib.import_module(module)).split())
    warned = text.format("Widget") + ". Its state will not be restored."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        adapter.ignore_warning(text.format("Widget"))
        warnings.warn(warned, UserWarning, stacklevel=1)
        warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another warning"]


def test_a_scheduler_asked_without_a_trainer_gives_what_it_gives_the_trainers_state(tmp_path, monkeypatch):
    from composer.core import Timestamp
    from composer.optim import CosineAnnealingWithWarmupScheduler, LinearWithWarmupScheduler

    from gcc.compat.composer import scheduler_at

    monkeypatch.chdir(tmp_path)
    trainer = _trainer(tmp_path)
    trainer.state.max_duration = "40ba"
    schedulers = (CosineAnnealingWithWarmupScheduler("5ba", alpha_f=0.1), LinearWithWarmupScheduler("5ba", alpha_f=0.2))
    for scheduler in schedulers:
        for batch in (0, 3, 5, 17, 40):
            trainer.state.timestamp = Timestamp(batch=batch)
            assert scheduler_at(scheduler, batch, trainer.state.max_duration) == float(scheduler(trainer.state))
    trainer.close()
