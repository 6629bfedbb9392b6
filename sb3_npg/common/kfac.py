"""K-FAC: the Kronecker-factored approximation of the Fisher (Martens and Grosse 2015), for ``nn.Linear`` and
``nn.Conv2d`` layers (what each layer contributes: :mod:`sb3_npg.common.kfac_layers`).

Pure PyTorch, with no Stable-Baselines3 imports, like :mod:`sb3_npg.common.natural_gradient`. ACKTR and the K-FAC
options of NPG and TRPO (``fisher_solver``) call it through :mod:`sb3_npg.common.kfac_policy`.

**The factors.** A layer ``s = W a + b`` sees inputs ``a`` (``n x in``) and, backpropagating the per-sample
log-likelihood, gradients ``g = d log p / d s`` at its outputs (``n x out``). With ``a_ext = [a, 1]`` when the layer
has a bias, ``A = E[a_ext a_ext^T]`` and ``G = E[g g^T]``, and the layer's Fisher block is approximated by
``kron(G, A)``: ``F[(o, i), (o', i')] = E[g_o g_o' a_i a_i'] ~= G[o, o'] A[i, i']``.

**The ordering.** ``kron(G, A)`` is indexed by the row-major vectorisation of the layer's gradient matrix
``V = [dW | db]`` (``out x in_ext``): index ``o * in_ext + i``, so ``kron(G, A) vec(V) = vec(G V A)`` and
``kron(G, A)^-1 vec(V) = vec(G^-1 V A^-1)``. The parameters themselves are flattened as ``[vec(W), b]`` (weight
row-major, then bias), a permutation of that order; :func:`layer_matrices` and :func:`flatten_layer_matrices` move
between the two, so every flat vector here is in the parameters' order (:func:`layer_parameters`).

**The true Fisher.** ``g`` comes from the policy's own distribution, never from the rollout's actions (that would be
the empirical Fisher): :func:`sampled_log_likelihood` draws actions from the distribution (with a generator, so it is
reproducible) and :func:`output_factors` backpropagates their log-likelihood, for any network and distribution;
:func:`expected_output_factors` takes the expectation over actions in closed form where the distribution's Fisher is
diagonal in some statistics (a Gaussian's mean, weight ``1 / sigma^2``), by backpropagating the rows of its square
root, one backward pass per statistic component. At a layer whose outputs are a Gaussian's mean,
:func:`gaussian_mean_layer_factor` is that closed form directly: ``G = E[diag(1 / sigma^2)]``. Parameters in no layer
get exact blocks: a state-independent ``log_std`` has ``GAUSSIAN_LOG_STD_FISHER * I`` (:func:`gaussian_log_std_fisher`).

**Damping** has two modes (:data:`DAMPING_MODES`). ``"factored"`` splits it between the factors with the
pi-correction (section 6.3 of the paper): ``pi = sqrt((tr(A) / dim(A)) / (tr(G) / dim(G)))``, ``A + pi sqrt(damping) I``
and ``G + sqrt(damping) / pi I``, whose Kronecker product is ``kron(G, A) + damping I`` plus the cross terms
``sqrt(damping) (pi kron(G, I) + kron(I, A) / pi)``. ``"eigenbasis"`` is exact Tikhonov damping of the Kronecker
product, ``(kron(G, A) + damping I)^-1``, which the factors' eigenbasis makes diagonal: with ``A = Q_A diag(s_A) Q_A^T``
and ``G = Q_G diag(s_G) Q_G^T``, its eigenvalues are ``s_G s_A^T + damping`` (OpenAI baselines' default).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from sb3_npg.common.kfac_layers import (
    CONV_OUTPUT_DIMS,
    LayerRecord,
    flatten_layer_matrices,
    input_factor,
    layer_matrices,
    output_factor,
)

#: The Fisher of a Gaussian in its log standard deviation: ``d^2 KL / d log_std^2 = 2`` per action dimension.
GAUSSIAN_LOG_STD_FISHER = 2.0
#: The pi-correction when a factor's trace is zero (no information to balance the damping with).
NEUTRAL_PI = 1.0
#: The factors are inverted in this precision, whatever the parameters' dtype.
INVERSION_DTYPE = torch.float64
#: Pi-corrected damping split between the two factors (Martens and Grosse 2015, section 6.3).
FACTORED_DAMPING = "factored"
#: Exact damping of the Kronecker product, ``(kron(G, A) + damping I)^-1``, diagonal in the factors' eigenbasis.
EIGENBASIS_DAMPING = "eigenbasis"
#: How the damping enters each layer's inverse (see the module doc).
DAMPING_MODES = (FACTORED_DAMPING, EIGENBASIS_DAMPING)
#: A map of tensors: a damped inverse's product with a layer's matrix, or with a flat gradient.
MatrixMap = Callable[[torch.Tensor], torch.Tensor]


def sample_actions(distribution: torch.distributions.Distribution, generator: torch.Generator) -> torch.Tensor:
    """
    Actions drawn from ``distribution`` with ``generator`` (so that a seeded generator repeats them), detached.

    :param distribution: a ``Normal`` (or ``Independent`` of one), ``Categorical`` or ``Bernoulli``
    :param generator: the random source
    :return: the actions, one per sample (as ``distribution.sample()`` shapes them)
    :raises TypeError: for another distribution
    """
    base = distribution.base_dist if isinstance(distribution, torch.distributions.Independent) else distribution
    with torch.no_grad():
        if isinstance(base, torch.distributions.Normal):
            noise = torch.randn(base.loc.shape, generator=generator, dtype=base.loc.dtype, device=base.loc.device)
            return base.loc + base.scale * noise
        if isinstance(base, torch.distributions.Categorical):
            probs = base.probs.reshape(-1, base.probs.shape[-1])
            return torch.multinomial(probs, 1, generator=generator).reshape(base.probs.shape[:-1])
        if isinstance(base, torch.distributions.Bernoulli):
            uniform = torch.rand(base.probs.shape, generator=generator, dtype=base.probs.dtype, device=base.probs.device)
            return (uniform < base.probs).to(base.probs.dtype)
    raise TypeError(f"No generator-driven sampler for {type(base).__name__}")


def sampled_log_likelihood(
    distributions: torch.distributions.Distribution | Sequence[torch.distributions.Distribution],
    generator: torch.Generator,
) -> torch.Tensor:
    """
    The summed log-likelihood of actions drawn from the policy's own distribution: the true Fisher's backward signal.

    Its gradient at a layer's outputs has, in row ``j``, sample ``j``'s score for its sampled action, so
    :func:`output_factors` of it is an unbiased estimate of the true Fisher's ``G`` (one action per sample).

    :param distributions: the policy's distribution on the batch, differentiable; several (as for a MultiCategorical)
        are summed
    :param generator: the random source of the actions
    :return: a scalar, the sum over samples (and action dimensions) of the sampled actions' log-likelihood
    """
    if isinstance(distributions, torch.distributions.Distribution):
        distributions = [distributions]
    return torch.stack([dist.log_prob(sample_actions(dist, generator)).sum() for dist in distributions]).sum()


def output_factors(log_likelihood: torch.Tensor, records: Sequence[LayerRecord]) -> list[torch.Tensor]:
    """
    ``G = g^T g / n`` of each layer, with ``g`` the gradient of a summed per-sample log-likelihood at its outputs.

    Because the log-likelihood is a sum of per-sample terms, row ``j`` of ``g`` is sample ``j``'s own gradient.

    :param log_likelihood: the summed log-likelihood (:func:`sampled_log_likelihood` for the true Fisher)
    :param records: the layers' records from the forward pass that built it
    :return: one ``(out, out)`` factor per record
    """
    outputs = [record.outputs for record in records]
    grads = torch.autograd.grad(log_likelihood, outputs, retain_graph=True, allow_unused=True)
    return [
        output_factor((torch.zeros_like(output) if grad is None else grad).detach())
        for output, grad in zip(outputs, grads, strict=True)
    ]


def expected_output_factors(
    statistics: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], records: Sequence[LayerRecord]
) -> list[torch.Tensor]:
    """
    The true Fisher's ``G`` of each layer in closed form: the expectation over actions, not a sample.

    For statistics ``s`` in which the distribution's Fisher is diagonal with weights ``w`` (a Gaussian's mean with
    ``1 / sigma^2``, as in :mod:`sb3_npg.common.fisher`), ``E_a[g g^T] = J^T diag(w) J`` per sample, the sum over
    components ``k`` of ``u_k u_k^T`` with ``u_k = J^T (sqrt(w_k) e_k)``: one backward pass per component.

    :param statistics: the statistics, each ``(n, d)``, with their graph to the layers' outputs
    :param weights: their diagonal Fisher weights, same shapes
    :param records: the layers' records from the forward pass that built the statistics
    :return: one ``(out, out)`` factor per record
    """
    outputs = [record.outputs for record in records]
    sizes = [output.shape[1] if output.dim() == CONV_OUTPUT_DIMS else output.shape[-1] for output in outputs]
    factors = [output.new_zeros(size, size) for output, size in zip(outputs, sizes, strict=True)]
    for statistic, weight in zip(statistics, weights, strict=True):
        flat = statistic.reshape(statistic.shape[0], -1)
        root = weight.detach().reshape(flat.shape).sqrt()
        for component in range(flat.shape[1]):
            signal = torch.zeros_like(flat)
            signal[:, component] = root[:, component]
            grads = torch.autograd.grad(flat, outputs, signal, retain_graph=True, allow_unused=True)
            for index, grad in enumerate(grads):
                if grad is not None:
                    factors[index] += output_factor(grad.detach())
    return factors


def gaussian_mean_layer_factor(std: torch.Tensor) -> torch.Tensor:
    """
    The exact ``G`` of a layer whose outputs are a diagonal Gaussian's mean: ``E[diag(1 / sigma^2)]``.

    :param std: the standard deviation, ``(d,)`` (state-independent) or ``(n, d)``
    :return: ``(d, d)``
    """
    inverse_variance = std.detach().reshape(-1, std.shape[-1]).pow(-2).mean(dim=0)
    return torch.diag(inverse_variance)


def gaussian_log_std_fisher(log_std: torch.Tensor) -> torch.Tensor:
    """
    The exact Fisher block of a state-independent ``log_std`` for the mean (summed over action dimensions) KL.

    ``KL`` per dimension is ``l - l_0 + exp(2 (l_0 - l)) / 2 - 1/2`` in ``l = log sigma``, whose second derivative
    at ``l_0`` is 2, whatever the state; the mean over states keeps it.

    :param log_std: the parameter
    :return: ``GAUSSIAN_LOG_STD_FISHER * I``, ``(numel, numel)``
    """
    return GAUSSIAN_LOG_STD_FISHER * torch.eye(log_std.numel(), dtype=log_std.dtype, device=log_std.device)


@dataclass
class KroneckerFactors:
    """
    One layer's Kronecker factors, as exponential moving averages across updates.

    :param input_factor: ``A``, ``(in_ext, in_ext)``; ``None`` before the first update
    :param output_factor: ``G``, ``(out, out)``; ``None`` before the first update
    :param updates: how many batches have been averaged in
    """

    input_factor: torch.Tensor | None = None
    output_factor: torch.Tensor | None = None
    updates: int = 0

    def update(self, input_factor: torch.Tensor, output_factor: torch.Tensor, decay: float) -> None:
        """
        Average a batch's factors in: ``F <- decay * F + (1 - decay) * F_new``.

        The first update sets the factors outright: starting from zero would bias the early averages toward zero
        (and the inverse toward the damping alone), as an uncorrected moving average does.

        :param input_factor: the batch's ``A``
        :param output_factor: the batch's ``G``
        :param decay: the weight of the past, in ``[0, 1)``
        """
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"The decay must be in [0, 1), not {decay}")
        if self.input_factor is None or self.output_factor is None:
            self.input_factor, self.output_factor = input_factor.detach().clone(), output_factor.detach().clone()
        else:
            self.input_factor = decay * self.input_factor + (1.0 - decay) * input_factor.detach()
            self.output_factor = decay * self.output_factor + (1.0 - decay) * output_factor.detach()
        self.updates += 1

    def factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The factors ``(A, G)``; raises before the first update."""
        if self.input_factor is None or self.output_factor is None:
            raise RuntimeError("The Kronecker factors have not been updated yet")
        return self.input_factor, self.output_factor


