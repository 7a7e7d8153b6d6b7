"""A verifiers (v1) environment package written for rlinf_like's example, loadable by name as `verifiers_calc`:
3-digit x 2-digit products with a calculator tool, scored by a two-function rubric. Nothing in it knows the
trainer: it is the shape a verifiers user would publish.

    agent.env=verifiers data.source=verifiers data.name=verifiers_calc

The tool runs as verifiers' own per-rollout MCP server (`python -m verifiers_calc.tools`).
"""

from verifiers_calc.taskset import CalcTaskset

__all__ = ["CalcTaskset"]  # the loader takes the one Taskset subclass exported here
