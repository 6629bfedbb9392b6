"""Stable-Baselines 2's ``ACKTR`` keywords translated into this ``ACKTR``'s, so that an SB2 configuration takes SB2's step.

Stable-Baselines 2 copied OpenAI baselines' ``acktr`` and its ``KfacOptimizer``. Two of its keywords share a name with
ours but not a meaning, derived here from the two step rules (``d`` the K-FAC direction of the gradient ``g``, ``lr``
the learning rate):

- **kfac_clip.** SB2 scales ``d`` by ``s = min(1, sqrt(kfac_clip / (lr^2 g^T d)))`` and moves by ``lr s d``, that is
  ``min(lr, sqrt(kfac_clip / g^T d)) d``: the ``lr`` cancels where the clip binds, and the quadratic model's KL of the
  step, ``1/2 (lr s)^2 g^T d``, is ``kfac_clip / 2``. Ours moves by ``min(lr, sqrt(2 kfac_clip / d^T F_hat d)) d``
  (the paper's rule), whose model KL is ``kfac_clip``. So SB2's ``c`` is our ``c / 2`` (:func:`sb2_kfac_clip`), for
  the actor and, as SB2 clips actor and critic with one bound, for the critic (``critic_kfac_clip``). SB2's curvature
  is ``g^T d = d^T (F_hat + damping I) d`` (damped), the paper's and our default ``d^T F_hat d`` (undamped): the
  translation takes SB2's (``kfac_clip_curvature="damped"``), without which a step's model KL would be larger by
  ``g^T d / d^T F_hat d``, a median 1.9 under SB2's settings on CartPole-v1 and Pendulum-v1
  (``benchmarks/acktr_baselines.py``).
  SB2's one joint bound over actor and critic becomes one bound on each.
- **vf_fisher_coef.** SB2's critic Fisher comes from the sampled loss ``-k mean((V - stop_gradient(V + eps))^2)``,
  ``eps ~ N(0, 1)``: the per-sample gradient at a layer's outputs is ``2 k eps dV/ds``, so its ``G`` is
  ``4 k^2 E[dV/ds dV/ds^T]``. Ours is ``vf_fisher_coef E[dV/ds dV/ds^T]``, so SB2's ``k`` is our ``4 k^2``
  (:func:`sb2_vf_fisher_coef`).

The rest follows SB2's ``ACKTR`` and its ``KfacOptimizer``: their defaults filled in (so that a change of this
package's defaults does not change a translated configuration), ``epsilon=0.01`` and ``stats_decay=0.99`` as
``kfac_damping`` and ``kfac_stats_decay``, its exact damping in the eigenbasis (``kfac_damping_mode="eigenbasis"``),
``lr_schedule`` as a schedule of ``learning_rate``, ``gae_lambda=None`` (n-step returns) as 1, advantages normalized
for continuous actions, and ``max_grad_norm`` dropped (SB2 clips only the gradient of its ten cold-start SGD steps,
never a K-FAC step's). What stays different: SB2's momentum (0.9) on the step and its cold start of ten SGD steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sb3_npg.acktr.kfac_state import DAMPED_CURVATURE
from sb3_npg.common.kfac import EIGENBASIS_DAMPING
from sb3_npg.common.validation import ConfigurationError

#: Stable-Baselines 2's ``ACKTR`` defaults of the keywords that shape the update (``stable_baselines/acktr/acktr.py``).
SB2_DEFAULTS: dict[str, Any] = {
    "gamma": 0.99,
    "n_steps": 20,
    "ent_coef": 0.01,
    "vf_coef": 0.25,
    "vf_fisher_coef": 1.0,
    "learning_rate": 0.25,
    "max_grad_norm": 0.5,
    "kfac_clip": 0.001,
    "lr_schedule": "linear",
    "kfac_update": 1,
    "gae_lambda": None,
}
#: The constants SB2's ``ACKTR`` passes its ``KfacOptimizer``, as our keywords.
SB2_OPTIMIZER = {
    "kfac_damping": 0.01,
    "kfac_stats_decay": 0.99,
    "kfac_damping_mode": EIGENBASIS_DAMPING,
    "kfac_clip_curvature": DAMPED_CURVATURE,
}
#: SB2 keywords with no effect on the update here (TensorFlow's threads and logging, the asynchronous eigensolver).
SB2_DROPPED = frozenset({"nprocs", "n_cpu_tf_sess", "async_eigen_decomp", "full_tensorboard_log", "max_grad_norm"})
#: Our ``kfac_clip`` per unit of SB2's: SB2's step has the quadratic-model KL ``kfac_clip / 2`` (the module doc).
SB2_KFAC_CLIP_FACTOR = 0.5
#: Our ``vf_fisher_coef`` per unit of SB2's squared: its sampled critic loss's ``G`` is ``4 k^2 E[dV dV^T]``.
SB2_VF_FISHER_FACTOR = 4.0
#: SB2's ``gae_lambda=None`` (n-step returns): GAE with lambda 1 gives the same advantages.
N_STEP_RETURNS_LAMBDA = 1.0
#: SB2's ``lr_schedule`` in ``double_linear_con`` and ``middle_drop``/``double_middle_drop`` (its ``a2c/utils.py``).
DOUBLE_LINEAR_FLOOR = 0.125
MIDDLE_DROP_POINT, MIDDLE_DROP_VALUE = 0.75, 0.075
LATE_DROP_POINT, LATE_DROP_VALUE = 0.25, 0.125


def _linear(elapsed: float) -> float:
    return 1.0 - elapsed


def _constant(elapsed: float) -> float:
    return 1.0


def _double_linear_con(elapsed: float) -> float:
    return max(1.0 - 2.0 * elapsed, DOUBLE_LINEAR_FLOOR)


def _middle_drop(elapsed: float) -> float:
    return 1.0 - elapsed if 1.0 - elapsed >= MIDDLE_DROP_POINT else MIDDLE_DROP_VALUE


def _double_middle_drop(elapsed: float) -> float:
    remaining = 1.0 - elapsed
    if remaining >= MIDDLE_DROP_POINT:
        return remaining
    return MIDDLE_DROP_VALUE if remaining >= LATE_DROP_POINT else LATE_DROP_VALUE


#: SB2's learning-rate schedules, as multipliers of the initial value against the fraction of training elapsed.
SB2_SCHEDULES: dict[str, Callable[[float], float]] = {
    "linear": _linear,
    "constant": _constant,
    "double_linear_con": _double_linear_con,
    "middle_drop": _middle_drop,
    "double_middle_drop": _double_middle_drop,
}


@dataclass(frozen=True)
class Sb2Schedule:
    """
    SB2's ``lr_schedule`` as an SB3 schedule (a function of the remaining progress, 1 to 0); picklable, so it saves.

    :param initial_value: SB2's ``learning_rate``
    :param name: one of :data:`SB2_SCHEDULES`
    """

    initial_value: float
    name: str

    def __call__(self, progress_remaining: float) -> float:
        return self.initial_value * SB2_SCHEDULES[self.name](1.0 - progress_remaining)


def sb2_kfac_clip(kfac_clip: float) -> float:
    """Our ``kfac_clip`` for SB2's: the bound on the same quadratic model's KL (the module doc)."""
    return SB2_KFAC_CLIP_FACTOR * kfac_clip


def sb2_vf_fisher_coef(vf_fisher_coef: float) -> float:
    """Our ``vf_fisher_coef`` for SB2's: the same critic Fisher (the module doc)."""
    return SB2_VF_FISHER_FACTOR * vf_fisher_coef**2


