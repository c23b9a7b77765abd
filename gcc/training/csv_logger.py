"""A Composer LoggerDestination writing `log_table` calls as CSV files (Composer has no CSV logger).

`<run_dir>/<name>.csv`, rank 0 only, one row per logged row, flushed at once. Two rules keep a resumed run's
files true:
* a file whose header differs from the code's columns (a code upgrade) is renamed `<name>.old<N>.csv` first,
  so rows never land under the wrong header;
* at fit start, once the checkpoint the launch resumes from is loaded, rows of steps after it (logged by a launch
  that died before its next checkpoint) are removed: those steps are trained again, and the file keeps one row
  per step. A launch that starts from step 0 removes every row: the only ones a run folder with nothing to resume
  may hold are the step-0 validation's (gcc/training/run_folder.py), which this launch writes again (after FIT_START:
  gcc/training/callbacks/validation.py, ValidateAtStart).
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
from pathlib import Path
from typing import Any

from composer.core import State
from composer.loggers import Logger, LoggerDestination
from composer.utils import dist

from gcc import inputs
from gcc.storage import atomic_write, open_in_place

log = logging.getLogger(__name__)  # not `logger`: Composer passes its Logger under that name


def rotated_name(path: Path) -> Path:
    n = 1
    while (p := path.with_name(f"{path.stem}.old{n}{path.suffix}")).exists():
        n += 1
    return p


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else repr(v)  # repr: exact round trip of the float
    return v


def _csv_text(rows: list[list[Any]]) -> str:
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    return buf.getvalue()


class CSVLogger(LoggerDestination):
    def __init__(self, run_dir: str | Path, tables: dict[str, list[str]]):
        self.run_dir, self.tables = Path(run_dir), tables
        self._ready: set[str] = set()

    def _path(self, name: str) -> Path:
        return self.run_dir / f"{name}.csv"

    def _prepare(self, name: str) -> None:
        """Header check/rotation, once per table and launch."""
        path = self._path(name)
        columns = self.tables[name]
        if path.exists():
            with inputs.open_text(path, "csv") as f:  # a regular file only: a FIFO would hang the launch
                header = next(csv.reader(f), None)
            if header != columns:
                dest = rotated_name(path)
                os.replace(path, dest)
                log.info(f"{path.name}: header differs from this code's columns; moved to {dest.name}")
        if not path.exists():
            atomic_write(path, _csv_text([columns]))
        self._ready.add(name)

    def fit_start(self, state: State, logger: Logger) -> None:
        if dist.get_global_rank() != 0:
            return
        start = int(state.timestamp.batch)
        for name, columns in self.tables.items():
            self._prepare(name)
            path = self._path(name)
            with inputs.open_text(path, "csv") as f:
                rows = list(csv.reader(f))
            # a row cut short (a write that found the disk full) goes too, whatever its first field says; a start
            # from step 0 keeps none
            keep = [rows[0]] + [r for r in rows[1:] if start and len(r) == len(columns) and int(float(r[0])) <= start]
            if len(keep) != len(rows):
                atomic_write(path, _csv_text(keep))
                log.info(
                    f"{path.name}: removed {len(rows) - len(keep)} row(s) "
                    + (
                        f"after step {start} (from a launch that stopped before its next checkpoint)"
                        if start
                        else "of a start from step 0 that stopped before its first checkpoint (this one starts over)"
                    )
                )

    def log_table(
        self, columns: list[str], rows: list[list[Any]], name: str = "Table", step: int | None = None
    ) -> None:
        if name not in self.tables or dist.get_global_rank() != 0:
            return
        if name not in self._ready:
            self._prepare(name)
        if columns != self.tables[name]:
            raise ValueError(f"{name}: logged columns {columns} differ from the declared {self.tables[name]}")
        # appended in place: never through a link, symbolic or hard (gcc.storage.open_in_place)
        with open(open_in_place(self._path(name), os.O_WRONLY | os.O_APPEND), "a", newline="") as f:
            csv.writer(f).writerows([[_fmt(v) for v in r] for r in rows])
