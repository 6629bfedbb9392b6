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
the functions its modules call, without the per-module call machinery, with detached parameters (no graph, so no grad
mode to enter), from observations converted as ``obs_as_tensor`` and ``preprocess_obs`` convert them but without the
calls that would return their input; the numbers are the same. A sampler takes the environments' arrays and returns
an array: the conversions are part of what it saves.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.distributions import (
    CategoricalDistribution,
    DiagGaussianDistribution,
    StateDependentNoiseDistribution,
)
from stable_baselines3.common.policies import ActorCriticPolicy, BaseModel
from stable_baselines3.common.preprocessing import is_image_space, preprocess_obs
from stable_baselines3.common.torch_layers import FlattenExtractor, MlpExtractor
from stable_baselines3.common.utils import obs_as_tensor
from torch import nn
from torch.nn import functional as F

#: Observations (an array, or a dict of arrays, as the environments return them) -> sampled actions (an array).
Sampler = Callable[[np.ndarray | dict[str, np.ndarray]], np.ndarray]
#: Observations as a tensor (or a dict of tensors) -> a tensor: the actor's latent, or the sampled actions.
TensorFunction = Callable[[torch.Tensor | dict[str, torch.Tensor]], torch.Tensor]

#: Activation modules and the functions their ``forward`` calls.
ACTIVATIONS: dict[type[nn.Module], Callable[[torch.Tensor], torch.Tensor]] = {nn.Tanh: torch.tanh, nn.ReLU: torch.relu}


def _has_hooks(module: nn.Module) -> bool:
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks")
    global_hooks = (nn.modules.module._global_forward_hooks, nn.modules.module._global_forward_pre_hooks)
    return any(any(getattr(part, name, None) for name in hooks) for part in module.modules()) or any(global_hooks)


