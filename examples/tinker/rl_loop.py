"""Reinforcement learning through the Tinker API, on our Tinker-compatible server: small sums, GRPO-style.

    python examples/tinker/rl_loop.py --model models/smollm2-135m-instruct --steps 20

Each step: the current weights as a sampling client, `--group` answers to each of `--prompts` questions, reward 1
for the right sum, advantages centred per question, one `forward_backward` with `importance_sampling` (the
sampler's logprobs as the behaviour policy) and one `optim_step`. Plain `tinker` 0.38 client code; without
`--base-url` (or $TINKER_BASE_URL) it starts `python -m rlinf_like.tinker serve` in this process first.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import time
from contextlib import ExitStack

from sl_loop import start_local_server


def question(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return f"What is {a} + {b}? Answer with the number only.", a + b


def reward(text: str, answer: int) -> float:
    numbers = re.findall(r"-?\d+", text)  # the last number is the answer (the question's are restated first)
    return float(bool(numbers) and int(numbers[-1]) == answer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the served model's local folder (its base_model name)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-url", default=os.environ.get("TINKER_BASE_URL"))
    args = parser.parse_args()

    import tinker
    from tinker import types
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    rng = random.Random(args.seed)

    def prompt_ids(text: str) -> list[int]:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                            add_generation_prompt=True)
        return tokenizer(chat, add_special_tokens=False)["input_ids"]

    with ExitStack() as stack:
        base_url = args.base_url or start_local_server(stack, args.model)
        service = stack.enter_context(tinker.ServiceClient(base_url=base_url, api_key="tml-local"))
        training = service.create_lora_training_client(base_model=args.model, rank=args.rank).result()
        params = types.SamplingParams(max_tokens=24, temperature=1.0, stop=[tokenizer.eos_token])
        for step in range(1, args.steps + 1):
            start = time.perf_counter()
            sampler = training.save_weights_and_get_sampling_client().result()
            asked = [question(rng) for _ in range(args.prompts)]
            prompts = [prompt_ids(text) for text, _ in asked]
            futures = [sampler.sample(types.ModelInput.from_ints(p), args.group, params) for p in prompts]
            data, rewards = [], []
            for prompt, (_, answer), future in zip(prompts, asked, futures):
                sequences = future.result().sequences
                scores = [reward(tokenizer.decode(s.tokens, skip_special_tokens=True), answer) for s in sequences]
                rewards += scores
                mean = sum(scores) / len(scores)
                for seq, score in zip(sequences, scores):
                    if score == mean or not seq.tokens:  # no signal in a group whose answers all scored alike
                        continue
                    tokens, pad = prompt + seq.tokens, [0.0] * (len(prompt) - 1)
                    data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
                        "target_tokens": tokens[1:], "logprobs": pad + list(seq.logprobs),
                        "advantages": pad + [score - mean] * len(seq.tokens)}))
            if data:
                training.forward_backward(data, "importance_sampling").result()
                training.optim_step(types.AdamParams(learning_rate=args.lr)).result()
            print(f"step {step}: reward {sum(rewards) / len(rewards):.3f}, {len(data)} samples trained on, "
                  f"{time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
