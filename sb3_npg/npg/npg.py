"""Natural Policy Gradient (NPG) with a KL-scaled step."""

from __future__ import annotations

from typing import ClassVar

from stable_baselines3.common.policies import BasePolicy

from sb3_npg.common.base import NaturalPolicyGradient, StepOutcome, StepProposal
from sb3_npg.common.docs import ARGS_AFTER_LINE_SEARCH, ARGS_BEFORE_LINE_SEARCH, SHARED_FEATURES_NOTE
from sb3_npg.npg.policies import CnnPolicy, MlpPolicy, MultiInputPolicy

FULL_STEP = 1.0


class NPG(NaturalPolicyGradient):
    __doc__ = (
        """
    Natural Policy Gradient (NPG)

    Paper: https://papers.nips.cc/paper/2073-a-natural-policy-gradient (Kakade, 2001); the KL-normalized step
    follows https://arxiv.org/abs/1703.02660 (Rajeswaran et al., 2017).

    Each update solves ``F s = g`` by conjugate gradient on Fisher-vector products (``F`` the Fisher matrix of the
    policy, ``g`` the gradient of the surrogate objective) and takes the full step
    ``sqrt(2 * target_kl / s^T F s) * s``, with no line search; the critic is fitted by minibatch regression.
"""
        + SHARED_FEATURES_NOTE
        + ARGS_BEFORE_LINE_SEARCH
        + ARGS_AFTER_LINE_SEARCH
    )

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "CnnPolicy": CnnPolicy,
        "MultiInputPolicy": MultiInputPolicy,
    }

    def _accept_step(self, proposal: StepProposal) -> StepOutcome:
        """Take the full natural step and measure where it landed."""
        proposal.apply(FULL_STEP)
        surrogate, kl = proposal.evaluate()
        return StepOutcome(fraction=FULL_STEP, surrogate=surrogate, kl=kl, last_candidate_kl=kl)
