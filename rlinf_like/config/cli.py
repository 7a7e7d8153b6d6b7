"""An example script's command line, read before hydra runs (`prepare_command_line`).

What hydra alone would do badly, done first:
  * `--help` / `-h` prints every key with the value the run would use: the preset composed with the overrides,
    each value a preset or an override changed marked with the schema's default;
  * `--config-name NAME` that names no preset lists the presets, one a line (hydra: "Cannot find primary config");
  * `group=option` (a subfolder of the script's config folder, e.g. `model=smollm2 data=gsm8k_files
    schedule=async`) selects that group's option: it replaces the preset's own choice of that group, or is laid
    over the preset when the preset chose none;
  * a list-typed key given one value (`data.train_files=/data/train.parquet`, as veRL takes it) becomes a one-item
    list (OmegaConf would refuse "str is not a ListConfig");
  * a dict-typed key given a whole dict (`data.options={n:120}`) is replaced by it, and one key of such a dict
    (`data.options.n=120`) is set whether or not the preset had it: hydra alone merges the new dict into the
    preset's and refuses a new key ("Key 'n' is not in struct");
  * an override hydra cannot parse (an unquoted `{`, `,` or space in a value) is named with the quoting that works;
  * then `check_overrides`: unknown keys with the closest match, values outside a key's choices or bounds.
"""

from __future__ import annotations

import os
import shlex
import sys
import typing
from pathlib import Path

from rlinf_like.config.schema import help_text
from rlinf_like.config.validate import ConfigError, _leaf_field, check_overrides, structure

# the keys this process's command line overrode (None: not started from a command line, e.g. a config built in code)
_USER_KEYS: set[str] | None = None
_SET_KEYS: set[str] | None = None  # of those, the ones given as key=value (not through a group option)


def user_overrides() -> set[str] | None:
    """The dotted keys the command line set (`prepare_command_line`), or None when there was none."""
    return _USER_KEYS


def command_line_keys() -> set[str] | None:
    """The dotted keys the command line set as key=value, not those a group option (`env=pendulum`) brought, or
    None when there was no command line."""
    return _SET_KEYS


USAGE = ("Override any key on the command line as key=value (hydra), e.g. runner.max_steps=50; "
         "hydra's own options: --hydra-help.")
_PRESET_FLAGS = ("--config-name", "-cn")


def presets(config_dir: Path) -> list[str]:
    """The presets of a script's config folder (its top-level YAML files)."""
    return sorted(p.stem for p in Path(config_dir).glob("*.yaml"))


def groups(config_dir: Path) -> dict[str, list[str]]:
    """The config groups of a script's config folder (its subfolders of YAML files) and their options: a group
    option replaces the section of the same name, e.g. `model=smollm2 data=gsm8k_files`."""
    return {d.name: sorted(p.stem for p in d.glob("*.yaml")) for d in sorted(Path(config_dir).iterdir())
            if d.is_dir() and any(d.glob("*.yaml"))}


def select_group(config_dir: Path, preset: str, override: str) -> tuple[str, set[str]] | None:
    """`group=option` naming one of the folder's group options: as it is when the preset's defaults list has the
    group (the embodied `env=`, `policy=`), else hydra's `+group=option` (appended after the preset, so it wins);
    with the keys that option sets. None for any other override."""
    import yaml

    key, _, option = override.partition("=")
    options = groups(config_dir).get(key.lstrip("+"))
    if "." in key or key.startswith(("~", "-")) or options is None:
        return None
    if option not in options:
        raise ConfigError(f"{override}: the config group {key.lstrip('+')!r} has the options {options} "
                          f"(files in {Path(config_dir) / key.lstrip('+')})")
    key = key.lstrip("+")
    text = (Path(config_dir) / key / f"{option}.yaml").read_text()
    content = yaml.safe_load(text) or {}
    defaults = (yaml.safe_load((Path(config_dir) / f"{preset}.yaml").read_text()) or {}).get("defaults", [])
    listed = any(isinstance(d, dict) and key in d for d in defaults)
    # an option under `# @package _global_` (schedule=) sets keys of several sections, named from the top
    keys = dotted_leaves(content, "" if "@package _global_" in text.split("\n", 1)[0] else key)
    return f"{'' if listed else '+'}{key}={option}", keys


