"""Print a runner's whole config schema: every key, its default, allowed values, bounds and comment.

    python -m rlinf_like.config.show reasoning      # same as examples/reasoning/main_grpo.py --help
    python -m rlinf_like.config.show embodied       # same as examples/embodied/main_embodied.py --help
    python -m rlinf_like.config.show engines        # rollout engines: capabilities, the CPU recommendation
"""

from __future__ import annotations

import importlib
import sys

from rlinf_like.config.schema import help_text

SCHEMAS = {"reasoning": "rlinf_like.runners.config:ReasoningConfig",
           "embodied": "rlinf_like.runners.embodied_config:EmbodiedConfig"}
USAGE = ("Override any key on the command line as key=value (hydra), e.g. runner.max_steps=50; "
         "hydra's own options: --hydra-help.")


def schema(name: str) -> type:
    module, cls = SCHEMAS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def print_help_if_asked(cls: type, argv: list[str], script: str) -> None:
    """`--help` / `-h` prints the schema and exits (hydra's own help lists only the YAML)."""
    if "--help" in argv or "-h" in argv:
        print(help_text(cls, f"usage: python {script} [--config-name PRESET] [key=value ...]\n{USAGE}"))
        sys.exit(0)


def main(argv: list[str]) -> None:
    if argv == ["engines"]:  # the registry's choices for rollout.engine, as the engine classes declare them
        from rlinf_like.workers.rollout.engine_advice import engine_listing

        print(engine_listing())
        return
    if len(argv) != 1 or argv[0] not in SCHEMAS:
        sys.exit(f"usage: python -m rlinf_like.config.show {{{'|'.join([*SCHEMAS, 'engines'])}}}")
    print(help_text(schema(argv[0]), f"{argv[0]} config ({SCHEMAS[argv[0]]}). {USAGE}"))


if __name__ == "__main__":
    main(sys.argv[1:])
