"""gcc/training/columns.py: the columns of train_log.csv and val_log.csv, composed from the statistics' declarations
(gcc/stats.py). A resumed run appends to its CSVs and gcc-compare compares by column, so the lists are pinned here as
the logs have them; a change to a declaration that moves, renames or drops a column fails here."""

from __future__ import annotations

import pytest

from gcc.stats import LOSS, MEAN, WEIGHTED, Stat
from gcc.training.columns import EXACT_TRAIN, EXACT_VAL, TIMING_COLUMNS, TRAIN_COLUMNS, VAL_COLUMNS

# the header lines of the CSV files, as runs wrote them
LOGGED_TRAIN = (
    "step,loss,mse,timestep,lr,cond_lr,grad_norm,sem_rms,x_rms,text_drop,cond_drop,mask_frac,step_time,data_time,"
    "mem_gb,epoch,time,clips"
).split(",")
LOGGED_VAL = "step,timestep,mse,mse_uncond,mse_nulltext,gap_uncond,gap_nulltext,n".split(",")


def test_the_logs_columns_and_their_order_are_those_runs_already_wrote():
    assert TRAIN_COLUMNS == LOGGED_TRAIN
    assert VAL_COLUMNS == LOGGED_VAL
    assert TIMING_COLUMNS == ["step_time", "data_time", "mem_gb", "time"]
    assert EXACT_TRAIN == [c for c in LOGGED_TRAIN if c not in TIMING_COLUMNS]
    assert EXACT_VAL == LOGGED_VAL


@pytest.mark.parametrize("bad", [dict(reduce="median"), dict(column="middle")])
def test_a_declaration_names_a_known_reduction_and_column_group(bad):
    Stat("kl", WEIGHTED, LOSS)
    Stat("kl", MEAN, "")  # not a column: a StepSync total only
    with pytest.raises(ValueError, match="kl"):
        Stat(**{"name": "kl", "reduce": WEIGHTED, "column": LOSS, **bad})
