"""IFEval (verifiable instruction following) on any checkpoint: greedy answers from the native engine, scored by the
official checkers (`ifeval_checks`), strict and loose, at prompt and instruction level.

    python -m rlinf_like.eval.ifeval models/smollm2-135m-instruct --limit 20

prints the four scores and a table per instruction type, and with `--out FILE` writes each prompt's response and
verdicts as JSON lines. The prompt is the official one in the model's own chat template (as lm-eval's
`--apply_chat_template` renders it), decoding is greedy with lm-eval's 1,280-token cap unless `--max-new-tokens`
says otherwise, so two runs on one machine give the same answers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field

from rlinf_like.data.ifeval_checks import Verdict, check, official_prompts

MAX_NEW_TOKENS = 1280  # lm-eval's ifeval task: max_gen_toks
SCORES = ("prompt_strict", "inst_strict", "prompt_loose", "inst_loose")


@dataclass
class Report:
    """Scores over a set of prompts: `scores` holds the four accuracies, `by_type` each instruction id's
    (count, strict share, loose share) over the instructions of that id."""

    scores: dict[str, float]
    by_type: dict[str, tuple[int, float, float]]
    verdicts: list[Verdict] = field(default_factory=list)


def score(rows: list[dict], responses: list[str]) -> Report:
    verdicts = [check(row, response) for row, response in zip(rows, responses, strict=True)]
    strict = [v for verdict in verdicts for v in verdict.strict]
    loose = [v for verdict in verdicts for v in verdict.loose]
    n = max(len(verdicts), 1)
    scores = {"prompt_strict": sum(v.prompt_strict for v in verdicts) / n,
              "inst_strict": sum(strict) / max(len(strict), 1),
              "prompt_loose": sum(v.prompt_loose for v in verdicts) / n,
              "inst_loose": sum(loose) / max(len(loose), 1)}
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for row, verdict in zip(rows, verdicts):
        for iid, s, lo in zip(row["instruction_id_list"], verdict.strict, verdict.loose):
            counts[iid][0] += 1
            counts[iid][1] += s
            counts[iid][2] += lo
    by_type = {iid: (c, s / c, lo / c) for iid, (c, s, lo) in sorted(counts.items())}
    return Report(scores=scores, by_type=by_type, verdicts=verdicts)


def select(rows: list[dict], types: list[str] | None = None, limit: int | None = None) -> list[dict]:
    """The prompts with at least one instruction among `types` (ids like `punctuation:no_comma`, or a whole group
    like `punctuation`), then the first `limit`."""
    if types:
        rows = [r for r in rows if any(iid in types or iid.split(":")[0] in types for iid in r["instruction_id_list"])]
    return rows[:limit] if limit else rows


def chat_engine(model_path: str, batch: int = 64, dtype: str = "auto"):
    """(tokenizer, its chat-template PromptFormat, a native engine) for `model_path`: what `answer` serves from."""
    from transformers import AutoTokenizer

    from rlinf_like.data.config import DataConfig
    from rlinf_like.data.prompts import PromptFormat
    from rlinf_like.workers.rollout.base import RolloutConfig
    from rlinf_like.workers.rollout.engine import make_engine

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    engine = make_engine(RolloutConfig(engine="native", model_path=model_path, max_batch_size=batch, dtype=dtype),
                         tokenizer=tokenizer)
    return tokenizer, PromptFormat(tokenizer, DataConfig()), engine


def answer(chat, prompts: list[str], sampling, n: int = 1, progress: bool = True) -> list[tuple[list[str], object]]:
    """Each prompt's `n` answers in the model's chat template from `chat` (`chat_engine`): (texts, its
    RolloutResult) per prompt, in order. `sampling(i)` is prompt i's SamplingParams."""
    from rlinf_like.data.tasks import Problem
    from rlinf_like.workers.rollout.types import RolloutRequest

    tokenizer, fmt, engine = chat
    requests = [RolloutRequest(request_id=str(i), prompt_ids=fmt.prompt_ids(Problem(prompt=p, answer="")),
                               sampling=sampling(i), n=n) for i, p in enumerate(prompts)]
    done, start = [0], time.monotonic()

    def on_result(_result) -> None:
        done[0] += 1
        if progress and (done[0] % 10 == 0 or done[0] == len(prompts)):
            print(f"  {done[0]}/{len(prompts)} answered, {time.monotonic() - start:.0f} s", file=sys.stderr,
                  flush=True)

    results = {r.request_id: r for r in engine.generate(requests, on_result=on_result)}
    bad = [rid for rid, r in results.items() if not r.ok]
    if bad:
        raise RuntimeError(f"the engine refused prompts {bad}: {results[bad[0]].error}")
    out = []
    for i in range(len(prompts)):
        result = results[str(i)]
        out.append(([tokenizer.decode(ids, skip_special_tokens=True) for ids in result.response_ids], result))
    return out


