"""Behaviour pinned against oracles computed here, not by the package's own helpers.

- The KL the update bounds and logs is KL(behaviour || new), the old policy first, as TRPO defines it (and as
  sb3-contrib computes ``kl_divergence(old_distribution, distribution)``): checked against the closed forms of the
  diagonal Gaussian and categorical KL on distributions where the two directions clearly differ, at the functions
  the update uses (``mean_kl``, ``surrogate_and_kl``) and end to end through ``train/kl_divergence`` and the line
  search's KL. The other tests use ``mean_kl`` itself as their oracle, so a flipped direction passed them.
- The critic's optimizer steps on gradients clipped to ``max_grad_norm`` (and on the raw gradients without one):
  observed at the optimizer's ``step``, since ``tests/test_clip.py`` tests only the clip function.
"""

import inspect

import pytest
import torch
from stable_baselines3.common.distributions import (
    CategoricalDistribution,
    DiagGaussianDistribution,
    MultiCategoricalDistribution,
)

from sb3_npg import NPG, TRPO
from sb3_npg.common.batches import PolicyBatch, rollout_tensors
from sb3_npg.common.clip import CLIP_EPS
from sb3_npg.common.critic import CriticFit
from sb3_npg.common.distributions import mean_kl
from sb3_npg.common.natural_step import surrogate_and_kl
from tests.float_comparisons import reduction_tolerance, unit_roundoff

TINY = {"n_steps": 64, "batch_size": 32, "policy_kwargs": {"net_arch": [16]}, "seed": 0, "device": "cpu"}
#: The two KL directions must differ by more than this fraction for a test to tell them apart.
DISTINCT = 0.05


# ------------------------------------------------------------------ closed forms (float64)


def gaussian_kl(mean_p, std_p, mean_q, std_q):
    """KL(p || q) of diagonal Gaussians per sample, summed over the action dimensions."""
    per_dim = torch.log(std_q / std_p) + (std_p**2 + (mean_p - mean_q) ** 2) / (2 * std_q**2) - 0.5
    return per_dim.sum(dim=-1)


