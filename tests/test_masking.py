"""
The masked natural gradient's parts (issue 46): sb3-contrib's masked policies and distributions through the update's
inputs, KL and Fisher, in float64 against closed forms and autograd Hessians.

The update hands a masked policy :class:`~sb3_npg.common.batches.MaskedInputs` (observations with the masks recorded
at collection); every distribution it builds comes from :func:`~sb3_npg.common.distributions.policy_distribution`.
"""

import math

import pytest
import torch
from gymnasium import spaces
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from torch.func import functional_call

from sb3_npg.common.batches import MaskedInputs, RolloutTensors, first_tensor, policy_sample, select_rows
from sb3_npg.common.distributions import frozen_distribution, mean_kl, policy_distribution
from sb3_npg.common.fisher import analytic_fisher_product
from sb3_npg.common.kfac_policy import batch_curvature, build_kfac_plan
from sb3_npg.common.natural_gradient import flat_grad
from sb3_npg.common.policy_parameters import split_actor_critic_parameters
from tests.float_comparisons import Float64Flatten

DTYPE = torch.float64
OBSERVATIONS = spaces.Box(-1.0, 1.0, (3,))
BATCH = 12
#: name -> (action space, its masks' width)
ACTION_SPACES = {
    "discrete": (spaces.Discrete(5), 5),
    "multi_discrete": (spaces.MultiDiscrete([3, 2]), 5),
    "multi_binary": (spaces.MultiBinary(3), 6),
}
#: Sub-spaces of each space's mask: (start, width) of each categorical (a MultiBinary bit is a two-way categorical).
GROUPS = {"discrete": [(0, 5)], "multi_discrete": [(0, 3), (3, 2)], "multi_binary": [(0, 2), (2, 2), (4, 2)]}


def _policy(action_space: spaces.Space) -> MaskableActorCriticPolicy:
    torch.manual_seed(0)
    policy = MaskableActorCriticPolicy(
        OBSERVATIONS, action_space, lambda _: 1e-3, net_arch=[8], features_extractor_class=Float64Flatten
    )
    return policy.to(DTYPE)


def _masks(name: str) -> torch.Tensor:
    """Random masks with one valid choice at least per sub-space; row 0 keeps exactly one per sub-space."""
    generator = torch.Generator().manual_seed(1)
    width = ACTION_SPACES[name][1]
    masks = (torch.rand(BATCH, width, generator=generator) < 0.6).to(DTYPE)
    for start, size in GROUPS[name]:
        masks[0, start : start + size] = 0.0
        masks[0, start] = 1.0  # all but one masked
        empty = masks[:, start : start + size].sum(dim=1) == 0
        masks[empty, start + size - 1] = 1.0
    return masks


def _inputs(name: str) -> MaskedInputs:
    observations = torch.rand(BATCH, 3, generator=torch.Generator().manual_seed(2), dtype=DTYPE) * 2 - 1
    return MaskedInputs(observations, _masks(name))


def _actor(policy: MaskableActorCriticPolicy) -> list[torch.nn.Parameter]:
    return split_actor_critic_parameters(policy)[0]


def _valid_log_probs(logits: torch.Tensor, masks: torch.Tensor, name: str) -> list[torch.Tensor]:
    """Per sub-space, the log-softmax over the valid choices (-inf on the masked ones), computed here from the logits."""
    parts = []
    for start, size in GROUPS[name]:
        part = logits[:, start : start + size].masked_fill(masks[:, start : start + size] == 0, -math.inf)
        parts.append(torch.log_softmax(part, dim=1))
    return parts


def _closed_form_kl(old_logits, new_logits, masks, name) -> torch.Tensor:
    """Mean over the batch of sum over sub-spaces of sum over valid a of p_a (log p_a - log q_a)."""
    total = torch.zeros((), dtype=DTYPE)
    pairs = zip(_valid_log_probs(old_logits, masks, name), _valid_log_probs(new_logits, masks, name), strict=True)
    for log_p, log_q in pairs:
        valid = torch.isfinite(log_p)
        total = total + (log_p.exp() * (log_p - log_q)).where(valid, torch.zeros((), dtype=DTYPE)).sum()
    return total / BATCH


def _logits(policy, inputs):
    """The action net's logits (before any mask)."""
    features = policy.extract_features(inputs.observations)
    latent = policy.mlp_extractor.forward_actor(features)
    return policy.action_net(latent)


@pytest.mark.parametrize("name", ACTION_SPACES)
def test_the_kl_is_the_closed_form_over_the_valid_actions(name):
    policy, inputs = _policy(ACTION_SPACES[name][0]), _inputs(name)
    old_logits = _logits(policy, inputs).detach()
    old = frozen_distribution(policy, inputs)
    with torch.no_grad():
        for param in _actor(policy):
            param.add_(0.3 * torch.randn_like(param))
    new_logits = _logits(policy, inputs).detach()
    kl = float(mean_kl(old, policy_distribution(policy, inputs)))
    expected = float(_closed_form_kl(old_logits, new_logits, inputs.action_masks, name))
    unmasked = float(mean_kl(frozen_distribution(policy, inputs.observations), policy_distribution(policy, inputs)))
    assert expected > 1e-3 and math.isfinite(kl)
    # portable: float64, a batch mean of sums over at most 6 actions against the same sums in another order
    assert kl == pytest.approx(expected, rel=1e-12)
    assert abs(unmasked - expected) > 1e-3 * expected, "the unmasked old policy must give another KL"


