"""Contract tests of gcc/compat/composer.py against the installed Composer (the LeanEngine's parity with Composer's
engine, with validation, checkpoint and FIT_END events: tests/model/test_objective.py)."""

from __future__ import annotations

import copy

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
