"""PPO or SAC on simulators with env / rollout / actor (and, for SAC, replay) workers.

    python examples/embodied/main_embodied.py                              # Reacher-v5, state MLP
    python examples/embodied/main_embodied.py env=cartpole runner.total_env_steps=30000
    python examples/embodied/main_embodied.py env=cartpole runner.pipeline=true   # env stages overlap inference
    python examples/embodied/main_embodied.py --help                        # every key, default, comment
    python examples/embodied/main_embodied.py env=pendulum algorithm.name=sac   # SAC: replay worker, twin Q
    python examples/embodied/main_embodied.py env=reach_colour_pixels policy=vla runner.gif=true
    python examples/embodied/bc_warmstart.py --out runs/bc/vla.pt      # VLA: behaviour-cloning warm start,
    python examples/embodied/main_embodied.py env=reach_colour_pixels policy=vla \
        policy.init_weights=runs/bc/vla.pt algorithm.lr=3e-4          # then PPO from it

Prints a progress bar, writes TensorBoard scalars (return, success rate, env steps/s, losses), a
plot of the return, checkpoints every `runner.save_every` updates (`runner.resume=true` continues).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import sys

import hydra
from hydra.core.config_store import ConfigStore

from rlinf_like.config import hydra_schema, prepare_command_line, structure
from rlinf_like.runners.embodied import train
from rlinf_like.runners.embodied.config import EmbodiedConfig
from rlinf_like.utils.logging import end_with_the_reader, setup_logging
from rlinf_like.utils.threads import limit_threads

ConfigStore.instance().store(name="embodied_schema", node=hydra_schema(EmbodiedConfig))


@hydra.main(config_path="config", config_name="embodied", version_base="1.3")
def main(cfg) -> None:
    setup_logging()  # after Hydra has set up logging
    limit_threads()
    config = structure(EmbodiedConfig, cfg)
    train(config)  # algorithm.name picks the runner (PPO, SAC, discrete SAC); runner.max_restarts its recovery


if __name__ == "__main__":
    end_with_the_reader()  # `... | head` ends the run instead of hanging it
    # --help with the preset's values, presets listed, one-value lists, quoting advice, then the keys checked
    sys.argv[1:] = prepare_command_line(EmbodiedConfig, sys.argv[1:], __file__, "embodied")
    main()
