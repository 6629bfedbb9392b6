"""
Invalid-action masking for NPG, TRPO and ACKTR, with sb3-contrib's parts (``MaskablePPO``'s API).

:class:`MaskableAlgorithm` is what a masked algorithm adds to its unmasked class, and nothing of the update: sb3-contrib's
masked policies under the usual aliases, its masked rollout buffers, the masks of each step (``get_action_masks``)
passed to the sampler and stored with the step, ``learn(..., use_masking=True)`` and ``predict(..., action_masks=...)``.
The update reads the stored masks from the buffer (:func:`~sb3_npg.common.batches.rollout_tensors`), so its surrogate,
KL, Fisher and K-FAC factors are those of the distribution over the valid actions under the behaviour policy's masks.
SB3's loop as the fallback becomes ``MaskablePPO``'s, called on this model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from gymnasium import spaces
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.buffers import MaskableDictRolloutBuffer, MaskableRolloutBuffer
from sb3_contrib.common.maskable.policies import (
    MaskableActorCriticCnnPolicy,
    MaskableActorCriticPolicy,
    MaskableMultiInputActorCriticPolicy,
)
from sb3_contrib.common.maskable.utils import get_action_masks, is_masking_supported
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import MaybeCallback
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv

from sb3_npg.common.algorithm import NaturalPolicyGradient


class AcceptsUseSde:
    """
    SB3's ``OnPolicyAlgorithm`` builds every policy with ``use_sde=``; sb3-contrib's masked policies take no such
    keyword (``MaskablePPO`` builds its policy itself). Masked actions are discrete, without gSDE: ``False`` is taken
    and dropped, ``True`` refused.
    """

    def __init__(self, *args: Any, use_sde: bool = False, **kwargs: Any) -> None:
        if use_sde:
            raise ValueError("A masked policy has discrete actions: gSDE (use_sde=True) does not apply")
        super().__init__(*args, **kwargs)


class MaskableMlpPolicy(AcceptsUseSde, MaskableActorCriticPolicy):
    """sb3-contrib's ``MaskableActorCriticPolicy``, built by SB3's ``_setup_model``."""


class MaskableCnnPolicy(AcceptsUseSde, MaskableActorCriticCnnPolicy):
    """sb3-contrib's ``MaskableActorCriticCnnPolicy``, built by SB3's ``_setup_model``."""


class MaskableMultiInputPolicy(AcceptsUseSde, MaskableMultiInputActorCriticPolicy):
    """sb3-contrib's ``MaskableMultiInputActorCriticPolicy``, built by SB3's ``_setup_model``."""


#: The policy aliases of a masked algorithm: sb3-contrib's masked actor-critic policies.
MASKABLE_POLICY_ALIASES: dict[str, type[BasePolicy]] = {
    "MlpPolicy": MaskableMlpPolicy,
    "CnnPolicy": MaskableCnnPolicy,
    "MultiInputPolicy": MaskableMultiInputPolicy,
}
#: The action spaces sb3-contrib masks.
MASKABLE_ACTION_SPACES = (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)

SelfMaskable = TypeVar("SelfMaskable", bound="MaskableAlgorithm")


class MaskableAlgorithm(NaturalPolicyGradient):
    """
    The masked variant of a natural-gradient algorithm: put it first among the bases of a subclass of the algorithm,
    ``class MaskableTRPO(MaskableAlgorithm, TRPO)``; everything else is the algorithm's.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = MASKABLE_POLICY_ALIASES
    reference_policy_class: ClassVar[type[BasePolicy]] = MaskableActorCriticPolicy
    known_buffers: ClassVar[tuple[type[RolloutBuffer], ...]] = (MaskableRolloutBuffer, MaskableDictRolloutBuffer)
    #: Whether the rollouts of the current ``learn`` read the environments' masks (its ``use_masking``).
    use_masking: bool = True

    def _setup_model(self) -> None:
        if not isinstance(self.action_space, MASKABLE_ACTION_SPACES):
            names = ", ".join(space.__name__ for space in MASKABLE_ACTION_SPACES)
            raise ValueError(f"{type(self).__name__} masks {names} actions, not {type(self.action_space).__name__}")
        if self.rollout_buffer_class is None:
            dict_observations = isinstance(self.observation_space, spaces.Dict)
            self.rollout_buffer_class = MaskableDictRolloutBuffer if dict_observations else MaskableRolloutBuffer
        super()._setup_model()

    def learn(  # type: ignore[override]
        self: SelfMaskable,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str | None = None,
        reset_num_timesteps: bool = True,
        use_masking: bool = True,
        progress_bar: bool = False,
    ) -> SelfMaskable:
        """
        Train as the unmasked algorithm does, with ``MaskablePPO.learn``'s ``use_masking``.

        :param total_timesteps: the number of environment steps to train for
        :param callback: callback(s) called at every step with the state of the algorithm
        :param log_interval: the number of rollouts between two log records
        :param tb_log_name: the name of the TensorBoard run (default: the algorithm's class name)
        :param reset_num_timesteps: whether to reset the current timestep count (used in logging)
        :param use_masking: whether each step's actions are drawn under the environments' ``action_masks()`` (and the
            update measured under them); ``False``: every action valid, the unmasked algorithm's update
        :param progress_bar: display a progress bar using tqdm and rich
        :return: the trained model
        """
        if use_masking and self.env is not None and not is_masking_supported(self.env):
            raise ValueError("The environment does not support action masking: wrap it with sb3-contrib's ActionMasker")
        self.use_masking = use_masking
        return super().learn(
            total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )

    def predict(
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        action_masks: np.ndarray | None = None,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """
        The policy's action (and state) for ``observation``, as ``MaskablePPO.predict``: under ``action_masks``.

        :param observation: the input observation
        :param state: the last hidden states (unused: the policy has none)
        :param episode_start: the last masks (unused)
        :param deterministic: whether to return the most likely valid action
        :param action_masks: the valid actions of this observation (``None``: all)
        :return: the action and the next hidden state
        """
        return self.policy.predict(observation, state, episode_start, deterministic, action_masks=action_masks)  # type: ignore[call-arg]

    # ------------------------------------------------------------------ the fast loop's masked parts

    def _step_masks(self, env: VecEnv) -> np.ndarray | None:
        return get_action_masks(env) if self.use_masking else None

    def _rollout_sampler(self) -> Callable[[Any, np.ndarray | None], np.ndarray]:
        """What ``MaskablePPO``'s loop draws: the masked distribution's ``get_actions()``, the same generator draw."""

        def sample(observations: Any, masks: np.ndarray | None) -> np.ndarray:
            with torch.no_grad():
                distribution = self.policy.get_distribution(obs_as_tensor(observations, self.device), action_masks=masks)  # type: ignore[call-arg]
                return distribution.get_actions().cpu().numpy()

        return sample

    def _reference_collect_rollouts(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """``MaskablePPO``'s own loop, on this model."""
        return MaskablePPO.collect_rollouts(self, env, callback, rollout_buffer, n_rollout_steps, self.use_masking)  # type: ignore[arg-type]