def _as_float_rows(observations: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
    """``obs.float()`` then ``flatten(1)`` for a Box's tensor, skipping the calls that would return their input."""
    assert isinstance(observations, torch.Tensor)  # a Box space's observations: for mypy
    rows = observations if observations.dtype is torch.float32 else observations.float()
    return rows if rows.dim() == 2 else rows.flatten(1)


def _plain_input(policy: ActorCriticPolicy) -> TensorFunction:
    """``preprocess_obs`` then the flatten extractor: for a Box that is not an image, only the cast to float."""
    space = policy.observation_space
    if isinstance(space, spaces.Box) and not (policy.normalize_images and is_image_space(space)):
        return _as_float_rows
    return lambda observations: preprocess_obs(  # type: ignore[union-attr]
        observations, space, normalize_images=policy.normalize_images
    ).flatten(1)


def _plain_latent(policy: ActorCriticPolicy) -> TensorFunction | None:
    """
    The actor's latent as the functions its modules call (``F.linear``, ``torch.tanh``...), without the modules' call
    machinery and with the parameters detached (no graph is recorded, so no grad mode is needed): for SB3's flatten
    extractor and MLP extractor of linear layers and tanh or ReLU, with no hooks.
    """
    parts = (policy.pi_features_extractor, policy.mlp_extractor)
    if type(parts[0]) is not FlattenExtractor or type(parts[1]) is not MlpExtractor or any(map(_has_hooks, parts)):
        return None
    modules = list(policy.mlp_extractor.policy_net)
    if not all(type(module) is nn.Linear or type(module) in ACTIVATIONS for module in modules):
        return None
    layers = [_plain_layer(module) for module in modules]
    plain_input = _plain_input(policy)

    def latent(observations: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        x = plain_input(observations)
        for layer in layers:
            x = layer(x)
        return x

    return latent


def _plain_layer(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """A linear layer or an activation as the function its ``forward`` calls, with detached parameters."""
    if type(module) is not nn.Linear:
        return ACTIVATIONS[type(module)]
    weight, bias = module.weight.detach(), None if module.bias is None else module.bias.detach()
    return lambda x: F.linear(x, weight, bias)


def _latent_pi(policy: ActorCriticPolicy) -> tuple[TensorFunction, bool]:
    """What ``get_distribution`` computes before the distribution (features, latent), and whether it needs no_grad."""
    plain = _plain_latent(policy)
    if plain is not None:
        return plain, False
    return lambda observations: policy.mlp_extractor.forward_actor(
        BaseModel.extract_features(policy, observations, policy.pi_features_extractor)
    ), True


def _with_arrays(policy: ActorCriticPolicy, sample: TensorFunction, needs_no_grad: bool) -> Sampler:
    """``sample`` from the environments' arrays to an array of actions, with the conversions of SB3's loop."""
    on_cpu = policy.device.type == "cpu"

    def tensor(observations: np.ndarray | dict[str, np.ndarray]) -> torch.Tensor | dict[str, torch.Tensor]:
        if on_cpu and type(observations) is np.ndarray and observations.flags.writeable:
            return torch.from_numpy(observations)  # what obs_as_tensor gives on the CPU, without its checks
        return obs_as_tensor(observations, policy.device)

    def array(actions: torch.Tensor) -> np.ndarray:
        return actions.numpy() if on_cpu else actions.cpu().numpy()

    if not needs_no_grad:
        return lambda observations: array(sample(tensor(observations)))

    def sample_without_graph(observations: np.ndarray | dict[str, np.ndarray]) -> np.ndarray:
        with torch.no_grad():
            return array(sample(tensor(observations)))

    return sample_without_graph


def action_sampler(policy: ActorCriticPolicy) -> Sampler:
    """
    The fastest sampler that draws exactly what ``policy.get_distribution(obs).get_actions()`` draws, from the
    environments' observations to an array of actions, for one rollout (it reads the parameters once: build it again
    after they change).

    :param policy: the policy (its ``get_distribution`` is SB3's: the caller checks it)
    """
    sample, needs_no_grad = _tensor_sampler(policy)
    return _with_arrays(policy, sample, needs_no_grad)


def _tensor_sampler(policy: ActorCriticPolicy) -> tuple[TensorFunction, bool]:
    """The sampler on tensors, and whether it must run without recording a graph."""
    own_head = type(policy)._get_action_dist_from_latent is not ActorCriticPolicy._get_action_dist_from_latent
    if own_head or type(policy.action_net) is not nn.Linear:
        return lambda observations: policy.get_distribution(observations).get_actions(), True
    latent, needs_no_grad = _latent_pi(policy)
    head = _plain_layer(policy.action_net)
    if type(policy.action_dist) is DiagGaussianDistribution:
        std = policy.log_std.detach().exp()  # fixed during a rollout: the sampler is built for each one

        def gaussian(observations: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
            mean = head(latent(observations))
            # Normal(mean, ones_like(mean) * std).sample() is torch.normal(mean, std), which on the CPU draws standard
            # normals into its output, then multiplies by std and adds the mean: the same steps, without its overhead.
            return torch.randn_like(mean).mul_(std).add_(mean)  # randn_like is empty_like(mean).normal_()

        return gaussian, needs_no_grad
    if type(policy.action_dist) is CategoricalDistribution:

        def categorical(observations: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
            logits = head(latent(observations))
            probabilities = F.softmax(logits - logits.logsumexp(dim=-1, keepdim=True), dim=-1)  # as Categorical
            # Categorical.sample() is torch.multinomial(probabilities, 1, True), which for one sample draws
            # exponentials and takes the argmax of probabilities / exponentials: the same steps, without its overhead.
            return probabilities.div(torch.empty_like(probabilities).exponential_()).argmax(dim=-1)

        return categorical, needs_no_grad
    if type(policy.action_dist) is StateDependentNoiseDistribution:
        state_dependent = policy.action_dist  # its exploration matrices change with reset_noise: read at each call

        def gsde(observations: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
            latent_pi = latent(observations)  # also the noise's features, as in _get_action_dist_from_latent
            # gSDE's sample() is the mean plus the state-dependent noise (no draw: the noise matrix is drawn by
            # reset_noise), then the tanh bijector if squashed; the variance it also computes is not needed to act.
            actions = head(latent_pi) + state_dependent.get_noise(latent_pi)
            return actions if state_dependent.bijector is None else state_dependent.bijector.forward(actions)

        return gsde, True  # the noise matrix is drawn with a graph to log_std
    return lambda observations: policy.get_distribution(observations).get_actions(), True
