"""The policy's part of an update, as methods of the algorithm: one natural step per policy batch, in one trust region.

The trust region is centred on the behaviour policy (the one that collected the rollout) and measured over all the
policy's samples of the update. With one batch (``policy_batch_size=None``, the default) that is the classic
TRPO/NPG step. With several, each step starts where the previous one left off, its ratio still taken against the
behaviour policy's log-probabilities, and TRPO's line search keeps every accepted step within ``target_kl`` of the
behaviour policy over all samples; NPG scales each step to ``target_kl`` from where it starts, so its KL from the
behaviour policy grows with the number of batches (the log says how far it went).
"""

from __future__ import annotations

import copy
import warnings
from abc import abstractmethod
from collections.abc import Mapping
from functools import partial
from typing import ClassVar

import torch
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.distributions import Distribution
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import Schedule
from stable_baselines3.common.utils import FloatSchedule

from sb3_npg.common.batches import (
    PolicyInputs,
    PolicyBatch,
    RolloutTensors,
    first_tensor,
    normalized_advantages,
    policy_sample,
    select_rows,
    split,
)
from sb3_npg.common.distributed import Reducer
from sb3_npg.common.distributions import frozen_copy, frozen_distribution, mean_kl, policy_distribution
from sb3_npg.common.fisher import analytic_fisher_product
from sb3_npg.common.natural_gradient import MatVec, fisher_vector_product
from sb3_npg.common.natural_step import (
    NO_METRICS,
    NO_STEP,
    REFUSED_STEP_EVENTS,
    PolicyObjective,
    SkippedStep,
    StepOutcome,
    StepProposal,
    StepSettings,
    TrustRegion,
    propose_step,
    surrogate_and_kl,
)
from sb3_npg.common.kfac_policy import KfacPlan
from sb3_npg.common.kl_convention import kl_components, scaled
from sb3_npg.common.solvers import CG_EVENTS, ConjugateGradientSolver, FisherSolver, KroneckerFactoredSolver, kfac_inverse
from sb3_npg.common.stats import WeightedMeans
from sb3_npg.common.validation import scheduled_value

#: A KL radius of 0 (a ``target_kl`` schedule at its end): the step is not taken, and nothing is solved.
ZERO_RADIUS = 0.0


