"""The options that make an update cheaper: the Fisher product, Fisher sub-sampling and the critic's fit."""

import pytest
import torch
from stable_baselines3.common.distributions import CategoricalDistribution, Distribution
from stable_baselines3.common.policies import ActorCriticPolicy

from sb3_npg import NPG, TRPO
from sb3_npg.common import actor_update
from sb3_npg.common.batches import rollout_tensors
from sb3_npg.common.natural_gradient import get_flat_params
from tests.test_algorithms import TINY, dense_natural_step, filled, logged, taken_step


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_analytic_and_autograd_fisher_take_the_same_step(env_id):
    models = {fisher: filled(NPG, env_id, fisher=fisher) for fisher in ("analytic", "autograd")}
    for model in models.values():
        model.train()
    analytic, autograd = (get_flat_params(models[f].actor_parameters) for f in ("analytic", "autograd"))
    start = get_flat_params(filled(NPG, env_id).actor_parameters)
    assert not torch.allclose(analytic, start)
    # The two products differ by float32 rounding, which CG amplifies: compared to 1e-3 of the step's largest entry.
    step = float((autograd - start).abs().max())
    assert torch.allclose(analytic - start, autograd - start, rtol=1e-3, atol=1e-3 * step)


@pytest.mark.parametrize("fisher", ["analytic", "autograd"])
def test_fisher_sub_sampling_uses_every_nth_sample_for_the_fisher_only(fisher, monkeypatch):
    fisher_batch_sizes, selections = [], []
    analytic = actor_update.analytic_fisher_product
    monkeypatch.setattr(
        actor_update,
        "analytic_fisher_product",
        lambda distribution, *args: (
            fisher_batch_sizes.append(len(distribution.distribution.logits)) or analytic(distribution, *args)
        ),
    )
    select = actor_update.select_rows
    monkeypatch.setattr(
        actor_update, "select_rows", lambda observations, index: selections.append(index) or select(observations, index)
    )
    full = filled(TRPO, "CartPole-v1", fisher=fisher)
    strided = filled(TRPO, "CartPole-v1", fisher=fisher, fisher_sub_sampling_factor=5)
    full.train()
    assert slice(None, None, 5) not in selections
    strided.train()
    assert slice(None, None, 5) in selections
    # The gradient is the same (whole batch, same base point); the Fisher is the subset's.
    # portable: the same gradient computation on the same data in one process, no amplifying step: a few ulps
    assert logged(full, "policy_grad_norm") == pytest.approx(logged(strided, "policy_grad_norm"), rel=1e-6)
    if fisher == "analytic":
        assert fisher_batch_sizes == [TINY["n_steps"], len(range(0, TINY["n_steps"], 5))]


@pytest.mark.parametrize("fisher", ["analytic", "autograd"])
def test_fisher_sub_sampling_takes_the_natural_step_of_the_whole_gradient_and_the_subsets_fisher(fisher):
    settings = {"fisher": fisher, "fisher_sub_sampling_factor": 5, "target_kl": 1e-3, "cg_max_steps": 200}
    model = filled(NPG, "CartPole-v1", cg_residual_tol=1e-12, **settings)
    expected, whole_fisher = dense_natural_step(model, fisher_every=5), dense_natural_step(model)
    step = taken_step(model)
    assert float((step - expected).norm() / expected.norm()) < 1e-3
    assert float((step - whole_fisher).norm() / whole_fisher.norm()) > 1e-2  # the subset's Fisher made a difference


def test_fisher_sub_sampled_step_still_respects_the_trust_region():
    model = filled(TRPO, "CartPole-v1", fisher_sub_sampling_factor=4)
    model.train()
    assert 0.0 < logged(model, "kl_divergence") <= model.target_kl


def test_lbfgs_critic_fits_at_least_as_well_as_minibatch():
    losses = {}
    for critic_fit in ("minibatch", "lbfgs"):
        model = filled(TRPO, critic_fit=critic_fit, n_critic_updates=20)
        rollout = rollout_tensors(model.rollout_buffer)
        observations, returns = rollout.observations, rollout.returns
        model._fit_critic(observations, returns)
        with torch.no_grad():
            losses[critic_fit] = float(torch.mean((model.policy.predict_values(observations).flatten() - returns) ** 2))
    assert losses["lbfgs"] <= losses["minibatch"]


def test_lbfgs_critic_moves_only_the_critic_and_logs_its_fit():
    model = filled(NPG, critic_fit="lbfgs", n_critic_updates=5)
    actor = get_flat_params(model.actor_parameters)
    critic = get_flat_params(model.critic_parameters)
    rollout = rollout_tensors(model.rollout_buffer)
    model._fit_critic(rollout.observations, rollout.returns)
    assert torch.equal(get_flat_params(model.actor_parameters), actor)
    assert not torch.equal(get_flat_params(model.critic_parameters), critic)
    with torch.no_grad():
        loss_before = float(torch.mean((model.policy.predict_values(rollout.observations).flatten() - rollout.returns) ** 2))
    model.train()
    # The logged loss is the fit's last full-batch evaluation: below where this update's fit started.
    assert 0.0 < logged(model, "value_loss") < loss_before
    assert logged(model, "value_grad_norm") > 0.0


class _OpaqueCategorical(Distribution):
    """A custom distribution (wrapping a categorical) that the analytic Fisher does not know."""

    def __init__(self, action_dim: int):
        super().__init__()
        self.inner = CategoricalDistribution(action_dim)

    def proba_distribution_net(self, *args, **kwargs):
        return self.inner.proba_distribution_net(*args, **kwargs)

    def proba_distribution(self, action_logits):
        self.inner = type(self.inner)(self.inner.action_dim).proba_distribution(action_logits)
        self.distribution = self.inner.distribution
        return self

    def log_prob(self, actions):
        return self.inner.log_prob(actions)

    def entropy(self):
        return self.inner.entropy()

    def sample(self):
        return self.inner.sample()

    def mode(self):
        return self.inner.mode()

    def actions_from_params(self, *args, **kwargs):
        return self.inner.actions_from_params(*args, **kwargs)

    def log_prob_from_params(self, *args, **kwargs):
        return self.inner.log_prob_from_params(*args, **kwargs)


class _CustomDistributionPolicy(ActorCriticPolicy):
    def _build(self, lr_schedule):
        super()._build(lr_schedule)
        self.action_dist = _OpaqueCategorical(int(self.action_space.n))

    def _get_action_dist_from_latent(self, latent_pi):
        return self.action_dist.proba_distribution(self.action_net(latent_pi))


def test_custom_distribution_needs_the_autograd_fisher(algo):
    with pytest.raises(ValueError, match="fisher='autograd'"):
        algo(_CustomDistributionPolicy, "CartPole-v1", **TINY)
    model = algo(_CustomDistributionPolicy, "CartPole-v1", fisher="autograd", **TINY).learn(2 * TINY["n_steps"])
    assert model.skipped_steps == 0
    assert logged(model, "cg_iterations") > 0
