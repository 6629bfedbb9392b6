"""Data-parallel updates on ``torch.distributed``: sample-weighted means across ranks, so every rank takes one step.

Every quantity an update derives from the data is a mean over samples: the advantage statistics, the surrogate and
its gradient, each Fisher-vector product, the line search's surrogate and KL, the critic's loss gradient. Each rank
computes it on its own samples, and :meth:`Reducer.mean` combines the ranks' values weighted by their sample counts,
which gives exactly the mean over all samples (up to float rounding). Conjugate gradient and the line search then see
the same numbers on every rank and take the same step, as OpenAI baselines' ``trpo_mpi`` does with MPI.

A :class:`Reducer` for a single process (no process group) returns its inputs unchanged, so the single-process path
runs no collective at all.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

#: How long a collective may wait for the other ranks before the run stops with an error (seconds).
DEFAULT_TIMEOUT_SECONDS = 600.0
#: Parameters are compared across ranks every this many updates (a cheap checksum).
CHECKSUM_INTERVAL = 10
#: The largest relative difference of the checksums tolerated across ranks (all ranks do the same arithmetic).
CHECKSUM_TOLERANCE = 0.0


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


def _running_statistics(vec_normalize: Any) -> dict[str, Any]:
    """The ``RunningMeanStd`` objects of a ``VecNormalize``, by name (one per key of a Dict observation)."""
    observations = vec_normalize.obs_rms
    named = (
        {f"obs/{key}": value for key, value in observations.items()}
        if isinstance(observations, dict)
        else {"obs": observations}
    )
    return {**named, "ret": vec_normalize.ret_rms}


class DistributedError(RuntimeError):
    """A rank is gone or stalled, or the ranks' parameters differ."""


def init_process_group(timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
    """
    Join the process group ``torchrun`` describes in the environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...),
    unless one is already initialized: NCCL when CUDA is available, gloo on CPU.

    :param timeout_seconds: how long a collective waits for the other ranks
    """
    if dist.is_initialized():
        return
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise DistributedError(
            "distributed=True needs a process group: launch with torchrun (which sets RANK and WORLD_SIZE), or call "
            "torch.distributed.init_process_group before building the model"
        )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_seconds))