def update_factors(
    factors: Sequence[KroneckerFactors],
    layers: Sequence[nn.Module],
    records: dict[nn.Module, LayerRecord],
    batch_output_factors: Sequence[torch.Tensor],
    decay: float,
) -> None:
    """
    Average one batch's factors into each layer's running ones.

    :param factors: the running factors, one per layer
    :param layers: the layers, in the same order
    :param records: the forward pass's records (:func:`record_layers`), for the inputs
    :param batch_output_factors: each layer's ``G`` for the batch (:func:`output_factors` or :func:`expected_output_factors`)
    :param decay: the moving average's decay
    """
    for running, layer, output in zip(factors, layers, batch_output_factors, strict=True):
        running.update(input_factor(layer, records[layer].inputs), output, decay)


def pi_correction(input_factor: torch.Tensor, output_factor: torch.Tensor) -> float:
    """
    ``pi = sqrt((tr(A) / dim(A)) / (tr(G) / dim(G)))``, which balances the damping between the factors.

    :param input_factor: ``A``
    :param output_factor: ``G``
    :return: ``pi``; ``NEUTRAL_PI`` when either trace is not positive
    """
    input_scale = float(torch.trace(input_factor)) / input_factor.shape[0]
    output_scale = float(torch.trace(output_factor)) / output_factor.shape[0]
    if input_scale <= 0.0 or output_scale <= 0.0:
        return NEUTRAL_PI
    return math.sqrt(input_scale / output_scale)


