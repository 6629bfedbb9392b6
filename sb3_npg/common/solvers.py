"""The Fisher solvers: the part of an algorithm that turns the policy gradient into a natural direction.

An algorithm holds one (``solver``, built from its options at each update) and every natural step asks it for
``s ~= (F + d I)^-1 g`` and the curvature ``s^T (F + d I) s`` of the damped quadratic KL model, which scales the step
(:func:`~sb3_npg.common.natural_gradient.kl_scaled_step_size`):

- :class:`ConjugateGradientSolver`: conjugate gradient on Fisher-vector products (the default, ``fisher_solver="cg"``),
  optionally preconditioned by K-FAC's inverse on the step's samples (``"kfac_preconditioned_cg"``): the same
  residual, in fewer products where K-FAC resembles the Fisher;
- :class:`KroneckerFactoredSolver`: K-FAC's inverse alone replaces the solve (``"kfac"``); one exact Fisher product
  gives the curvature, so the step is scaled by the same damped KL model as conjugate gradient's.

K-FAC's inverse on a batch is :func:`kfac_inverse` (:mod:`sb3_npg.common.kfac_policy`, :mod:`sb3_npg.common.kfac`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
from stable_baselines3.common.policies import ActorCriticPolicy

from sb3_npg.common.batches import PolicyInputs
from sb3_npg.common.kfac_policy import KfacCurvature, KfacPlan, batch_curvature, kfac_natural_inverse
from sb3_npg.common.natural_gradient import MatVec, conjugate_gradient

#: Conjugate gradient stopped at its budget (``cg_max_steps``) before its tolerance: the step proceeds from there.
CG_MAX_STEPS_REACHED = "cg_max_steps_reached"
#: A search direction of conjugate gradient had non-positive or non-finite curvature: it stopped at the last iterate.
CG_CURVATURE_FAILURE = "cg_curvature_failure"
#: The preconditioned residual's ``r^T M^-1 r`` of conjugate gradient was not positive and finite (the preconditioner
#: not positive definite there, or the product underflowed): it stopped at the last iterate.
CG_PRECONDITIONER_FAILURE = "cg_preconditioner_failure"
#: The events of conjugate gradient that let the step proceed from the iterate it reached.
CG_EVENTS = (CG_MAX_STEPS_REACHED, CG_CURVATURE_FAILURE, CG_PRECONDITIONER_FAILURE)
#: ``fisher_solver`` options: conjugate gradient, K-FAC alone, conjugate gradient preconditioned by K-FAC.
FISHER_SOLVERS = ("cg", "kfac", "kfac_preconditioned_cg")
#: K-FAC's factors of one step are measured on that step's samples alone (no running average across steps).
FRESH_FACTORS = 0.0
#: A solver's curvature on a batch: the product ``v -> M^-1 v`` of an approximate inverse of the damped Fisher there.
Preconditioning = Callable[[PolicyInputs], MatVec]


@dataclass(frozen=True)
class NaturalDirection:
    """
    What a solver returns for one natural step.

    :param direction: ``s ~= (F + d I)^-1 g``
    :param curvature: ``s^T A s`` with ``A`` the matrix of the KL model the step is scaled by (``F + d I`` for CG)
    :param diagnostics: the solver's metrics, logged as ``train/<name>`` (averaged over batches by samples)
    :param events: what happened that is counted (``train/events/<name>``), each one of the solver's :attr:`events`
    """

    direction: torch.Tensor
    curvature: float
    diagnostics: Mapping[str, float]
    events: tuple[str, ...] = ()


class FisherSolver(ABC):
    """Solves ``(F + d I) s = g`` for a natural step, given the gradient and the damped Fisher-vector product."""

    #: The events :meth:`solve` may report (the algorithm counts them from its first update on).
    events: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def solve(self, gradient: torch.Tensor, fisher: MatVec, observations: PolicyInputs) -> NaturalDirection:
        """
        The natural direction of ``gradient``.

        :param gradient: the policy gradient ``g`` over the actor parameters (flat, averaged across ranks)
        :param fisher: the damped Fisher-vector product ``v -> (F + d I) v`` at the step's base point
        :param observations: the samples ``fisher`` is measured on, for a solver that measures curvature of its own
        :return: the direction, its curvature, and the solver's diagnostics and events
        """


class ConjugateGradientSolver(FisherSolver):
    """
    Conjugate gradient on Fisher-vector products, from a zero start (deterministic), as in the TRPO paper
    (https://arxiv.org/abs/1502.05477, appendix C).

    :param max_steps: the most Fisher-vector products (``cg_max_steps``)
    :param residual_tol: stop once ``||g - A s||^2 <= residual_tol * ||g||^2`` (``cg_residual_tol``)
    :param preconditioning: an approximate inverse of the damped Fisher on the step's samples (K-FAC's), or ``None``
    """

    events: ClassVar[tuple[str, ...]] = CG_EVENTS

    def __init__(self, max_steps: int, residual_tol: float, preconditioning: Preconditioning | None = None):
        self.max_steps, self.residual_tol, self.preconditioning = max_steps, residual_tol, preconditioning

    def solve(self, gradient: torch.Tensor, fisher: MatVec, observations: PolicyInputs) -> NaturalDirection:
        preconditioner = None if self.preconditioning is None else self.preconditioning(observations)
        result = conjugate_gradient(fisher, gradient, self.max_steps, self.residual_tol, preconditioner)
        if result.curvature_failure:
            events: tuple[str, ...] = (CG_CURVATURE_FAILURE,)
        elif result.preconditioner_failure:
            events = (CG_PRECONDITIONER_FAILURE,)
        elif not result.converged:
            events = (CG_MAX_STEPS_REACHED,)
        else:
            events = ()
        diagnostics = {"cg_iterations": float(result.iterations), "cg_residual": result.residual}
        return NaturalDirection(result.solution, result.solution_curvature, diagnostics, events)


class KroneckerFactoredSolver(FisherSolver):
    """
    K-FAC's inverse of the damped Fisher on the step's samples as the direction (Martens and Grosse 2015,
    https://arxiv.org/abs/1503.05671), with one exact Fisher product for its curvature; ``cg_residual`` logs how far
    it is from solving ``(F + d I) s = g``.

    :param preconditioning: K-FAC's inverse on a batch (:func:`kfac_inverse`)
    """

    def __init__(self, preconditioning: Preconditioning):
        self.preconditioning = preconditioning

    def solve(self, gradient: torch.Tensor, fisher: MatVec, observations: PolicyInputs) -> NaturalDirection:
        direction = self.preconditioning(observations)(gradient)
        product = fisher(direction)
        gradient_dot_gradient = float(torch.dot(gradient, gradient))
        residual = float(torch.dot(gradient - product, gradient - product)) / gradient_dot_gradient
        diagnostics = {"cg_iterations": 0.0, "cg_residual": residual}
        return NaturalDirection(direction, float(torch.dot(direction, product)), diagnostics)


def kfac_inverse(
    policy: ActorCriticPolicy,
    plan: KfacPlan,
    damping: float,
    generator: torch.Generator,
    mean: Callable[[torch.Tensor], torch.Tensor],
    observations: PolicyInputs,
) -> MatVec:
    """
    K-FAC's inverse of ``F + damping I`` for the policy's actor on ``observations``: the true-Fisher factors of that
    batch (closed form for SB3's distributions) over every rank's samples, each layer's block inverted with the
    pi-corrected damping.

    :param policy: the policy, at the step's base point
    :param plan: its K-FAC blocks (:func:`~sb3_npg.common.kfac_policy.build_kfac_plan`)
    :param damping: the damping, > 0 (``cg_damping``)
    :param generator: the random source where a distribution's Fisher is sampled
    :param mean: averages a mean over this rank's samples across ranks (the identity in one process): every factor
        and block is such a mean, so the factors are those of all ranks' samples together, exactly
    :param observations: the step's samples
    :return: the product ``v -> K^-1 v``, vectors in the actor parameters' order
    """
    curvature = KfacCurvature.for_plan(plan)
    curvature.update(batch_curvature(plan, policy, observations, generator).averaged(mean), FRESH_FACTORS)
    return kfac_natural_inverse(plan, curvature, damping)
