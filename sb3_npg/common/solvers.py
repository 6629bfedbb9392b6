"""The Fisher solvers: the part of an algorithm that turns the policy gradient into a natural direction.

An algorithm holds one (``solver``, built from its options at each update) and every natural step asks it for
``s ~= (F + d I)^-1 g`` and the curvature ``s^T (F + d I) s`` of the damped quadratic KL model, which scales the step
(:func:`~sb3_npg.common.natural_gradient.kl_scaled_step_size`). Today's solver is conjugate gradient on Fisher-vector
products (:class:`ConjugateGradientSolver`); a K-FAC solver (:mod:`sb3_npg.common.kfac`) is the next one, as a
:class:`FisherSolver` like this one, not another base class of the algorithm.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from sb3_npg.common.natural_gradient import MatVec, conjugate_gradient

#: Conjugate gradient stopped at its budget (``cg_max_steps``) before its tolerance: the step proceeds from there.
CG_MAX_STEPS_REACHED = "cg_max_steps_reached"
#: A search direction of conjugate gradient had non-positive or non-finite curvature: it stopped at the last iterate.
CG_CURVATURE_FAILURE = "cg_curvature_failure"
#: The events of conjugate gradient that let the step proceed from the iterate it reached.
CG_EVENTS = (CG_MAX_STEPS_REACHED, CG_CURVATURE_FAILURE)


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
    def solve(self, gradient: torch.Tensor, fisher: MatVec) -> NaturalDirection:
        """
        The natural direction of ``gradient``.

        :param gradient: the policy gradient ``g`` over the actor parameters (flat, averaged across ranks)
        :param fisher: the damped Fisher-vector product ``v -> (F + d I) v`` at the step's base point
        :return: the direction, its curvature, and the solver's diagnostics and events
        """


class ConjugateGradientSolver(FisherSolver):
    """
    Conjugate gradient on Fisher-vector products, from a zero start (deterministic), as in the TRPO paper
    (https://arxiv.org/abs/1502.05477, appendix C).

    :param max_steps: the most Fisher-vector products (``cg_max_steps``)
    :param residual_tol: stop once ``||g - A s||^2 <= residual_tol * ||g||^2`` (``cg_residual_tol``)
    """

    events: ClassVar[tuple[str, ...]] = CG_EVENTS

    def __init__(self, max_steps: int, residual_tol: float):
        self.max_steps, self.residual_tol = max_steps, residual_tol

    def solve(self, gradient: torch.Tensor, fisher: MatVec) -> NaturalDirection:
        result = conjugate_gradient(fisher, gradient, self.max_steps, self.residual_tol)
        if result.curvature_failure:
            events: tuple[str, ...] = (CG_CURVATURE_FAILURE,)
        elif not result.converged:
            events = (CG_MAX_STEPS_REACHED,)
        else:
            events = ()
        diagnostics = {"cg_iterations": float(result.iterations), "cg_residual": result.residual}
        return NaturalDirection(result.solution, result.solution_curvature, diagnostics, events)
