"""Every exit code gcc's trainer and tools return (docs/training.md, "Exit codes"). One table, so that a scheduler's
retry rule, the docs and the code cannot drift apart.

0 and 1 are the usual: done (a finished, preempted or nothing-to-do run, a tool that did its job) and, for
`gcc-compare` only, "the runs differ". 2-3 are the launch's verdict before any work and come from every rank
alike; 4-8 stop a run that was training. A relaunch of the same command is the cure for 5, 7 and 8 once their
cause is gone; 2, 3, 4 and 6 need a person.

Every module names a code as `exit_codes.X`, never under a name of its own. Each of gcc's error classes carries
its code (`exit_code`) and `gcc.errors.exit_for` gives any error its code and message, for the trainer and every
tool alike.
"""

OK = 0
DIFFER = 1  # gcc-compare: the two runs disagree somewhere
CONFIG = 2  # bad config or bad input to a tool: names the key, flag or file (the launch never started)
REFUSED = 3  # the launch was refused: data, run folder, checkpoint prefix or lock (nothing was changed)
NONFINITE = 4  # the loss or a gradient became NaN/inf (no checkpoint is written after it)
STALLED = 5  # a rank missed a deadline (stacks in <run_dir>/stacks/)
DATA = 6  # damaged data: a shard or index that cannot be read back as convert_data wrote it
STORAGE = 7  # object storage (or a logger's tracking server) did not answer after the bounded retries
DISK = 8  # no space left where the run or the tool writes
PEER_LOST = 9  # another rank's process died (a crash, a kill) and this rank's collective failed with it
INTERRUPTED = 130  # a second Ctrl-C (128 + SIGINT, the shell's code): stopped at once, without a checkpoint

# the faults: one rank sees it while the others may wait in a collective, so every rank leaves at once
FAULTS = (STALLED, DATA, STORAGE, DISK)
# the codes every rank reaches together: the launch ends in order (closing barrier, then the process group)
TOGETHER = (CONFIG, REFUSED, NONFINITE)
