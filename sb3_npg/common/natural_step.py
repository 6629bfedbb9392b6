"""One natural step, from the objective to a proposal for the acceptance hook.

The order of one step (Kakade 2001; Schulman et al. 2015), for a batch of the rollout:

1. :func:`freeze` the policy at the base point: its distribution, and the log-probabilities of the batch's actions.
2. :func:`surrogate_and_kl`, the one place where the objective is written: the surrogate ``mean(ratio * advantage)``
   and the mean KL from the base point, used for the base point (with gradients) and for every candidate.
3. :func:`propose_step`: the surrogate's gradient ``g``, conjugate gradient on Fisher-vector products for
   ``s ~= F^-1 g``, and the KL-scaled step ``sqrt(2 * target_kl / s^T F s) * s``; a non-finite or degenerate
   quantity raises :class:`SkippedStep` and nothing is applied.
4. The algorithm's acceptance hook turns the :class:`StepProposal` into a :class:`StepOutcome`: NPG takes the full
   step, TRPO backtracks.

:class:`NaturalStepMixin` runs these for one policy batch as methods of the algorithm (``policy_objective`` is the
method to override to change the objective), counts the events and records the batch's metrics.
"""

from __future__ import annotations

import copy
import math
import warnings
from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import ClassVar, NamedTuple

import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.distributions import Distribution, kl_divergence
from stable_baselines3.common.policies import ActorCriticPolicy

from sb3_npg.common.batches import Observations, PolicyBatch, first_tensor, select_rows
from sb3_npg.common.distributed import Reducer
from sb3_npg.common.fisher import analytic_fisher_product
from sb3_npg.common.natural_gradient import (
    MatVec,
    conjugate_gradient,
    fisher_vector_product,
    flat_grad,
    get_flat_params,
    kl_scaled_step_size,
    set_flat_params_,
)
from sb3_npg.common.stats import WeightedMeans

#: The events that refuse a natural step (:class:`SkippedStep`): the parameters stay as they were.
REFUSED_STEP_EVENTS = (
    "zero_gradient",
    "non_finite_gradient",
    "non_finite_direction",
    "non_positive_curvature",
    "non_finite_step",
)
#: The events of conjugate gradient that let the step proceed from the iterate it reached.
CG_EVENTS = ("cg_max_steps_reached", "cg_curvature_failure")
#: The fraction of the full step in place when none is taken.
NO_STEP = 0.0
#: No metrics (an immutable empty mapping, safe as a default).
NO_METRICS: Mapping[str, float] = MappingProxyType({})

#: ``(surrogate, kl)`` at the parameters in place, averaged over every rank's samples, without gradients.
Evaluate = Callable[[], tuple[float, float]]


class SkippedStep(Exception):
    """Raised inside a natural step when a non-finite or degenerate quantity means the step must not be applied.

    :param event: one of :data:`REFUSED_STEP_EVENTS`
    :param reason: what happened, for the warning
    """

    def __init__(self, event: str, reason: str):
        super().__init__(reason)
        self.event = event


def mean_kl(old: Distribution, new: Distribution) -> torch.Tensor:
    """
    The mean over the batch of the true KL(old || new) between action distributions.

    SB3's ``kl_divergence`` returns one value per action dimension (Box, MultiBinary) or per sub-action
    (MultiDiscrete); those are independent, so the KL of the joint distribution is their sum.

    :param old: the frozen distribution at the base point
    :param new: the current distribution
    :return: the scalar mean KL
    """
    per_sample = kl_divergence(old, new)
    if per_sample.dim() > 1:
        per_sample = per_sample.flatten(start_dim=1).sum(dim=1)
    return per_sample.mean()


def frozen_distribution(policy: ActorCriticPolicy, observations: Observations) -> Distribution:
    """
    The policy's action distribution on ``observations`` at the parameters in place, without gradients.

    A copy: SB3's policies reuse one distribution object, which the next ``get_distribution`` would overwrite.
    """
    with torch.no_grad():
        return copy.copy(policy.get_distribution(observations))


class BasePoint(NamedTuple):
    """The policy where a natural step starts, frozen: what the surrogate's ratio and the KL are measured from."""

    distribution: Distribution
    log_prob: torch.Tensor


