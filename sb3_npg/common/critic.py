"""The critic's fit: regress the value on the returns, over the critic's own parameters only.

Two methods (``critic_fit``): epochs of minibatch steps of the policy's optimizer with the shared global-norm clip
(as sb3-contrib), or full-batch L-BFGS with a strong-Wolfe line search. Both average the loss gradient across ranks
through the :class:`~sb3_npg.common.distributed.Reducer`.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.policies import ActorCriticPolicy
from torch.nn import functional as F

from sb3_npg.common.batches import Observations, select_rows
from sb3_npg.common.clip import clip_grad_norm_, clip_grad_norm_on_device_, grad_norm
from sb3_npg.common.distributed import Reducer
from sb3_npg.common.stats import WeightedMeans
from sb3_npg.common.value_targets import NormalizedValueHead

#: ``critic_fit`` options: minibatch epochs with the policy's optimizer, or full-batch L-BFGS.
CRITIC_FITS = ("minibatch", "lbfgs")
#: L-BFGS's initial step scale; its strong-Wolfe line search then chooses each step.
LBFGS_LEARNING_RATE = 1.0


def make_critic_optimizer(
    optimizer_class: type[torch.optim.Optimizer],
    params: list[torch.nn.Parameter],
    learning_rate: float,
    optimizer_kwargs: dict[str, Any],
) -> torch.optim.Optimizer:
    """
    The critic's optimizer; the fused implementation when the class offers one and the user chose none.

    Fused Adam does the same arithmetic in one kernel instead of a per-tensor loop, which is cheaper for the many
    small steps of the critic fit (``benchmarks/bench_update.py`` measures the whole update).

    :param optimizer_class: the policy's optimizer class (Adam by default)
    :param params: the critic's own parameters
    :param learning_rate: the initial learning rate
    :param optimizer_kwargs: the policy's optimizer options
    """
    kwargs = dict(optimizer_kwargs)
    accepts_fused = "fused" in inspect.signature(optimizer_class.__init__).parameters
    if accepts_fused and "fused" not in kwargs and "foreach" not in kwargs:
        try:
            return optimizer_class(params, lr=learning_rate, fused=True, **kwargs)  # type: ignore[call-arg]
        except (RuntimeError, ValueError):  # no fused kernel for this device or dtype
            pass
    return optimizer_class(params, lr=learning_rate, **kwargs)  # type: ignore[call-arg]


class CriticFit:
    """
    Fits the value of ``policy`` to returns by moving ``params`` (the critic's own parameters) only.

    :param policy: the actor-critic policy
    :param params: the critic's own parameters (the actor's, a shared extractor included, never move here)
    :param reducer: the model's reducer: the loss gradient is averaged over every rank's samples
    :param value_head: with ``normalize_value_targets``, the policy's value layer: the loss is then measured in its
        normalized units (``None``: in the returns' units)
    """

    def __init__(
        self,
        policy: ActorCriticPolicy,
        params: list[torch.nn.Parameter],
        reducer: Reducer,
        value_head: NormalizedValueHead | None = None,
    ):
        self.policy, self.params, self.reducer, self.value_head = policy, params, reducer, value_head
        # The same clip either way: decided on an accelerator without waiting for it, on a CPU with fewer operations.
        on_accelerator = params[0].device.type != "cpu"
        self._clip = clip_grad_norm_on_device_ if on_accelerator else clip_grad_norm_

    def loss_with_gradient(self, observations: Observations, returns: torch.Tensor) -> torch.Tensor:
        """
        The value loss (mean squared error to the returns, both normalized when the policy has a
        :class:`~sb3_npg.common.value_targets.NormalizedValueHead`) on a batch; its gradient goes into the critic's
        ``.grad``.

        :return: the loss, detached; in a distributed update the loss and the gradients are means over every rank's
            batch
        """
        values = self.policy.predict_values(observations).flatten()
        if self.value_head is not None:
            values, returns = self.value_head.normalized(values), self.value_head.normalized(returns)
        value_loss = F.mse_loss(values, returns)
        grads = torch.autograd.grad(value_loss, self.params, allow_unused=True)
        for param, grad in zip(self.params, grads, strict=True):
            param.grad = grad
        return self.reducer.mean_gradients(self.params, len(returns), value_loss.detach())

    def minibatch_epochs(
        self,
        observations: Observations,
        returns: torch.Tensor,
        epochs: int,
        batch_size: int,
        max_grad_norm: float | None,
    ) -> WeightedMeans:
        """
        ``epochs`` passes of shuffled minibatch steps of the policy's optimizer, each after the global-norm clip.

        :return: ``value_loss`` and ``value_grad_norm`` (before clipping), averaged over every minibatch by samples
        """
        size = len(returns)
        loss_sum = torch.zeros((), device=returns.device)
        grad_norm_sum: float | torch.Tensor = 0.0
        for _ in range(epochs):
            # One permutation per epoch from numpy's generator, which SB3 seeds, as RolloutBuffer.get() does; the data
            # is gathered once in that order, so each minibatch is a contiguous slice (a view, no copy).
            order = torch.as_tensor(np.random.permutation(size), device=returns.device)
            shuffled_observations, shuffled_returns = select_rows(observations, order), returns[order]
            for start in range(0, size, batch_size):
                part = slice(start, start + batch_size)
                n_part = len(shuffled_returns[part])
                loss_sum += self.loss_with_gradient(select_rows(shuffled_observations, part), shuffled_returns[part]) * n_part
                grad_norm_sum += self._clip(self.params, max_grad_norm) * n_part
                self.policy.optimizer.step()
        n_samples = size * epochs
        stats = WeightedMeans()
        stats.add(n_samples, value_loss=loss_sum / n_samples, value_grad_norm=grad_norm_sum / n_samples)
        return stats

    def lbfgs(self, observations: Observations, returns: torch.Tensor, max_iterations: int) -> WeightedMeans:
        """
        Full-batch L-BFGS with a strong-Wolfe line search, at most ``max_iterations`` iterations, started afresh.

        The line search sets the step, so neither the learning rate nor the gradient clip applies (clipping would
        corrupt the curvature pairs).

        :return: ``value_loss`` and ``value_grad_norm`` of the last evaluation
        """
        optimizer = torch.optim.LBFGS(
            self.params, lr=LBFGS_LEARNING_RATE, max_iter=max_iterations, line_search_fn="strong_wolfe"
        )
        last: dict[str, torch.Tensor] = {}

        def closure() -> torch.Tensor:
            last["loss"] = self.loss_with_gradient(observations, returns)
            return last["loss"]

        optimizer.step(closure)
        stats = WeightedMeans()
        stats.add(len(returns), value_loss=last["loss"].item(), value_grad_norm=grad_norm(self.params))
        return stats