def categorical_kl(logits_p, logits_q):
    """KL(p || q) = sum_a p_a log(p_a / q_a) per sample."""
    log_p, log_q = torch.log_softmax(logits_p, dim=-1), torch.log_softmax(logits_q, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def closed_form_kl(statistics_p, statistics_q):
    """The mean over the batch of KL(p || q), from the statistics of :func:`statistics` (summed over sub-actions)."""
    kind, *p = statistics_p
    _, *q = statistics_q
    if kind == "gaussian":
        return float(gaussian_kl(*p, *q).mean())
    return float(sum(categorical_kl(logits_p, logits_q) for logits_p, logits_q in zip(p, q, strict=True)).mean())


def statistics(distribution):
    """The parameters of an SB3 distribution in float64, detached: ``("gaussian", mean, std)`` or logits."""
    if isinstance(distribution, DiagGaussianDistribution):
        normal = distribution.distribution
        return ("gaussian", normal.loc.detach().double(), normal.scale.detach().double())
    if isinstance(distribution, CategoricalDistribution):
        return ("categorical", distribution.distribution.logits.detach().double())
    assert isinstance(distribution, MultiCategoricalDistribution)
    return ("categorical", *(part.logits.detach().double() for part in distribution.distribution))


# ------------------------------------------------------------------ distribution pairs where the directions differ

BATCH = 5


def _gaussian_pair():
    """Old: unit Gaussians; new: shifted means and standard deviations of 2 and 1.5 (state-independent, as MlpPolicy)."""
    generator = torch.Generator().manual_seed(0)
    old_mean = torch.randn(BATCH, 2, generator=generator, dtype=torch.float64)
    new_mean = old_mean + torch.tensor([0.5, -0.3], dtype=torch.float64)
    old = DiagGaussianDistribution(2).proba_distribution(old_mean, torch.zeros(2, dtype=torch.float64))
    new = DiagGaussianDistribution(2).proba_distribution(new_mean, torch.log(torch.tensor([2.0, 1.5]).double()))
    return old, new


def _categorical_pair():
    """Old: near uniform over 4 actions; new: concentrated on one action (KL(old||new) >> KL(new||old))."""
    generator = torch.Generator().manual_seed(1)
    old_logits = 0.1 * torch.randn(BATCH, 4, generator=generator, dtype=torch.float64)
    new_logits = old_logits + torch.tensor([3.0, 0.0, -1.0, 0.0], dtype=torch.float64)
    return CategoricalDistribution(4).proba_distribution(old_logits), CategoricalDistribution(4).proba_distribution(new_logits)


def _multi_categorical_pair():
    """Sub-actions of 3 and 2 choices; each moves so that the two directions differ."""
    generator = torch.Generator().manual_seed(2)
    old_logits = 0.1 * torch.randn(BATCH, 5, generator=generator, dtype=torch.float64)
    new_logits = old_logits + torch.tensor([2.5, 0.0, -1.0, -2.0, 0.0], dtype=torch.float64)
    return (
        MultiCategoricalDistribution([3, 2]).proba_distribution(old_logits),
        MultiCategoricalDistribution([3, 2]).proba_distribution(new_logits),
    )


PAIRS = [_gaussian_pair, _categorical_pair, _multi_categorical_pair]


def _directions(old, new):
    """The closed-form mean KL(old || new) and KL(new || old), checked to differ clearly (else nothing is tested)."""
    forward = closed_form_kl(statistics(old), statistics(new))
    reverse = closed_form_kl(statistics(new), statistics(old))
    assert abs(forward - reverse) > DISTINCT * forward, "the pair must tell the two directions apart"
    return forward, reverse


@pytest.mark.parametrize("make", PAIRS, ids=lambda f: f.__name__[1:-5])
def test_mean_kl_is_the_closed_form_kl_from_old_to_new(make):
    """``mean_kl(old, new)`` is the batch mean of KL(old || new), summed over Box dimensions and sub-actions."""
    old, new = make()
    forward, reverse = _directions(old, new)
    # portable: float64 distributions against their closed form
    assert float(mean_kl(old, new)) == pytest.approx(forward, rel=1e-10)
    # portable: float64 distributions against their closed form
    assert float(mean_kl(new, old)) == pytest.approx(reverse, rel=1e-10)


@pytest.mark.parametrize("make", PAIRS, ids=lambda f: f.__name__[1:-5])
def test_surrogate_and_kl_measures_the_kl_from_the_behaviour_policy(make):
    """
    The objective's KL (the one the trust region bounds, and what the line search and the log see) is
    KL(behaviour || current), not KL(current || behaviour); its surrogate is ``mean(ratio * advantage)`` with the ratio
    against the behaviour policy's log-probabilities of the actions.
    """
    behaviour, current = make()
    forward, _ = _directions(behaviour, current)
    generator = torch.Generator().manual_seed(3)
    actions = behaviour.sample()
    advantages = torch.randn(BATCH, generator=generator, dtype=torch.float64)
    old_log_prob = behaviour.log_prob(actions)
    batch = PolicyBatch(torch.zeros(BATCH, 1, dtype=torch.float64), actions, advantages, old_log_prob)
    objective = surrogate_and_kl(batch, current, behaviour)
    # portable: float64 distributions against their closed form
    assert float(objective.kl) == pytest.approx(forward, rel=1e-10)
    expected_surrogate = (torch.exp(current.log_prob(actions) - old_log_prob) * advantages).mean()
    # portable: float64 distributions against their closed form
    assert float(objective.surrogate) == pytest.approx(float(expected_surrogate), rel=1e-10)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("algo", [NPG, TRPO], ids=lambda algo: algo.__name__)
def test_logged_kl_is_the_closed_form_kl_from_the_policy_before_the_update(algo, env_id):
    """
    After one update, ``train/kl_divergence`` (and TRPO's ``train/line_search_last_kl``, the KL its line search
    accepted) is KL(old || new) over the rollout, computed here in closed form from the policy's action distributions
    before and after ``train()``, on a step large enough that KL(new || old) differs clearly.
    """
    model = algo("MlpPolicy", env_id, target_kl=0.3, sub_sampling_factor=1, **TINY)
    _, callback = model._setup_learn(model.n_steps * model.n_envs)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    observations = rollout_tensors(model.rollout_buffer).observations
    with torch.no_grad():
        before = statistics(model.policy.get_distribution(observations))
    model.train()
    with torch.no_grad():
        after = statistics(model.policy.get_distribution(observations))
    logged = model.logger.name_to_value
    assert logged["train/step_fraction"] > 0.0, "the update must move the policy"
    forward = closed_form_kl(before, after)
    reverse = closed_form_kl(after, before)
    assert abs(forward - reverse) > DISTINCT * forward, "the step must tell the two directions apart"
    assert logged["train/kl_divergence"] == pytest.approx(forward, rel=1e-3)
    if algo is TRPO:
        assert logged["train/line_search_last_kl"] == pytest.approx(forward, rel=1e-3)
        assert forward <= model.target_kl * (1 + 1e-3)


# ------------------------------------------------------------------ the critic's gradient clip


def _record_critic_steps(model, monkeypatch):
    """
    Train ``model`` once and return, for every step of the critic's optimizer, the critic's gradients as the loss
    produced them (raw) and as the optimizer's ``step`` saw them.
    """
    raw, seen = [], []
    params = list(model.critic_parameters)
    loss_with_gradient = CriticFit.loss_with_gradient

    def recording_loss(self, observations, returns):
        loss = loss_with_gradient(self, observations, returns)
        raw.append([param.grad.detach().clone() for param in params])
        return loss

    def before_step(optimizer, args, kwargs):
        seen.append([param.grad.detach().clone() for param in params])

    monkeypatch.setattr(CriticFit, "loss_with_gradient", recording_loss)
    handle = model.policy.optimizer.register_step_pre_hook(before_step)
    try:
        model.train()
    finally:
        handle.remove()
    n_steps = model.n_critic_updates * (model.n_steps * model.n_envs) // model.batch_size
    assert len(raw) == len(seen) == n_steps, "every minibatch must go through the loss and one optimizer step"
    return raw, seen


def _norm(gradients):
    return float(torch.linalg.vector_norm(torch.cat([grad.flatten() for grad in gradients]).double()))


def _filled(algo, **kwargs):
    model = algo("MlpPolicy", "Pendulum-v1", critic_fit="minibatch", n_critic_updates=2, **TINY, **kwargs)
    _, callback = model._setup_learn(model.n_steps * model.n_envs)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    return model


@pytest.mark.parametrize("algo", [NPG, TRPO], ids=lambda algo: algo.__name__)
def test_critic_optimizer_steps_on_gradients_clipped_to_max_grad_norm(algo, monkeypatch):
    """
    With a tiny ``max_grad_norm`` every raw gradient exceeds it (checked, so the test cannot pass vacuously), and every
    step of the critic's optimizer sees the raw gradient scaled to the cap: global norm at most ``max_grad_norm``,
    same direction. Skipping the clip in the fit passes ``tests/test_clip.py`` and fails here.
    """
    max_grad_norm = 1e-3
    model = _filled(algo, max_grad_norm=max_grad_norm)
    raw, seen = _record_critic_steps(model, monkeypatch)
    for raw_grads, seen_grads in zip(raw, seen, strict=True):
        raw_norm = _norm(raw_grads)
        assert raw_norm > 10 * max_grad_norm, "the raw gradient must exceed the cap for the clip to act"
        assert _norm(seen_grads) <= max_grad_norm * (1 + 1e-5)
        scale = max_grad_norm / (raw_norm + CLIP_EPS)
        # The clip's float32 norm is a sum of n squares (within gamma_n of this float64 one), its scale one division.
        rtol = reduction_tolerance(sum(grad.numel() for grad in raw_grads), torch.float32) + 2 * unit_roundoff(torch.float32)
        for raw_grad, seen_grad in zip(raw_grads, seen_grads, strict=True):
            assert torch.allclose(seen_grad, raw_grad * scale, rtol=rtol, atol=0.0)


@pytest.mark.parametrize("algo", [NPG, TRPO], ids=lambda algo: algo.__name__)
def test_critic_optimizer_steps_on_the_raw_gradients_without_max_grad_norm(algo, monkeypatch):
    """
    With ``max_grad_norm=None`` the critic's optimizer sees exactly the gradients of the loss: no clip touches them,
    not even one with the default cap, which every one of these gradients exceeds (checked, so a clip would show).
    """
    default_cap = inspect.signature(algo.__init__).parameters["max_grad_norm"].default
    model = _filled(algo, max_grad_norm=None)
    raw, seen = _record_critic_steps(model, monkeypatch)
    for raw_grads, seen_grads in zip(raw, seen, strict=True):
        assert _norm(raw_grads) > default_cap, "the raw gradient must exceed the default cap"
        for raw_grad, seen_grad in zip(raw_grads, seen_grads, strict=True):
            assert torch.equal(seen_grad, raw_grad)
