"""
Comparing floats that were computed in another order: across processes, batch splits, kernels and CPUs.

The rule every test here follows. Two computations that are equal in exact arithmetic but add their terms in another
order (two ranks' half batches against one whole batch, a minibatch split against the full batch, another CPU's
vectorized kernels, ``ATEN_CPU_CAPABILITY`` or ``MKL_CBWR`` variants) differ by rounding, and never by the same bits on
every machine. Such a test compares them in one of three ways, and never with a tolerance read off what one machine
printed:

1. **In float64, through anything.** The whole computation (the policy, the buffer's float fields, every reduction)
   runs in float64 (:func:`float64_policy_kwargs`, :class:`Float64RolloutBuffer`, :func:`to_float64`) and the result is
   compared relatively to the quantity computed, with :data:`AMPLIFIED_RTOL`: ``sqrt(eps)`` of float64, which
   leaves room for rounding amplified by a condition number up to ``1 / sqrt(eps)`` (6.7e7: eigendecompositions of
   K-FAC factors, conjugate gradient, L-BFGS, a line search's comparisons) and still fails a real mistake, whose
   relative size is that of the weights it gets wrong (a rank's half counted twice, an unweighted mean of unequal
   batches: 1e-3 and up).
2. **Before any amplification, in the data type it runs in.** A sum or mean of ``n`` terms of either type is compared
   with :func:`reduction_tolerance`, the a-priori bound ``gamma_n = n u / (1 - n u)`` (``u`` the unit roundoff) on
   the error of any order of summation, relative to the sum of the terms' magnitudes.
3. **An exact property.** Equal integers, the same bits from the same computation in the same process, a count.

A float32 comparison of a quantity that passed through a reduction, an eigendecomposition, conjugate gradient or
L-BFGS with a relative tolerance below :data:`FLOAT32_AMPLIFIED_FLOOR` is not portable: ``tests/test_tolerances.py``
rejects one that is not in float64, not derived here and not justified in a comment beside it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.torch_layers import FlattenExtractor

#: The relative tolerance of a float64 comparison whose rounding passed through amplifying steps: ``sqrt(eps)``.
AMPLIFIED_RTOL = math.sqrt(torch.finfo(torch.float64).eps)
#: Below this relative tolerance a float32 quantity that passed through an amplifying step is compared in float64
#: instead: ``sqrt(eps)`` of float32 (3.5e-4), rounded down to a power of ten.
FLOAT32_AMPLIFIED_FLOOR = 1e-4
#: The rollout buffer's per-step arrays that SB3 allocates as float32 (observations and actions keep their spaces').
FLOAT_BUFFER_FIELDS = ("rewards", "returns", "episode_starts", "values", "log_probs", "advantages")


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon of ``dtype``: the largest relative error of one rounding."""
    return torch.finfo(dtype).eps / 2


def reduction_tolerance(n_terms: int, dtype: torch.dtype) -> float:
    """
    ``gamma_n = n u / (1 - n u)``: the bound on the error of a sum of ``n_terms`` terms in ``dtype``, in any order,
    relative to the sum of their magnitudes (Higham, *Accuracy and Stability of Numerical Algorithms*, section 4.2).

    :param n_terms: the number of terms summed (a mean of ``n`` samples: ``n``; a dot product of length ``n``: ``n``)
    :param dtype: the floating type the sum runs in
    """
    nu = n_terms * unit_roundoff(dtype)
    if nu >= 1.0:
        raise ValueError(f"gamma_n is unbounded for {n_terms} terms in {dtype}")
    return nu / (1.0 - nu)


def relative_step_difference(got: torch.Tensor, want: torch.Tensor, start: torch.Tensor) -> float:
    """
    ``||got - want|| / ||want - start||``: the difference of two updates from ``start``, relative to the step itself
    (relative to the parameters, a wrong step would hide behind their size).
    """
    step = (want - start).double().norm()
    if step == 0:
        raise ValueError("the update did not move the parameters: there is no step to compare")
    return float((got - want).double().norm() / step)


class Float64Flatten(FlattenExtractor):
    """SB3's flatten extractor, casting its input to the policy's dtype (``policy.to(torch.float64)`` casts its buffer)."""

    def __init__(self, observation_space: spaces.Space):
        super().__init__(observation_space)
        self.dtype_probe: torch.Tensor
        self.register_buffer("dtype_probe", torch.zeros(()))

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return super().forward(observations.to(self.dtype_probe.dtype))


class Float64RolloutBuffer(RolloutBuffer):
    """SB3's rollout buffer with float64 rewards, values, log-probabilities, returns and advantages."""

    def reset(self) -> None:
        super().reset()
        for name in FLOAT_BUFFER_FIELDS:
            setattr(self, name, getattr(self, name).astype(np.float64))


def float64_policy_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """An algorithm's keyword arguments with the float64 features extractor and rollout buffer added."""
    policy_kwargs = {**kwargs.get("policy_kwargs", {}), "features_extractor_class": Float64Flatten}
    return {**kwargs, "policy_kwargs": policy_kwargs, "rollout_buffer_class": Float64RolloutBuffer}


def to_float64(model: Any) -> Any:
    """
    Cast a model built with :func:`float64_policy_kwargs` to float64, its policy and any other module it holds (ACKTR's
    running K-FAC statistics), and check that no parameter stayed float32.
    """
    for module in [model.policy, *(value for value in vars(model).values() if isinstance(value, torch.nn.Module))]:
        module.to(torch.float64)
    dtypes = {param.dtype for param in model.policy.parameters()}
    if dtypes != {torch.float64}:
        raise TypeError(f"the policy kept parameters of {dtypes}")
    return model


def float64_buffer(model: Any) -> None:
    """Replace the float fields of ``model``'s rollout buffer by float64 copies (the data itself unchanged)."""
    buffer = model.rollout_buffer
    for name in FLOAT_BUFFER_FIELDS:
        setattr(buffer, name, getattr(buffer, name).astype(np.float64))


def preprocess_to_float64(monkeypatch: Any) -> None:
    """
    Make SB3's preprocessing of Box observations give float64 (it gives float32): a model built without
    :class:`Float64Flatten`, cast by :func:`to_float64` after it was trained or loaded, can then run in float64.
    """
    import stable_baselines3.common.policies as sb3_policies

    preprocess = sb3_policies.preprocess_obs
    monkeypatch.setattr(sb3_policies, "preprocess_obs", lambda *args, **kwargs: preprocess(*args, **kwargs).double())