def damped_factors(
    input_factor: torch.Tensor, output_factor: torch.Tensor, damping: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    The damped factors ``(A + pi sqrt(damping) I, G + sqrt(damping) / pi I)``.

    :param input_factor: ``A``
    :param output_factor: ``G``
    :param damping: the Tikhonov damping ``lambda`` of the product (``kron`` of the two adds about ``lambda I``)
    :return: the damped ``(A, G)``
    """
    pi = pi_correction(input_factor, output_factor)
    root = math.sqrt(damping)
    eye_a = torch.eye(input_factor.shape[0], dtype=input_factor.dtype, device=input_factor.device)
    eye_g = torch.eye(output_factor.shape[0], dtype=output_factor.dtype, device=output_factor.device)
    return input_factor + pi * root * eye_a, output_factor + root / pi * eye_g


def damped_eigenvalues(
    values_a: torch.Tensor, values_g: torch.Tensor, damping: float, pi: float, mode: str = FACTORED_DAMPING
) -> torch.Tensor:
    """
    The eigenvalues of a layer's damped Kronecker product, ``(out, in_ext)``, in the factors' eigenbasis.

    :param values_a: ``A``'s eigenvalues (clamped at 0 here: a factor is positive semi-definite)
    :param values_g: ``G``'s eigenvalues
    :param damping: the Tikhonov damping
    :param pi: the pi-correction (used by ``"factored"`` only)
    :param mode: one of :data:`DAMPING_MODES`
    :return: ``(s_G + sqrt(damping) / pi)(s_A + pi sqrt(damping))^T`` (factored) or ``s_G s_A^T + damping`` (eigenbasis)
    :raises ValueError: for another mode
    """
    values_a, values_g = values_a.clamp(min=0.0), values_g.clamp(min=0.0)
    if mode == FACTORED_DAMPING:
        root = math.sqrt(damping)
        return torch.outer(values_g + root / pi, values_a + pi * root)
    if mode == EIGENBASIS_DAMPING:
        return torch.outer(values_g, values_a) + damping
    raise ValueError(f"The damping mode must be one of {DAMPING_MODES}, not {mode!r}")


def damped_inverse(
    input_factor: torch.Tensor, output_factor: torch.Tensor, damping: float, mode: str = FACTORED_DAMPING
) -> MatrixMap:
    """
    ``V -> (damped kron(G, A))^-1 vec(V)``, by symmetric eigendecompositions computed once (in ``INVERSION_DTYPE``)
    for every ``V`` it is applied to: with ``G = Q_G L_G Q_G^T`` and ``A = Q_A L_A Q_A^T``, the map is
    ``Q_G ((Q_G^T V Q_A) / E) Q_A^T`` with ``E`` the damped eigenvalues of :func:`damped_eigenvalues`: the pi-corrected
    damped factors' ``G_d^-1 V A_d^-1`` (``"factored"``), or ``(kron(G, A) + damping I)^-1 vec(V)`` (``"eigenbasis"``).

    :param input_factor: ``A``
    :param output_factor: ``G``
    :param damping: the Tikhonov damping
    :param mode: one of :data:`DAMPING_MODES`
    :return: the map ``V`` ``(out, in_ext)`` -> the damped inverse's product, in ``V``'s dtype
    """
    pi = pi_correction(input_factor, output_factor)
    values_a, vectors_a = torch.linalg.eigh(input_factor.to(INVERSION_DTYPE))
    values_g, vectors_g = torch.linalg.eigh(output_factor.to(INVERSION_DTYPE))
    eigenvalues = damped_eigenvalues(values_a, values_g, damping, pi, mode)

    def apply(matrix: torch.Tensor) -> torch.Tensor:
        rotated = vectors_g.T @ matrix.to(INVERSION_DTYPE) @ vectors_a
        return (vectors_g @ (rotated / eigenvalues) @ vectors_a.T).to(matrix.dtype)

    return apply


def kronecker_product(input_factor: torch.Tensor, output_factor: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """``kron(G, A) vec(V) = vec(G V A)`` for ``V`` ``(out, in_ext)``: one layer's K-FAC Fisher product, undamped."""
    return output_factor @ matrix @ input_factor


def kfac_fisher_product(
    factors: Sequence[KroneckerFactors], layers: Sequence[nn.Module], vector: torch.Tensor
) -> torch.Tensor:
    """
    The K-FAC approximate Fisher times a flat vector: ``vec(G V A)`` per layer (block-diagonal across layers).

    :param factors: each layer's running factors
    :param layers: the layers
    :param vector: in the parameters' order
    :return: the product, in the parameters' order
    """
    products = [
        kronecker_product(*running.factors(), matrix)
        for running, matrix in zip(factors, layer_matrices(vector, layers), strict=True)
    ]
    return flatten_layer_matrices(products, layers)


def kfac_inverse(
    factors: Sequence[KroneckerFactors], layers: Sequence[nn.Module], damping: float, mode: str = FACTORED_DAMPING
) -> MatrixMap:
    """
    The K-FAC natural-gradient map, each layer's damped inverse (:func:`damped_inverse`) applied to its part of the
    gradient; each layer's eigendecompositions are computed once, here, for every gradient it is applied to.

    :param factors: each layer's running factors
    :param layers: the layers
    :param damping: the Tikhonov damping
    :param mode: one of :data:`DAMPING_MODES`: the pi-corrected factored damping, or exact damping in the eigenbasis
    :return: the map from a flat gradient to its preconditioned direction, both in the parameters' order
    """
    inverses = [damped_inverse(*running.factors(), damping, mode) for running in factors]

    def apply(gradient: torch.Tensor) -> torch.Tensor:
        matrices = layer_matrices(gradient, layers)
        return flatten_layer_matrices([inverse(m) for inverse, m in zip(inverses, matrices, strict=True)], layers)

    return apply
