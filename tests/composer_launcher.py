"""Composer's launcher, as the `composer` command runs it (`from composer.cli.launcher import main; sys.exit(main())`),
with gcc's import adapter loaded first (gcc/compat/composer.py): the launcher then loads Composer without the parts
no process of a run uses, as every rank does, which saves about 3 s of CPU per launch of the suite. The ranks it
starts are the same processes either way. The `composer` command itself is run by the entry points' subprocess
tests (tests/tools/test_bad_input.py), tests/data/test_data.py, `make demo` and bench/launch_cost.py."""

import sys

import gcc.compat.composer  # noqa: F401  (first: see above)

if __name__ == "__main__":
    from composer.cli.launcher import main

    sys.exit(main())
