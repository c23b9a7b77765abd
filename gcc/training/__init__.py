"""Training: typed config, builders, the Composer run, the run folder, loggers and callbacks (docs/design.md §9).
The entry point is the script `gcc/train.py`."""
