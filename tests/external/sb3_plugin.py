"""A pytest plugin that adds NPG and TRPO to Stable-Baselines3's own tests wherever they parametrize over PPO or A2C.

Loaded with ``-p tests.external.sb3_plugin`` (``make test-sb3`` runs SB3's tests from its source distribution):
every ``@pytest.mark.parametrize`` whose values include the classes ``PPO`` or ``A2C`` gains ``NPG`` and ``TRPO``
(ids ``NPG`` and ``TRPO``, so ``-k "NPG or TRPO"`` selects them), and our algorithms must pass what SB3's do.

SB3's tests choose their settings by class (``kwargs = {} if model_class == A2C else dict(n_epochs=1)``,
``if model_class in [PPO, A2C]: ...``, dicts keyed by class): the classes added here compare and hash as ``A2C``,
the on-policy algorithm whose options ours share, so each test gives them A2C's settings. Nothing else differs from
``sb3_npg.NPG`` and ``sb3_npg.TRPO``.

Wherever a test parametrizes over ``PPO``, NPG and TRPO are also added the way users reuse PPO's tests for an
algorithm of their own (ids ``NPG-as-PPO`` and ``TRPO-as-PPO``): as thin subclasses that take PPO's settings, drop
the keywords only PPO has (``n_epochs``, ``clip_range``...) and forward every other argument with
``*args, **kwargs``. They guard what an SB3 user's subclass needs: keyword forwarding, and ``load`` through SB3's
``cls(policy=..., env=..., device=..., _init_setup_model=False)``.
"""

from __future__ import annotations

from typing import Any

import pytest
from stable_baselines3 import A2C, PPO

from sb3_npg import NPG, TRPO

#: Tests of what A2C learns within a budget sized for its 5-step updates (2000 and 500 steps): ours, with 2048 steps
#: per update, makes one update there. They are skipped for ours, with this reason.
BUDGETED_FOR_A2C = {
    "test_continuous": "reward threshold after 2000 steps, sized for A2C's 400 updates of 5 steps",
    "test_infinite_horizon": "value after 500 steps of bootstrapping, sized for A2C's 100 updates of 5 steps",
}


def _settings_of(algorithm: type) -> type:
    """A metaclass whose classes are equal to, and hashed as, ``algorithm`` where a test picks settings by class."""

    class SettingsOf(type(NPG)):  # type: ignore[misc]
        def __eq__(cls, other: object) -> bool:
            return other is algorithm or type.__eq__(cls, other)

        def __hash__(cls) -> int:
            return hash(algorithm)

    return SettingsOf


_SettingsOfA2C, _SettingsOfPPO = _settings_of(A2C), _settings_of(PPO)


class NPGTested(NPG, metaclass=_SettingsOfA2C):
    """``sb3_npg.NPG`` under SB3's tests."""


class TRPOTested(TRPO, metaclass=_SettingsOfA2C):
    """``sb3_npg.TRPO`` under SB3's tests."""


class NPGAsPPO(NPG, metaclass=_SettingsOfPPO):
    """A user's thin subclass of ``sb3_npg.NPG`` that runs PPO's tests: PPO's own keywords dropped, the rest
    forwarded."""

    def __init__(self, *args: Any, n_epochs: Any = None, clip_range: Any = None, clip_range_vf: Any = None,
                 ent_coef: Any = None, vf_coef: Any = None, **kwargs: Any):  # fmt: skip
        super().__init__(*args, **kwargs)


class TRPOAsPPO(TRPO, metaclass=_SettingsOfPPO):
    """A user's thin subclass of ``sb3_npg.TRPO`` that runs PPO's tests: PPO's own keywords dropped, the rest
    forwarded."""

    def __init__(self, *args: Any, n_epochs: Any = None, clip_range: Any = None, clip_range_vf: Any = None,
                 ent_coef: Any = None, vf_coef: Any = None, **kwargs: Any):  # fmt: skip
        super().__init__(*args, **kwargs)


NPGTested.__name__, TRPOTested.__name__ = "NPG", "TRPO"
#: What each algorithm of SB3 gets beside it in the parametrize marks that list it, and whether also in those that list
#: it alone (a test of PPO alone tests PPO's own options, ``clip_range`` and its schedule).
ADDED = {
    A2C: ((pytest.param(NPGTested, id="NPG"), pytest.param(TRPOTested, id="TRPO")), True),
    PPO: ((pytest.param(NPGAsPPO, id="NPG-as-PPO"), pytest.param(TRPOAsPPO, id="TRPO-as-PPO")), False),
}


def _with_ours(mark: pytest.Mark) -> pytest.Mark:
    """A parametrize mark with NPG and TRPO added beside A2C, and beside PPO listed with other algorithms, when its
    values include them (and no explicit ids)."""
    if mark.name != "parametrize" or "ids" in mark.kwargs or len(mark.args) < 2:
        return mark
    names, values = mark.args[0], list(mark.args[1])
    added = [
        param
        for algorithm, (params, alone) in ADDED.items()
        if any(value is algorithm for value in values) and (alone or len(values) > 1)
        for param in params
    ]
    if not added:
        return mark
    return pytest.mark.parametrize(names, [*values, *added], *mark.args[2:], **mark.kwargs).mark


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
