"""ACKTR's critic: K-FAC on the value function's Gauss-Newton matrix (``critic_fit="kfac"``).

As in the paper (Wu et al. 2017, section 3.2), the critic is a Gaussian ``N(V(s), 1)`` over the returns, whose Fisher
is the Gauss-Newton matrix ``E[J^T J]`` of the squared error (``J = dV / dtheta``), scaled by ``vf_fisher_coef``. Its
K-FAC factors come in closed form (``G = vf_fisher_coef E[dV/ds dV/ds^T]`` at each layer's outputs ``s``), as running
averages saved with the policy (:class:`~sb3_npg.acktr.kfac_state.KfacStatistics`). Each of ``n_critic_updates``
steps takes the value loss's gradient (times ``vf_coef``, after the shared global-norm clip at ``max_grad_norm``), its
K-FAC direction ``d``, and moves by ``min(learning_rate, sqrt(2 clip / d^T F_hat d)) d``: the actor's step rule, with
the critic's own KL bound (``critic_kfac_clip``). With ``normalize_value_targets``, values and returns are in
normalized units, as for the other critic fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from stable_baselines3.common.policies import ActorCriticPolicy

from sb3_npg.acktr.kfac_state import KfacSettings, KfacStatistics, clip_curvature
from sb3_npg.common.batches import Observations, first_tensor
from sb3_npg.common.clip import clip_grad_norm_
from sb3_npg.common.critic import CriticFit
from sb3_npg.common.kfac import expected_output_factors
from sb3_npg.common.kfac_layers import input_factor, record_layers
from sb3_npg.common.kfac_policy import BatchCurvature, KfacPlan
from sb3_npg.common.natural_gradient import get_flat_params, set_flat_params_
from sb3_npg.common.stats import WeightedMeans
from sb3_npg.common.value_targets import NormalizedValueHead


@dataclass(frozen=True)
class KfacCriticOptions:
    """
    The K-FAC critic's curvature scale and step rule.

    :param learning_rate: the most the direction is multiplied by
    :param kl_clip: the bound on the quadratic model's KL, ``1/2 step^T F_hat step``
    :param vf_coef: the value loss's weight on its gradient
    :param vf_fisher_coef: the Gauss-Newton matrix's weight in the critic's Fisher
    :param max_grad_norm: the shared clip's cap on the gradient's global norm (``None`` or <= 0: no clip)
    """

    learning_rate: float
    kl_clip: float
    vf_coef: float
    vf_fisher_coef: float
    max_grad_norm: float | None


def critic_batch_curvature(
    plan: KfacPlan,
    policy: ActorCriticPolicy,
    observations: Observations,
    fisher_coef: float,
    mean: Callable[[torch.Tensor], torch.Tensor],
) -> BatchCurvature:
    """
    The critic's K-FAC factors on a batch: ``A`` from each layer's inputs, ``G = fisher_coef E[dV/ds dV/ds^T]``.

    :param plan: the critic's blocks (Kronecker-factored layers only)
    :param policy: the policy
    :param observations: the batch
    :param fisher_coef: ``vf_fisher_coef``
    :param mean: averages a mean over this rank's samples across ranks
    :return: the factors of every rank's samples together
    """
    head = policy.value_net if isinstance(policy.value_net, NormalizedValueHead) else None
    with torch.enable_grad(), record_layers(plan.layers) as records:
        values = policy.predict_values(observations)
    if head is not None:
        values = head.normalized(values)
    layer_records = [records[layer] for layer in plan.layers]
    outputs = expected_output_factors([values], [torch.full_like(values, fisher_coef)], layer_records)
    if head is not None and head in plan.layers:
        # The head's recorded outputs are in the returns' units, ``mean + std * s`` with ``s = W x + b`` its own linear
        # output, the one its Kronecker block ``kron(G, A)`` is of: ``G`` in ``s`` is ``std^2`` times ``G`` in those.
        index = plan.layers.index(head)
        outputs[index] = outputs[index] * head.target_std.pow(2)
    inputs = [input_factor(layer, record.inputs) for layer, record in zip(plan.layers, layer_records, strict=True)]
    return BatchCurvature([(mean(a), mean(g)) for a, g in zip(inputs, outputs, strict=True)], [])


def kfac_critic_steps(
    critic: CriticFit,
    plan: KfacPlan,
    statistics: KfacStatistics,
    data: tuple[Observations, torch.Tensor],
    settings: KfacSettings,
    options: KfacCriticOptions,
    steps: int,
) -> WeightedMeans:
    """
    Average the rollout's critic factors in, then ``steps`` K-FAC steps on the value loss (the module doc).

    :param critic: the critic's loss and gradient (averaged across ranks), and its parameters
    :param plan: the critic's blocks
    :param statistics: its running curvature
    :param data: the rollout's observations and returns
    :param settings: damping, decay and inversion interval
    :param options: the curvature's scale and the step's size rule
    :param steps: how many steps
    :return: ``value_loss`` and ``value_grad_norm`` (before the clip) averaged over the steps, and ``value_step_size``
    """
    observations, returns = data
    mean = partial(critic.reducer.mean, weight=len(first_tensor(observations)))
    batch = critic_batch_curvature(plan, critic.policy, observations, options.vf_fisher_coef, mean)
    statistics.update(batch, settings.decay)
    inverse = statistics.inverse(plan, settings)
    stats = WeightedMeans()
    for _ in range(steps):
        loss = critic.loss_with_gradient(observations, returns)
        norm = clip_grad_norm_(critic.params, options.max_grad_norm)
        grads = [torch.zeros_like(param) if param.grad is None else param.grad for param in critic.params]
        gradient = options.vf_coef * torch.cat([grad.reshape(-1) for grad in grads])
        direction = inverse(gradient)
        curvature = clip_curvature(plan, statistics, direction, gradient, settings)
        if not (math.isfinite(curvature) and curvature > 0.0):
            break
        step_size = min(options.learning_rate, math.sqrt(2.0 * options.kl_clip / curvature))
        set_flat_params_(critic.params, get_flat_params(critic.params) - step_size * direction)
        stats.add(1, value_loss=loss, value_grad_norm=norm, value_step_size=step_size)
    return stats
