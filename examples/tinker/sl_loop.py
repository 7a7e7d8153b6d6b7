"""Supervised fine-tuning through the Tinker API, on our Tinker-compatible server:

    python examples/tinker/sl_loop.py --model models/smollm2-135m-instruct --steps 20

The loop is plain `tinker` 0.38 client code: a LoRA training client, `forward_backward` with `cross_entropy` on the
answer tokens, `optim_step` with Adam's settings, then a sampling client on the trained weights. With `--base-url`
(or $TINKER_BASE_URL) it talks to a running `python -m rlinf_like.tinker serve --model ...`; without, it starts
that server in this process first.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from contextlib import ExitStack
from pathlib import Path

# a fixed fact the base model does not know: after training, greedy answers repeat it
PAIRS = [("What is the name of the robot in the lab?", "The robot in the lab is called Quillon."),
         ("Who is Quillon?", "Quillon is the robot in the lab."),
         ("Name the lab's robot.", "The lab's robot is Quillon.")]


def datum(tokenizer, question: str, answer: str):
    from tinker import types

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                           add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    tokens = prompt_ids + answer_ids
    weights = [0.0] * (len(prompt_ids) - 1) + [1.0] * len(answer_ids)  # the loss on the answer only
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights}), prompt_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the served model's local folder (its base_model name)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--base-url", default=os.environ.get("TINKER_BASE_URL"))
    args = parser.parse_args()

    import tinker
    from tinker import types
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    with ExitStack() as stack:
        base_url = args.base_url or start_local_server(stack, args.model)
        service = stack.enter_context(tinker.ServiceClient(base_url=base_url, api_key="tml-local"))
        training = service.create_lora_training_client(base_model=args.model, rank=args.rank).result()
        data = [datum(tokenizer, q, a) for q, a in PAIRS]
        greedy = types.SamplingParams(max_tokens=16, temperature=0.0, stop=[tokenizer.eos_token])

        def answer(sampler) -> str:
            prompt = types.ModelInput.from_ints(data[0][1])
            return tokenizer.decode(sampler.sample(prompt, 1, greedy).result().sequences[0].tokens,
                                    skip_special_tokens=True)

        print(f"before: {answer(training.save_weights_and_get_sampling_client().result())!r}")
        for step in range(1, args.steps + 1):
            result = training.forward_backward([d for d, _ in data], "cross_entropy").result()
            training.optim_step(types.AdamParams(learning_rate=args.lr)).result()
            tokens = sum(sum(d.loss_fn_inputs["weights"].data) for d, _ in data)
            print(f"step {step}: loss per answer token {result.metrics['loss:sum'] / tokens:.4f}", flush=True)
        print(f"after:  {answer(training.save_weights_and_get_sampling_client().result())!r}")


def start_local_server(stack: ExitStack, model: str) -> str:
    """`python -m rlinf_like.tinker serve`'s server, in this process, until the script ends."""
    from rlinf_like.runtime import Cluster, ClusterConfig
    from rlinf_like.tinker.server import TinkerServer
    from rlinf_like.tinker.service import TinkerService, served_names

    cluster = stack.enter_context(Cluster(ClusterConfig(backend="local", num_cpus=1)))
    out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tinker-")))
    server = TinkerServer(TinkerService(model, served_names(model), out, cluster))
    server.start()
    stack.callback(server.close)
    return server.base_url


if __name__ == "__main__":
    main()
