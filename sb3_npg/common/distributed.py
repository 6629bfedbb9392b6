"""Data-parallel updates on ``torch.distributed``: the :class:`Reducer`, through which every cross-rank message goes.

Every quantity an update derives from the data is a mean over samples: the advantage statistics, the surrogate and
its gradient, each Fisher-vector product, the line search's surrogate and KL, the critic's loss gradient. Each rank
computes it on its own samples, and :meth:`Reducer.mean` combines the ranks' values weighted by their sample counts,
which gives exactly the mean over all samples (up to float rounding). Conjugate gradient and the line search then see
the same numbers on every rank and take the same step, as OpenAI baselines' ``trpo_mpi`` does with MPI.

A :class:`Reducer` for a single process (no process group) returns its inputs unchanged, so the single-process path
runs no collective at all. A new quantity measured on the data must go through the reducer too, or the ranks drift
apart (the periodic :meth:`Reducer.check_same` then stops the run).
"""

from __future__ import annotations

import atexit
import datetime
import importlib
import os
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from sb3_npg.common.validation import ConfigurationError

#: How long a collective may wait for the other ranks before the run stops with an error (seconds).
DEFAULT_TIMEOUT_SECONDS = 600.0
#: Parameters are compared across ranks every this many updates (a cheap checksum).
CHECKSUM_INTERVAL = 10
#: The largest relative difference of the checksums tolerated across ranks (all ranks do the same arithmetic).
CHECKSUM_TOLERANCE = 0.0
#: The rank whose weights every rank starts from, and which logs, evaluates and saves.
MAIN_RANK = 0
#: Imported before the process group is created: a group created first outlives ``destroy_process_group`` in torch 2.13.
TORCH_MODULE_THAT_PINS_THE_GROUP = "torch._inductor"

#: The process group :func:`init_process_group` created (a weak reference: it must not keep a destroyed group alive).
_created_group: weakref.ref[Any] | None = None
#: Whether :func:`leave_process_group` is registered to run at the interpreter's exit (once per process).
_leaves_at_exit = False


class DistributedError(RuntimeError):
    """A rank is gone or stalled, or the ranks' parameters differ."""


