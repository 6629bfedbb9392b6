"""Trust Region Policy Optimization (TRPO): the natural step with a backtracking line search."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, Schedule

from sb3_npg.common.base import NaturalPolicyGradient, StepOutcome, StepProposal
from sb3_npg.common.distributed import DEFAULT_TIMEOUT_SECONDS
from sb3_npg.common.docs import ARGS_AFTER_LINE_SEARCH, ARGS_BEFORE_LINE_SEARCH, ARGS_LINE_SEARCH, SHARED_FEATURES_NOTE
from sb3_npg.common.validation import check_float, check_int
from sb3_npg.trpo.policies import CnnPolicy, MlpPolicy, MultiInputPolicy

REJECTED = 0.0


class TRPO(NaturalPolicyGradient):
    __doc__ = (
        """
    Trust Region Policy Optimization (TRPO)

    Paper: https://arxiv.org/abs/1502.05477 (Schulman et al., 2015)

    A drop-in replacement for ``sb3_contrib.TRPO``: every argument of its constructor is accepted with the same
    meaning and default. The natural step ``sqrt(2 * target_kl / s^T F s) * s`` is shrunk by
    ``line_search_shrinking_factor`` until the KL from the old policy is at most ``target_kl`` and the surrogate
    objective improved; if no candidate passes, the old parameters are kept.
"""
        + SHARED_FEATURES_NOTE
        + ARGS_BEFORE_LINE_SEARCH
        + ARGS_LINE_SEARCH
        + ARGS_AFTER_LINE_SEARCH
    )

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "CnnPolicy": CnnPolicy,
        "MultiInputPolicy": MultiInputPolicy,
    }
    has_line_search: ClassVar[bool] = True

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        learning_rate: float | Schedule = 1e-3,
        n_steps: int = 2048,
        batch_size: int = 128,
        gamma: float = 0.99,
        cg_max_steps: int = 15,
        cg_damping: float = 0.1,
        line_search_shrinking_factor: float = 0.8,
        line_search_max_iter: int = 10,
        n_critic_updates: int = 10,
        gae_lambda: float = 0.95,
        use_sde: bool = False,
        sde_sample_freq: int = -1,
        rollout_buffer_class: type[RolloutBuffer] | None = None,
        rollout_buffer_kwargs: dict[str, Any] | None = None,
        normalize_advantage: bool = True,
        target_kl: float = 0.01,
        sub_sampling_factor: int = 1,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: torch.device | str = "auto",
        *,
        max_grad_norm: float | None = 0.5,
        cg_residual_tol: float = 1e-10,
        policy_batch_size: int | None = None,
        fisher: str = "analytic",
        fisher_sub_sampling_factor: int = 1,
        critic_fit: str = "minibatch",
        distributed: bool = False,
        distributed_timeout: float = DEFAULT_TIMEOUT_SECONDS,
        _init_setup_model: bool = True,
    ):
        # Set before the shared constructor, which validates every option and builds the model.
        self.line_search_shrinking_factor = line_search_shrinking_factor
        self.line_search_max_iter = line_search_max_iter
        super().__init__(
            policy,
            env,
            learning_rate=learning_rate,
            n_steps=n_steps,
            batch_size=batch_size,
            gamma=gamma,
            cg_max_steps=cg_max_steps,
            cg_damping=cg_damping,
            n_critic_updates=n_critic_updates,
            gae_lambda=gae_lambda,
            use_sde=use_sde,
            sde_sample_freq=sde_sample_freq,
            rollout_buffer_class=rollout_buffer_class,
            rollout_buffer_kwargs=rollout_buffer_kwargs,
            normalize_advantage=normalize_advantage,
            target_kl=target_kl,
            sub_sampling_factor=sub_sampling_factor,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            verbose=verbose,
            seed=seed,
            device=device,
            max_grad_norm=max_grad_norm,
            cg_residual_tol=cg_residual_tol,
            policy_batch_size=policy_batch_size,
            fisher=fisher,
            fisher_sub_sampling_factor=fisher_sub_sampling_factor,
            critic_fit=critic_fit,
            distributed=distributed,
            distributed_timeout=distributed_timeout,
            _init_setup_model=_init_setup_model,
        )

    def _validate_hyperparameters(self) -> None:
        super()._validate_hyperparameters()
        check_float(
            "line_search_shrinking_factor",
            self.line_search_shrinking_factor,
            0.0,
            1.0,
            low_inclusive=False,
            high_inclusive=False,
        )
        check_int("line_search_max_iter", self.line_search_max_iter, 1)

    def _accept_step(self, proposal: StepProposal) -> StepOutcome:
        """Backtrack from the full step until the KL is within ``target_kl`` and the surrogate improved."""
        kl = REJECTED
        for shrink_count in range(self.line_search_max_iter):
            fraction = self.line_search_shrinking_factor**shrink_count
            proposal.apply(fraction)
            surrogate, kl = proposal.evaluate()
            if kl <= self.target_kl and surrogate > proposal.surrogate_before:
                return StepOutcome(fraction=fraction, surrogate=surrogate, kl=kl, last_candidate_kl=kl)
        proposal.apply(REJECTED)
        return StepOutcome(fraction=REJECTED, surrogate=proposal.surrogate_before, kl=0.0, last_candidate_kl=kl)
