"""What the schema dataclasses say about themselves: an omegaconf-compatible mirror for hydra, and
every key's default, allowed values, bounds and comment (read from the source) for `--help`.

Comment convention, which `field_comments` reads: a key's comment is the `#` comment at the end of
its line, after any comment-only lines directly above it (for text too long for one line).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize
import types
import typing
from typing import Any

from rlinf_like.config.validate import bounds_text


@functools.cache
def hydra_schema(cls: type) -> type:
    """`cls` as a dataclass omegaconf accepts, to store in hydra's ConfigStore: omegaconf 2.3 rejects
    `Literal`, so a Literal field becomes its values' type here; `structure(cls, cfg)` then checks
    the real schema. Defaults (nested ones included) are the schema's own."""
    hints = typing.get_type_hints(cls)
    default = cls()
    specs = [(f.name, _omegaconf_type(hints[f.name]),
              dataclasses.field(default_factory=functools.partial(_mirror, getattr(default, f.name))))
             for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(cls.__name__, specs, kw_only=True)


def _mirror(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        mirror = hydra_schema(type(value))
        return mirror(**{f.name: _mirror(getattr(value, f.name)) for f in dataclasses.fields(value)})
    return _copy(value)


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _omegaconf_type(tp: Any) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return type(args[0])
    if origin in (typing.Union, types.UnionType):
        return typing.Optional[_omegaconf_type(next(a for a in args if a is not type(None)))] \
            if type(None) in args and len(args) == 2 else tp
    if dataclasses.is_dataclass(tp):
        return hydra_schema(tp)
    if origin is dict and args[1:] == (Any,):
        # Any in the mirror only, so that `cli.normalize_override` can replace a whole dict (null, then the new
        # one): hydra merges a dict override into the old one, and the struct flag refuses its new keys.
        # `structure` checks the real type (a null is refused).
        return Any
    return tp


def field_comments(cls: type) -> dict[str, str]:
    """Each field's comment from the source of `cls` and its dataclass bases (convention above)."""
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            comments.update(_class_comments(klass))
    return comments


def _class_comments(cls: type) -> dict[str, str]:
    source = textwrap.dedent(inspect.getsource(cls))
    by_line: dict[int, tuple[str, bool]] = {}  # line -> (text, the line holds only the comment)
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            by_line[row] = (tok.string.lstrip("#").strip(), not lines[row - 1][:col].strip())
    body = ast.parse(source).body[0].body
    out = {}
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above, row = [], node.lineno - 1
            while row in by_line and by_line[row][1]:
                above.insert(0, by_line[row][0])
                row -= 1
            trailing = [by_line[r][0] for r in range(node.lineno, node.end_lineno + 1)
                        if r in by_line and not by_line[r][1]]
            out[node.target.id] = " ".join(above + trailing)
    return out


def describe(cls: type, prefix: str = "", values: Any = None) -> list[tuple[str, str, str]]:
    """(key, value and allowed values, comment) for every leaf key of schema `cls`, in order: the schema's defaults,
    or those of `values` (an instance: a preset composed with overrides), each marked where it differs from the
    schema's default."""
    rows = []
    hints, comments, default = typing.get_type_hints(cls), field_comments(cls), cls()
    for f in dataclasses.fields(cls):
        key, value, tp = f"{prefix}{f.name}", getattr(default, f.name), hints[f.name]
        if dataclasses.is_dataclass(value):
            rows.append((key, "", comments[f.name]))
            rows += describe(type(value), key + ".", None if values is None else getattr(values, f.name))
            continue
        spec = f"= {_yaml(value)}"
        if values is not None and getattr(values, f.name) != value:
            spec = f"= {_yaml(getattr(values, f.name))}  (set here; schema default {_yaml(value)})"
        choices = _literal_values(tp)
        if choices:
            spec += f"  one of {choices}"
        if bounds_text(f):
            spec += f"  {bounds_text(f)}"
        rows.append((key, spec, comments[f.name]))
    return rows


def _literal_values(tp: Any) -> list:
    if typing.get_origin(tp) is typing.Literal:
        return list(typing.get_args(tp))
    return [v for a in typing.get_args(tp) for v in _literal_values(a)]


def _yaml(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)


def help_text(cls: type, title: str, values: Any = None) -> str:
    """Every key with its value (the schema's default, or `values`'), allowed values and comment: what `--help`
    prints."""
    lines = [title, ""]
    for key, spec, comment in describe(cls, values=values):
        if not spec:  # a section
            lines += ["", f"{key}:  {comment}".rstrip()]
            continue
        lines.append(f"  {key} {spec}")
        if comment:
            lines.append(f"      {comment}")
    return "\n".join(lines) + "\n"