class ActorUpdate(BaseAlgorithm):
    """
    Natural steps on the policy, as methods of the algorithm: measure the objective at a step's base point, propose
    the KL-scaled step, hand it to the acceptance hook (:meth:`_accept_step`, the one method NPG and TRPO differ by)
    and record what happened. The algorithm provides the attributes annotated below.
    """

    policy: ActorCriticPolicy
    _actor_params: list[torch.nn.Parameter]
    _reducer: Reducer
    _n_updates: int
    event_counts: dict[str, int]
    target_kl: float | Schedule
    cg_max_steps: int
    cg_residual_tol: float
    cg_damping: float
    kl_per_action_dimension: bool
    fisher: str
    fisher_solver: str
    _kfac_plan: KfacPlan
    _kfac_generator: torch.Generator
    fisher_sub_sampling_factor: int
    sub_sampling_factor: int
    policy_batch_size: int | None
    normalize_advantage: bool
    #: The events counted over training, each logged as ``train/events/<name>`` from the first update on. An
    #: acceptance hook that reports events of its own (:attr:`StepOutcome.events`) adds their names here.
    counted_events: ClassVar[tuple[str, ...]] = (*REFUSED_STEP_EVENTS, *CG_EVENTS)
    #: The acceptance hook's metrics for a batch whose step was refused before it reached the hook.
    refused_step_metrics: ClassVar[Mapping[str, float]] = NO_METRICS
    #: The user's name of the KL radius, quoted in the error when its schedule gives a value out of range.
    target_kl_option: ClassVar[str] = "target_kl"

    @property
    def skipped_steps(self) -> int:
        """How many natural steps were refused since the start of training (the parameters stayed as they were)."""
        return sum(self.event_counts.get(event, 0) for event in REFUSED_STEP_EVENTS)

    @property
    def kl_scale(self) -> int:
        """What ``target_kl`` and ``cg_damping`` are multiplied by in use: with ``kl_per_action_dimension``, the number
        of per-dimension KLs of the action space (:func:`~sb3_npg.common.kl_convention.kl_components`), else 1."""
        return kl_components(self.action_space) if self.kl_per_action_dimension else 1

    @property
    def damping(self) -> float:
        """The Tikhonov damping of the Fisher in use: ``cg_damping`` times :attr:`kl_scale`."""
        return self.kl_scale * self.cg_damping

    @property
    def target_kl_schedule(self) -> Schedule:
        """The KL radius in use as a function of the remaining progress: ``target_kl`` (SB3's ``FloatSchedule``: a
        float is a constant) times :attr:`kl_scale`."""
        return scaled(FloatSchedule(self.target_kl), self.kl_scale)

    @property
    def solver(self) -> FisherSolver:
        """The part that turns the policy gradient into the natural direction, from the options in place
        (``fisher_solver``): conjugate gradient on Fisher-vector products (``cg_max_steps``, ``cg_residual_tol``),
        preconditioned by K-FAC or not, or K-FAC alone."""
        if self.fisher_solver == "kfac":
            return KroneckerFactoredSolver(self._kfac_inverse)
        preconditioning = self._kfac_inverse if self.fisher_solver == "kfac_preconditioned_cg" else None
        return ConjugateGradientSolver(self.cg_max_steps, self.cg_residual_tol, preconditioning)

    def _kfac_inverse(self, observations: PolicyInputs) -> MatVec:
        """K-FAC's inverse of the damped Fisher of the actor on ``observations`` (at the parameters in place)."""
        mean = partial(self._reducer.mean, weight=len(first_tensor(observations)))
        return kfac_inverse(self.policy, self._kfac_plan, self.damping, self._kfac_generator, mean, observations)

    def current_target_kl(self) -> float:
        """The KL radius of the update in progress: ``target_kl`` at the current remaining progress, >= 0 and finite
        (0, where a schedule reaches it, takes no step)."""
        return scheduled_value(self.target_kl_option, self.target_kl_schedule, self._current_progress_remaining)

    def policy_objective(self, batch: PolicyBatch, distribution: Distribution, behaviour: Distribution) -> PolicyObjective:
        """
        The surrogate the natural step maximizes and the KL it bounds
        (:func:`~sb3_npg.common.natural_step.surrogate_and_kl`).

        A step's base point (with gradients) and every line-search candidate (without) are measured by this one
        method: override it to change the objective everywhere at once, for example with an entropy bonus
        ``objective._replace(surrogate=objective.surrogate + coef * distribution.entropy().mean())``.

        :param batch: the observations, actions, advantages and behaviour log-probabilities
        :param distribution: the policy's distribution on ``batch.observations`` at the parameters in place
        :param behaviour: the behaviour policy's distribution on the same observations, frozen
        """
        return surrogate_and_kl(batch, distribution, behaviour)

    def _update_actor(self, rollout: RolloutTensors) -> WeightedMeans:
        """One natural step per policy batch, then the update's surrogate, KL and improvement over all of them."""
        normalize = partial(normalized_advantages, reducer=self._reducer) if self.normalize_advantage else None
        discrete = isinstance(self.action_space, spaces.Discrete)
        sample = policy_sample(rollout, self.sub_sampling_factor, discrete_actions=discrete, normalize=normalize)
        batches = split(sample, self.policy_batch_size)
        stats = WeightedMeans()
        region = self._trust_region(sample) if len(batches) > 1 else None
        behaviours = [frozen_distribution(self.policy, batch.observations) for batch in batches] if region else [None]
        for batch, behaviour in zip(batches, behaviours, strict=True):
            region = self._natural_step(batch, behaviour, region, stats)
            self._n_updates += 1
        if region is not None:
            improvement = region.surrogate - region.start_surrogate
            stats.add(1, policy_objective=region.surrogate, kl_divergence=region.kl, surrogate_improvement=improvement)
        return stats

    def _trust_region(self, sample: PolicyBatch) -> TrustRegion:
        """The trust region of an update of several batches: the behaviour policy over all of them, frozen now."""
        behaviour = frozen_distribution(self.policy, sample.observations)
        with torch.no_grad():
            surrogate = self.policy_objective(sample, behaviour, behaviour).surrogate
        return TrustRegion(sample, behaviour, float(self._reducer.mean(surrogate, sample.size)))

    def _measure(self, region: TrustRegion) -> tuple[float, float]:
        """The surrogate and the KL from the behaviour policy over ``region`` at the parameters in place."""
        with torch.no_grad():
            distribution = policy_distribution(self.policy, region.sample.observations)
            objective = self.policy_objective(region.sample, distribution, region.behaviour)
            surrogate, kl = self._reducer.mean(torch.stack(list(objective)), region.sample.size).tolist()
        return surrogate, kl

    def _natural_step(
        self, batch: PolicyBatch, behaviour: Distribution | None, region: TrustRegion | None, stats: WeightedMeans
    ) -> TrustRegion:
        """
        Propose one KL-scaled natural step on ``batch`` from the current parameters, and hand it to the hook.

        :param batch: the step's samples
        :param behaviour: the behaviour policy on them (``None``: the current parameters are the behaviour policy)
        :param region: the update's trust region (``None``: ``batch`` is all of the update's samples)
        :param stats: where the step's metrics go
        :return: the trust region, with where the parameters stand after the step
        """
        distribution = copy.copy(policy_distribution(self.policy, batch.observations))  # the base point, with gradients
        frozen = frozen_copy(self.policy, batch.observations, distribution)
        behaviour = behaviour or frozen
        objective = self.policy_objective(batch, distribution, behaviour)
        mean = partial(self._reducer.mean, weight=batch.size)
        if region is None:
            region = TrustRegion(batch, behaviour, float(mean(objective.surrogate.detach())))
        entropy = distribution.entropy()
        if entropy is not None:
            stats.add(batch.size, entropy=entropy.mean().detach())
        target_kl = self.current_target_kl()
        if target_kl == ZERO_RADIUS:  # a schedule at its end: no step, nothing to solve
            stats.add(batch.size, expected_improvement=0.0, step_fraction=NO_STEP)
            return region
        fisher = self._fisher_product(batch, distribution, frozen)
        settings = StepSettings(self.solver, target_kl, self._fisher_observations(batch))
        measure = partial(self._measure, region)
        try:
            proposal = propose_step(
                objective.surrogate, self._actor_params, fisher, mean, settings, region, measure, self._count
            )
        except SkippedStep as skipped:
            self._refuse_step(skipped, batch.size, stats)
            return region
        outcome = self._accept_safely(proposal)
        region.surrogate, region.kl = outcome.surrogate, outcome.kl
        for event in outcome.events:
            self._count(event)
        stats.add(batch.size, **proposal.diagnostics, step_fraction=outcome.fraction, **outcome.metrics)
        return region

    def _fisher_product(self, batch: PolicyBatch, distribution: Distribution, frozen: Distribution) -> MatVec:
        """
        The damped Fisher-vector product at the step's base point, over every ``fisher_sub_sampling_factor``-th sample.

        :param batch: the step's samples
        :param distribution: the policy's distribution on them, with its graph to the actor parameters
        :param frozen: the same, frozen (the base point of the KL whose Hessian the autograd product takes)
        :return: the product ``v -> (F + cg_damping * I) v``, averaged across ranks
        """
        observations = self._fisher_observations(batch)
        if self.fisher_sub_sampling_factor > 1:
            # A forward pass on the subset: products then cost the subset's size (slicing the whole batch's statistics
            # would keep every product's backward pass over the whole batch).
            distribution = copy.copy(policy_distribution(self.policy, observations))
            if self.fisher == "autograd":
                frozen = frozen_copy(self.policy, observations, distribution)
        if self.fisher == "analytic":
            product = analytic_fisher_product(distribution, self._actor_params, self.damping)
        else:
            product = fisher_vector_product(mean_kl(frozen, distribution), self._actor_params, self.damping)
        return self._reducer.averaged(product, len(first_tensor(observations)))

    def _fisher_observations(self, batch: PolicyBatch) -> PolicyInputs:
        """The samples of ``batch`` the Fisher is measured on: every ``fisher_sub_sampling_factor``-th."""
        if self.fisher_sub_sampling_factor > 1:
            return select_rows(batch.observations, slice(None, None, self.fisher_sub_sampling_factor))
        return batch.observations

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

        :param proposal: the full natural step and a way to measure candidates in the trust region
        :return: what was done, with the hook's own metrics and events
        """

    def _count(self, event: str) -> None:
        """Count one occurrence of ``event`` (one of :attr:`counted_events`)."""
        self.event_counts[event] = self.event_counts.get(event, 0) + 1

    def _refuse_step(self, skipped: SkippedStep, weight: int, stats: WeightedMeans) -> None:
        """Leave the parameters as they are, count the refusal by its cause, and say why."""
        self._count(skipped.event)
        warnings.warn(
            f"{type(self).__name__}: natural step skipped because {skipped}; the policy parameters are unchanged",
            RuntimeWarning,
            stacklevel=2,
        )
        stats.add(weight, expected_improvement=0.0, step_fraction=NO_STEP, **self.refused_step_metrics)
