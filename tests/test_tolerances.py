"""
The guard of ``tests/float_comparisons.py``'s rule: no tolerance set from one machine's floats lands.

Every literal relative or absolute tolerance below :data:`~tests.float_comparisons.FLOAT32_AMPLIFIED_FLOOR` in the
tests (a ``rtol=``, ``atol=``, ``rel=`` or ``abs=`` argument, or a module constant whose name holds ``TOL``) must say
why it holds on every CPU, in a comment on its line or on the comment lines just above it that starts with
``portable:`` (for example ``# portable: float64, one dot product of 6 terms``). Tolerances computed by the helper
(:data:`~tests.float_comparisons.AMPLIFIED_RTOL`, :func:`~tests.float_comparisons.reduction_tolerance`) need none.
"""

from __future__ import annotations

import ast
import tokenize
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.float_comparisons import FLOAT32_AMPLIFIED_FLOOR

TESTS = Path(__file__).parent
#: The keyword arguments that carry a tolerance (torch's and numpy's allclose, assert_close, pytest.approx, isclose).
TOLERANCE_KEYWORDS = frozenset({"rtol", "atol", "rel", "abs"})
#: The comment that justifies a small tolerance.
MARKER = "portable:"
#: How many lines above a tolerance its justifying comment may start (a comment block over a long call).
COMMENT_REACH = 3


class Site(NamedTuple):
    path: Path
    line: int
    value: float


def _literal(node: ast.expr) -> float | None:
    """The smallest positive numeric literal in ``node`` (``1e-5``, ``1e-5 * scale``), else ``None``."""
    values = [
        float(each.value)
        for each in ast.walk(node)
        if isinstance(each, ast.Constant) and isinstance(each.value, int | float) and not isinstance(each.value, bool)
    ]
    positive = [value for value in values if value > 0]
    return min(positive) if positive else None


def small_tolerances(source: str, path: Path) -> list[Site]:
    """The literal tolerances below the floor in ``source``: keyword arguments and module constants."""
    sites = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in TOLERANCE_KEYWORDS:
            value, line = _literal(node.value), node.value.lineno
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [target.id for target in targets if isinstance(target, ast.Name)]
            if not any("TOL" in name for name in names) or node.value is None:
                continue
            value, line = _literal(node.value), node.lineno
        else:
            continue
        if value is not None and value < FLOAT32_AMPLIFIED_FLOOR:
            sites.append(Site(path, line, value))
    return sites


def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment on that line."""
    lines = iter(source.splitlines(keepends=True))
    return {
        token.start[0]: token.string
        for token in tokenize.generate_tokens(lambda: next(lines, ""))
        if token.type == tokenize.COMMENT
    }


def justified(site: Site, source: str) -> bool:
    """Whether a ``portable:`` comment sits on the site's line or starts at most :data:`COMMENT_REACH` lines above."""
    comments = _comments(source)
    return any(MARKER in comments.get(line, "") for line in range(site.line - COMMENT_REACH, site.line + 1))


def _test_sources() -> list[Path]:
    return sorted(path for path in TESTS.rglob("*.py") if path.name != Path(__file__).name)


@pytest.mark.parametrize("path", _test_sources(), ids=lambda path: str(path.relative_to(TESTS)))
def test_every_small_tolerance_says_why_it_holds_on_every_cpu(path):
    source = path.read_text()
    unjustified = [site for site in small_tolerances(source, path) if not justified(site, source)]
    assert not unjustified, "\n".join(
        f"{site.path.name}:{site.line}: a tolerance of {site.value:g} below {FLOAT32_AMPLIFIED_FLOOR:g} without a "
        f"'# {MARKER} <why>' comment: compare in float64, derive it (tests/float_comparisons.py) or say why it holds"
        for site in unjustified
    )


def test_the_guard_finds_an_unjustified_tolerance_and_accepts_a_justified_one():
    path = Path("example.py")
    bare = "import torch\nRTOL = 1e-6\nassert torch.allclose(a, b, rtol=1e-5, atol=2.0 * 1e-7)\nok = approx(x, rel=1e-3)\n"
    assert [(site.line, site.value) for site in small_tolerances(bare, path)] == [(2, 1e-6), (3, 1e-5), (3, 1e-7)]
    assert not any(justified(site, bare) for site in small_tolerances(bare, path))
    commented = (
        "# portable: float64, a sum of 3 terms\nassert close(a, b,\n    rtol=1e-12)\nx = f(abs=1e-9)  # portable: exact\n"
    )
    assert all(justified(site, commented) for site in small_tolerances(commented, path))
    far = "# portable: float64\n\n\n\n\nassert close(a, b, rtol=1e-12)\n"
    assert not any(justified(site, far) for site in small_tolerances(far, path))
