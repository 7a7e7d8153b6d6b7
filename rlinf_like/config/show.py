"""Print a runner's whole config schema: every key, its default, allowed values, bounds and comment.

    python -m rlinf_like.config.show reasoning      # the schema's defaults, then each preset's changes to them
    python -m rlinf_like.config.show embodied
    python -m rlinf_like.config.show engines        # rollout engines: capabilities, the CPU recommendation

A script's `--help` prints the values of one preset composed with its overrides; this prints the schema every
preset starts from, and what each preset of the example folders changes (one line each).
"""

from __future__ import annotations

import sys
from pathlib import Path

from rlinf_like.config.cli import USAGE
from rlinf_like.config.schema import help_text
from rlinf_like.utils.registry import import_ref

SCHEMAS = {"reasoning": "rlinf_like.runners.reasoning.config:ReasoningConfig",
           "embodied": "rlinf_like.runners.embodied.config:EmbodiedConfig"}
# the example folders whose presets build on each schema, and the name they give it in their `defaults:` list
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PRESET_DIRS = {"reasoning": ("reasoning_schema", ["reasoning/config", "agentic/config"]),
               "embodied": ("embodied_schema", ["embodied/config"])}


def schema(name: str) -> type:
    return import_ref(SCHEMAS[name])


def main(argv: list[str]) -> None:
    if argv == ["engines"]:  # the registry's choices for rollout.engine, as the engine classes declare them
        from rlinf_like.workers.rollout.engines.engine_advice import engine_listing

        print(engine_listing())
        return
    if len(argv) != 1 or argv[0] not in SCHEMAS:
        sys.exit(f"usage: python -m rlinf_like.config.show {{{'|'.join([*SCHEMAS, 'engines'])}}}")
    print(help_text(schema(argv[0]), f"{argv[0]} config ({SCHEMAS[argv[0]]}). {USAGE}"))
    name, folders = PRESET_DIRS[argv[0]]
    if all((EXAMPLES / f).is_dir() for f in folders):  # a checkout, not an installed package alone
        from rlinf_like.config.cli import preset_listing

        print("presets (what each sets away from the defaults above):")
        print(preset_listing(schema(argv[0]), name, [EXAMPLES / f for f in folders]))


if __name__ == "__main__":
    main(sys.argv[1:])
