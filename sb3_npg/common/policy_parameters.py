"""Which policy parameters are the actor's and which the critic's, found from the computation graph, not from names."""

from __future__ import annotations

import copy

import torch
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy


def _probe_observation(policy: ActorCriticPolicy) -> torch.Tensor | dict[str, torch.Tensor]:
    """One observation as a batched tensor, drawn from a copy of the space so no user-visible RNG is consumed."""
    observation_space: spaces.Space = copy.deepcopy(policy.observation_space)
    observation_space.seed(0)
    observation, _ = policy.obs_to_tensor(observation_space.sample())
    return observation


def _connected(output: torch.Tensor, params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """The parameters that ``output`` depends on through the autograd graph."""
    grads = torch.autograd.grad(output, params, allow_unused=True, retain_graph=True)
    return [param for param, grad in zip(params, grads, strict=True) if grad is not None]


def split_actor_critic_parameters(
    policy: ActorCriticPolicy,
) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """
    Split a policy's trainable parameters into the actor's and the critic's.

    The actor's are those the action distribution depends on (found by one forward pass on a probe observation
    and the autograd graph of a log-probability), so custom policies with any module names work. The critic's
    are those the value depends on that are not the actor's: with a shared features extractor, the extractor
    belongs to the actor and is moved only by the natural step, never by the critic's optimizer, so the critic
    cannot move the policy outside the trust region.

    :param policy: the actor-critic policy
    :return: ``(actor_params, critic_params)``, each in ``policy.parameters()`` order
    :raises ValueError: when the policy has no actor or no critic parameters
    """
    params = [param for param in policy.parameters() if param.requires_grad]
    was_training = policy.training
    policy.set_training_mode(False)
    try:
        with torch.enable_grad():
            observation = _probe_observation(policy)
            distribution = policy.get_distribution(observation)
            log_prob = distribution.log_prob(distribution.mode().detach()).sum()
            actor = _connected(log_prob, params)
            value = policy.predict_values(observation).sum()
            actor_ids = {id(param) for param in actor}
            critic = [param for param in _connected(value, params) if id(param) not in actor_ids]
        with torch.no_grad():  # the policy keeps its last distribution: leave one without a graph (copyable)
            policy.get_distribution(observation)
    finally:
        policy.set_training_mode(was_training)
    if not actor:
        raise ValueError(f"{type(policy).__name__} has no trainable parameter that the action distribution depends on")
    if not critic:
        raise ValueError(
            f"{type(policy).__name__} has no trainable critic parameter of its own: the value function must have "
            "parameters the action distribution does not depend on"
        )
    return actor, critic
