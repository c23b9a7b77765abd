"""The synthetic world: clips whose semantics a decoder can read back (`make demo`, the tests, bench, gcc-sample)."""
