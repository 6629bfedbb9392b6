"""A lean guard against environments that emit NaN or inf: the first one stops training with a clear error.

It is a callback that our algorithms put first in every ``learn()``: SB3's ``collect_rollouts`` hands each step's
``new_obs`` and ``rewards`` to the callbacks before the policy or the rollout buffer sees them, so the error comes
before any NaN is trained on, and the user's wrapper chain stays as it is (SB3's ``VecCheckNan`` as an extra outer
wrapper would break ``EvalCallback``'s ``VecNormalize`` synchronisation). It also costs less: ``VecCheckNan`` checks
actions and ``dones`` too and builds its report on every call, about eight times the cost per step
(``benchmarks/bench_finite_check.py``). Actions need no check here, since the policy's parameters are checked before
every rollout; integer observations (images) cannot hold NaN and are skipped.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback


def _non_finite_rows(values: np.ndarray) -> list[int]:
    """The environment indices whose entries hold NaN or inf (empty for integer arrays)."""
    if not np.issubdtype(values.dtype, np.floating):
        return []
    finite = np.isfinite(values)
    if finite.all():
        return []
    return sorted({int(index) for index in np.argwhere(~finite.reshape(len(finite), -1))[:, 0]})


def check_finite(observations: Any, rewards: np.ndarray | None, when: str) -> None:
    """
    Raise a ``ValueError`` naming the environment(s), what and when, if observations or rewards hold NaN or inf.

    :param observations: a batch of observations (an array, or a dict of arrays for Dict spaces)
    :param rewards: the batch of rewards, or ``None`` (at reset)
    :param when: ``"reset"`` or ``"step"``
    """
    parts = observations.items() if isinstance(observations, dict) else [("", observations)]
    for key, values in parts:
        rows = _non_finite_rows(np.asarray(values))
        if rows:
            _raise(f"observation{f'[{key!r}]' if key else ''}", rows, when)
    if rewards is not None and (rows := _non_finite_rows(np.asarray(rewards))):
        _raise("reward", rows, when)


def _raise(what: str, rows: list[int], when: str) -> None:
    moment = "at reset" if when == "reset" else "after a step"
    raise ValueError(
        f"Environment {', '.join(map(str, rows))} returned a NaN or inf {what} {moment}; sb3-npg stops rather than "
        "train on it. Fix the environment (or sanitize its output in a wrapper); SB3's "
        "VecCheckNan(env, raise_exception=True) reports the action that led to it."
    )


class FiniteRolloutCheck(BaseCallback):
    """Checks the observation each rollout starts from, and every step's new observations and rewards."""

    def _on_rollout_start(self) -> None:
        check_finite(self.model._last_obs, None, "reset")

    def _on_step(self) -> bool:
        check_finite(self.locals["new_obs"], self.locals["rewards"], "step")
        return True
