"""Action distributions frozen at a point, and the true KL between two of them.

SB3's policies reuse one distribution object, which every ``get_distribution`` call overwrites: a distribution kept
for later (the behaviour policy, the base point of a Fisher product) must be a copy. :func:`detached_distribution`
makes one from statistics already computed (no second forward pass) for SB3's distributions;
:func:`frozen_distribution` runs the policy without gradients for any other.
"""

from __future__ import annotations

import copy

import torch
from sb3_contrib.common.maskable.distributions import MaskableMultiCategoricalDistribution
from stable_baselines3.common.distributions import Distribution, kl_divergence
from stable_baselines3.common.policies import ActorCriticPolicy
from torch.distributions import Bernoulli, Categorical, Normal

from sb3_npg.common.batches import MaskedInputs, PolicyInputs


def mean_kl(old: Distribution, new: Distribution) -> torch.Tensor:
    """
    The mean over the batch of the true KL(old || new) between action distributions.

    SB3's ``kl_divergence`` returns one value per action dimension for Box and MultiBinary actions; those are
    independent, so the KL of the joint distribution is their sum. (For MultiDiscrete actions it returns that sum over
    the sub-actions already, one value per sample.)

    :param old: the frozen distribution (the behaviour policy, or a base point)
    :param new: the current distribution
    :return: the scalar mean KL
    """
    if isinstance(old, MaskableMultiCategoricalDistribution) and isinstance(new, MaskableMultiCategoricalDistribution):
        # sb3-contrib keeps its masked sub-distributions in ``distributions``, which SB3's kl_divergence does not read.
        parts = zip(old.distributions, new.distributions, strict=True)
        per_sample = torch.stack([torch.distributions.kl_divergence(p, q) for p, q in parts], dim=1)
    else:
        per_sample = kl_divergence(old, new)
    if per_sample.dim() > 1:
        per_sample = per_sample.flatten(start_dim=1).sum(dim=1)
    return per_sample.mean()


def _detached(inner: object) -> object | None:
    """A torch distribution rebuilt from the detached parameters of ``inner`` (``None`` for another kind)."""
    if isinstance(inner, Normal):
        return Normal(inner.loc.detach(), inner.scale.detach())
    if isinstance(inner, Categorical):
        return Categorical(logits=inner.logits.detach())
    if isinstance(inner, Bernoulli):
        return Bernoulli(logits=inner.logits.detach())
    if isinstance(inner, list) and inner:
        parts = [_detached(part) for part in inner]
        return None if any(part is None for part in parts) else parts
    return None


def detached_distribution(distribution: Distribution) -> Distribution | None:
    """
    A copy of ``distribution`` that no longer depends on the parameters, without a new forward pass.

    :param distribution: an SB3 distribution whose ``distribution`` attribute is a torch ``Normal``, ``Categorical``
        or ``Bernoulli``, or a list of ``Categorical`` (MultiDiscrete)
    :return: the copy, or ``None`` for a distribution of another kind (then use :func:`frozen_distribution`)
    """
    inner = _detached(getattr(distribution, "distribution", None))
    if inner is None:
        return None
    frozen = copy.copy(distribution)
    frozen.distribution = inner  # type: ignore[assignment]
    return frozen


def policy_distribution(policy: ActorCriticPolicy, inputs: PolicyInputs) -> Distribution:
    """
    The policy's action distribution on ``inputs`` at the parameters in place: ``get_distribution(observations)``, or
    for :class:`~sb3_npg.common.batches.MaskedInputs` sb3-contrib's ``get_distribution(observations, action_masks)``
    (the distribution over the valid actions). The one place the update asks the policy for a distribution.

    :param policy: the policy
    :param inputs: the observations, or the observations with what else the policy reads
    """
    if isinstance(inputs, MaskedInputs):
        return policy.get_distribution(inputs.observations, action_masks=inputs.action_masks)  # type: ignore[call-arg]
    return policy.get_distribution(inputs)


def frozen_distribution(policy: ActorCriticPolicy, observations: PolicyInputs) -> Distribution:
    """The policy's action distribution on ``observations`` at the parameters in place, without gradients (a copy)."""
    with torch.no_grad():
        return copy.copy(policy_distribution(policy, observations))


def frozen_copy(policy: ActorCriticPolicy, observations: PolicyInputs, distribution: Distribution) -> Distribution:
    """
    ``distribution`` (the policy's on ``observations``, just computed with gradients) frozen: detached when its kind
    allows, else computed again without gradients.
    """
    return detached_distribution(distribution) or frozen_distribution(policy, observations)
