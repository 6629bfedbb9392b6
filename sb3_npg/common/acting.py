"""Sampling the policy's actions as its distribution would, without building the distribution.

SB3's ``get_distribution(obs).get_actions()`` builds a torch distribution object every step (normalizing logits,
validating arguments) before it draws. For SB3's diagonal Gaussian, gSDE and categorical distributions the samplers here
compute the same tensors and make, from the same generator, the draws that ``torch.normal`` and ``torch.multinomial``
make inside (standard normals, then scaled and shifted; exponentials, then the argmax of probabilities over them;
gSDE draws nothing per step: the mean plus the noise of its current matrix),
without those functions' overhead: the actions are the same to the bit (``tests/test_rollouts.py`` compares whole
rollouts with SB3's loop, so a PyTorch release that draws differently fails there, not silently). Any other
distribution, or a policy that builds its distribution its own way, is sampled through ``get_distribution``.
For SB3's MLP policies (flatten extractor, linear layers, tanh or ReLU, no hooks) the actor network is evaluated as
the functions its modules call, without the per-module call machinery; the numbers are the same.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from stable_baselines3.common.distributions import (
    CategoricalDistribution,
    DiagGaussianDistribution,
    StateDependentNoiseDistribution,
)
from stable_baselines3.common.policies import ActorCriticPolicy, BaseModel
from stable_baselines3.common.preprocessing import preprocess_obs
from stable_baselines3.common.torch_layers import FlattenExtractor, MlpExtractor
from torch import nn
from torch.nn import functional as F

#: Observations (a tensor, or a dict of tensors) -> sampled actions.
Sampler = Callable[[torch.Tensor | dict[str, torch.Tensor]], torch.Tensor]


#: Activation modules and the functions their ``forward`` calls.
ACTIVATIONS: dict[type[nn.Module], Callable[[torch.Tensor], torch.Tensor]] = {nn.Tanh: torch.tanh, nn.ReLU: torch.relu}
#: Latent of the actor: observations (a tensor, or a dict of tensors) -> the input of the action head.
Latent = Callable[[torch.Tensor | dict[str, torch.Tensor]], torch.Tensor]


def _has_hooks(module: nn.Module) -> bool:
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks")
    global_hooks = (nn.modules.module._global_forward_hooks, nn.modules.module._global_forward_pre_hooks)
    return any(any(getattr(part, name, None) for name in hooks) for part in module.modules()) or any(global_hooks)


def _plain_latent(policy: ActorCriticPolicy) -> Latent | None:
    """
    The actor's latent as the functions its modules call (``F.linear``, ``torch.tanh``...), without the modules' call
    machinery: for SB3's flatten extractor and MLP extractor of linear layers and tanh or ReLU, with no hooks.
    """
    parts = (policy.pi_features_extractor, policy.mlp_extractor)
    if type(parts[0]) is not FlattenExtractor or type(parts[1]) is not MlpExtractor or any(map(_has_hooks, parts)):
        return None
    layers = list(policy.mlp_extractor.policy_net)
    if not all(type(layer) is nn.Linear or type(layer) in ACTIVATIONS for layer in layers):
        return None

    def latent(observations: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        x = preprocess_obs(observations, policy.observation_space, normalize_images=policy.normalize_images)
        x = x.flatten(1)  # type: ignore[union-attr]
        for layer in layers:
            x = F.linear(x, layer.weight, layer.bias) if type(layer) is nn.Linear else ACTIVATIONS[type(layer)](x)
        return x

    return latent


def _latent_pi(policy: ActorCriticPolicy) -> Latent:
    """What ``get_distribution`` computes before the distribution: the actor's features and latent."""
    plain = _plain_latent(policy)
    if plain is not None:
        return plain
    return lambda observations: policy.mlp_extractor.forward_actor(
        BaseModel.extract_features(policy, observations, policy.pi_features_extractor)
    )


def action_sampler(policy: ActorCriticPolicy) -> Sampler:
    """
    The fastest sampler that draws exactly what ``policy.get_distribution(obs).get_actions()`` draws, for one rollout
    (it may read parameters once, so build it again after they change).

    :param policy: the policy (its ``get_distribution`` is SB3's: the caller checks it)
    """
    own_head = type(policy)._get_action_dist_from_latent is not ActorCriticPolicy._get_action_dist_from_latent
    if own_head:
        return lambda observations: policy.get_distribution(observations).get_actions()
    latent = _latent_pi(policy)
    head = policy.action_net
    if type(policy.action_dist) is DiagGaussianDistribution and type(head) is nn.Linear:
        with torch.no_grad():
            std = policy.log_std.exp()  # fixed during a rollout: the sampler is built for each one

        def gaussian(observations: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
            mean = F.linear(latent(observations), head.weight, head.bias)
            # Normal(mean, ones_like(mean) * std).sample() is torch.normal(mean, std), which on the CPU draws standard
            # normals into its output, then multiplies by std and adds the mean: the same steps, without its overhead.
            return torch.empty_like(mean).normal_().mul_(std).add_(mean)

        return gaussian
    if type(policy.action_dist) is CategoricalDistribution and type(head) is nn.Linear:

        def categorical(observations: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
            logits = F.linear(latent(observations), head.weight, head.bias)
            probabilities = F.softmax(logits - logits.logsumexp(dim=-1, keepdim=True), dim=-1)  # as Categorical
            # Categorical.sample() is torch.multinomial(probabilities, 1, True), which for one sample draws
            # exponentials and takes the argmax of probabilities / exponentials: the same steps, without its overhead.
            return probabilities.div(torch.empty_like(probabilities).exponential_()).argmax(dim=-1)

        return categorical
    if type(policy.action_dist) is StateDependentNoiseDistribution and type(head) is nn.Linear:
        state_dependent = policy.action_dist  # its exploration matrices change with reset_noise: read at each call

        def gsde(observations: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
            latent_pi = latent(observations)  # also the noise's features, as in _get_action_dist_from_latent
            # gSDE's sample() is the mean plus the state-dependent noise (no draw: the noise matrix is drawn by
            # reset_noise), then the tanh bijector if squashed; the variance it also computes is not needed to act.
            actions = F.linear(latent_pi, head.weight, head.bias) + state_dependent.get_noise(latent_pi)
            return actions if state_dependent.bijector is None else state_dependent.bijector.forward(actions)

        return gsde
    return lambda observations: policy.get_distribution(observations).get_actions()
