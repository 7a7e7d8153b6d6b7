"""How well a small LLM judge agrees with a rule it could replace: SmolLM2-135M-Instruct (our own judge, the
`judge_worker` path `reward.fn=judge` runs) judges two-term sums whose answers the math rule checks exactly.

Responses are made, not sampled, so the truth is known: per problem one correct boxed answer and one off by
1..9, each said the way a policy says it ("The sum is N. \\boxed{N}"). Both parsers: yes/no read from P(yes)
(no text), and yes/no parsed from greedy text. Prints the agreement with the rule, P(yes) on right and wrong
answers, and the parse-failure rate; the last line is one JSON object.

    python bench/judge_agreement.py --problems 64
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Machine, result_line  # noqa: E402

MODEL = "models/smollm2-135m-instruct"


def cases(n: int, seed: int = 0) -> list[tuple[str, str, str, bool]]:
    """(question, response, answer, correct): n problems, each answered once rightly and once wrongly."""
    import reasoning_gym

    rng = random.Random(seed)
    data = reasoning_gym.create_dataset("chain_sum", size=n, seed=seed, min_terms=2, max_terms=2, min_digits=1,
                                        max_digits=1)
    out = []
    for entry in data:
        answer = int(entry["answer"])
        wrong = answer + rng.choice([-1, 1]) * rng.randint(1, 9)
        for value in (answer, wrong):
            out.append((entry["question"], f"The sum is {value}. \\boxed{{{value}}}", str(answer), value == answer))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problems", type=int, default=64)
    p.add_argument("--model", default=MODEL)
    args = p.parse_args()
    from rlinf_like.models import load_tokenizer
    from rlinf_like.workers.reward.judge import JudgeConfig
    from rlinf_like.workers.reward.judge_worker import JudgeWorker
    from rlinf_like.workers.rollout.types import RolloutResult

    machine = Machine.start({"judge": args.model, "problems": args.problems, "task": "chain_sum, 2 one-digit terms"})
    tokenizer = load_tokenizer(args.model)
    made = cases(args.problems)
    results = [RolloutResult(f"c{i}", tokenizer(q).input_ids, [tokenizer(r, add_special_tokens=False).input_ids],
                             [[0.0]], ["stop"]) for i, (q, r, _, _) in enumerate(made)]
    answers, rows, truth = [c[2] for c in made], [{} for _ in made], [c[3] for c in made]
    out = {}
    for mode, cfg in {"probability": JudgeConfig(model_path=args.model, yes_probability=True),
                      "text": JudgeConfig(model_path=args.model, yes_probability=False, max_tokens=4)}.items():
        judge = JudgeWorker(args.model, cfg, max_context=1024)
        began = time.perf_counter()
        scores = [s[0] for s in judge.judge(results, answers, rows)]
        seconds = time.perf_counter() - began
        parsed = [(s, t) for s, t in zip(scores, truth) if s is not None]
        agree = sum((s >= 0.5) == t for s, t in parsed) / max(len(parsed), 1)
        right = [s for s, t in parsed if t]
        wrong = [s for s, t in parsed if not t]
        out[mode] = {"agreement": agree, "parse_failed": 1 - len(parsed) / len(scores),
                     "mean_score_right": statistics.fmean(right) if right else None,
                     "mean_score_wrong": statistics.fmean(wrong) if wrong else None,
                     "engine_calls": judge.engine_calls(), "seconds": seconds}
        print(f"{mode}: agreement with the rule {agree:.3f} over {len(parsed)} parsed of {len(scores)}; mean score "
              f"right {out[mode]['mean_score_right']}, wrong {out[mode]['mean_score_wrong']}; "
              f"{judge.engine_calls()} engine call(s), {seconds:.1f} s")
    machine.end()
    print(result_line("judge_agreement", **out))


if __name__ == "__main__":
    main()