def generate(model_path: str, rows: list[dict], max_new_tokens: int = MAX_NEW_TOKENS, dtype: str = "auto",
             batch: int = 64, progress: bool = True) -> list[str]:
    """Greedy answers to `rows`' prompts, each in the model's chat template, from the native engine."""
    from rlinf_like.workers.rollout.types import SamplingParams

    greedy = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    answers = answer(chat_engine(model_path, batch, dtype), [r["prompt"] for r in rows], lambda i: greedy,
                     progress=progress)
    return [texts[0] for texts, _ in answers]


def table(report: Report) -> str:
    lines = ["  ".join(f"{k} {report.scores[k]:.3f}" for k in SCORES), "",
             f"{'instruction':<48} {'n':>4} {'strict':>7} {'loose':>7}"]
    lines += [f"{iid:<48} {n:>4} {s:>7.3f} {lo:>7.3f}" for iid, (n, s, lo) in report.by_type.items()]
    return "\n".join(lines)


def write(path: str, rows: list[dict], responses: list[str], verdicts: list[Verdict] | None = None) -> None:
    with open(path, "w") as f:
        for i, (row, response) in enumerate(zip(rows, responses)):
            line = {"key": row["key"], "prompt": row["prompt"], "response": response,
                    "instruction_id_list": row["instruction_id_list"]}
            if verdicts:
                line.update(strict=list(verdicts[i].strict), loose=list(verdicts[i].loose))
            f.write(json.dumps(line) + "\n")


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m rlinf_like.eval.ifeval", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a Hugging Face model folder, e.g. models/smollm2-135m-instruct or a run's "
                                      "final_model/")
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts only")
    parser.add_argument("--types", default="", help="comma-separated instruction ids or groups (e.g. "
                                                    "punctuation,change_case:english_lowercase): prompts with one")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--out", default="", help="write each prompt's response and verdicts here (JSON lines)")
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        parser.error(f"MODEL={args.model!r} is not a model folder (no config.json)")
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1, got {args.limit}")
    rows = select(official_prompts(), [t for t in args.types.split(",") if t], args.limit)
    if not rows:
        parser.error(f"--types={args.types!r} selects no prompt")
    from rlinf_like.data.ifeval_checks import punkt_source
    from rlinf_like.utils import hardware

    import torch

    # one process does all the work here, so it takes every core torch sees (OMP_NUM_THREADS caps it); the answers
    # depend on the thread count in their last bits, as any float reduction does
    print(f"IFEval: {len(rows)} of 541 prompts, greedy, up to {args.max_new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads; {args.model}")
    print(f"host: {hardware.cpu_model()}, flags {hardware.isa_flags()}; "
          f"sentence splitting: Punkt with {punkt_source()}")
    start = time.monotonic()
    responses = generate(args.model, rows, args.max_new_tokens, args.dtype)
    seconds = time.monotonic() - start
    if args.out:  # the answers first: a checker that fails must not cost the generation
        write(args.out, rows, responses)
    report = score(rows, responses)
    print(table(report))
    print(f"generated in {seconds:.0f} s")
    if args.out:
        write(args.out, rows, responses, report.verdicts)
    print(json.dumps({k: round(v, 4) for k, v in report.scores.items()}))
    return report.scores


if __name__ == "__main__":
    from rlinf_like.utils.logging import end_with_the_reader

    end_with_the_reader()  # `... | head` ends the evaluation instead of hanging it
    main()