def freeze(policy: ActorCriticPolicy, batch: PolicyBatch) -> BasePoint:
    """
    The base point of a step on ``batch``: the frozen distribution and the log-probabilities of the batch's actions.
    """
    distribution = frozen_distribution(policy, batch.observations)
    with torch.no_grad():
        return BasePoint(distribution, distribution.log_prob(batch.actions))


class PolicyObjective(NamedTuple):
    """What the natural step maximizes and bounds, at the parameters in place.

    :param surrogate: the scalar objective to maximize
    :param kl: the scalar mean KL from the base point (the trust region's measure)
    :param distribution: the policy's distribution it was computed from (SB3 reuses this object: read it at once)
    """

    surrogate: torch.Tensor
    kl: torch.Tensor
    distribution: Distribution


def surrogate_and_kl(policy: ActorCriticPolicy, batch: PolicyBatch, base: BasePoint) -> PolicyObjective:
    """
    The surrogate objective ``mean(pi(a|s) / pi_base(a|s) * A)`` and the mean KL from the base point, on ``batch``.

    With gradients when called with gradients enabled (the base point), without inside ``torch.no_grad()`` (line-search
    candidates): both go through this one function, so they always measure the same objective.

    :param policy: the policy, at the parameters to measure
    :param batch: the observations, actions and advantages
    :param base: the frozen base point
    """
    distribution = policy.get_distribution(batch.observations)
    ratio = torch.exp(distribution.log_prob(batch.actions) - base.log_prob)
    return PolicyObjective((batch.advantages * ratio).mean(), mean_kl(base.distribution, distribution), distribution)


@dataclass(frozen=True)
class StepProposal:
    """
    A natural step ready for the acceptance hook.

    :param params: the actor parameters
    :param start: their values at the base point, flattened
    :param full_step: the KL-scaled natural step, flattened
    :param surrogate_before: the surrogate objective at the base point
    :param expected_improvement: the first-order improvement of the full step, ``g . full_step``
    :param evaluate: measures ``(surrogate, kl)`` at the parameters currently in place, without gradients
    :param diagnostics: the step's metrics for the log (gradient norm, CG iterations and residual...)
    """

    params: list[torch.nn.Parameter]
    start: torch.Tensor
    full_step: torch.Tensor
    surrogate_before: float
    expected_improvement: float
    evaluate: Evaluate
    diagnostics: Mapping[str, float] = field(default_factory=dict)

    def apply(self, fraction: float) -> None:
        """Put ``start + fraction * full_step`` into the parameters."""
        set_flat_params_(self.params, self.start + fraction * self.full_step)


class StepOutcome(NamedTuple):
    """
    What the step-acceptance hook did with a proposed natural step.

    :param fraction: the fraction of the full step in place afterwards (``NO_STEP`` when rejected)
    :param surrogate: the surrogate objective at the parameters in place afterwards
    :param kl: the mean KL from the base point to the parameters in place afterwards
    :param metrics: the hook's own metrics, logged as ``train/<name>`` (averaged over batches by samples)
    :param events: the hook's own events, counted over training as ``train/events/<name>``
    """

    fraction: float
    surrogate: float
    kl: float
    metrics: Mapping[str, float] = NO_METRICS
    events: tuple[str, ...] = ()


@dataclass(frozen=True)
class SolverSettings:
    """
    How a natural step is solved and scaled.

    :param cg_max_steps: the most Fisher-vector products conjugate gradient uses
    :param cg_residual_tol: conjugate gradient stops once the squared residual norm is at or below this
    :param target_kl: the KL radius of the step
    """

    cg_max_steps: int
    cg_residual_tol: float
    target_kl: float


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


def _scaled_step(direction: torch.Tensor, fisher: MatVec, target_kl: float) -> torch.Tensor:
    """``direction`` scaled so that the quadratic model of the KL equals ``target_kl``; refused when not finite."""
    if not bool(torch.isfinite(direction).all()):
        raise SkippedStep("non_finite_direction", "the conjugate-gradient direction is not finite")
    curvature = float(torch.dot(direction, fisher(direction)))
    step_size = kl_scaled_step_size(curvature, target_kl)
    if not math.isfinite(step_size):
        raise SkippedStep("non_positive_curvature", f"the curvature s^T F s = {curvature} is not positive and finite")
    full_step = step_size * direction
    if not bool(torch.isfinite(full_step).all()):
        raise SkippedStep("non_finite_step", "the natural step is not finite")
    return full_step


