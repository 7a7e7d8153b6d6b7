"""Schema-first config: dataclasses are the source of truth; hydra composes YAML + CLI overrides;
`structure` turns the result into the dataclass, naming any wrong key and the allowed ones."""

from rlinf_like.config.validate import ConfigError, check_overrides, structure

__all__ = ["ConfigError", "check_overrides", "structure"]