def dotted_leaves(tree: dict, prefix: str) -> set[str]:
    """{"a": {"b": 1}, "c": 2} under prefix "p": {"p.a.b", "p.c"}."""
    keys = set()
    for name, value in tree.items():
        dotted = f"{prefix}.{name}" if prefix else str(name)
        keys |= dotted_leaves(value, dotted) if isinstance(value, dict) and value else {dotted}
    return keys


def split_preset(argv: list[str], default: str) -> tuple[str, list[str], list[str]]:
    """(preset, the arguments naming it, the other arguments)."""
    preset, flags, rest, i = default, [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in _PRESET_FLAGS and i + 1 < len(argv):
            preset, flags, i = argv[i + 1], flags + argv[i:i + 2], i + 2
            continue
        if arg.startswith(tuple(f + "=" for f in _PRESET_FLAGS)):
            preset, flags = arg.split("=", 1)[1], flags + [arg]
        else:
            rest.append(arg)
        i += 1
    return preset, flags, rest


def _is_list(tp) -> bool:
    if typing.get_origin(tp) is list:
        return True
    return any(_is_list(a) for a in typing.get_args(tp) if a is not type(None))


def normalize_override(cls: type, override: str) -> list[str]:
    """One override as hydra will read it: a list key's single value wrapped in a list; a dict key's new dict
    given as null, then the dict (so it replaces the old one); refused, naming the override and the quoting that
    works, if hydra cannot parse it."""
    if "=" in override and not override.startswith(("-", "~")):
        key, value = override.split("=", 1)
        name = key.lstrip("+")
        try:
            leaf = None if name.startswith("hydra.") else _leaf_field(cls, name)
        except ConfigError:  # an unknown or moved key: check_overrides names it, with the closest match
            leaf = None
        if leaf is not None and _is_list(leaf[1]) and value and not value.startswith("[") and value != "null" \
                and "${" not in value:
            quoted = value if value[:1] in "'\"" else '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
            override = f"{key}=[{quoted}]"
        if leaf is not None and typing.get_origin(leaf[1]) is dict and typing.get_args(leaf[1])[1:] == (typing.Any,) \
                and value.startswith("{") and not key.startswith("+"):  # the mirror types it Any (`hydra_schema`)
            _parse(override)
            return [f"{key}=null", override]
        if leaf is None and not key.startswith("+") and "." in name and _is_dict_key(cls, name.rsplit(".", 1)[0]):
            override = f"++{override}"  # one key of a dict (`data.options.n=120`): set it, whether or not it was there
    _parse(override)
    return [override]


def _is_dict_key(cls: type, key: str) -> bool:
    try:
        leaf = _leaf_field(cls, key)
    except ConfigError:
        return False
    return leaf is not None and typing.get_origin(leaf[1]) is dict


def _parse(override: str) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        OverridesParser.create().parse_override(override)
    except Exception as err:  # hydra's OverrideParseException: a grammar message with no advice
        key, _, value = override.partition("=")
        raise ConfigError(f"cannot parse the override {override!r}: {str(err).splitlines()[0]}. A value holding "
                          f"spaces, braces, commas or quotes needs hydra's quotes inside the shell's: "
                          f"{shlex.quote(f'{key}=' + chr(34) + value.strip(chr(34)) + chr(34))}") from None


def prepare_command_line(cls: type, argv: list[str], script: str | Path, default_preset: str) -> list[str]:
    """The arguments to hand hydra (see the module docstring); `--help` prints and exits, and a bad argument exits
    with its one-line message. `script`: the script's own file (`__file__`), whose `config/` folder holds the
    presets, wherever the command runs from."""
    try:
        return _prepare(cls, argv, script, default_preset)
    except ConfigError as err:
        sys.exit(f"error: {err}")


def _prepare(cls: type, argv: list[str], script: str | Path, default_preset: str) -> list[str]:
    config_dir = Path(script).resolve().parent / "config"
    preset, preset_args, overrides = split_preset(argv, default_preset)
    known = presets(config_dir)
    if preset not in known:
        sys.exit(f"--config-name {preset!r}: no such preset in {config_dir}. Presets:\n"
                 + "\n".join(f"  --config-name {p}" for p in known)
                 + "\nGroups, added to any preset: "
                 + ", ".join(f"{g}={'|'.join(o)}" for g, o in groups(config_dir).items()))
    asked_help = any(a in ("--help", "-h") for a in overrides)
    user_keys: set[str] = set()
    prepared, keyed = [], []  # all of them; those that set keys (not a group choice)
    for override in overrides:
        if override in ("--help", "-h"):
            continue
        selected = select_group(config_dir, preset, override)
        if selected is not None:
            prepared.append(selected[0])
            user_keys |= selected[1]
        else:
            normalized = normalize_override(cls, override)
            prepared += normalized
            keyed.append(normalized[-1])
            user_keys.add(normalized[-1].lstrip("+~").split("=", 1)[0])
    overrides = prepared
    check_overrides(cls, keyed)
    global _USER_KEYS, _SET_KEYS
    _USER_KEYS, _SET_KEYS = user_keys, {k.lstrip("+~").split("=", 1)[0] for k in keyed}
    if asked_help:
        values = composed(cls, config_dir, preset, overrides)
        shown = " ".join([f"--config-name {preset}", *overrides])
        usage = f"usage: python {os.path.relpath(script)} [--config-name PRESET] [key=value ...]"
        print(help_text(cls, f"{usage}\n{USAGE}\nValues of: {shown} (presets: {', '.join(known)})", values))
        sys.exit(0)
    return preset_args + overrides


def composed(cls: type, config_dir: Path, preset: str, overrides: list[str]):
    """The preset composed with the overrides, as the run would structure it (the script has registered the
    schema with hydra's ConfigStore)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return structure(cls, compose(preset, overrides=[o for o in overrides if not o.startswith("hydra.")]))


def changed_keys(cls: type, values, prefix: str = "") -> list[str]:
    """`key=value` for every leaf of `values` (an instance of schema `cls`) that differs from the schema's default."""
    import dataclasses

    out, default = [], cls()
    for f in dataclasses.fields(cls):
        mine, theirs = getattr(values, f.name), getattr(default, f.name)
        if dataclasses.is_dataclass(theirs):
            out += changed_keys(type(theirs), mine, f"{prefix}{f.name}.")
        elif mine != theirs:
            out.append(f"{prefix}{f.name}={mine!r}")
    return out


def preset_changes(cls: type, schema_name: str, config_dirs: list[Path]) -> list[tuple[Path, str, list[str]]]:
    """(folder, preset, what it sets away from the schema's defaults) for each preset of the folders (their presets
    build on `schema_name`)."""
    from hydra.core.config_store import ConfigStore

    from rlinf_like.config.schema import hydra_schema

    ConfigStore.instance().store(name=schema_name, node=hydra_schema(cls))
    return [(folder, preset, changed_keys(cls, composed(cls, folder, preset, [])))
            for folder in map(Path, config_dirs) for preset in presets(folder)]


def preset_listing(cls: type, schema_name: str, config_dirs: list[Path]) -> str:
    """Each preset of the folders with what it sets away from the schema's defaults, a line each."""
    return "\n".join(f"{folder.parent.name}/ --config-name {preset}: {' '.join(changes)}"
                     for folder, preset, changes in preset_changes(cls, schema_name, config_dirs))
