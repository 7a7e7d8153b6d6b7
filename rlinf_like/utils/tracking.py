"""One interface for metrics: a `Tracker` takes `log(metrics, step)` and `close()`; TensorBoard,
Weights & Biases and a console table implement it, and `Trackers` fans out to the ones the
`logger` config section turns on.

    trackers = make_trackers(cfg.logger, out_dir, run_config=asdict(cfg))
    trackers.log({"grpo/reward": 0.5}, step)      # every enabled tracker
    trackers.log_text("grpo/samples/train", markdown, step)   # the trackers that take text (TensorBoard)
    trackers.close()                              # flushes; also `with make_trackers(...) as trackers:`
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from rlinf_like.utils.extras import MissingExtraError


@dataclass(kw_only=True)
class LoggerConfig:
    tensorboard: bool = True  # scalars under <runner.output_dir>/tensorboard
    wandb: bool = False  # Weights & Biases (the [wandb] extra); files under <runner.output_dir>/wandb
    wandb_project: str = "rlinf_like"  # the W&B project the run is logged to
    wandb_name: str | None = None  # the W&B run name; null: W&B picks one
    wandb_mode: Literal["online", "offline", "disabled"] | None = None  # null: $WANDB_MODE, else online
    console: bool = False  # a table row of the metrics per logged step on stdout


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    # optional: `log_text(tag, text, step)`, markdown text (generations); TensorBoard has it

    def close(self) -> None: ...


class TensorBoardTracker:
    def __init__(self, log_dir: str | Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def log_text(self, tag: str, text: str, step: int) -> None:
        self.writer.add_text(tag, text, step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, project: str, name: str | None, out_dir: str | Path, mode: str | None = None,
                 config: dict | None = None):
        try:
            import wandb
        except ImportError as err:
            raise MissingExtraError("logger.wandb=true needs 'wandb', which comes with the [wandb] extra: "
                                    "pip install 'rlinf_like[wandb]' (or pip install wandb)") from err
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        # a run of its own even if this process logged another one (tests, notebooks)
        self.run = wandb.init(project=project, name=name, dir=str(out_dir), config=config, mode=mode,
                              reinit="create_new")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class ConsoleTracker:
    """A fixed-width table: the header (the first call's keys) once, then a row per call. `write`
    defaults to tqdm.write so rows do not tear a progress bar."""

    def __init__(self, write: Callable[[str], None] | None = None, width: int = 12):
        self.write = write or _tqdm_write
        self.width, self.keys = width, None

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.keys is None:
            self.keys = list(metrics)
            self.write(" ".join(f"{k[-self.width:]:>{self.width}}" for k in ["step", *self.keys]))
        cells = [f"{step:>{self.width}}"] + [self._cell(metrics.get(k)) for k in self.keys]
        self.write(" ".join(cells))

    def _cell(self, value: float | None) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return " " * (self.width - 1) + "-"
        return f"{value:>{self.width}.4g}"

    def close(self) -> None:
        pass


def _tqdm_write(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)


class Trackers:
    """Fan-out: `log` and `close` go to every tracker, in order."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = list(trackers)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for tracker in self.trackers:
            tracker.log(metrics, step)

    def log_text(self, tag: str, text: str, step: int) -> None:
        """Markdown `text` to the trackers that take text (TensorBoard); the others skip it."""
        for tracker in self.trackers:
            if hasattr(tracker, "log_text"):
                tracker.log_text(tag, text, step)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_trackers(cfg: LoggerConfig, out_dir: str | Path, run_config: dict | None = None) -> Trackers:
    """The trackers `cfg` enables, writing under `out_dir` (a runner's output_dir)."""
    out = Path(out_dir)
    trackers: list[Tracker] = []
    if cfg.tensorboard:
        trackers.append(TensorBoardTracker(out / "tensorboard"))
    if cfg.wandb:
        trackers.append(WandbTracker(cfg.wandb_project, cfg.wandb_name, out, cfg.wandb_mode or
                                     os.environ.get("WANDB_MODE"), run_config))
    if cfg.console:
        trackers.append(ConsoleTracker())
    return Trackers(trackers)
