"""The natural-gradient core: flat parameters and gradients, Fisher-vector products, conjugate gradient, step size.

Pure PyTorch functions with no Stable-Baselines3 imports, in the order of one natural-gradient step
(Kakade 2001, Schulman et al. 2015):

1. ``g = flat_grad(surrogate, actor_params)``: the policy gradient, in one ``autograd.grad`` call.
2. ``F v`` through :func:`fisher_vector_product`: the Hessian of the mean KL at the base point (the Fisher
   matrix) times ``v``, by double backward through a KL gradient built once.
3. ``s ~= (F + d I)^-1 g`` by :func:`conjugate_gradient` from a zero start (``d`` the damping), which also gives
   the curvature ``s^T (F + d I) s``.
4. ``step = sqrt(2 * target_kl / s^T (F + d I) s) * s`` by :func:`kl_scaled_step_size`, so that the damped quadratic
   model of the KL, ``1/2 step^T (F + d I) step``, equals ``target_kl`` (the undamped model ``1/2 step^T F step`` is
   lower by the damping's share of the curvature).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

#: The quadratic model of the KL is ``KL(step) ~= 1/2 step^T F step``; solving ``KL = target_kl`` for the
#: scale of ``s`` gives ``sqrt(QUADRATIC_KL_FACTOR * target_kl / s^T F s)`` (with the damped ``F + d I`` in its place,
#: as conjugate gradient gives it, the damped model equals ``target_kl``).
QUADRATIC_KL_FACTOR = 2.0

MatVec = Callable[[torch.Tensor], torch.Tensor]


def flat_grad(
    output: torch.Tensor,
    params: Sequence[torch.Tensor],
    *,
    retain_graph: bool = False,
    create_graph: bool = False,
) -> torch.Tensor:
    """
    Gradient of a scalar with respect to several parameters, in one ``autograd.grad`` call, flattened.

    Parameters the output does not depend on contribute zeros.

    :param output: the scalar to differentiate
    :param params: the tensors to differentiate with respect to
    :param retain_graph: keep the graph for a later backward pass
    :param create_graph: build a graph of the gradient itself (for double backward)
    :return: the concatenated, flattened gradient, of length ``sum(p.numel() for p in params)``
    """
    grads = torch.autograd.grad(output, list(params), retain_graph=retain_graph, create_graph=create_graph, allow_unused=True)
    return _flatten(grads, params)


def _flatten(grads: Sequence[torch.Tensor | None], params: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate per-parameter gradients into one vector, zeros for parameters without one."""
    return torch.cat(
        [(torch.zeros_like(param) if grad is None else grad).reshape(-1) for param, grad in zip(params, grads, strict=True)]
    )


