"""ACKTR's K-FAC state: running curvature saved with the policy, and the solver of its actor.

:class:`KfacStatistics` keeps a plan's running K-FAC curvature (each layer's ``A`` and ``G``, each exact block) as
buffers of a module attached to the policy, so SB3's ``policy.pth`` carries them and a loaded model continues exactly:
with ``kfac_update > 1`` the curvature the current inverse was computed from is kept too, and the inverse is
recomputed from it after loading. :class:`RunningKroneckerSolver` is ACKTR's :class:`~sb3_npg.common.solvers.FisherSolver`:
it averages each step's true-Fisher factors in and returns K-FAC's direction with its curvature under the undamped
K-FAC Fisher, ``d^T F_hat d``, which scales the step (the paper's KL clip), or with ``kfac_clip_curvature="damped"``
its curvature under the damped one, ``g^T d`` (baselines' clip: :func:`clip_curvature`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from sb3_npg.common.batches import PolicyInputs
from sb3_npg.common.kfac import FACTORED_DAMPING, KroneckerFactors
from sb3_npg.common.kfac_layers import factor_sizes
from sb3_npg.common.kfac_policy import BatchCurvature, KfacCurvature, KfacPlan, kfac_natural_inverse, kfac_product
from sb3_npg.common.natural_gradient import MatVec
from sb3_npg.common.solvers import FisherSolver, NaturalDirection

#: The two copies of the curvature a :class:`KfacStatistics` keeps: the running averages, and the inverse's source.
RUNNING, INVERTED = "running", "inverted"
#: The KL clip's curvature of a direction ``d``: ``d^T F_hat d`` under the undamped running K-FAC Fisher (the paper's).
UNDAMPED_CURVATURE = "undamped"
#: ``g^T d = d^T (F_hat damped) d``, under the damped Fisher the direction was solved with (OpenAI baselines').
DAMPED_CURVATURE = "damped"
#: ``kfac_clip_curvature`` options.
CLIP_CURVATURES = (UNDAMPED_CURVATURE, DAMPED_CURVATURE)


@dataclass(frozen=True)
class KfacSettings:
    """
    How running K-FAC curvature is kept and inverted.

    :param damping: the Tikhonov damping of the inverse, > 0 (split between the factors by the pi-correction)
    :param decay: the running averages' decay, in ``[0, 1)``: ``F <- decay F + (1 - decay) F_batch``
    :param update_interval: recompute the inverse every this many updates of the averages (``kfac_update``)
    :param damping_mode: how the damping enters each layer's inverse, one of :data:`~sb3_npg.common.kfac.DAMPING_MODES`
        (``kfac_damping_mode``)
    """

    damping: float
    decay: float
    update_interval: int
    damping_mode: str = FACTORED_DAMPING
    #: the curvature the KL clip scales a direction by, one of :data:`CLIP_CURVATURES` (``kfac_clip_curvature``)
    clip_curvature: str = UNDAMPED_CURVATURE


class KfacStatistics(nn.Module):
    """
    A plan's running K-FAC curvature as buffers: ``running_input_<i>`` / ``running_output_<i>`` (layer ``i``'s ``A``
    and ``G``), ``running_block_<j>`` (exact block ``j``), the same under ``inverted_`` for the curvature the inverse
    was last computed from, ``updates`` (batches averaged in) and ``inverted_at`` (``updates`` at that inversion, 0
    before the first).

    :param plan: the blocks whose curvature it keeps
    """

    updates: torch.Tensor
    inverted_at: torch.Tensor

    def __init__(self, plan: KfacPlan):
        super().__init__()
        self.n_layers, self.n_blocks = len(plan.layers), len(plan.blocks)
        device = plan.order.device
        for prefix in (RUNNING, INVERTED):
            for index, layer in enumerate(plan.layers):
                input_size, output_size = factor_sizes(layer)
                self.register_buffer(f"{prefix}_input_{index}", torch.zeros(input_size, input_size, device=device))
                self.register_buffer(f"{prefix}_output_{index}", torch.zeros(output_size, output_size, device=device))
            for index, block in enumerate(plan.blocks):
                size = block.parameter.numel()
                self.register_buffer(f"{prefix}_block_{index}", torch.zeros(size, size, device=device))
        self.register_buffer("updates", torch.zeros((), dtype=torch.long, device=device))
        self.register_buffer("inverted_at", torch.zeros((), dtype=torch.long, device=device))
        self._inverse: MatVec | None = None
        self._inverse_damping: tuple[float, str] | None = None
        # Statistics loaded into a live model (``set_parameters``) must not meet an inverse of the old ones.
        self.register_load_state_dict_post_hook(lambda module, incompatible_keys: module.forget_inverse())

    def forget_inverse(self) -> None:
        """Drop the cached inverse: the next :meth:`inverse` rebuilds it from the ``inverted_`` copy."""
        self._inverse = None

    def _tensors(self, prefix: str) -> list[torch.Tensor]:
        """Every buffer of one copy, layers (``A``, ``G``) then blocks."""
        names = [f"{prefix}_{kind}_{index}" for index in range(self.n_layers) for kind in ("input", "output")]
        names += [f"{prefix}_block_{index}" for index in range(self.n_blocks)]
        return [getattr(self, name) for name in names]

    def update(self, batch: BatchCurvature, decay: float) -> None:
        """
        Average a batch's curvature in, ``F <- decay F + (1 - decay) F_batch``; the first batch sets it outright.

        :param batch: the batch's curvature (the same for every rank: averaged across ranks before)
        :param decay: the weight of the past, in ``[0, 1)``
        """
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"The decay must be in [0, 1), not {decay}")
        fresh = [factor for pair in batch.layer_factors for factor in pair] + list(batch.block_fishers)
        first = int(self.updates) == 0
        with torch.no_grad():
            for running, new in zip(self._tensors(RUNNING), fresh, strict=True):
                if first:
                    running.copy_(new)
                else:
                    running.mul_(decay).add_(new.to(running.dtype), alpha=1.0 - decay)
        self.updates += 1

    def curvature(self, prefix: str = RUNNING) -> KfacCurvature:
        """The curvature of one copy, as :mod:`sb3_npg.common.kfac_policy` takes it; raises before the first update."""
        if int(self.updates) == 0:
            raise RuntimeError("The K-FAC statistics have not been updated yet")
        tensors = self._tensors(prefix)
        layers = [
            KroneckerFactors(tensors[2 * index], tensors[2 * index + 1], int(self.updates)) for index in range(self.n_layers)
        ]
        blocks: list[torch.Tensor | None] = list(tensors[2 * self.n_layers :])
        return KfacCurvature(layers, blocks)

    def inverse(self, plan: KfacPlan, settings: KfacSettings) -> MatVec:
        """
        K-FAC's damped inverse, ``g -> about (F_hat + damping I)^-1 g``: recomputed from the running curvature every
        ``settings.update_interval`` updates (and at the first), else the one computed then (rebuilt after loading
        from the curvature it was computed from, so a loaded model takes the same steps).
        """
        if int(self.inverted_at) == 0 or int(self.updates) - int(self.inverted_at) >= settings.update_interval:
            with torch.no_grad():
                for inverted, running in zip(self._tensors(INVERTED), self._tensors(RUNNING), strict=True):
                    inverted.copy_(running)
            self.inverted_at.copy_(self.updates)
            self._inverse = None
        damping = (settings.damping, settings.damping_mode)
        if self._inverse is None or self._inverse_damping != damping:
            self._inverse = kfac_natural_inverse(plan, self.curvature(INVERTED), *damping)
            self._inverse_damping = damping
        return self._inverse


def quadratic_curvature(plan: KfacPlan, statistics: KfacStatistics, direction: torch.Tensor) -> float:
    """``d^T F_hat d`` with ``F_hat`` the undamped running K-FAC Fisher: twice the quadratic model's KL of ``d``."""
    return float(torch.dot(direction, kfac_product(plan, statistics.curvature(), direction)))


