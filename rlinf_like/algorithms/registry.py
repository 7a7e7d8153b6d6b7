"""Name -> function tables for algorithms; the generic `Registry` lives in `rlinf_like.utils.registry`
(engines, envs, policies and backends use it too)."""

from rlinf_like.utils.registry import Registry, UnknownNameError

__all__ = ["Registry", "UnknownNameError"]