def launched_by_torchrun() -> bool:
    """Whether this process was started by ``torchrun`` (which describes the process group in the environment)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


@dataclass(frozen=True)
class Collective:
    """One collective a :class:`Reducer` ran, as reported to :attr:`Reducer.on_collective`.

    :param name: the ``torch.distributed`` function (``all_reduce``, ``broadcast``)
    :param payload_bytes: the size of the tensor it exchanged
    :param seconds: how long it took on this rank
    """

    name: str
    payload_bytes: int
    seconds: float


def init_process_group(timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
    """
    Join the process group ``torchrun`` describes in the environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...),
    unless one is already initialized: NCCL when CUDA is available, gloo on CPU. The group created here is destroyed
    at the interpreter's exit by :func:`leave_process_group` unless the script destroyed it first; a group that was
    already initialized (the script's own) is left to the script.

    :param timeout_seconds: how long a collective waits for the other ranks
    """
    if dist.is_initialized():
        return  # the script created the group: it decides when to destroy it (it may use it after the model)
    if not launched_by_torchrun():
        raise DistributedError(
            "distributed=True needs a process group: launch with torchrun (which sets RANK and WORLD_SIZE), or call "
            "torch.distributed.init_process_group before building the model"
        )
    # When torch._inductor is first imported after the group exists (building any optimizer imports it), the group
    # survives destroy_process_group: its gloo threads run on into the interpreter's exit, where one that drops the
    # last reference to a tensor aborts the process ("terminate called without an active exception"). Imported
    # first, the group is freed and its threads joined by destroy_process_group.
    importlib.import_module(TORCH_MODULE_THAT_PINS_THE_GROUP)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_seconds))
    _leave_at_exit()


def _leave_at_exit() -> None:
    """Remember the group just created, and register :func:`leave_process_group` with :mod:`atexit` (once)."""
    global _created_group, _leaves_at_exit
    _created_group = weakref.ref(dist.group.WORLD)
    if not _leaves_at_exit:
        atexit.register(leave_process_group)
        _leaves_at_exit = True


def leave_process_group() -> None:
    """
    Destroy the process group :func:`init_process_group` created, if it is still the default group; otherwise do
    nothing (a group the script created itself is the script's to destroy).

    Registered with :mod:`atexit` by :func:`init_process_group`, so it runs however the script ends: at its end, after
    an uncaught exception (a refused configuration included) or ``sys.exit``; not after ``os._exit`` or a signal.
    A group left to the interpreter's finalization keeps its gloo threads running there, and one that drops the last
    reference to a tensor then aborts the process ("terminate called without an active exception", SIGABRT), which
    fails the whole torchrun job (``benchmarks/distributed_exit.py``). Destroying the group is local to the process (no
    collective): it returns at once when the other ranks have died or stalled (measured on gloo).
    """
    global _created_group
    created = _created_group() if _created_group is not None else None
    _created_group = None
    if created is not None and dist.is_available() and dist.is_initialized() and dist.group.WORLD is created:
        dist.destroy_process_group()


class Reducer:
    """
    Sample-weighted means across the ranks of the default process group (the identity without one).

    :param enabled: whether to reduce across ranks; requires an initialized process group
    """

    def __init__(self, enabled: bool = False):
        self.enabled = enabled and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.rank = dist.get_rank() if self.enabled else MAIN_RANK
        self.world_size = dist.get_world_size() if self.enabled else 1
        #: Where tensors built from numpy go before a collective (NCCL reduces CUDA tensors only).
        self.device = torch.device("cpu")
        #: Called after every collective with what it exchanged (for benchmarks and monitoring); ``None``: nothing.
        self.on_collective: Callable[[Collective], None] | None = None

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
        self._call(dist.all_reduce, packed)
        return (packed[:-1] / packed[-1]).view_as(value)

    def averaged(
        self, function: Callable[[torch.Tensor], torch.Tensor], weight: float
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """
        ``function`` with its result averaged over all ranks by :meth:`mean` (``function`` itself in one process).

        :param function: a per-rank mean over this rank's samples, such as a Fisher-vector product
        :param weight: this rank's number of samples
        """
        if not self.enabled:
            return function
        return lambda value: self.mean(function(value), weight)

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """The sum of ``value`` over all ranks (a new tensor)."""
        if not self.enabled:
            return value
        total = value.detach().clone()
        self._call(dist.all_reduce, total)
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

    def all_true(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank (``flag`` itself in one process)."""
        if not self.enabled:
            return flag
        agreed = torch.tensor([float(flag)], device=self.device)
        self._call(dist.all_reduce, agreed, dist.ReduceOp.MIN)
        return bool(agreed.item())

    def check_agree(self, quantities: Mapping[str, int]) -> None:
        """
        Raise a :class:`~sb3_npg.common.validation.ConfigurationError` on every rank when the ranks' ``quantities``
        differ: they decide which collectives an update runs, and ranks that run different ones pair them wrongly.

        :param quantities: name -> this rank's value
        """
        if not self.enabled:
            return
        values = torch.tensor([float(value) for value in quantities.values()], dtype=torch.float64, device=self.device)
        low, high = values.clone(), values.clone()
        self._call(dist.all_reduce, low, dist.ReduceOp.MIN)
        self._call(dist.all_reduce, high, dist.ReduceOp.MAX)
        differing = [
            f"{name} (from {lowest:g} to {highest:g}; rank {self.rank}: {quantities[name]})"
            for name, lowest, highest in zip(quantities, low.tolist(), high.tolist(), strict=True)
            if lowest != highest
        ]
        if differing:
            raise ConfigurationError(
                f"The ranks of this distributed run differ in {'; '.join(differing)}: every rank must collect the same "
                "number of samples per update (n_steps * n_envs) and use the same batch and epoch options"
            )

    def broadcast_(self, tensors: list[torch.Tensor]) -> None:
        """Overwrite ``tensors`` in place with the main rank's values."""
        if not self.enabled:
            return
        with torch.no_grad():
            for tensor in tensors:
                self._call(dist.broadcast, tensor, MAIN_RANK)

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

    def _call(self, collective: Callable[..., Any], tensor: torch.Tensor, *args: Any) -> None:
        start = time.perf_counter()
        try:
            collective(tensor, *args)
        except RuntimeError as error:  # gloo and NCCL raise RuntimeError on a timeout or a lost peer
            # Without torch's frames: they hold the process group, which an uncaught error (kept in sys.last_exc)
            # would keep alive past destroy_process_group, its gloo threads running into the interpreter's exit.
            raise DistributedError(
                f"Rank {self.rank}: a collective failed, so another rank has died or stalled ({error}). Restart the "
                "run from the last checkpoint written by rank 0."
            ) from error.with_traceback(None)
        if self.on_collective is not None:
            payload = tensor.numel() * tensor.element_size()
            self.on_collective(Collective(collective.__name__, payload, time.perf_counter() - start))
