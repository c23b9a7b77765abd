"""StepSync (gcc/training/callbacks/step_sync.py): the step's one reduction. At AFTER_TRAIN_BATCH it reads each
registered source once and gives `totals` (every SUMMED name; 0 where none contributes) and `sample_ids` (the step's
sample ids of every micro-batch, in order), reset at each BATCH_START."""

from __future__ import annotations

import json

import pytest
import torch
from _cbfit import Fit, micro
from composer.core import Event

from gcc.training.callbacks import StepSync
from gcc.training.callbacks.step_sync import SUMMED


def test_totals_carry_each_source_under_its_names_and_the_flags_as_counts():
    sync = StepSync(per_rank_batch=4)
    reads = []
    sync.source(["mse", "n"], lambda: reads.append(1) or torch.tensor([2.5, 4.0]))
    sync.source(["sem_rms"], lambda: [0.25])  # a plain sequence of numbers is a source too
    requested = [False]
    sync.flag("preempt", lambda: requested[0])
    fit = Fit([sync])
    fit.fit_start()
    fit.step()
    assert set(sync.totals) == set(SUMMED)
    assert sync.totals["mse"] == 2.5 and sync.totals["n"] == 4.0 and sync.totals["sem_rms"] == 0.25
    assert sync.totals["preempt"] == 0.0
    assert all(v == 0.0 for k, v in sync.totals.items() if k not in ("mse", "n", "sem_rms"))
    assert len(reads) == 1  # one read per step, at the reduce
    requested[0] = True
    fit.step()
    assert sync.totals["preempt"] == 1.0  # the flag is read at the reduce of the step
    assert len(reads) == 2


def test_sample_ids_are_the_steps_micro_batches_ids_in_order_and_reset_each_step():
    sync = StepSync(per_rank_batch=4)
    fit = Fit([sync])
    fit.fit_start()
    fit.step([micro(["a", "b"], [0, 7]), micro(["c", "d"], [3, 2])])  # id 0 is a sample too (slots hold id + 1)
    assert sync.sample_ids == [0, 7, 3, 2]
    fit.step([micro(["e"], [5])])  # a short step: the empty slots name no sample
    assert sync.sample_ids == [5]


def test_ids_of_an_earlier_step_do_not_leak_into_the_next():
    sync = StepSync(per_rank_batch=4)
    fit = Fit([sync])
    fit.fit_start()
    sync.run_event(Event.BATCH_START, fit.state, fit.logger)
    fit.state.batch = micro(["a"], [1])[0]
    sync.run_event(Event.AFTER_LOSS, fit.state, fit.logger)
    # an aborted step (no AFTER_TRAIN_BATCH), then a whole one: BATCH_START started over
    fit.step([micro(["b", "c"], [8, 9])])
    assert sync.sample_ids == [8, 9]


def test_a_name_has_one_source():
    sync = StepSync(per_rank_batch=2)
    sync.source(["mse", "timestep"], lambda: [1.0, 2.0])
    with pytest.raises(ValueError, match=r"\['timestep'\] already have a source"):
        sync.source(["timestep", "x_rms"], lambda: [3.0, 4.0])
    with pytest.raises(ValueError, match="already have a source"):
        sync.flag("mse", lambda: True)


# rank 1 of the group (tests/_launch.py `rank_0_here`): the same step as rank 0's, with its own values and ids
RANK1 = """
import json
from types import SimpleNamespace
import torch
from composer.devices import DeviceCPU
from gcc.training.callbacks import StepSync

sync = StepSync(per_rank_batch=3)
sync.source(["mse", "n"], lambda: torch.tensor([1.5, 2.0]))
sync.flag("written", lambda: False)
state = SimpleNamespace(device=DeviceCPU(), batch={"sample_id": [11, 0]})
sync.batch_start(state, None)
sync.after_loss(state, None)
sync.after_train_batch(state, None)
print(json.dumps([sync.totals, sync.sample_ids]), flush=True)
"""


@pytest.mark.slow  # starts rank 1's process
def test_two_ranks_sum_their_totals_and_gather_their_ids_in_rank_order():
    """In a real 2-process gloo group: every total is the sum over the ranks (a flag counts the ranks where it held),
    and every rank gets every rank's sample ids, rank 0's first."""
    from types import SimpleNamespace

    from _launch import rank_0_here
    from composer.devices import DeviceCPU

    with rank_0_here(RANK1) as rank1:
        sync = StepSync(per_rank_batch=3)
        sync.source(["mse", "n"], lambda: torch.tensor([0.25, 3.0]))
        sync.flag("written", lambda: True)
        state = SimpleNamespace(device=DeviceCPU(), batch={"sample_id": [4, 2, 9]})
        sync.batch_start(state, None)
        sync.after_loss(state, None)
        sync.after_train_batch(state, None)
        out, err = rank1.communicate(timeout=120)
    assert rank1.returncode == 0, err[-3000:]
    want = {**dict.fromkeys(SUMMED, 0.0), "mse": 1.75, "n": 5.0, "written": 1.0}
    assert sync.totals == want and sync.sample_ids == [4, 2, 9, 11, 0]
    assert json.loads(out) == [want, [4, 2, 9, 11, 0]]


def test_two_device_sources_fill_their_own_slots_and_nothing_is_summed_before_the_first_step():
    """Each device source's positions are its own (kept per source and device); before the first reduction a
    reader finds no totals, not stale ones."""
    sync = StepSync(2)
    assert sync.totals == {} and sync.sample_ids == []
    sync.source(["nonfinite"], lambda: torch.tensor([3.0]))
    sync.source(["grad_norm"], lambda: torch.tensor([0.5]))
    fit = Fit([sync], max_steps=3)
    fit.fit_start()
    try:
        for _ in range(2):
            fit.step()
            assert (sync.totals["nonfinite"], sync.totals["grad_norm"]) == (3.0, 0.5)
    finally:
        fit.fit_end()
