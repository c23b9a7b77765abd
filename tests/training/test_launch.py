"""The launch's verdict (gcc/training/launch.py `agree_on_start`) in a real 2-process gloo group: rank 0 is this
test's process, rank 1 a process of its own. The rest of launch.py: tests/training/test_config_roles.py (the
signature), tests/test_errors.py (refusals), tests/training/test_trust_run.py (the run folder it reads)."""

from __future__ import annotations

import json

import pytest
from _launch import rank_0_here

from gcc.training import launch

# rank 1 (in the group: tests/_launch.py `rank_0_here`): asks for the verdict three times, printing each; were it
# asked to decide, its own verdict would say so
RANK1 = """
import json
from gcc.training import launch

launch.prepare_run = lambda cfg, lock: launch.RunStart({"decided by": 1}, {}, "", None, "", None, provenance=None)
for _ in range(3):
    try:
        print(json.dumps(["RunStart", launch.agree_on_start(None, None).manifest]), flush=True)
    except (launch.Refusal, launch.ConfigError) as e:
        print(json.dumps([type(e).__name__, str(e)]), flush=True)
"""

VERDICTS = [
    launch.RunStart({"decided by": 0}, {}, "", None, "", None, provenance=None),
    launch.Refusal("data /d: the train split has no clips (rank 0)"),
    launch.ConfigError("model.vae_path: /v.pth does not exist (rank 0)"),
]


@pytest.mark.slow  # starts rank 1's process
def test_every_rank_gets_rank_0s_verdict(monkeypatch):
    """Rank 0's RunStart is every rank's; rank 0's Refusal or ConfigError is raised on every rank with its message."""
    with rank_0_here(RANK1) as rank1:
        for verdict in VERDICTS:

            def prepare_run(cfg, lock, verdict=verdict):
                if isinstance(verdict, Exception):
                    raise verdict
                return verdict

            monkeypatch.setattr(launch, "prepare_run", prepare_run)
            if isinstance(verdict, Exception):
                with pytest.raises(type(verdict)) as raised:
                    launch.agree_on_start(None, None)
                assert str(raised.value) == str(verdict)
            else:
                assert launch.agree_on_start(None, None).manifest == {"decided by": 0}
        out, err = rank1.communicate(timeout=120)
    assert rank1.returncode == 0, err[-3000:]
    assert [json.loads(line) for line in out.splitlines()] == [
        ["RunStart", {"decided by": 0}],
        ["Refusal", str(VERDICTS[1])],
        ["ConfigError", str(VERDICTS[2])],
    ], err[-3000:]
