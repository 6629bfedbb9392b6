"""Sample-weighted means of per-batch metrics, for one record per update."""

from __future__ import annotations

from collections import defaultdict

import torch


class WeightedMeans:
    """Accumulates ``value * weight`` per key; :meth:`means` gives each key's weighted mean."""

    def __init__(self) -> None:
        self._sums: dict[str, float | torch.Tensor] = defaultdict(float)
        self._weights: dict[str, float] = defaultdict(float)

    def add(self, weight: float, **values: float | torch.Tensor) -> None:
        """
        Add one batch's metrics.

        :param weight: the batch's weight (its number of samples)
        :param values: the metrics of that batch: numbers, or scalar tensors (summed where they are, read once by
            :meth:`means`, so a GPU update does not wait for each of them)
        """
        for key, value in values.items():
            self._sums[key] += value * weight
            self._weights[key] += weight

    def means(self) -> dict[str, float]:
        """The weighted mean of every key added so far."""
        return {key: float(self._sums[key]) / self._weights[key] for key in self._sums if self._weights[key] > 0}
