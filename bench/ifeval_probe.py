"""Where GRPO has signal on IFEval-style constraints: the base model's pass@1 and pass@k per constraint type.

    python bench/ifeval_probe.py                  # 16 training prompts a type, 8 samples each, 256 new tokens
    python bench/ifeval_probe.py --quick          # 2 prompts of 3 types, 2 samples, 32 tokens: checks it runs

For each trained type (`data.source=ifeval_train`'s defaults), generated training prompts with that one constraint
(never an official prompt), `--samples` answers each at temperature 1 from the native engine, scored by the official
checkers (strict). pass@1 is the share of answers that follow the constraint, pass@k the share of prompts with at
least one that does. A type whose pass@k is well above its pass@1 gives GRPO groups with both outcomes, the signal
it learns from; a type at 0 or near 1 gives none. The last line is one JSON object: each type's pass@1 and pass@k.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Machine, result_line  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--per-type", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--types", nargs="*", default=None, help="instruction ids (default: the source's defaults)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    from rlinf_like.data.sources.ifeval_train import DEFAULT_TYPES, generate

    types = args.types or list(DEFAULT_TYPES)
    if args.quick:
        args.per_type, args.samples, args.max_new_tokens, types = 2, 2, 32, types[:3]
    import torch

    from rlinf_like.data.ifeval_checks import check
    from rlinf_like.eval.ifeval import answer, chat_engine
    from rlinf_like.workers.rollout.types import SamplingParams

    machine = Machine.start({"model": args.model, "per_type": args.per_type, "samples": args.samples,
                             "max_new_tokens": args.max_new_tokens, "temperature": 1.0, "threads":
                             torch.get_num_threads(), "types": len(types), "seed": args.seed})
    rows = {t: generate(args.per_type, args.seed + i, [t], 1, 1) for i, t in enumerate(types)}
    flat = [row for group in rows.values() for row in group]

    def sampling(i: int) -> SamplingParams:  # one seed per prompt's position in its type, as before
        return SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0,
                              seed=args.seed * 7919 + i % args.per_type)

    chat = chat_engine(args.model, batch=128)
    start = time.monotonic()
    answers = answer(chat, [row["prompt"] for row in flat], sampling, n=args.samples, progress=False)
    seconds = time.monotonic() - start
    tokens = sum(len(ids) for _, result in answers for ids in result.response_ids)
    print(f"{len(flat)} prompts x {args.samples} answers, {tokens} tokens in {seconds:.0f} s "
          f"({tokens / seconds:.0f} tokens/s)")
    print(f"{'type':<48} {'pass@1':>7} {'pass@' + str(args.samples):>7} {'tokens':>7} {'cut':>5}")
    out, at = {}, 0
    for t, group in rows.items():
        follows, lengths, cut = [], [], []
        for row, (texts, result) in zip(group, answers[at:at + len(group)]):
            follows.append([check(row, text).strict[0] for text in texts])
            lengths += [len(ids) for ids in result.response_ids]
            cut += [reason == "length" for reason in result.finish_reasons]
        at += len(group)
        pass1 = sum(sum(f) for f in follows) / sum(len(f) for f in follows)
        passk = sum(any(f) for f in follows) / len(follows)
        out[t] = {"pass1": round(pass1, 3), f"pass{args.samples}": round(passk, 3)}
        print(f"{t:<48} {pass1:>7.3f} {passk:>7.3f} {sum(lengths) / len(lengths):>7.0f} {sum(cut) / len(cut):>5.2f}")
    machine.end()
    # a type "has signal" where at least a fifth more prompts have a good answer among k than one answer has
    signal = sorted(t for t, v in out.items() if v[f"pass{args.samples}"] - v["pass1"] >= 0.2)
    print(f"types with signal (pass@{args.samples} - pass@1 >= 0.2): {signal}")
    print(result_line("ifeval_probe", tokens_per_s=tokens / seconds, signal_types=len(signal), types=out))


if __name__ == "__main__":
    main()
