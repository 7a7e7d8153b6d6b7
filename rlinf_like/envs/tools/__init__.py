"""Tools for agentic rollouts (`python`, `calculator`, `search`) and their registry, `agent.tools`."""

from rlinf_like.envs.tools.base import TOOLS, Tool, ToolError, ToolOptions, ToolResult, ToolTimeout, build_tools

__all__ = ["TOOLS", "Tool", "ToolError", "ToolOptions", "ToolResult", "ToolTimeout", "build_tools"]
