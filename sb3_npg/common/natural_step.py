"""One natural step, from the objective to a proposal for the acceptance hook.

Every step of an update solves one problem: maximize the surrogate over the policy's samples while the KL from the
behaviour policy (the one that collected them) stays within ``target_kl``. A step on one batch of those samples:

1. :func:`surrogate_and_kl`, the one place where the objective is written: the surrogate ``mean(ratio * advantage)``
   with the ratio against the behaviour policy's log-probabilities (the rollout's), and the mean KL from the
   behaviour policy. It measures the step's base point (with gradients) and every candidate (without).
2. :func:`propose_step`: the surrogate's gradient ``g``, the algorithm's Fisher solver (:mod:`sb3_npg.common.solvers`:
   conjugate gradient on Fisher-vector products by default) for ``s ~= (F + d I)^-1 g`` (``d`` the damping), and the
   KL-scaled step ``sqrt(2 * target_kl / s^T (F + d I) s) * s``; a non-finite or degenerate quantity raises
   :class:`SkippedStep` and nothing is applied.
3. The algorithm's acceptance hook turns the :class:`StepProposal` into a :class:`StepOutcome`: NPG takes the full
   step, TRPO backtracks until the candidate is inside the :class:`TrustRegion`.

:class:`~sb3_npg.common.actor_update.ActorUpdate` runs these for each policy batch as methods of the algorithm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

import torch
from stable_baselines3.common.distributions import Distribution

from sb3_npg.common.batches import PolicyInputs, PolicyBatch
from sb3_npg.common.distributions import mean_kl
from sb3_npg.common.natural_gradient import (
    MatVec,
    flat_grad,
    get_flat_params,
    kl_scaled_step_size,
    set_flat_params_,
)
from sb3_npg.common.solvers import FisherSolver

#: The events that refuse a natural step (:class:`SkippedStep`): the parameters stay as they were.
REFUSED_STEP_EVENTS = (
    "zero_gradient",
    "non_finite_gradient",
    "non_finite_direction",
    "non_positive_curvature",
    "non_finite_step",
)
#: The fraction of the full step in place when none is taken.
NO_STEP = 0.0
#: No metrics (an immutable empty mapping, safe as a default).
NO_METRICS: Mapping[str, float] = MappingProxyType({})

#: ``(surrogate, kl)`` over the trust region's samples at the parameters in place, averaged over every rank's.
Measure = Callable[[], tuple[float, float]]


class SkippedStep(Exception):
    """Raised inside a natural step when a non-finite or degenerate quantity means the step must not be applied.

    :param event: one of :data:`REFUSED_STEP_EVENTS`
    :param reason: what happened, for the warning
    """

    def __init__(self, event: str, reason: str):
        super().__init__(reason)
        self.event = event


class PolicyObjective(NamedTuple):
    """What the natural step maximizes and bounds.

    :param surrogate: the scalar objective to maximize
    :param kl: the scalar mean KL from the behaviour policy (the trust region's measure)
    """

    surrogate: torch.Tensor
    kl: torch.Tensor


def surrogate_and_kl(batch: PolicyBatch, distribution: Distribution, behaviour: Distribution) -> PolicyObjective:
    """
    The surrogate objective ``mean(pi(a|s) / pi_behaviour(a|s) * A)`` and the mean ``KL(pi_behaviour || pi)``.

    :param batch: the observations, actions, advantages and the behaviour policy's log-probabilities of the actions
    :param distribution: the policy's action distribution on ``batch.observations`` at the parameters to measure
        (with gradients for the base point of a step, without for a candidate)
    :param behaviour: the behaviour policy's distribution on the same observations, frozen
    """
    ratio = torch.exp(distribution.log_prob(batch.actions) - batch.old_log_prob)
    return PolicyObjective((batch.advantages * ratio).mean(), mean_kl(behaviour, distribution))


@dataclass
class TrustRegion:
    """
    The update's trust region and where the parameters stand in it.

    :param sample: the samples it is measured on (every policy batch of the update)
    :param behaviour: the behaviour policy's distribution on them, frozen: the region's centre
    :param surrogate: the surrogate over ``sample`` at the parameters in place
    :param kl: the KL from ``behaviour`` over ``sample`` at the parameters in place
    """

    sample: PolicyBatch
    behaviour: Distribution
    surrogate: float
    kl: float = 0.0
    #: The surrogate where the update started.
    start_surrogate: float = field(init=False)

    def __post_init__(self) -> None:
        self.start_surrogate = self.surrogate


@dataclass(frozen=True)
class StepProposal:
    """
    A natural step ready for the acceptance hook.

    :param params: the actor parameters
    :param start: their values at the step's base point, flattened
    :param full_step: the KL-scaled natural step, flattened
    :param kl_scale: the factor that scaled the solver's direction into ``full_step`` (``sqrt(2 target_kl / s^T A s)``):
        a hook that caps the step size (ACKTR's learning rate) compares with it
    :param surrogate_before: the trust region's surrogate at the base point
    :param kl_before: the trust region's KL from the behaviour policy at the base point (0 for an update's first step)
    :param expected_improvement: the first-order improvement of the full step, ``g . full_step``
    :param measure: measures ``(surrogate, kl)`` over the trust region at the parameters currently in place
    :param diagnostics: the step's metrics for the log (gradient norm, CG iterations and residual...)
    """

    params: list[torch.nn.Parameter]
    start: torch.Tensor
    full_step: torch.Tensor
    kl_scale: float
    surrogate_before: float
    kl_before: float
    expected_improvement: float
    measure: Measure
    diagnostics: Mapping[str, float] = field(default_factory=dict)

    def apply(self, fraction: float) -> None:
        """Put ``start + fraction * full_step`` into the parameters."""
        set_flat_params_(self.params, self.start + fraction * self.full_step)


class StepOutcome(NamedTuple):
    """
    What the step-acceptance hook did with a proposed natural step.

    :param fraction: the fraction of the full step in place afterwards (``NO_STEP`` when rejected)
    :param surrogate: the trust region's surrogate at the parameters in place afterwards
    :param kl: the trust region's KL from the behaviour policy at the parameters in place afterwards
    :param metrics: the hook's own metrics, logged as ``train/<name>`` (averaged over batches by samples)
    :param events: the hook's own events, counted over training as ``train/events/<name>``
    """

    fraction: float
    surrogate: float
    kl: float
    metrics: Mapping[str, float] = NO_METRICS
    events: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepSettings:
    """
    How a natural step is solved and scaled.

    :param solver: the algorithm's Fisher solver (conjugate gradient by default)
    :param target_kl: the KL radius of the step
    :param observations: the samples the Fisher-vector products are measured on (for a solver's own curvature)
    """

    solver: FisherSolver
    target_kl: float
    observations: PolicyInputs


def _policy_gradient(
    surrogate: torch.Tensor, params: list[torch.nn.Parameter], mean: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[torch.Tensor, float]:
    """The surrogate's gradient over ``params`` averaged across ranks, and its norm; refused when zero or not finite."""
    gradient = mean(flat_grad(surrogate, params, retain_graph=True))
    norm = float(torch.linalg.vector_norm(gradient))
    if not math.isfinite(norm):
        raise SkippedStep("non_finite_gradient", "the policy gradient is not finite")
    if norm == 0.0:
        raise SkippedStep("zero_gradient", "the policy gradient is zero (are all advantages equal?)")
    return gradient, norm


def _scaled_step(direction: torch.Tensor, curvature: float, target_kl: float) -> tuple[torch.Tensor, float]:
    """``direction`` scaled so that the damped quadratic model of the KL (``curvature`` is ``s^T (F + d I) s``) equals
    ``target_kl``, and the scale; refused when not finite."""
    if not bool(torch.isfinite(direction).all()):
        raise SkippedStep("non_finite_direction", "the conjugate-gradient direction is not finite")
    step_size = kl_scaled_step_size(curvature, target_kl)
    if not math.isfinite(step_size):
        raise SkippedStep("non_positive_curvature", f"the curvature s^T F s = {curvature} is not positive and finite")
    full_step = step_size * direction
    if not bool(torch.isfinite(full_step).all()):
        raise SkippedStep("non_finite_step", "the natural step is not finite")
    return full_step, step_size


def propose_step(
    surrogate: torch.Tensor,
    params: list[torch.nn.Parameter],
    fisher: MatVec,
    mean: Callable[[torch.Tensor], torch.Tensor],
    settings: StepSettings,
    region: TrustRegion,
    measure: Measure,
    count: Callable[[str], None],
) -> StepProposal:
    """
    The KL-scaled natural step from the parameters in place; raises :class:`SkippedStep` on any non-finite quantity.

    :param surrogate: the batch's surrogate at the base point, with its graph to ``params``
    :param params: the actor parameters
    :param fisher: the damped Fisher-vector product at the base point (averaged across ranks)
    :param mean: averages a per-rank mean of this batch across ranks (the identity in one process)
    :param settings: the solver, and the KL radius
    :param region: the update's trust region, where the parameters stand now
    :param measure: measures candidates in ``region``, for the hook
    :param count: called with each of the solver's events that happens
    """
    gradient, gradient_norm = _policy_gradient(surrogate, params, mean)
    solved = settings.solver.solve(gradient, fisher, settings.observations)
    for event in solved.events:
        count(event)
    full_step, kl_scale = _scaled_step(solved.direction, solved.curvature, settings.target_kl)
    expected_improvement = float(torch.dot(gradient, full_step))
    return StepProposal(
        params=params,
        start=get_flat_params(params),
        full_step=full_step,
        kl_scale=kl_scale,
        surrogate_before=region.surrogate,
        kl_before=region.kl,
        expected_improvement=expected_improvement,
        measure=measure,
        diagnostics={
            "policy_grad_norm": gradient_norm,
            "expected_improvement": expected_improvement,
            **solved.diagnostics,
        },
    )
