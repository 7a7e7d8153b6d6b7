"""Schema-first config: dataclasses are the source of truth; hydra composes YAML + CLI overrides;
`structure` turns the result into the dataclass, naming any wrong key, any value outside a `Literal`
or a field's bounds, and the allowed ones. `help_text` / `python -m rlinf_like.config.show` print it."""

from rlinf_like.config.cli import prepare_command_line
from rlinf_like.config.schema import describe, field_comments, help_text, hydra_schema
from rlinf_like.config.validate import ConfigError, bounded, check_instance, check_overrides, structure

__all__ = ["ConfigError", "bounded", "check_instance", "check_overrides", "describe", "field_comments", "help_text", "hydra_schema",
           "prepare_command_line", "structure"]