@pytest.mark.parametrize("name", ACTION_SPACES)
def test_the_analytic_fisher_product_is_the_hessian_of_the_masked_kl(name):
    """Against ``torch.autograd.functional.hessian`` of the closed-form masked KL over the flat actor parameters."""
    policy, inputs = _policy(ACTION_SPACES[name][0]), _inputs(name)
    actor = _actor(policy)
    names = [key for key, param in policy.named_parameters() if any(param is each for each in actor)]
    theta0 = torch.cat([param.detach().flatten() for param in actor])
    old_logits = _logits(policy, inputs).detach()

    def kl_at(flat):
        pieces, offset = {}, 0
        for key, param in zip(names, actor, strict=True):
            pieces[key] = flat[offset : offset + param.numel()].view_as(param)
            offset += param.numel()
        features = policy.extract_features(inputs.observations)
        latent = functional_call(policy.mlp_extractor.policy_net, _sub(pieces, "mlp_extractor.policy_net."), (features,))
        logits = functional_call(policy.action_net, _sub(pieces, "action_net."), (latent,))
        return _closed_form_kl(old_logits, logits, inputs.action_masks, name)

    hessian = torch.autograd.functional.hessian(kl_at, theta0)
    product = analytic_fisher_product(policy_distribution(policy, inputs), actor, damping=0.0)
    generator = torch.Generator().manual_seed(3)
    for _ in range(3):
        vector = torch.randn(theta0.numel(), generator=generator, dtype=DTYPE)
        got, want = product(vector), hessian @ vector
        assert bool(torch.isfinite(got).all())
        # portable: float64, two exact second derivatives of the same KL over 12 samples
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12 * float(want.abs().max()))


def _sub(pieces: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {key[len(prefix) :]: value for key, value in pieces.items() if key.startswith(prefix)}


@pytest.mark.parametrize("name", ACTION_SPACES)
def test_a_masked_action_has_probability_zero_no_gradient_and_nothing_is_nan(name):
    policy, inputs = _policy(ACTION_SPACES[name][0]), _inputs(name)
    distribution = policy_distribution(policy, inputs)
    parts = getattr(distribution, "distributions", None) or [distribution.distribution]
    masks = inputs.action_masks
    for (start, size), categorical in zip(GROUPS[name], parts, strict=True):
        probabilities = categorical.probs
        assert bool((probabilities[masks[:, start : start + size] == 0] == 0).all())
        assert torch.equal(probabilities[0], torch.eye(size, dtype=DTYPE)[0])  # the one valid choice of row 0
    entropy, log_prob = distribution.entropy(), distribution.log_prob(distribution.sample())
    assert bool(torch.isfinite(entropy).all()) and bool(torch.isfinite(log_prob).all())
    gradient = flat_grad(distribution.log_prob(distribution.mode()).mean() + entropy.mean(), _actor(policy))
    assert bool(torch.isfinite(gradient).all())


def test_masks_go_with_their_rows_through_sub_sampling_and_batches():
    inputs = _inputs("discrete")
    rollout = RolloutTensors(
        inputs.observations,
        torch.arange(BATCH, dtype=DTYPE)[:, None] % 5,
        torch.linspace(-1.0, 1.0, BATCH, dtype=DTYPE),
        torch.zeros(BATCH, dtype=DTYPE),
        torch.zeros(BATCH, dtype=DTYPE),
        inputs.action_masks,
    )
    sample = policy_sample(rollout, 3, discrete_actions=True, normalize=None)
    assert isinstance(sample.observations, MaskedInputs) and first_tensor(sample.observations).shape[0] == 4
    assert torch.equal(sample.observations.action_masks, inputs.action_masks[::3])
    assert torch.equal(sample.rows(slice(1, 3)).observations.action_masks, inputs.action_masks[::3][1:3])
    assert torch.equal(select_rows(inputs, torch.tensor([2, 0])).observations, inputs.observations[[2, 0]])
    unmasked = policy_sample(rollout._replace(action_masks=None), 3, discrete_actions=True, normalize=None)
    assert torch.is_tensor(unmasked.observations)


def test_k_facs_output_factor_gives_a_masked_action_no_curvature():
    """With action 4 masked in every sample, the action layer's G factor has zero row and column 4."""
    policy, inputs = _policy(spaces.Discrete(5)), _inputs("discrete")
    masks = inputs.action_masks.clone()
    masks[:, 4] = 0.0
    masks[masks.sum(dim=1) == 0, 0] = 1.0
    plan = build_kfac_plan(policy, _actor(policy))
    curvature = batch_curvature(plan, policy, MaskedInputs(inputs.observations, masks), torch.Generator().manual_seed(0))
    (action_layer_index,) = [index for index, layer in enumerate(plan.layers) if layer is policy.action_net]
    _, output_factor = curvature.layer_factors[action_layer_index]
    # Zero up to the rounding of the other actions' terms (p_4 is exactly 0; its row is what rounding leaves).
    assert float(output_factor[4].abs().max()) <= 8 * torch.finfo(DTYPE).eps * float(output_factor.abs().max())
    assert float(output_factor[0, 0]) > 0
    unmasked = batch_curvature(plan, policy, inputs.observations, torch.Generator().manual_seed(0))
    assert float(unmasked.layer_factors[action_layer_index][1][4, 4]) > 0, "without masks action 4 has curvature"
