"""Agentic RL: multi-turn GRPO where the model calls tools, or trains through an agent program of your own.

    python examples/agentic/main_agent.py                                  # calculator tool, CPU defaults
    python examples/agentic/main_agent.py --config-name search             # BM25 search over a shipped corpus
    python examples/agentic/main_agent.py --config-name openai_agent       # your agent program, via the endpoint
    python examples/agentic/main_agent.py runner.max_steps=2 runner.sft_steps=5 runner.eval_every=2 \\
        runner.prompts_per_step=4 algorithm.samples_per_prompt=2 runner.output_dir=runs/agent_smoke
    python examples/agentic/main_agent.py --help                           # every key, default, comment

Every sample is an episode: the model writes, the environment answers (tool results rendered through the chat
template and appended as tokens), until the model answers or a limit (`agent.max_turns`, `agent.max_total_tokens`)
ends it. The loss covers the model's own tokens only. The run prints a held-out episode at each evaluation, logs
the tool-call and malformed-call rates, and ends with the curves and a table, as the reasoning runner does.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import sys

import hydra
from hydra.core.config_store import ConfigStore

from rlinf_like.config import hydra_schema, prepare_command_line, structure
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.runners.reasoning import train
from rlinf_like.utils.logging import end_with_the_reader, setup_logging
from rlinf_like.utils.threads import limit_threads

ConfigStore.instance().store(name="reasoning_schema", node=hydra_schema(ReasoningConfig))


@hydra.main(config_path="config", config_name="calculator", version_base="1.3")
def main(cfg) -> None:
    setup_logging()
    limit_threads()
    train(structure(ReasoningConfig, cfg))


if __name__ == "__main__":
    end_with_the_reader()  # `... | head` ends the run instead of hanging it
    # --help with the preset's values, presets listed, one-value lists, quoting advice, then the keys checked
    sys.argv[1:] = prepare_command_line(ReasoningConfig, sys.argv[1:], __file__, "calculator")
    main()