class Reducer:
    """
    Sample-weighted means across the ranks of the default process group (the identity without one).

    :param enabled: whether to reduce across ranks; requires an initialized process group
    """

    def __init__(self, enabled: bool = False):
        self.enabled = enabled and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.rank = dist.get_rank() if self.enabled else 0
        self.world_size = dist.get_world_size() if self.enabled else 1
        #: Where tensors built from numpy go before a collective (NCCL reduces CUDA tensors only).
        self.device = torch.device("cpu")

    def mean(self, value: torch.Tensor, weight: float) -> torch.Tensor:
        """
        The mean of ``value`` over all ranks, each rank's value weighted by ``weight`` (its number of samples).

        :param value: this rank's mean over its own samples (any shape)
        :param weight: this rank's number of samples
        :return: the mean over all ranks' samples, the same on every rank
        """
        if not self.enabled:
            return value
        packed = torch.cat([value.detach().reshape(-1) * weight, value.new_tensor([weight])])
        self._all_reduce(packed)
        return (packed[:-1] / packed[-1]).view_as(value)

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """The sum of ``value`` over all ranks (a new tensor)."""
        if not self.enabled:
            return value
        total = value.detach().clone()
        self._all_reduce(total)
        return total

    def mean_gradients(self, params: list[torch.nn.Parameter], weight: float, loss: torch.Tensor) -> torch.Tensor:
        """
        Replace each parameter's ``.grad`` by its sample-weighted mean over all ranks, in one collective that also
        averages ``loss`` (one message per critic minibatch, not two).

        :param params: the parameters whose gradients to average
        :param weight: this rank's number of samples
        :param loss: this rank's loss (a scalar)
        :return: the loss averaged over all ranks' samples
        """
        if not self.enabled:
            return loss
        grads = [param.grad if param.grad is not None else torch.zeros_like(param) for param in params]
        flat = self.mean(torch.cat([*(grad.reshape(-1) for grad in grads), loss.detach().reshape(1)]), weight)
        offset = 0
        for param, grad in zip(params, grads, strict=True):
            param.grad = flat[offset : offset + grad.numel()].view_as(grad).clone()
            offset += grad.numel()
        return flat[-1]

    def broadcast_(self, tensors: list[torch.Tensor]) -> None:
        """Overwrite ``tensors`` in place with rank 0's values."""
        if not self.enabled:
            return
        with torch.no_grad():
            for tensor in tensors:
                self._call(dist.broadcast, tensor, 0)

    def check_same(self, params: list[torch.nn.Parameter], what: str) -> None:
        """Raise :class:`DistributedError` when the ranks' ``params`` differ (a sum checksum, compared by min/max)."""
        if not self.enabled:
            return
        with torch.no_grad():
            checksum = torch.stack([param.double().sum() for param in params]).sum().reshape(1)
        low, high = checksum.clone(), checksum.clone()
        self._call(dist.all_reduce, low, dist.ReduceOp.MIN)
        self._call(dist.all_reduce, high, dist.ReduceOp.MAX)
        if float(high - low) > CHECKSUM_TOLERANCE * max(abs(float(high)), 1.0):
            raise DistributedError(
                f"The ranks' {what} have diverged (checksums from {float(low)!r} to {float(high)!r}): every rank must "
                "run the same sb3-npg, torch and configuration; restart from the last checkpoint"
            )

    def combine_normalization(self, vec_normalize: Any, base: dict[str, Moments]) -> dict[str, Moments]:
        """
        Give every rank the ``VecNormalize`` statistics of all ranks' samples (in place), exactly.

        Each rank's running statistics are ``base`` (the combined statistics after the previous call, the same on
        every rank) merged with what its own environments added since. Those additions are recovered by un-merging
        ``base``, summed over the ranks, and merged back into ``base``. The first call has no base: each rank's
        statistics count whole (a run resumed from saved statistics then counts them once per rank).

        :param vec_normalize: the ``VecNormalize`` wrapper of this rank's environments
        :param base: what the previous call returned (empty at first)
        :return: the combined statistics, to pass to the next call
        """
        if not self.enabled:
            return base
        combined = {}
        for name, stats in _running_statistics(vec_normalize).items():
            current = Moments(stats.mean, stats.var, stats.count)
            added = current.without(base.get(name, Moments.empty_like(current)))
            packed = torch.from_numpy(
                np.concatenate(
                    [[added.count], added.count * added.mean.ravel(), added.count * (added.var + added.mean**2).ravel()]
                )
            )
            packed = packed.to(self.device)
            self._all_reduce(packed)
            packed = packed.cpu()
            count = float(packed[0])
            size = added.mean.size
            mean = (packed[1 : 1 + size].numpy() / max(count, MIN_COUNT)).reshape(added.mean.shape)
            second = (packed[1 + size :].numpy() / max(count, MIN_COUNT)).reshape(added.mean.shape)
            total = base.get(name, Moments.empty_like(current)).merged(Moments(mean, np.maximum(second - mean**2, 0.0), count))
            stats.mean, stats.var, stats.count = total.mean.copy(), total.var.copy(), total.count
            combined[name] = total
        return combined

    def _all_reduce(self, tensor: torch.Tensor) -> None:
        self._call(dist.all_reduce, tensor)

    def _call(self, collective: Callable[..., Any], *args: Any) -> None:
        try:
            collective(*args)
        except RuntimeError as error:  # gloo and NCCL raise RuntimeError on a timeout or a lost peer
            raise DistributedError(
                f"Rank {self.rank}: a collective failed, so another rank has died or stalled ({error}). Restart the "
                "run from the last checkpoint written by rank 0."
            ) from error
