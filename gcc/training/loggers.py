"""The run's loggers, chosen in yaml (`loggers:`), built from Composer's own logger classes (docs/training.md).

    loggers:
      tensorboard: {}                      # the default: one event file per launch in <run_dir>/tensorboard/
      wandb: {project: gc25d, entity: me}  # Composer's WandBLogger; any of its arguments
      mlflow: {experiment_name: gc25d}     # Composer's MLFlowLogger; any of its arguments

`train_log.csv` and `val_log.csv` are always written (gcc/training/csv_logger.py). Every logger receives the same
`train/*` and `val/*` scalars, each once: Composer's own copies of the step's loss and of the validation metric
(`loss/train/total`, `metrics/val/val_mse`) are left out (`GccNames`). The CSV rows reach the loggers as Composer tables: only the CSV logger keeps
them (W&B and MLflow would store one table artifact per step). Defaults that make a relaunch continue the
same run: W&B gets a run id fixed by the run folder (`resume: allow`, files under `<run_dir>/wandb/`), MLflow
looks up the run by name (`resume: true`) in `tracking_uri`, `MLFLOW_TRACKING_URI` or else the file store
`<run_dir>/mlruns`. Both use the
run folder's name as the run name (TensorBoard's too: `<run_dir>/tensorboard/<run folder's name>/`). System metrics (psutil / NVML sampling) are off unless asked for.

Each logger is one entry of `LOGGERS` (Composer's class and how gcc builds it), and its class here writes the
training samples (`log_samples`, called by gcc/training/callbacks/samples.py) its own way: TensorBoard as images,
W&B as videos and images, MLflow as artifacts.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from composer.loggers import MLFlowLogger, WandBLogger

from gcc.compat.composer import LocalTensorboardLogger
from gcc.compat.loggers import allow_mlflow_file_store, check_installed, mlflow_run, wandb_for_composer
from gcc.training.composer_options import option_problems
from gcc.training.config import STEPS, Range
from gcc.training.csv_logger import CSVLogger

# Composer logs the step's total loss and each evaluator's metrics itself; gcc logs the same values under its own names
# (`train/loss`; `val/mse_mean` and the rest, gcc/training/callbacks/validation.py), so Composer's copies are dropped
COMPOSER_COPIES = ("loss/train/", "metrics/")


class GccNames:
    """A logger (put first among its bases) that receives each scalar once, under gcc's name."""

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        kept = {k: v for k, v in metrics.items() if not k.startswith(COMPOSER_COPIES)}
        if kept:
            super().log_metrics(kept, step)  # type: ignore[misc]  # the logger class this is mixed into


class SampleTensorboardLogger(GccNames, LocalTensorboardLogger):
    def log_samples(self, step: int, folder: Path, clips: list[dict]) -> None:
        """The training samples of `step` (gcc/training/callbacks/samples.py): per clip, an animated GIF per
        variant (`samples/<clip>/<variant>`, as torch's `add_video` writes one, without needing moviepy) and the
        contact sheet (`samples/<clip>/sheet`), as image summaries in one event, in the Images tab."""
        from tensorboard.compat.proto.summary_pb2 import Summary  # optional: only with a tensorboard logger

        def image(tag: str, data: bytes, hw: tuple[int, int]):
            img = Summary.Image(height=hw[0], width=hw[1], colorspace=3, encoded_image_string=data)
            return Summary.Value(tag=tag, image=img)

        values = []
        for c in clips:
            for name, v in c["videos"].items():
                values.append(image(f"samples/{c['clip_id']}/{name}", v["gif"], v["hw"]))
            values.append(image(f"samples/{c['clip_id']}/sheet", c["sheet"]["png"], c["sheet"]["hw"]))
        self.write_summary(Summary(value=values), step, flush=True)


class TablelessWandBLogger(GccNames, WandBLogger):
    def init(self, state, logger) -> None:
        wandb_for_composer()
        super().init(state, logger)

    def log_table(self, *args, **kwargs) -> None:  # the CSV logger keeps the per-step rows
        pass

    # Checkpoints live in the run folder, never in W&B: Composer's autoresume would otherwise ask W&B's API for
    # a checkpoint artifact (an error offline or without an API key)
    def can_upload_files(self) -> bool:
        return False

    def download_file(self, remote_file_name: str, *args, **kwargs) -> None:
        raise FileNotFoundError(f"{remote_file_name}: gcc keeps checkpoints in the run folder, not in W&B")

    def log_samples(self, step: int, folder: Path, clips: list[dict]) -> None:
        """The training samples (gcc/training/callbacks/samples.py): a `wandb.Video` per clip and variant (the
        mp4 in `folder`) and the contact sheet as a `wandb.Image`."""
        import wandb  # optional: only when the yaml asks for W&B

        if wandb.run is None:  # not started (the callback calls this on rank 0, where Composer starts it)
            return

        media = {}
        for c in clips:
            for name, v in c["videos"].items():
                media[f"samples/{c['clip_id']}/{name}"] = wandb.Video(str(folder / v["file"]), format="mp4")
            media[f"samples/{c['clip_id']}/sheet"] = wandb.Image(str(folder / c["sheet"]["file"]))
        wandb.log(media, step=step)


