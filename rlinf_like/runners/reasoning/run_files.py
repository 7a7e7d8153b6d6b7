"""What a reasoning run writes for a person to read afterwards, beside its metrics (`ReasoningRun` uses it):

- `run.log`: the driver's console lines (the package's log records, the closing table included), appended to by
  every attempt that uses the folder, each attempt opening with a `--- run started ...` line (`RunLog`);
- `samples.jsonl`: a few generations per step and per held-out evaluation, one JSON object a line (step, kind
  `train` / `eval`, prompt, response, answer, reward, correct, formatted, finish reason), also TensorBoard text
  under `grpo/samples/<kind>` (`SampleLog`);
- one log line when the TensorBoard folder already holds an earlier attempt's event files (`earlier_attempts`);
- per-component host memory (`memory_metrics`) and the progress bar's postfix (`progress_postfix`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlinf_like.data.tasks import Problem
from rlinf_like.runtime.process_memory import read_memory
from rlinf_like.utils.logging import PACKAGE
from rlinf_like.workers.reward.types import SampleScore
from rlinf_like.workers.rollout import RolloutResult

log = logging.getLogger(__name__)
RUN_LOG = "run.log"
SAMPLES = "samples.jsonl"
SAMPLES_PER_STEP = 4  # prompts per step (and per evaluation) whose first sample is written out
GIB = 2**30


@dataclass(kw_only=True)
class Generated:
    """A step's (or an evaluation's) generations with their problems and scores, in request order."""

    results: Sequence[RolloutResult]
    problems: Sequence[Problem]
    scores: Sequence[Sequence[SampleScore]]  # per request, per sample


class RunLog:
    """Appends the package's log records to `<out>/run.log` until `close()`. While open, records at INFO reach it
    even where nothing configured the package's logger (a run started from Python)."""

    def __init__(self, out: Path):
        self.path = out / RUN_LOG
        self.logger = logging.getLogger(PACKAGE)
        self.handler = logging.FileHandler(self.path, mode="a", encoding="utf-8")
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                                    datefmt="%Y-%m-%d %H:%M:%S"))
        self.handler.stream.write(f"--- run started {time.strftime('%Y-%m-%d %H:%M:%S')} (pid {os.getpid()}) ---\n")
        self.handler.flush()
        self.level = self.logger.level
        if self.logger.getEffectiveLevel() > logging.INFO:
            self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self.handler)

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)
        self.handler.close()


def earlier_attempts(tensorboard_dir: Path) -> str | None:
    """A line saying that `tensorboard_dir` already holds event files (a failed or resumed earlier attempt), or None.
    TensorBoard reads them all: a step an earlier attempt logged after its last checkpoint shows twice."""
    events = sorted(tensorboard_dir.glob("events.out.tfevents.*"))
    if not events:
        return None
    return (f"{tensorboard_dir} holds {len(events)} event file(s) of earlier attempts; TensorBoard overlays them "
            f"(steps an earlier attempt logged after its last checkpoint show twice): a new runner.output_dir "
            f"starts clean")


def sample_records(step: int, kind: str, generated: Generated, decode, limit: int = SAMPLES_PER_STEP) -> list[dict]:
    """The first sample of each of the first `limit` requests, as text (`decode`: token ids -> str)."""
    records = []
    for result, problem, scores in list(zip(generated.results, generated.problems, generated.scores))[:limit]:
        if not result.response_ids:  # a rejected request
            continue
        score = scores[0]
        records.append({"step": step, "kind": kind, "request_id": result.request_id,
                        "prompt": decode(result.prompt_ids), "response": decode(result.response_ids[0]),
                        "answer": problem.answer, "reward": score.reward, "correct": bool(score.correct),
                        "formatted": bool(score.formatted),
                        "finish_reason": result.finish_reasons[0] if result.finish_reasons else None,
                        "response_tokens": len(result.response_ids[0])})
    return records


def as_markdown(records: list[dict]) -> str:
    """TensorBoard's text plugin renders markdown: a heading per sample, prompt and response as code blocks."""
    parts = []
    for r in records:
        parts.append(f"#### {r['request_id']}: reward {r['reward']:.3f}, correct {r['correct']}, formatted "
                     f"{r['formatted']}, finish {r['finish_reason']}, {r['response_tokens']} tokens\n\n"
                     f"prompt:\n\n```\n{r['prompt']}\n```\n\nresponse:\n\n```\n{r['response']}\n```\n\n"
                     f"answer: `{r['answer']}`\n")
    return "\n".join(parts)


class SampleLog:
    """`record` appends a few generations to `<out>/samples.jsonl` and logs them as TensorBoard text."""

    def __init__(self, out: Path, trackers, decode):
        self.path, self.trackers, self.decode = out / SAMPLES, trackers, decode

    def record(self, step: int, kind: str, generated: Generated) -> None:
        records = sample_records(step, kind, generated, self.decode)
        if not records:
            return
        with self.path.open("a", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        self.trackers.log_text(f"grpo/samples/{kind}", as_markdown(records), step)


def memory_metrics(groups: dict) -> dict[str, float]:
    """Host memory (GiB): `memory/<component>_gb` (resident, summed over the component's ranks on this node) and
    `memory/<component>_peak_gb` (their peaks, summed), read from /proc now; `memory/driver_gb` (this process,
    which holds every component under `cluster.backend=local`). A component on other nodes is left out.
    Device memory (GiB), for components on GPUs, on any node: `memory/<component>_gpu_gb` and `_gpu_peak_gb`,
    torch's allocator summed over the ranks (`Worker.device_memory`)."""
    out = {}
    for name, group in groups.items():
        if group is None:
            continue
        group.sample_memory(*range(group.world_size))
        if group.memory:
            out[f"memory/{name}_gb"] = sum(s.rss for s in group.memory.values()) / GIB
            out[f"memory/{name}_peak_gb"] = sum(s.peak for s in group.memory.values()) / GIB
        if group.gpu_ranks:
            held = [m for m in group.call("device_memory", ranks=group.gpu_ranks).wait() if m is not None]
            out[f"memory/{name}_gpu_gb"] = sum(now for now, _ in held) / GIB
            out[f"memory/{name}_gpu_peak_gb"] = sum(peak for _, peak in held) / GIB
    driver = read_memory(os.getpid())
    if driver is not None:
        out["memory/driver_gb"] = driver.rss / GIB
    return out


def progress_postfix(metrics: dict[str, float], last_eval: dict[str, float]) -> dict[str, str]:
    """The GRPO bar's postfix: the step's mean reward, and the held-out accuracy and format rate of the latest
    evaluation (this step's, else the last one before it); none before the first."""
    postfix = {"reward": f"{metrics['reward']:.2f}"} if "reward" in metrics else {}
    for key, name in (("eval_accuracy", "acc"), ("eval_format_rate", "fmt")):
        value = metrics.get(key, last_eval.get(key))
        if value is not None and not math.isnan(value):
            postfix[name] = f"{value:.2f}"
    return postfix