def sb2_acktr_kwargs(continuous_actions: bool = False, **sb2_kwargs: Any) -> dict[str, Any]:
    """
    The keywords of this ``ACKTR`` that take Stable-Baselines 2's step for an SB2 ``ACKTR`` configuration:
    ``ACKTR(policy, env, **sb2_acktr_kwargs(**config))`` (see the module doc for what is translated and why).

    :param continuous_actions: whether the action space is continuous (SB2 normalizes the advantages then)
    :param sb2_kwargs: SB2 ``ACKTR`` keywords; SB2's defaults fill the ones not given; keywords SB2 shares with SB3
        (``policy_kwargs``, ``verbose``, ``seed``, ``tensorboard_log``...) pass through
    :return: our keywords
    :raises ConfigurationError: for an ``lr_schedule`` SB2 does not have, or a ``kfac_clip`` that is not a number
    """
    config = {**SB2_DEFAULTS, **sb2_kwargs}
    schedule = config.pop("lr_schedule")
    if schedule not in SB2_SCHEDULES:
        raise ConfigurationError(f"`lr_schedule` must be one of {', '.join(map(repr, SB2_SCHEDULES))}, got {schedule!r}")
    kfac_clip = config.pop("kfac_clip")
    if isinstance(kfac_clip, bool) or not isinstance(kfac_clip, int | float):
        raise ConfigurationError(f"`kfac_clip` must be a number (Stable-Baselines 2's is a float), got {kfac_clip!r}")
    learning_rate = config.pop("learning_rate")
    gae_lambda = config.pop("gae_lambda")
    ours = {name: value for name, value in config.items() if name not in SB2_DROPPED}
    ours["vf_fisher_coef"] = sb2_vf_fisher_coef(ours["vf_fisher_coef"])
    return {
        **ours,
        **SB2_OPTIMIZER,
        "learning_rate": learning_rate if schedule == "constant" else Sb2Schedule(learning_rate, schedule),
        "kfac_clip": sb2_kfac_clip(kfac_clip),
        "critic_kfac_clip": sb2_kfac_clip(kfac_clip),
        "gae_lambda": N_STEP_RETURNS_LAMBDA if gae_lambda is None or gae_lambda < 0 else gae_lambda,
        "max_grad_norm": None,
        "critic_fit": "kfac",
        "n_critic_updates": 1,
        "normalize_advantage": continuous_actions,
    }
