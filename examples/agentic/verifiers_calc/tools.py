"""The calculator, as a verifiers MCP toolset (one server per rollout)."""

import ast
import operator

import verifiers.v1 as vf

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.USub: operator.neg}


def calculate(expression: str) -> int:
    """+, -, * over integers; ValueError for anything else."""
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(f"only integers with + - * are supported, got {ast.unparse(node)!r}")
    return value(ast.parse(expression, mode="eval").body)


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None  # the model sees the bare name: calculator

    @vf.tool
    def calculator(self, expression: str) -> str:
        """Evaluate an integer expression such as '722*93'."""
        return str(calculate(expression))


if __name__ == "__main__":
    CalcToolset.run()
