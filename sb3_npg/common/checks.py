"""Checks of what an update is given: the environment's spaces and rollout size, and finite rollouts and parameters.

Environments that emit NaN or inf are stopped at the first one by :class:`FiniteRolloutCheck`, a callback that our
algorithms put first in every ``learn()``: SB3's ``collect_rollouts`` hands each step's ``new_obs`` and ``rewards`` to
the callbacks before the policy or the rollout buffer sees them, so the error comes before any NaN is trained on, and
the user's wrapper chain stays as it is (SB3's ``VecCheckNan`` as an extra outer wrapper would break
``EvalCallback``'s ``VecNormalize`` synchronisation). It checks less than ``VecCheckNan`` and builds no report per
call, so it costs less (``benchmarks/bench_finite_check.py`` measures both). Actions need no check, since the policy's
parameters are checked before every rollout; integer observations (images) cannot hold NaN and are skipped.
"""

from __future__ import annotations

import inspect
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback

from sb3_npg.common.validation import ConfigurationError

#: Action spaces whose distributions have a closed-form KL in Stable-Baselines3.
SUPPORTED_ACTION_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
#: numpy's ``dtype.kind`` of floating-point arrays (a cheaper test than ``np.issubdtype`` on every step).
FLOAT_KIND = "f"
#: The package's folder: warnings point at the first caller outside it.
PACKAGE_DIR = Path(__file__).resolve().parent.parent


class NonFiniteParametersError(RuntimeError):
    """The policy's parameters hold NaN or inf, so no update can be computed from them."""


# ------------------------------------------------------------------------------------------------ the environment


def check_action_space(algorithm: str, action_space: spaces.Space, use_sde: bool) -> None:
    """
    Refuse an action space the natural step cannot handle, naming it.

    :param algorithm: the class name, for the message
    :param action_space: the environment's action space
    :param use_sde: whether gSDE is on (it needs a Box)
    """
    if not isinstance(action_space, SUPPORTED_ACTION_SPACES):
        names = ", ".join(space.__name__ for space in SUPPORTED_ACTION_SPACES)
        raise ConfigurationError(
            f"{algorithm} does not support the action space {action_space}: supported action spaces are {names}"
        )
    if use_sde and not isinstance(action_space, spaces.Box):
        raise ConfigurationError(f"`use_sde=True` needs a Box action space (gSDE is Gaussian noise), got {action_space}")


