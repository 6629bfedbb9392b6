"""The package stays readable: small modules, short functions (docs/design.md, "Code shape")."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "sb3_npg"
MAX_MODULE_LINES = 450
MAX_BODY_LINES = 60
MODULES = sorted(PACKAGE.rglob("*.py"))


def _body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's body, without its signature and docstring."""
    body = function.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    if not body:
        return 0
    return (body[-1].end_lineno or body[-1].lineno) - body[0].lineno + 1


@pytest.mark.parametrize("module", MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_modules_and_functions_are_small(module):
    source = module.read_text(encoding="utf-8")
    assert len(source.splitlines()) <= MAX_MODULE_LINES
    long = {
        node.name: _body_lines(node)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _body_lines(node) > MAX_BODY_LINES
    }
    assert not long, f"function bodies over {MAX_BODY_LINES} lines: {long}"


#: A path that leaves the repository (``../name``): the package's notes live in its own ``docs/``.
OUTSIDE_PATH = re.compile(r"\.\./\w")


def test_the_package_never_points_outside_the_repository():
    for module in MODULES:
        assert not OUTSIDE_PATH.search(module.read_text(encoding="utf-8")), module
