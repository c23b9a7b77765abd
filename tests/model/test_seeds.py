"""Named seeds (gcc/model/seeds.py): a pure function of its parts, the same in every process (unlike `hash()`,
salted per process), 63 bits, and different for different parts."""

from __future__ import annotations

import os
import subprocess
import sys

from gcc.model.seeds import stable_seed


def test_a_seed_is_a_63_bit_pure_function_of_its_parts():
    a = stable_seed("gcc.tools.sample", 0, "clip00001")
    assert a == stable_seed("gcc.tools.sample", 0, "clip00001") and 0 <= a < 1 << 63
    others = {stable_seed("gcc.tools.sample", s, c) for s in range(20) for c in ("clip00001", "clip00002")}
    assert len(others) == 40  # different parts, different seeds
    assert stable_seed("ab", "c") != stable_seed("a", "bc")  # parts are separated, not concatenated
    assert stable_seed(1) == stable_seed("1")  # parts by their string forms


def test_the_seed_is_the_same_in_another_process_with_another_hash_salt():
    code = "from gcc.model.seeds import stable_seed; print(stable_seed('x', 3))"
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert int(out) == stable_seed("x", 3)