def user_stack_level() -> int:
    """
    The ``stacklevel`` for ``warnings.warn`` called by this function's caller that points at the first frame outside
    sb3-npg: the user's line, whichever of our classes and helpers lie between.
    """
    frame = inspect.currentframe()
    frame = frame.f_back if frame is not None else None  # the function that will call warnings.warn: level 1
    level = 1
    while frame is not None and Path(frame.f_code.co_filename).resolve().is_relative_to(PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


def warn_if_batches_uneven(name: str, size: int, samples: int, what: str) -> None:
    """
    Warn (once, at construction) when batches of ``size`` do not split ``samples`` evenly; training still runs.

    :param name: the option that sets the batch size
    :param size: its value
    :param samples: the samples it splits
    :param what: what those samples are, for the message
    """
    if size > samples:
        message = f"is larger than {what} = {samples}: each epoch uses one batch of all {samples}"
    elif samples % size != 0:
        message = (
            f"does not divide {what} = {samples}: the last batch holds {samples % size} samples "
            "(its metrics are weighted by its samples)"
        )
    else:
        return
    warnings.warn(f"`{name}`={size} {message}", UserWarning, stacklevel=user_stack_level())


def check_fisher_samples(factor: int, batch_samples: int) -> None:
    """
    Refuse a ``fisher_sub_sampling_factor`` that leaves one sample of a policy batch for the Fisher-vector products:
    a Fisher matrix of one observation misjudges the KL of the step it scales.

    :param factor: ``fisher_sub_sampling_factor``
    :param batch_samples: the samples of a full policy batch
    """
    if factor > 1 and math.ceil(batch_samples / factor) < 2:
        raise ConfigurationError(
            f"`fisher_sub_sampling_factor`={factor} leaves one of the {batch_samples} samples of each policy batch for "
            f"the Fisher-vector products: use at most {max(1, batch_samples - 1)}, "
            "or more samples per policy batch (n_steps * n_envs / sub_sampling_factor, or policy_batch_size)"
        )


# -------------------------------------------------------------------------------------------- finite environments


def _non_finite_rows(values: np.ndarray) -> list[int]:
    """The environment indices whose entries hold NaN or inf (empty for integer arrays)."""
    if values.dtype.kind != FLOAT_KIND:  # integer observations (images) cannot hold NaN
        return []
    finite = np.isfinite(values)
    if finite.all():
        return []
    return sorted({int(index) for index in np.argwhere(~finite.reshape(len(finite), -1))[:, 0]})


def _raise_environment_fault(what: str, rows: list[int], when: str) -> None:
    moment = "at reset" if when == "reset" else "after a step"
    raise ValueError(
        f"Environment {', '.join(map(str, rows))} returned a NaN or inf {what} {moment}; sb3-npg stops rather than "
        "train on it. Fix the environment (or sanitize its output in a wrapper); SB3's "
        "VecCheckNan(env, raise_exception=True) reports the action that led to it."
    )


def _named_parts(observations: Any, noun: str) -> list[tuple[str, Any]]:
    """``(name, array)`` per observation part: ``noun``, or ``noun['key']`` for each key of a Dict space."""
    if isinstance(observations, dict):
        return [(f"{noun}[{key!r}]", values) for key, values in observations.items()]
    return [(noun, observations)]


def check_finite(observations: Any, rewards: np.ndarray | None, when: str) -> None:
    """
    Raise a ``ValueError`` naming the environment(s), what and when, if observations or rewards hold NaN or inf.

    :param observations: a batch of observations (an array, or a dict of arrays for Dict spaces)
    :param rewards: the batch of rewards, or ``None`` (at reset)
    :param when: ``"reset"`` or ``"step"``
    """
    for name, values in _named_parts(observations, "observation"):
        rows = _non_finite_rows(np.asarray(values))
        if rows:
            _raise_environment_fault(name, rows, when)
    if rewards is not None and (rows := _non_finite_rows(np.asarray(rewards))):
        _raise_environment_fault("reward", rows, when)


class FiniteRolloutCheck(BaseCallback):
    """Checks the observation each rollout starts from, and every step's new observations and rewards."""

    def _on_rollout_start(self) -> None:
        check_finite(self.model._last_obs, None, "reset")

    def _on_step(self) -> bool:
        check_finite(self.locals["new_obs"], self.locals["rewards"], "step")
        return True


# ------------------------------------------------------------------------------------- what an update is given


def _raise_if_not_finite(values: np.ndarray, what: str) -> None:
    """Raise a ``ValueError`` naming ``what`` when ``values`` (from the environment) hold NaN or inf."""
    if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
        count = int(np.size(values) - np.isfinite(values).sum())
        raise ValueError(
            f"The rollout's {what} hold {count} NaN or inf values: the environment emitted them, and training on them "
            "would corrupt the policy, so the update is refused. Fix the environment, or wrap it in "
            "stable_baselines3.common.vec_env.VecCheckNan(env, raise_exception=True) to stop at the step that "
            "produced them."
        )


def check_rollout_finite(buffer: RolloutBuffer) -> None:
    """
    Refuse to train on a rollout whose observations or rewards hold NaN or inf, naming which.

    :param buffer: the filled rollout buffer
    """
    for name, values in _named_parts(buffer.observations, "observations"):
        _raise_if_not_finite(values, name)
    _raise_if_not_finite(buffer.rewards, "rewards")


def check_parameters_finite(policy: torch.nn.Module, algorithm: str) -> None:
    """
    Refuse to update from non-finite parameters, naming them and how to recover.

    :param policy: the policy
    :param algorithm: the class name, for the message
    """
    named = list(policy.named_parameters())
    finite = torch.stack([torch.isfinite(param).all() for _, param in named]).tolist()  # one read from the device
    broken = [name for (name, _), ok in zip(named, finite, strict=True) if not ok]
    if broken:
        raise NonFiniteParametersError(
            f"{algorithm}: the policy parameters {', '.join(broken)} hold NaN or inf, so this update is refused. "
            f"The model cannot recover by itself: load the last good checkpoint ({algorithm}.load(path, env=env), for "
            "example one written by CheckpointCallback) or restore good weights with model.set_parameters(...), "
            "then make the problem better conditioned (normalize observations and rewards with VecNormalize, "
            "lower target_kl or learning_rate)."
        )
