"""The analytic Fisher of Stable-Baselines3's action distributions, for the Gauss-Newton Fisher-vector product.

Each distribution is described by per-sample statistics in which its Fisher information is diagonal:

- Gaussian (``DiagGaussianDistribution``, gSDE's ``StateDependentNoiseDistribution``): mean ``mu`` and standard
  deviation ``sigma`` per action dimension, with weights ``1 / sigma^2`` and ``2 / sigma^2``. A state-independent
  ``log_std`` enters through ``sigma``.
- Categorical and each sub-action of MultiCategorical: the normalized log-probabilities ``log p``, with weights
  ``p`` (since ``F = sum_a p_a grad log p_a grad log p_a^T``).
- Bernoulli (MultiBinary): the logit ``z`` of each bit, with weight ``p (1 - p)``.
- sb3-contrib's masked categorical, multi-categorical and Bernoulli (two-way categoricals): the normalized
  log-probabilities over the valid actions, with weights ``p``. A masked action has ``p = 0`` exactly and its
  log-probability no gradient, so the product is the Fisher of the distribution over the valid actions,
  ``diag(p) - p p^T`` in the logits restricted to them, with zero curvature on the masked ones.

The product ``J^T M J v`` over these statistics is exactly the Hessian of the mean KL at the base point
(:func:`~sb3_npg.common.natural_gradient.gauss_newton_vector_product`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from stable_baselines3.common.distributions import (
    BernoulliDistribution,
    CategoricalDistribution,
    DiagGaussianDistribution,
    Distribution,
    MultiCategoricalDistribution,
    StateDependentNoiseDistribution,
)
from sb3_contrib.common.maskable.distributions import MaskableCategoricalDistribution, MaskableMultiCategoricalDistribution
from torch import nn

from sb3_npg.common.natural_gradient import MatVec, gauss_newton_vector_product

#: The Fisher information of a Gaussian in its standard deviation is ``2 / sigma^2`` (and ``1 / sigma^2`` in its mean).
GAUSSIAN_STD_FISHER_FACTOR = 2.0
GAUSSIAN = (DiagGaussianDistribution, StateDependentNoiseDistribution)
#: Distributions whose statistics are the log-probabilities of one categorical, or of a list of them.
SINGLE_CATEGORICAL = (CategoricalDistribution, MaskableCategoricalDistribution)
MULTI_CATEGORICAL = (MultiCategoricalDistribution, MaskableMultiCategoricalDistribution)
DISCRETE = (*SINGLE_CATEGORICAL, *MULTI_CATEGORICAL)
#: The distributions whose Fisher :func:`analytic_fisher_product` knows.
ANALYTIC_FISHER_DISTRIBUTIONS = (*GAUSSIAN, *DISCRETE, BernoulliDistribution)


def distribution_statistics(distribution: Distribution) -> tuple[torch.Tensor, ...]:
    """
    The per-sample statistics of ``distribution`` in which its Fisher information is diagonal (see the module doc).

    :param distribution: an SB3 distribution after ``proba_distribution``
    :return: one tensor per statistic, each with the batch as its first dimension
    :raises ValueError: for a distribution without an analytic Fisher here
    """
    if isinstance(distribution, GAUSSIAN):
        normal = distribution.distribution
        return normal.loc, normal.scale
    if isinstance(distribution, SINGLE_CATEGORICAL):
        return (distribution.distribution.logits,)
    if isinstance(distribution, MaskableMultiCategoricalDistribution):  # also MultiBinary's two-way categoricals
        return tuple(categorical.logits for categorical in distribution.distributions)
    if isinstance(distribution, MultiCategoricalDistribution):
        return tuple(categorical.logits for categorical in distribution.distribution)
    if isinstance(distribution, BernoulliDistribution):
        return (distribution.distribution.logits,)
    raise ValueError(f"No analytic Fisher for {type(distribution).__name__}: use fisher='autograd'")


def fisher_weights(distribution: Distribution, statistics: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """
    The diagonal Fisher information of each statistic of :func:`distribution_statistics`.

    :param distribution: the distribution the statistics came from (only its type is used)
    :param statistics: the statistics at the base point
    :return: one weight tensor per statistic, of the same shape
    """
    if isinstance(distribution, GAUSSIAN):
        _, std = statistics
        inverse_variance = std.pow(-2)
        return inverse_variance, GAUSSIAN_STD_FISHER_FACTOR * inverse_variance
    if isinstance(distribution, DISCRETE):
        return tuple(log_probs.exp() for log_probs in statistics)
    (logits,) = statistics
    probability = torch.sigmoid(logits)
    return (probability * (1.0 - probability),)


def analytic_fisher_product(distribution: Distribution, actor_params: Sequence[nn.Parameter], damping: float) -> MatVec:
    """
    The damped Fisher-vector product of the mean KL at the base point, as ``J^T M J v`` (see the module doc).

    :param distribution: the policy's distribution on the Fisher batch, built with gradients at the base point; its
        statistics are read at once, so the policy may build other distributions afterwards
    :param actor_params: the parameters the product is taken over, in the order of the flat vectors
    :param damping: the Tikhonov damping added to the product (``cg_damping``)
    :return: a function computing the damped product on flat vectors
    """
    statistics = distribution_statistics(distribution)
    weights = fisher_weights(distribution, [statistic.detach() for statistic in statistics])
    return gauss_newton_vector_product(statistics, actor_params, weights, damping)