def clip_curvature(
    plan: KfacPlan, statistics: KfacStatistics, direction: torch.Tensor, gradient: torch.Tensor, settings: KfacSettings
) -> float:
    """
    The curvature the KL clip scales ``direction`` by: :func:`quadratic_curvature` (``"undamped"``), or ``g^T d``
    (``"damped"``: the damped inverse's own ``d^T (F_hat damped) d``, which OpenAI baselines' clip takes).

    :param plan: the blocks
    :param statistics: their running curvature
    :param direction: ``d``, the damped inverse applied to ``gradient``
    :param gradient: ``g``
    :param settings: ``settings.clip_curvature`` chooses
    """
    if settings.clip_curvature == DAMPED_CURVATURE:
        return float(torch.dot(direction, gradient))
    return quadratic_curvature(plan, statistics, direction)


class RunningKroneckerSolver(FisherSolver):
    """
    ACKTR's solver (Wu et al. 2017, https://arxiv.org/abs/1708.05144): each step's true-Fisher K-FAC factors are
    averaged into running ones, and the direction is their damped inverse applied to the gradient, ``d``. Its
    curvature is ``d^T F_hat d`` under the undamped running K-FAC Fisher ``F_hat``, so the shared step
    ``sqrt(2 kfac_clip / d^T F_hat d) d`` has the paper's clipped quadratic-model KL. No exact Fisher product is taken.

    :param plan: the actor's K-FAC blocks
    :param statistics: the running curvature (a module of the policy)
    :param batch_curvature: the step's curvature on its samples, averaged across ranks
    :param settings: damping, decay and inversion interval
    """

    def __init__(
        self,
        plan: KfacPlan,
        statistics: KfacStatistics,
        batch_curvature: Callable[[PolicyInputs], BatchCurvature],
        settings: KfacSettings,
    ):
        self.plan, self.statistics, self.batch_curvature, self.settings = plan, statistics, batch_curvature, settings

    def solve(self, gradient: torch.Tensor, fisher: MatVec, observations: PolicyInputs) -> NaturalDirection:
        self.statistics.update(self.batch_curvature(observations), self.settings.decay)
        direction = self.statistics.inverse(self.plan, self.settings)(gradient)
        curvature = clip_curvature(self.plan, self.statistics, direction, gradient, self.settings)
        return NaturalDirection(direction, curvature, {"kfac_curvature": curvature})