def propose_step(
    surrogate: torch.Tensor,
    params: list[torch.nn.Parameter],
    fisher: MatVec,
    mean: Callable[[torch.Tensor], torch.Tensor],
    settings: SolverSettings,
    evaluate: Evaluate,
    count: Callable[[str], None],
) -> StepProposal:
    """
    The KL-scaled natural step from the base point; raises :class:`SkippedStep` on any non-finite quantity.

    :param surrogate: the surrogate at the base point, with its graph to ``params``
    :param params: the actor parameters
    :param fisher: the damped Fisher-vector product at the base point (averaged across ranks)
    :param mean: averages a per-rank mean of this batch across ranks (the identity in one process)
    :param settings: conjugate gradient's budget and tolerance, and the KL radius
    :param evaluate: measures candidates, for the hook
    :param count: called with each of :data:`CG_EVENTS` that happens
    """
    gradient, gradient_norm = _policy_gradient(surrogate, params, mean)
    solve = conjugate_gradient(fisher, gradient, settings.cg_max_steps, settings.cg_residual_tol)
    if solve.curvature_failure:
        count("cg_curvature_failure")
    elif not solve.converged:
        count("cg_max_steps_reached")
    full_step = _scaled_step(solve.solution, fisher, settings.target_kl)
    expected_improvement = float(torch.dot(gradient, full_step))
    return StepProposal(
        params=params,
        start=get_flat_params(params),
        full_step=full_step,
        surrogate_before=float(mean(surrogate.detach())),
        expected_improvement=expected_improvement,
        evaluate=evaluate,
        diagnostics={
            "policy_grad_norm": gradient_norm,
            "expected_improvement": expected_improvement,
            "cg_iterations": float(solve.iterations),
            "cg_residual": solve.residual,
        },
    )