def get_flat_params(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """
    A detached copy of several parameters, flattened into one vector.

    :param params: the parameters
    :return: the concatenated values
    """
    return torch.cat([param.detach().reshape(-1) for param in params]).clone()


@torch.no_grad()
def set_flat_params_(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """
    Write a flat vector back into several parameters, in place.

    :param params: the parameters to overwrite
    :param flat: the values, as produced by :func:`get_flat_params`
    """
    total = sum(param.numel() for param in params)
    if total != flat.numel():
        raise ValueError(f"The flat vector has {flat.numel()} values but the parameters hold {total}")
    offset = 0
    for param in params:
        numel = param.numel()
        param.copy_(flat[offset : offset + numel].view_as(param))
        offset += numel


def fisher_vector_product(kl: torch.Tensor, params: Sequence[torch.Tensor], damping: float) -> MatVec:
    """
    The damped Fisher-vector product ``v -> (F + damping * I) v`` of the mean KL at the base point.

    ``F`` is the Hessian of ``kl`` (the mean KL between the frozen old distribution and the current one,
    zero at the base point), which equals the Fisher information matrix there. The KL gradient is built
    once, with ``create_graph=True``; every product is then one double-backward pass through it.

    :param kl: the scalar mean KL, differentiable with respect to ``params``
    :param params: the actor parameters
    :param damping: the Tikhonov damping added to the product (``cg_damping``)
    :return: a function computing the damped product; it keeps the graph, so it can be called repeatedly
    """
    kl_grad = flat_grad(kl, params, retain_graph=True, create_graph=True)

    def product(vector: torch.Tensor) -> torch.Tensor:
        directional = torch.dot(kl_grad, vector.detach())
        return flat_grad(directional, params, retain_graph=True) + damping * vector

    return product


@dataclass(frozen=True)
class ConjugateGradientResult:
    """
    The outcome of :func:`conjugate_gradient`.

    :param solution: the approximate solution ``x`` of ``A x = b``
    :param solution_curvature: ``x^T A x``, from the solver's own quantities as ``x^T (b - r)`` (no further product)
    :param iterations: how many matrix-vector products were used
    :param residual: the final squared residual norm relative to the right-hand side's, ``||b - A x||^2 / ||b||^2``
    :param converged: whether that relative squared residual fell to the tolerance
    :param curvature_failure: whether a search direction had non-positive or non-finite curvature
        ``p^T A p`` (``A`` not positive definite there); the iterate before it is returned
    :param preconditioner_failure: whether the preconditioned residual's ``r^T M^-1 r`` was not positive and finite
        (``M^-1`` not positive definite there, or the product underflowed to 0) while the residual was still above
        the tolerance; the iterate reached is returned
    """

    solution: torch.Tensor
    solution_curvature: float
    iterations: int
    residual: float
    converged: bool
    curvature_failure: bool
    preconditioner_failure: bool = False


def conjugate_gradient(
    matvec: MatVec, b: torch.Tensor, max_steps: int, residual_tol: float, preconditioner: MatVec | None = None
) -> ConjugateGradientResult:
    """
    Solve ``A x = b`` for a symmetric positive-definite ``A`` given only as products ``A v``.

    Deterministic: it starts from ``x = 0`` and consumes no random numbers. The stopping rule is relative to ``b``,
    so scaling ``b`` (say, the rewards behind a policy gradient) scales the solution and changes nothing else. With a
    preconditioner ``M^-1`` (symmetric positive definite, about ``A^-1``) it is preconditioned conjugate gradient: the
    same stopping rule on the same residual ``b - A x``, in fewer products when ``M`` resembles ``A``.

    :param matvec: the product ``v -> A v``
    :param b: the right-hand side
    :param max_steps: the most matrix-vector products to use
    :param residual_tol: stop once ``||b - A x||^2 <= residual_tol * ||b||^2``
    :param preconditioner: the product ``v -> M^-1 v``; ``None``: plain conjugate gradient
    :return: the solution and its curvature, with the iteration count, final relative residual and status flags
    """
    x = torch.zeros_like(b)
    r = b.clone()
    z = r if preconditioner is None else preconditioner(r)
    p = z.clone()
    b_dot_b = r_dot_r = float(torch.dot(r, r))
    r_dot_z = r_dot_r if preconditioner is None else float(torch.dot(r, z))
    threshold = residual_tol * b_dot_b
    iterations = 0
    curvature_failure = preconditioner_failure = False
    while iterations < max_steps and r_dot_r > threshold:
        if not _is_positive_and_finite(r_dot_z):
            preconditioner_failure = True
            break
        a_p = matvec(p)
        curvature = float(torch.dot(p, a_p))
        iterations += 1
        if not _is_positive_and_finite(curvature):
            curvature_failure = True
            break
        alpha = r_dot_z / curvature
        x += alpha * p
        r -= alpha * a_p
        r_dot_r = float(torch.dot(r, r))
        z = r if preconditioner is None else preconditioner(r)
        new_r_dot_z = r_dot_r if preconditioner is None else float(torch.dot(r, z))
        p = z + (new_r_dot_z / r_dot_z) * p
        r_dot_z = new_r_dot_z
    return ConjugateGradientResult(
        solution=x,
        solution_curvature=float(torch.dot(x, b - r)),
        iterations=iterations,
        residual=r_dot_r / b_dot_b if b_dot_b > 0.0 else 0.0,
        converged=r_dot_r <= threshold,
        curvature_failure=curvature_failure,
        preconditioner_failure=preconditioner_failure,
    )


def _is_positive_and_finite(value: float) -> bool:
    """Whether ``value`` can divide: a breakdown of conjugate gradient where it cannot."""
    return math.isfinite(value) and value > 0.0


def kl_scaled_step_size(curvature: float, target_kl: float) -> float:
    """
    The scale ``beta`` of a direction ``s`` such that the quadratic KL model of ``beta * s`` equals ``target_kl``.

    :param curvature: ``s^T A s`` for the search direction ``s``, with ``A`` the matrix of that model (the damped
        ``F + d I`` where conjugate gradient solved with it)
    :param target_kl: the KL radius of the step
    :return: ``sqrt(2 * target_kl / curvature)``; ``nan`` when the curvature is not positive and finite
    """
    if not math.isfinite(curvature) or curvature <= 0.0:
        return math.nan
    return math.sqrt(QUADRATIC_KL_FACTOR * target_kl / curvature)


def gauss_newton_vector_product(
    statistics: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
    damping: float,
) -> MatVec:
    """
    The damped Gauss-Newton product ``v -> (J^T M J / n + damping * I) v`` with a distribution's analytic Fisher.

    ``statistics`` are per-sample statistics of the action distribution (for example a Gaussian's mean and standard
    deviation), each of shape ``(n, ...)`` and differentiable with respect to ``params``; ``J`` is their Jacobian
    and ``M`` the distribution's Fisher information in those statistics, diagonal for the statistics used here, so
    it is given as one weight tensor per statistic. At the base point this equals the Hessian of the mean KL
    (:func:`fisher_vector_product`) exactly, without differentiating the KL twice.

    ``J v`` comes from reverse mode too: ``J^T u`` is built once as a function of a probe ``u`` (linear in it),
    and ``J v`` is its derivative with respect to ``u`` in the direction ``v``. Each product is then two
    backward passes through small graphs built once; on CPU this beats forward-mode ``torch.func.jvp``, whose
    per-operation overhead dominates for networks this small (``benchmarks/bench_fisher.py`` measures all three).

    :param statistics: the distribution's statistics at the base point, with their graph to ``params``
    :param params: the parameters, in the order of the flat vectors
    :param weights: the diagonal Fisher weight of each statistic at the base point (same shapes, no graph needed)
    :param damping: the Tikhonov damping added to the product (``cg_damping``)
    :return: a function computing the damped product on flat vectors; it keeps its graphs, so it can be called
        repeatedly
    """
    params = list(params)
    n_samples = statistics[0].shape[0]
    scaled_weights = [weight.detach() / n_samples for weight in weights]
    probes = [torch.zeros_like(statistic, requires_grad=True) for statistic in statistics]
    transposed = torch.autograd.grad(statistics, params, probes, create_graph=True, allow_unused=True)
    used = [index for index, grad in enumerate(transposed) if grad is not None]
    shapes = [param.shape for param in params]
    sizes = [param.numel() for param in params]

    def product(vector: torch.Tensor) -> torch.Tensor:
        parts = [part.view(shape) for part, shape in zip(vector.detach().split(sizes), shapes, strict=True)]
        directional = torch.autograd.grad(
            [transposed[index] for index in used],
            probes,
            [parts[index] for index in used],
            retain_graph=True,
            allow_unused=True,
        )
        cotangents = [
            torch.zeros_like(probe) if change is None else weight * change
            for probe, weight, change in zip(probes, scaled_weights, directional, strict=True)
        ]
        grads = torch.autograd.grad(statistics, params, cotangents, retain_graph=True, allow_unused=True)
        return _flatten(grads, params) + damping * vector

    return product
