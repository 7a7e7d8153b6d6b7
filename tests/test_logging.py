"""The package logger: `[rlinf_like] ...` lines on stdout that leave an open tqdm bar intact, in the
driver and inside Ray workers (whose stdout Ray forwards to the driver)."""

import contextlib
import io
import logging
import sys

import pytest
from tqdm import tqdm

from rlinf_like.runtime import Worker
from rlinf_like.utils.logging import TqdmHandler, setup_logging


@pytest.fixture
def package_logger():
    """setup_logging() configures the process-wide `rlinf_like` logger: put it back for the other tests."""
    logger = logging.getLogger("rlinf_like")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield logger
    logger.handlers[:], logger.propagate = saved[0], saved[2]
    logger.setLevel(saved[1])


def test_log_lines_go_to_stdout_above_an_open_bar(package_logger, capsys):
    setup_logging()
    setup_logging()  # again (e.g. a second entry point): still one handler
    assert [type(h) for h in package_logger.handlers if isinstance(h, TqdmHandler)] == [TqdmHandler]
    log = logging.getLogger("rlinf_like.runners.some_runner")
    with tqdm(range(3), desc="updates", file=sys.stderr) as bar:
        for i in bar:
            log.info("resumed at update %d", i)
        log.warning("no env state")
        log.debug("not shown at INFO")
    out, err = capsys.readouterr()
    assert out.splitlines() == ["[rlinf_like] resumed at update 0", "[rlinf_like] resumed at update 1",
                                "[rlinf_like] resumed at update 2", "[rlinf_like] warning: no env state"]
    assert "updates: 100%" in err and "[rlinf_like]" not in err  # the bar stays on its own stream


def test_the_progress_bar_shows_the_latest_evaluation_between_evaluations():
    from rlinf_like.runners.reasoning.run_files import progress_postfix

    assert progress_postfix({"reward": 0.5}, {}) == {"reward": "0.50"}  # before any evaluation: nothing, not nan
    last = {"eval_accuracy": 0.25, "eval_format_rate": 0.75}
    assert progress_postfix({"reward": 0.5}, last) == {"reward": "0.50", "acc": "0.25", "fmt": "0.75"}
    assert progress_postfix({"reward": 0.5, "eval_accuracy": 1.0, "eval_format_rate": 1.0}, last) == \
        {"reward": "0.50", "acc": "1.00", "fmt": "1.00"}


class LogProbe(Worker):
    def log_line(self, text: str) -> str:
        """Log `text` with the worker's own configuration; return what reached its stdout."""
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            logging.getLogger("rlinf_like.workers.probe").info("%s from rank %d", text, self.rank)
        return buf.getvalue()


def test_workers_log_to_their_stdout(cluster):
    group = LogProbe.create_group().launch(cluster, cluster.place({"probe": "0"}), "probe")
    try:
        assert group.log_line("hello").wait() == ["[rlinf_like] hello from rank 0\n"]
    finally:
        group.shutdown()
