"""The `calculator` tool: arithmetic on int and float literals, evaluated by walking the parsed expression.

Hand-written over `ast` rather than a library: the grammar is five node types, every operator is checked before
it runs (a huge power or product is refused before it is computed), and nothing but numbers can be reached
(simpleeval, for one, allows names and function calls unless configured away, and is not installed here).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from rlinf_like.envs.tools.base import Tool, ToolError

MAX_EXPRESSION_CHARS = 500  # parsing is recursive: a bound on length bounds the nesting too
MAX_INT_BITS = 3400  # about 1000 decimal digits
ALLOWED = "numbers and + - * / // % ** ( )"

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_SYNTAX = {ast.Call: "a function call", ast.Attribute: "an attribute", ast.Subscript: "a subscript",
           ast.Compare: "a comparison", ast.BoolOp: "and/or"}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; ToolError, with a short reason, for anything else."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ToolError(f"invalid expression; use {ALLOWED}") from None
    try:
        value = _value(tree.body)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except OverflowError:
        raise ToolError("the result is too large") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("the result is too large")
    return value


def format_number(value: int | float) -> str:
    """Ints exactly; floats to 12 significant digits (0.1 + 0.2 -> 0.3, 10 / 4 -> 2.5, 10 / 2 -> 5)."""
    return str(value) if isinstance(value, int) else f"{value:.12g}"


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # not bool, complex or str
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        _check_size(node.op, left, right)
        return _BINARY[type(node.op)](left, right)
    raise ToolError(f"only {ALLOWED} are allowed, not {_describe(node)}")


def _check_size(op: ast.operator, left: int | float, right: int | float) -> None:
    """Refuses an int result over MAX_INT_BITS before computing it (9**9**9 would take minutes)."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return  # float arithmetic overflows to an error or inf, checked after
    if isinstance(op, ast.Pow) and right > 0 and abs(left) > 1:
        bits = right * math.log2(abs(left))
    elif isinstance(op, ast.Mult):
        bits = left.bit_length() + right.bit_length()
    else:
        return
    if bits > MAX_INT_BITS:
        raise ToolError(f"the result would have more than {int(MAX_INT_BITS * math.log10(2))} digits")


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Constant):
        return f"the constant {node.value!r}"
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        return f"the operator {type(node.op).__name__}" + (" (use ** for powers)" if isinstance(node.op, ast.BitXor)
                                                             else "")
    return _SYNTAX.get(type(node), f"Python syntax ({type(node).__name__})")


class CalculatorTool(Tool):
    name = "calculator"
    description = f"Evaluate an arithmetic expression exactly, e.g. (3 + 4) * 12 / 7. Allowed: {ALLOWED}."
    parameters = {"type": "object",
                  "properties": {"expression": {"type": "string", "description": "the expression to evaluate"}},
                  "required": ["expression"]}

    def run(self, arguments: dict[str, Any]) -> str:
        return format_number(evaluate(self.string_argument(arguments, "expression")))
