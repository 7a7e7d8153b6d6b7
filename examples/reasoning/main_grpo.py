"""GRPO on verifiable arithmetic with a small local model: the project's main job.

    python examples/reasoning/main_grpo.py                                  # collocated, CPU defaults
    python examples/reasoning/main_grpo.py --config-name grpo_pipelined     # rollout runs ahead
    python examples/reasoning/main_grpo.py runner.max_steps=50 algorithm.kl_beta=0.01
    python examples/reasoning/main_grpo.py cluster.component_placement.actor=0 \\
        cluster.component_placement.rollout=1 runner.max_staleness=1    # disaggregated by hand
    python examples/reasoning/main_grpo.py schedule=async data=gsm8k_files  # swap parts: config/<group>/
    python examples/reasoning/main_grpo.py --help                           # every key, default, comment

Placement has one key per component (`cluster.component_placement.<component>=<devices>`); components
whose device ranges overlap are collocated. A preset is built from parts, one folder each under config/:
`model=`, `data=` and `schedule=` (collocated, pipelined, async, dynamic: a placement and its loop) swap one
part and keep the rest.

Warm-starts the actor with SFT, then trains with GRPO; prints a table of held-out accuracy,
writes TensorBoard scalars, a PNG of the curves, a checkpoint every `runner.save_every` steps
(resume with `runner.resume=true`) and the final model as HF safetensors.
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


# The dataclass schema is the base of every preset: any of its keys can be overridden.
ConfigStore.instance().store(name="reasoning_schema", node=hydra_schema(ReasoningConfig))


@hydra.main(config_path="config", config_name="grpo_collocated", version_base="1.3")
def main(cfg) -> None:
    setup_logging()  # after Hydra has set up logging
    limit_threads()
    config = structure(ReasoningConfig, cfg)
    train(config)


if __name__ == "__main__":
    end_with_the_reader()  # `... | head` ends the run instead of hanging it
    # --help with the preset's values, presets listed, one-value lists, quoting advice, then the keys checked
    sys.argv[1:] = prepare_command_line(ReasoningConfig, sys.argv[1:], __file__, "grpo_collocated")
    main()
