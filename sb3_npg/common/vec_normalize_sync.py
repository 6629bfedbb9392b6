"""``VecNormalize`` statistics combined exactly across ranks, so every rank normalizes with all ranks' samples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sb3_npg.common.distributed import Reducer

#: Guards divisions by a count of zero samples.
MIN_COUNT = 1e-12


@dataclass(frozen=True)
class Moments:
    """Mean, variance and count of a set of samples (as SB3's ``RunningMeanStd`` holds them)."""

    mean: np.ndarray
    var: np.ndarray
    count: float

    @staticmethod
    def empty_like(other: Moments) -> Moments:
        return Moments(np.zeros_like(other.mean), np.zeros_like(other.var), 0.0)

    def merged(self, other: Moments) -> Moments:
        """The moments of both sets together (Chan et al.'s parallel formula)."""
        total = self.count + other.count
        if total <= MIN_COUNT:
            return self
        delta = other.mean - self.mean
        mean = self.mean + delta * other.count / total
        squares = self.var * self.count + other.var * other.count + delta**2 * self.count * other.count / total
        return Moments(mean, squares / total, total)

    def without(self, part: Moments) -> Moments:
        """The moments of this set minus a subset ``part`` of it (the inverse of :meth:`merged`)."""
        count = self.count - part.count
        if count <= MIN_COUNT:
            return Moments(np.zeros_like(self.mean), np.zeros_like(self.var), 0.0)
        mean = (self.count * self.mean - part.count * part.mean) / count
        squares = self.var * self.count - part.var * part.count - (mean - part.mean) ** 2 * part.count * count / self.count
        return Moments(mean, np.maximum(squares / count, 0.0), count)


def running_statistics(vec_normalize: Any) -> dict[str, Any]:
    """
    The ``RunningMeanStd`` objects a ``VecNormalize`` uses, by name (one per key of a Dict observation).

    :param vec_normalize: the wrapper
    :return: ``obs`` (or ``obs/<key>``) when it normalizes observations, ``ret`` when it normalizes rewards
    """
    named: dict[str, Any] = {}
    if vec_normalize.norm_obs:
        observations = vec_normalize.obs_rms
        named = (
            {f"obs/{key}": value for key, value in observations.items()}
            if isinstance(observations, dict)
            else {"obs": observations}
        )
    if vec_normalize.norm_reward:
        named["ret"] = vec_normalize.ret_rms
    return named


def summed_over_ranks(reducer: Reducer, added: Moments) -> Moments:
    """The moments of every rank's ``added`` samples together (count, sum and sum of squares in one collective)."""
    packed = torch.from_numpy(
        np.concatenate([[added.count], added.count * added.mean.ravel(), added.count * (added.var + added.mean**2).ravel()])
    )
    packed = reducer.sum(packed.to(reducer.device)).cpu()
    count = float(packed[0])
    size = added.mean.size
    mean = (packed[1 : 1 + size].numpy() / max(count, MIN_COUNT)).reshape(added.mean.shape)
    second = (packed[1 + size :].numpy() / max(count, MIN_COUNT)).reshape(added.mean.shape)
    return Moments(mean, np.maximum(second - mean**2, 0.0), count)


def combine_normalization(reducer: Reducer, vec_normalize: Any, base: dict[str, Moments]) -> dict[str, Moments]:
    """
    Give every rank the ``VecNormalize`` statistics of all ranks' samples (in place), exactly.

    Each rank's running statistics are ``base`` (the combined statistics after the previous call, the same on
    every rank) merged with what its own environments added since. Those additions are recovered by un-merging
    ``base``, summed over the ranks, and merged back into ``base``. The first call has no base: each rank's
    statistics count whole (a run resumed from saved statistics then counts them once per rank).

    :param reducer: the model's reducer (nothing happens in a single process)
    :param vec_normalize: the ``VecNormalize`` wrapper of this rank's environments
    :param base: what the previous call returned (empty at first)
    :return: the combined statistics, to pass to the next call
    """
    if not reducer.enabled:
        return base
    combined = {}
    for name, stats in running_statistics(vec_normalize).items():
        current = Moments(stats.mean, stats.var, stats.count)
        previous = base.get(name, Moments.empty_like(current))
        total = previous.merged(summed_over_ranks(reducer, current.without(previous)))
        stats.mean, stats.var, stats.count = total.mean.copy(), total.var.copy(), total.count
        combined[name] = total
    return combined
