"""Small modules with one job each: no module of the package over 400 lines, no function over 60."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rlinf_like"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60


def test_no_module_over_400_lines_and_no_function_over_60():
    long_modules, long_functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            long_modules.append(f"{path.relative_to(PACKAGE)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {lines} lines")
    assert long_modules == [] and long_functions == []
