"""Offline TI2V evaluation (docs/design.md §10), `python -m gcc.tools.sample`: sample clips with a gc25d teacher,
decode, compare with the ground truth. The command line is in `cli`; docs/sample.md describes it."""
