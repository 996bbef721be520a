"""The ``dataflow`` loggers, and where their lines go.

Loggers, all under ``dataflow``:

* ``dataflow.execution``: an execution's start (its operators, one line) and end (rows, bytes,
  time, or the error); every task run again after its worker died;
* ``dataflow.worker``: a worker's death, with its cause (signal or exit code, memory); an actor
  restarted in its place;
* ``dataflow.engine``: the executor (the store spilling to disk, messages it dropped, its bugs);
* ``dataflow.progress``: the progress lines of "log" mode (``dataflow.progress``);
* ``dataflow.split``, ``dataflow.ray``, ``dataflow.udf``...

``setup()`` runs on the first execution (or ``dataflow.init``). It writes every line of those
loggers, INFO and up, to one file per process: ``~/.dataflow/logs/dataflow-<date>-<time>-<pid>.log``
(``DATAFLOW_LOG_DIR`` for another folder; ``latest.log`` there links to the newest; the 50 newest
files are kept). It sets the ``dataflow`` logger's level to INFO unless the program set one.

The console gets no more than Python prints when nothing configured logging: warnings, and the
progress lines of "log" mode, on standard error; and only while the program has configured no
logging of its own (no handler on the root logger). Once it has, its handlers receive dataflow's
lines (INFO included, unless it sets ``logging.getLogger("dataflow")``'s level) and dataflow
prints nothing itself.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import sys
import tempfile
import threading
import time

from dataflow.context import env_log_dir

PROGRESS_LOGGER = "dataflow.progress"
KEEP_FILES = 50
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_lock = threading.Lock()
_set_up = False
_file: str | None = None


class ConsoleFallback(logging.Handler):
    """Standard error for warnings and progress lines (records logged with
    ``extra={"console": True}``), while the program has configured no logging: what Python's
    last-resort handler does for warnings, which it no longer does once the ``dataflow`` logger
    has a handler of its own (the log file's)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self._progress = logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S")

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:  # the program's own handlers get it (propagation)
            return
        progress = bool(getattr(record, "console", False))  # marked by dataflow.progress
        if record.levelno < logging.WARNING and not progress:
            return
        try:
            text = self._progress.format(record) if progress else record.getMessage()
            stream = sys.stderr
            stream.write(text + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def log_folder() -> str:
    """Where session log files go: ``DATAFLOW_LOG_DIR``, or ``~/.dataflow/logs``."""
    return env_log_dir() or os.path.join(os.path.expanduser("~"), ".dataflow", "logs")


def setup() -> str | None:
    """Give the ``dataflow`` loggers their file and console fallback (once per process); the
    file's path, or None when no folder could be written."""
    global _set_up, _file
    with _lock:
        if _set_up:
            return _file
        _set_up = True
        logger = logging.getLogger("dataflow")
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
        logger.addHandler(ConsoleFallback())
        for folder in (log_folder(), os.path.join(tempfile.gettempdir(), f"dataflow-{os.getuid()}-logs")):
            _file = _open_file(logger, folder)
            if _file is not None:
                break
        return _file


def log_file() -> str | None:
    """This process's log file (None before the first execution, or when none could be made)."""
    return _file


def _open_file(logger: logging.Logger, folder: str) -> str | None:
    name = f"dataflow-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    path = os.path.join(folder, name)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError:
        return None
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    logger.addHandler(handler)
    latest = os.path.join(folder, "latest.log")
    with contextlib.suppress(OSError):
        if os.path.islink(latest) or os.path.exists(latest):
            os.unlink(latest)
        os.symlink(name, latest)
    _prune(folder)
    return path


def _prune(folder: str) -> None:
    """Keep the newest ``KEEP_FILES`` log files of the folder."""
    def modified(path: str) -> float:
        try:
            return os.path.getmtime(path)
        except OSError:
            return 0.0

    files = sorted(glob.glob(os.path.join(folder, "dataflow-*.log")), key=modified)
    for old in files[:-KEEP_FILES]:
        with contextlib.suppress(OSError):
            os.unlink(old)


def _forget_after_fork() -> None:
    """A forked child (a DataLoader worker) keeps the parent's handlers, writing to its file."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