class TablelessMLFlowLogger(GccNames, MLFlowLogger):
    def log_table(self, *args, **kwargs) -> None:  # the CSV logger keeps the per-step rows
        pass

    def log_samples(self, step: int, folder: Path, clips: list[dict]) -> None:
        """The training samples' folder (mp4s, contact sheets, samples.json) as artifacts under
        `samples/step-N/`."""
        client, run_id = mlflow_run(self)
        if client is None or run_id is None:
            return
        client.log_artifacts(run_id, str(folder), artifact_path=f"samples/step-{step}")


def check_logger_options(loggers: dict[str, Any]) -> list[str]:
    """Problems with the yaml's `loggers:` section, each naming the key (empty: fine); then the named loggers' packages
    are checked against the versions gcc verified (gcc/compat/loggers.py)."""
    # log_dir is gcc's (the run folder); every other argument of Composer's class is the yaml's, of its type
    problems = [
        problem
        for name, options in loggers.items()
        for problem in option_problems("loggers", "logger", LOGGERS, name, options, reserved={"log_dir"})[0]
    ]
    if not problems:  # a logger outside the version gcc verified stops the launch here (exit 2), before any work
        check_installed(loggers)
    return problems


def wandb_run_id(run_dir: str | Path) -> str:
    """A W&B run id that stays the same for every launch of one run folder."""
    path = str(Path(run_dir).resolve())
    return f"{Path(path).name[:40]}-{hashlib.sha1(path.encode()).hexdigest()[:10]}"


def _tensorboard(run_dir: Path, kw: dict[str, Any]) -> SampleTensorboardLogger:
    return SampleTensorboardLogger(log_dir=str(run_dir / "tensorboard"), **{"flush_interval": 10, **kw})


def _wandb(run_dir: Path, kw: dict[str, Any]) -> TablelessWandBLogger:
    init = {"dir": str(run_dir), "id": wandb_run_id(run_dir), "resume": "allow", **(kw.pop("init_kwargs", None) or {})}
    Path(init["dir"]).mkdir(parents=True, exist_ok=True)
    return TablelessWandBLogger(**{"name": run_dir.name, **kw, "init_kwargs": init})


# MLflow's HTTP requests, unless the environment sets them: its defaults (7 retries, 120 s each, backoff doubling from
# 2 s) take ~255 s to report a server that does not answer; these take at most ~40 s (3 tries of 10 s, 6 s between)
MLFLOW_REQUESTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def _mlflow(run_dir: Path, kw: dict[str, Any]) -> TablelessMLFlowLogger:
    uri = str(
        kw.pop("tracking_uri", None) or os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
    )
    for name, value in MLFLOW_REQUESTS.items():
        os.environ.setdefault(name, value)
    if uri.startswith("file:"):  # a local run folder has no database
        allow_mlflow_file_store()
    return TablelessMLFlowLogger(
        **{"run_name": run_dir.name, "tracking_uri": uri, "resume": True, "log_system_metrics": False, **kw}
    )


class LoggerKind(NamedTuple):
    # Composer's logger: its arguments are the options the yaml may set (`check_logger_options`)
    composer_class: type[Any]
    build: Callable[[Path, dict[str, Any]], Any]  # gcc's logger for a run folder, from those options (`build_loggers`)
    # the range of each numeric argument (every one has a range: tests/training/test_loggers.py), checked with the
    # config: Composer's class takes values that fail later, in the run (a flush_interval of 0 divides by zero at
    # the first step)
    bounds: dict[str, Range]


# every logger the yaml may name, in one place
LOGGERS: dict[str, LoggerKind] = {
    "tensorboard": LoggerKind(LocalTensorboardLogger, _tensorboard, {"flush_interval": Range(1, STEPS)}),
    "wandb": LoggerKind(WandBLogger, _wandb, {}),
    "mlflow": LoggerKind(
        MLFlowLogger,
        _mlflow,
        {
            "flush_interval": Range(0, STEPS),
            "logging_buffer_seconds": Range(0, 3600, " s"),
            "log_duplicated_metric_every_n_steps": Range(0, STEPS),
        },
    ),
}


def build_loggers(run_dir: str | Path, loggers: dict[str, Any], tables: dict[str, list[str]]) -> list:
    """CSV tables always, then the yaml's loggers in its order."""
    run_dir = Path(run_dir)
    return [CSVLogger(run_dir, tables)] + [
        LOGGERS[name].build(run_dir, dict(options or {})) for name, options in loggers.items()
    ]
