"""Value-target normalization with preserved outputs (``normalize_value_targets``).

The critic learns the returns in units of their running mean and standard deviation: the policy's value layer is
replaced by :class:`NormalizedValueHead`, whose outputs are ``mean + std * (W x + b)``, and the critic's loss compares
normalized values with normalized returns. When a rollout's returns move the statistics, ``W`` and ``b`` are rescaled
so that every output stays what it was (the "preserving outputs" half of PopArt, van Hasselt et al. 2016,
https://arxiv.org/abs/1602.07714). Everything outside the critic's fit (the rollout's values, GAE, bootstrapping at
time limits, ``explained_variance``) sees values in the returns' own units, as without the option.
"""

from __future__ import annotations

import numpy as np
import torch
from stable_baselines3.common.policies import ActorCriticPolicy
from torch import nn

from sb3_npg.common.distributed import Reducer
from sb3_npg.common.vec_normalize_sync import Moments, summed_over_ranks

#: The smallest standard deviation the targets are divided by, so that returns that barely vary are not blown up.
MIN_TARGET_STD = 1e-4


class NormalizedValueHead(nn.Linear):
    """
    A linear value layer that learns in normalized units: ``forward`` returns ``mean + std * (W x + b)``.

    The statistics are buffers (saved with the policy's state dict, moved with it between devices), in the state
    dict next to SB3's ``weight`` and ``bias``: ``target_mean``, ``target_var`` and ``target_count``.
    """

    target_mean: torch.Tensor
    target_var: torch.Tensor
    target_count: torch.Tensor

    def __init__(self, in_features: int, out_features: int, device: torch.device | None = None):
        super().__init__(in_features, out_features, device=device)
        self.register_buffer("target_mean", torch.zeros((), device=device))
        self.register_buffer("target_var", torch.ones((), device=device))
        self.register_buffer("target_count", torch.zeros((), dtype=torch.float64, device=device))

    @classmethod
    def replacing(cls, layer: nn.Linear) -> NormalizedValueHead:
        """A head with ``layer``'s weights and empty statistics (mean 0, std 1): until the first returns arrive, the
        same outputs."""
        head = cls(layer.in_features, layer.out_features, device=layer.weight.device)
        with torch.no_grad():
            head.weight.copy_(layer.weight)
            head.bias.copy_(layer.bias)
        return head

    @property
    def target_std(self) -> torch.Tensor:
        """The standard deviation the targets are divided by (at least :data:`MIN_TARGET_STD`)."""
        return self.target_var.sqrt().clamp_min(MIN_TARGET_STD)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return super().forward(features) * self.target_std + self.target_mean

    def normalized(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (in the returns' units) in the units the layer learns in."""
        return (values - self.target_mean) / self.target_std

    @torch.no_grad()
    def add_targets(self, returns: torch.Tensor, reducer: Reducer) -> None:
        """
        Merge one rollout's returns, over every rank, into the statistics; rescale ``W`` and ``b`` so that no output
        changes. The first rollout's returns set the statistics outright: the untrained layer's outputs carry nothing
        worth preserving, and scaled by the returns' spread around their mean they start the critic in their units.

        :param returns: this rank's returns of the rollout
        :param reducer: the model's reducer: every rank merges the same samples, so the statistics stay equal
        """
        flat = returns.detach().double().flatten().cpu().numpy()
        added = summed_over_ranks(reducer, Moments(np.array(flat.mean()), np.array(flat.var()), float(flat.size)))
        current = Moments(np.array(self.target_mean.item()), np.array(self.target_var.item()), float(self.target_count.item()))
        first = current.count == 0
        total = current.merged(added)
        old_mean, old_std = self.target_mean.clone(), self.target_std
        self.target_mean.fill_(float(total.mean))
        self.target_var.fill_(float(total.var))
        self.target_count.fill_(total.count)
        if not first:
            new_std = self.target_std
            self.weight.mul_(old_std / new_std)
            self.bias.mul_(old_std).add_(old_mean - self.target_mean).div_(new_std)


def install_value_head(policy: ActorCriticPolicy) -> NormalizedValueHead:
    """
    Replace ``policy.value_net`` by a :class:`NormalizedValueHead` with its weights (once: an installed head stays).

    :param policy: an actor-critic policy whose value layer is an ``nn.Linear`` (all of SB3's are)
    :return: the head now in the policy
    :raises ValueError: when the value layer is not an ``nn.Linear``
    """
    layer = policy.value_net
    if isinstance(layer, NormalizedValueHead):
        return layer
    if not isinstance(layer, nn.Linear):
        raise ValueError(
            f"`normalize_value_targets=True` needs a linear value layer (`policy.value_net`), got {type(layer).__name__}"
        )
    policy.value_net = NormalizedValueHead.replacing(layer)
    return policy.value_net
