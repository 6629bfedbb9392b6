"""
The two KL conventions: ours sums the KL over action dimensions, sb3-contrib's TRPO averages it.

On a d-dimensional Box (or the d bits of a MultiBinary) sb3-contrib's trust region ``target_kl`` and its
``cg_damping`` are per action dimension: the same step under our summed KL takes both multiplied by d
(docs/guide/sb3_contrib.md). :func:`kl_components` is that d; a schedule is scaled by :class:`ScaledSchedule`.
Loading an sb3-contrib file and ``kl_per_action_dimension=True`` both rest on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces


def kl_components(action_space: spaces.Space) -> int:
    """
    How many per-dimension KLs sb3-contrib averages where we sum them: the dimensions of a Box, the bits of a
    MultiBinary (SB3's ``kl_divergence`` returns one value per dimension there, and sb3-contrib takes their mean).
    SB3's ``kl_divergence`` already sums a MultiDiscrete action's sub-actions into one KL per sample, so there, as for
    Discrete actions, sb3-contrib's KL equals ours: 1.
    """
    if isinstance(action_space, spaces.Box | spaces.MultiBinary):
        return int(np.prod(action_space.shape))
    return 1


class ScaledSchedule:
    """
    A schedule of the remaining progress multiplied by a constant (a class, so that a model holding one saves).

    :param schedule: the schedule to scale
    :param scale: the factor
    """

    def __init__(self, schedule: Callable[[float], float], scale: float):
        self.schedule, self.scale = schedule, scale

    def __call__(self, progress_remaining: float) -> float:
        return self.scale * self.schedule(progress_remaining)

    def __repr__(self) -> str:
        return f"ScaledSchedule({self.schedule!r}, scale={self.scale:g})"


def scaled(value: Any, scale: int) -> Any:
    """``scale * value`` for a number; a :class:`ScaledSchedule` for a schedule."""
    return ScaledSchedule(value, scale) if callable(value) else scale * value
