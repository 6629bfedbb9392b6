"""Rollout collection: SB3's loop, doing per step only what is needed to act.

SB3's ``collect_rollouts`` runs the whole policy every step: features, actor and critic networks, the action
distribution, the log-probability of the action. Only the action is needed to step the environments. This loop
samples the action exactly as SB3's does (the same distribution, the same draw from the same generator, so the same
actions, observations and rewards), then computes the values and log-probabilities of the whole rollout, and the
values that bootstrap truncated episodes, in batched passes after it. The buffer then holds what SB3's loop writes:
identical observations, actions, rewards and episode starts; values, log-probabilities, returns and advantages equal
up to float rounding (a batched matrix product may round differently from per-step ones).

Callbacks are called as by SB3's loop, with the same local variables, except ``values`` and ``log_probs``, which do
not exist per step here: a callback that needs them per step needs ``rollout_collection="sb3"`` (they are in the
rollout buffer by ``on_rollout_end``). SB3's loop also runs, automatically, for a policy that overrides a method the
two loops reach differently (:data:`LOOP_POLICY_METHODS`) and for a custom rollout buffer class; a warning says so.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv

from sb3_npg.common.acting import action_sampler

#: ``rollout_collection`` options.
ROLLOUT_COLLECTIONS = ("fast", "sb3")
#: Policy methods that SB3's loop (``forward``) and this one (``get_distribution``, ``evaluate_actions``,
#: ``predict_values``) reach differently: a policy that overrides one is collected by SB3's loop.
LOOP_POLICY_METHODS = ("forward", "get_distribution", "evaluate_actions", "predict_values", "extract_features")
#: The buffers whose ``add`` and arrays this loop knows.
KNOWN_BUFFERS = (RolloutBuffer, DictRolloutBuffer)
#: Rows per batched pass over the rollout (bounds the memory of image observations).
BATCHED_PASS_ROWS = 4096


class Truncation(NamedTuple):
    """An episode cut by a time limit: its value bootstraps the reward of that step."""

    step: int
    env_index: int
    terminal_observation: Any


def _rows(observations: np.ndarray | dict[str, np.ndarray], count: int) -> np.ndarray | dict[str, np.ndarray]:
    """The rollout's ``(n_steps, n_envs, ...)`` observations as ``count`` rows."""
    if isinstance(observations, dict):
        return {key: value.reshape(count, *value.shape[2:]) for key, value in observations.items()}
    return observations.reshape(count, *observations.shape[2:])


def _stacked(observations: list[Any]) -> np.ndarray | dict[str, np.ndarray]:
    """Single observations (arrays, or dicts of arrays) as one batch."""
    if isinstance(observations[0], dict):
        return {key: np.stack([observation[key] for observation in observations]) for key in observations[0]}
    return np.stack(observations)


def _storer(buffer: RolloutBuffer) -> Callable[..., None]:
    """``buffer.add``, or for a plain ``RolloutBuffer`` of array observations the same writes without its copies."""
    if type(buffer) is not RolloutBuffer or isinstance(buffer.observation_space, spaces.Discrete):
        return buffer.add

    def store(observations: np.ndarray, actions: np.ndarray, rewards: np.ndarray, starts: np.ndarray, *_: Any) -> None:
        position = buffer.pos
        buffer.observations[position] = observations
        buffer.actions[position] = actions.reshape(buffer.n_envs, buffer.action_dim)
        buffer.rewards[position] = rewards
        buffer.episode_starts[position] = starts
        buffer.pos += 1
        buffer.full = buffer.pos == buffer.buffer_size

    return store


def compute_returns_and_advantage(buffer: RolloutBuffer, last_values: torch.Tensor, dones: np.ndarray) -> None:
    """
    ``buffer.compute_returns_and_advantage(last_values, dones)`` (GAE), to the bit, in a fraction of its time.

    SB3's loop evaluates, step by step from the last, ``delta = r + gamma * V' * (1 - start') - V`` and
    ``A = delta + gamma * gae_lambda * (1 - start') * A'`` in float32. Every factor but the previous advantage is
    known before the loop, so here the deltas and coefficients of all steps are computed at once (the same float32
    operations in the same order, so the same numbers) and the loop keeps only the recursion.

    :param buffer: a filled ``RolloutBuffer`` or ``DictRolloutBuffer`` (their own method, not a subclass's)
    :param last_values: the values of the observations after the last step
    :param dones: whether the last step ended each environment's episode
    """
    next_values = np.concatenate([buffer.values[1:], last_values.clone().cpu().numpy().reshape(1, -1)])
    next_non_terminal = 1.0 - np.concatenate([buffer.episode_starts[1:], dones.astype(np.float32).reshape(1, -1)])
    deltas = buffer.rewards + buffer.gamma * next_values * next_non_terminal - buffer.values
    coefficients = buffer.gamma * buffer.gae_lambda * next_non_terminal
    advantage = deltas[-1]
    buffer.advantages[-1] = advantage
    for step in range(buffer.buffer_size - 2, -1, -1):
        advantage = deltas[step] + coefficients[step] * advantage
        buffer.advantages[step] = advantage
    buffer.returns = buffer.advantages + buffer.values