class NaturalStepMixin(BaseAlgorithm):
    """
    The natural step of one policy batch, as methods of the algorithm: measure the objective at the base point,
    propose the KL-scaled step, hand it to the acceptance hook (:meth:`_accept_step`, the one method NPG and TRPO
    differ by) and record what happened. The algorithm provides the attributes annotated below.
    """

    policy: ActorCriticPolicy
    _actor_params: list[torch.nn.Parameter]
    _reducer: Reducer
    event_counts: dict[str, int]
    target_kl: float
    cg_max_steps: int
    cg_residual_tol: float
    cg_damping: float
    fisher: str
    fisher_sub_sampling_factor: int
    #: The events counted over training, each logged as ``train/events/<name>`` from the first update on. An
    #: acceptance hook that reports events of its own (:attr:`StepOutcome.events`) adds their names here.
    counted_events: ClassVar[tuple[str, ...]] = (*REFUSED_STEP_EVENTS, *CG_EVENTS)
    #: The acceptance hook's metrics for a batch whose step was refused before it reached the hook.
    refused_step_metrics: ClassVar[Mapping[str, float]] = NO_METRICS

    @property
    def skipped_steps(self) -> int:
        """How many natural steps were refused since the start of training (the parameters stayed as they were)."""
        return sum(self.event_counts.get(event, 0) for event in REFUSED_STEP_EVENTS)

    def policy_objective(self, batch: PolicyBatch, base: BasePoint) -> PolicyObjective:
        """
        The surrogate the natural step maximizes and the KL it bounds, at the parameters in place
        (:func:`~sb3_npg.common.natural_step.surrogate_and_kl`).

        The base point (with gradients) and every line-search candidate (without) are measured by this one method:
        override it to change the objective everywhere at once, for example with an entropy bonus
        ``objective._replace(surrogate=objective.surrogate + coef * objective.distribution.entropy().mean())``.

        :param batch: the observations, actions and advantages of the step
        :param base: the policy frozen where the step starts
        """
        return surrogate_and_kl(self.policy, batch, base)

    def _natural_step(self, batch: PolicyBatch, stats: WeightedMeans) -> None:
        """Propose one KL-scaled natural step on ``batch`` from the current parameters, and hand it to the hook."""
        base = freeze(self.policy, batch)
        objective = self.policy_objective(batch, base)
        entropy = objective.distribution.entropy()
        if entropy is not None:
            stats.add(batch.size, entropy=entropy.mean().item())
        fisher = self._fisher_product(batch, base, objective.distribution)
        mean = partial(self._reducer.mean, weight=batch.size)

        def evaluate() -> tuple[float, float]:
            with torch.no_grad():
                candidate = self.policy_objective(batch, base)
                surrogate, kl = mean(torch.stack([candidate.surrogate, candidate.kl])).tolist()
            return surrogate, kl

        settings = SolverSettings(self.cg_max_steps, self.cg_residual_tol, self.target_kl)
        try:
            proposal = propose_step(objective.surrogate, self._actor_params, fisher, mean, settings, evaluate, self._count)
        except SkippedStep as skipped:
            self._refuse_step(skipped, objective.surrogate.item(), batch.size, stats)
            return
        outcome = self._accept_safely(proposal)
        for event in outcome.events:
            self._count(event)
        stats.add(
            batch.size,
            **proposal.diagnostics,
            policy_objective=outcome.surrogate,
            kl_divergence=outcome.kl,
            surrogate_improvement=outcome.surrogate - proposal.surrogate_before,
            step_fraction=outcome.fraction,
            **outcome.metrics,
        )

    def _fisher_product(self, batch: PolicyBatch, base: BasePoint, distribution: Distribution) -> MatVec:
        """
        The damped Fisher-vector product at the base point, over every ``fisher_sub_sampling_factor``-th sample.

        :param batch: the policy batch
        :param base: the frozen base point on the whole batch
        :param distribution: the distribution on the whole batch, with its graph to the actor parameters
        :return: the product ``v -> (F + cg_damping * I) v``, averaged across ranks
        """
        observations, old = batch.observations, base.distribution
        if self.fisher_sub_sampling_factor > 1:
            observations = select_rows(observations, slice(None, None, self.fisher_sub_sampling_factor))
            distribution = copy.copy(self.policy.get_distribution(observations))
            if self.fisher == "autograd":
                old = frozen_distribution(self.policy, observations)
        if self.fisher == "analytic":
            product = analytic_fisher_product(distribution, self._actor_params, self.cg_damping)
        else:
            product = fisher_vector_product(mean_kl(old, distribution), self._actor_params, self.cg_damping)
        return self._reducer.averaged(product, len(first_tensor(observations)))

    def _accept_safely(self, proposal: StepProposal) -> StepOutcome:
        """The hook's outcome; an interrupt mid line search leaves the last accepted parameters, not a candidate."""
        try:
            return self._accept_step(proposal)
        except BaseException:
            proposal.apply(NO_STEP)
            raise

    @abstractmethod
    def _accept_step(self, proposal: StepProposal) -> StepOutcome:
        """
        Decide how much of the proposed step to take and leave those parameters in place.

        :param proposal: the full natural step and a way to measure candidates
        :return: what was done, with the hook's own metrics and events
        """

    def _count(self, event: str) -> None:
        """Count one occurrence of ``event`` (one of :attr:`counted_events`)."""
        self.event_counts[event] = self.event_counts.get(event, 0) + 1

    def _refuse_step(self, skipped: SkippedStep, surrogate: float, weight: int, stats: WeightedMeans) -> None:
        """Leave the parameters as they are, count the refusal by its cause, and say why."""
        self._count(skipped.event)
        warnings.warn(
            f"{type(self).__name__}: natural step skipped because {skipped}; the policy parameters are unchanged",
            RuntimeWarning,
            stacklevel=2,
        )
        stats.add(
            weight,
            policy_objective=surrogate,
            kl_divergence=0.0,
            surrogate_improvement=0.0,
            expected_improvement=0.0,
            step_fraction=NO_STEP,
            **self.refused_step_metrics,
        )
