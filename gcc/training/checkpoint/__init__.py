"""A run's checkpoints, in one package: `files` (the checkpoints on the run's disk: complete or not, the repair
before a start, the rotation, `latest`), `background` (the periodic saves written from a host copy while training
goes on), `rotation` (the callback that keeps the newest), `store` (object storage: `save_folder`, its manifests,
head and commit) and `upload` (the callback that commits each checkpoint there). The launch's decisions about
them (resume, fetch, start over) are gcc/training/run_start.py's; Composer's saver and loader are Composer's, what
gcc relies on of them is gcc/compat/composer.py's (docs/training.md, "Checkpoints")."""