class FastRollouts(OnPolicyAlgorithm):
    """
    SB3's rollout collection with per-step work cut to acting (see the module doc); SB3's loop as the fallback.

    A policy kind that reads more than observations (sb3-contrib's masked policies) plugs in through
    :attr:`reference_policy_class`, :attr:`known_buffers`, :meth:`_step_masks`, :meth:`_rollout_sampler` and
    :meth:`_reference_collect_rollouts`; the loop itself is the same.
    """

    rollout_collection: str
    #: The policy class whose methods the fast loop reproduces (a policy overriding one is collected by the fallback).
    reference_policy_class: ClassVar[type[BasePolicy]] = ActorCriticPolicy
    #: The buffers whose ``add`` and arrays the fast loop knows.
    known_buffers: ClassVar[tuple[type[RolloutBuffer], ...]] = KNOWN_BUFFERS

    def _step_masks(self, env: VecEnv) -> np.ndarray | None:
        """The action masks of this step (``None``: the policy takes none)."""
        return None

    def _rollout_sampler(self) -> Callable[[Any, np.ndarray | None], np.ndarray]:
        """The actions for the environments' observations (and this step's masks), as the reference loop draws them."""
        sample = action_sampler(self.policy)
        return lambda observations, _masks: sample(observations)

    def _reference_collect_rollouts(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """The fallback: SB3's own loop (for a policy kind, the loop of its reference algorithm)."""
        return OnPolicyAlgorithm.collect_rollouts(self, env, callback, rollout_buffer, n_rollout_steps)

    def sb3_loop_reason(self, rollout_buffer: RolloutBuffer | None = None) -> str | None:
        """
        Why SB3's own loop collects the rollouts of this model, or ``None`` when the fast loop does.

        :param rollout_buffer: the buffer to fill (default: the model's)
        """
        if self.rollout_collection == "sb3":
            return "rollout_collection='sb3'"
        reference = self.reference_policy_class
        overridden = [name for name in LOOP_POLICY_METHODS if getattr(type(self.policy), name) is not getattr(reference, name)]
        if overridden:
            return f"the policy overrides {', '.join(overridden)}"
        if type(rollout_buffer or self.rollout_buffer) not in self.known_buffers:
            return f"the rollout buffer is a {type(rollout_buffer or self.rollout_buffer).__name__}"
        return None

    def collect_rollouts(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """Fill ``rollout_buffer`` as SB3's ``collect_rollouts`` does (same arguments and return value)."""
        reason = self.sb3_loop_reason(rollout_buffer)
        if reason is None:
            return self._collect_fast(env, callback, rollout_buffer, n_rollout_steps)
        if reason != "rollout_collection='sb3'" and not getattr(self, "_warned_sb3_loop", False):
            warnings.warn(f"{type(self).__name__} collects rollouts with SB3's loop: {reason}", UserWarning, stacklevel=2)
            self._warned_sb3_loop = True
        return self._reference_collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)

    def _act(
        self, n_steps: int, n_envs: int, sample: Callable[[Any, np.ndarray | None], np.ndarray], masks: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The actions for ``self._last_obs`` as SB3's loop samples them, and those the environments receive."""
        if self.use_sde and self.sde_sample_freq > 0 and n_steps % self.sde_sample_freq == 0:
            self.policy.reset_noise(n_envs)  # a new noise matrix, as SB3's loop draws it
        actions = sample(self._last_obs, masks)
        actions = actions.reshape((-1, *(self.action_space.shape or ())))  # as the policy's forward does (Box of rank > 1)
        clipped_actions = actions
        if isinstance(self.action_space, spaces.Box):
            if self.policy.squash_output:
                clipped_actions = self.policy.unscale_action(clipped_actions)
            else:
                clipped_actions = actions.clip(self.action_space.low, self.action_space.high)  # np.clip, less overhead
        return actions, clipped_actions

    def _collect_fast(self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int) -> bool:
        """SB3's loop (same order of calls, same callback locals but ``values`` and ``log_probs``), acting only."""
        assert self._last_obs is not None, "No previous observation was provided"
        self.policy.set_training_mode(False)
        n_steps = 0
        rollout_buffer.reset()
        if self.use_sde:
            self.policy.reset_noise(env.num_envs)
        callback.on_rollout_start()
        truncations: list[Truncation] = []
        unknown = torch.zeros(env.num_envs)  # values and log-probabilities: filled after the rollout
        sample, store = self._rollout_sampler(), _storer(rollout_buffer)
        while n_steps < n_rollout_steps:
            masks = self._step_masks(env)
            actions, clipped_actions = self._act(n_steps, env.num_envs, sample, masks)
            new_obs, rewards, dones, infos = env.step(clipped_actions)
            self.num_timesteps += env.num_envs
            callback.update_locals(locals())
            if not callback.on_step():
                return False
            self._update_info_buffer(infos, dones)
            if isinstance(self.action_space, spaces.Discrete):
                actions = actions.reshape(-1, 1)
            for index, done in enumerate(dones):
                if (
                    done
                    and infos[index].get("terminal_observation") is not None
                    and infos[index].get("TimeLimit.truncated", False)
                ):
                    truncations.append(Truncation(n_steps, index, infos[index]["terminal_observation"]))
            n_steps += 1
            extra = {} if masks is None else {"action_masks": masks}
            store(self._last_obs, actions, rewards, self._last_episode_starts, unknown, unknown, **extra)
            self._last_obs = new_obs  # type: ignore[assignment]
            self._last_episode_starts = dones
        self._complete_rollout(rollout_buffer, truncations, new_obs, dones)
        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    def _complete_rollout(
        self, rollout_buffer: RolloutBuffer, truncations: list[Truncation], new_obs: Any, dones: np.ndarray
    ) -> None:
        """The values and log-probabilities of the whole rollout, the truncation bootstraps, returns and advantages."""
        with torch.no_grad():
            self._evaluate_rollout(rollout_buffer)
            if truncations:
                terminal = self.policy.obs_to_tensor(
                    _stacked([truncation.terminal_observation for truncation in truncations])
                )[0]
                terminal_values = self.policy.predict_values(terminal).flatten()
                for truncation, value in zip(truncations, terminal_values, strict=True):
                    rollout_buffer.rewards[truncation.step, truncation.env_index] += self.gamma * value.item()
            last_values = self.policy.predict_values(obs_as_tensor(new_obs, self.device))
        compute_returns_and_advantage(rollout_buffer, last_values, dones)

    def _evaluate_rollout(self, rollout_buffer: RolloutBuffer) -> None:
        """``values`` and ``log_probs`` of every stored step, in batched passes of the policy."""
        shape = rollout_buffer.values.shape
        count = int(np.prod(shape))
        observations = _rows(rollout_buffer.observations, count)
        actions = rollout_buffer.actions.reshape(count, -1)
        masks = getattr(rollout_buffer, "action_masks", None)  # sb3-contrib's masked buffers: the stored masks
        values, log_probs = np.empty(count, np.float32), np.empty(count, np.float32)
        for start in range(0, count, BATCHED_PASS_ROWS):
            rows = slice(start, start + BATCHED_PASS_ROWS)
            part = (
                {key: value[rows] for key, value in observations.items()}
                if isinstance(observations, dict)
                else observations[rows]
            )
            action = torch.as_tensor(actions[rows], device=self.device)
            action = action.long().flatten() if isinstance(self.action_space, spaces.Discrete) else action.float()
            extra = {} if masks is None else {"action_masks": masks.reshape(count, -1)[rows]}
            value, log_prob, _ = self.policy.evaluate_actions(obs_as_tensor(part, self.device), action, **extra)
            values[rows], log_probs[rows] = value.flatten().cpu().numpy(), log_prob.cpu().numpy()
        rollout_buffer.values[:] = values.reshape(shape)
        rollout_buffer.log_probs[:] = log_probs.reshape(shape)
