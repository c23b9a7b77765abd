"""This process's place in its launch (gcc/training/ranks.py), from the launcher's environment, before any
process group exists: one process alone (rank 0 of 1 on node 0) when the variables are unset."""

from __future__ import annotations

from gcc.training import ranks


def test_unset_is_one_process_alone(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert (ranks.rank(), ranks.world_size(), ranks.node_rank()) == (0, 1, 0)


def test_the_launchers_variables_are_read(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("NODE_RANK", "1")
    assert (ranks.rank(), ranks.world_size(), ranks.node_rank()) == (5, 16, 1)
