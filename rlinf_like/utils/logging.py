"""Console logging for the package: `[rlinf_like] message` lines on stdout.

Modules log with `log = logging.getLogger(__name__)`; the entry points (the examples) call
`setup_logging()`, and so does every Ray worker process (`runtime/worker.py`), whose stdout Ray
forwards to the driver's console. Lines go through `tqdm.write`, so an open progress bar is
redrawn below them instead of being broken.
"""

from __future__ import annotations

import logging
import sys

from tqdm import tqdm

PACKAGE = "rlinf_like"


def end_with_the_reader() -> None:
    """An entry point whose output goes into a pipe (`... | head`) ends when the reader closes it, as Unix tools do.
    Python's default turns the closed pipe into BrokenPipeError at the next print, and the progress bar's lock then
    deadlocks the interpreter's exit: the run would hang, idle. Ray ends the workers of a dead driver; a
    checkpoint is whole or not committed. Called by the example scripts' `__main__` blocks only (not on import)."""
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)


class TqdmHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record))  # sys.stdout as it is now (pytest's capture, Ray's redirect)
            sys.stdout.flush()  # a run's log file shows progress as it happens
        except Exception:
            self.handleError(record)


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno <= logging.INFO else f"{record.levelname.lower()}: "
        return f"[{PACKAGE}] {level}{super().format(record)}"


def setup_logging(level: int | str = logging.INFO) -> logging.Logger:
    """Send the package's records at `level` and above to stdout; calling it again only sets the level."""
    logger = logging.getLogger(PACKAGE)
    logger.setLevel(level)
    if not any(isinstance(h, TqdmHandler) for h in logger.handlers):
        handler = TqdmHandler()
        handler.setFormatter(_Formatter("%(message)s"))
        logger.addHandler(handler)
    # Hydra's root handlers would print every line again in their own format
    logger.propagate = False
    return logger
