"""Value-target normalization: the critic learns normalized returns, and no value changes when the statistics move."""

import numpy as np
import pytest
import torch
from stable_baselines3.common.policies import ActorCriticPolicy
from torch import nn

from tests.float_comparisons import reduction_tolerance

from sb3_npg import TRPO
from sb3_npg.common.batches import rollout_tensors
from sb3_npg.common.distributed import Reducer
from sb3_npg.common.critic import CriticFit
from sb3_npg.common.value_targets import MIN_TARGET_STD, NormalizedValueHead
from tests.test_algorithms import TINY, filled, logged

NORMALIZED = {"normalize_value_targets": True}
#: Returns far from the unit scale (a mean of -500 and a spread of 200, then 50 and 5), as undiscounted MuJoCo sums.
TARGET_BATCHES = [(-500.0, 200.0, 100), (50.0, 5.0, 60)]


def _statistics_tolerances(values: np.ndarray) -> tuple[float, float]:
    """
    How far two float32 computations of the mean and std of ``values`` (in other orders) may differ: each mean is
    within ``gamma_n`` of the mean of the magnitudes, each variance (a sum of squares) within ``gamma_n`` relatively.
    """
    gamma = reduction_tolerance(len(values), torch.float32)
    return 2 * gamma * float(np.abs(values).mean()), 2 * gamma


def _values(model, observations):
    with torch.no_grad():
        return model.policy.predict_values(observations).flatten()


def test_new_targets_move_the_statistics_and_leave_every_value_unchanged(algo):
    model = algo("MlpPolicy", "Pendulum-v1", **{**TINY, **NORMALIZED})
    head = model.policy.value_net
    observations = torch.randn(32, 3, generator=torch.Generator().manual_seed(0))
    untrained = _values(model, observations)  # empty statistics: the layer's own outputs
    rng = np.random.default_rng(0)
    batches = [rng.normal(mean, std, size) for mean, std, size in TARGET_BATCHES]
    head.add_targets(torch.as_tensor(batches[0], dtype=torch.float32), Reducer())
    # The first returns set the statistics outright: the untrained outputs become normalized values.
    torch.testing.assert_close(_values(model, observations), head.target_mean + head.target_std * untrained)
    before = _values(model, observations)
    for batch in batches[1:]:
        head.add_targets(torch.as_tensor(batch, dtype=torch.float32), Reducer())
        torch.testing.assert_close(_values(model, observations), before, rtol=1e-4, atol=1e-3)
    everything = np.concatenate(batches).astype(np.float32)
    mean_atol, std_rtol = _statistics_tolerances(everything)
    assert head.target_mean.item() == pytest.approx(everything.mean(), abs=mean_atol)
    assert head.target_std.item() == pytest.approx(everything.std(), rel=std_rtol)
    assert head.target_count.item() == len(everything)


def test_the_critic_fits_the_rollouts_returns_in_normalized_units(algo):
    # A learning rate too small to move anything: the logged loss is the loss of the parameters the fit started from.
    model = filled(algo, learning_rate=1e-12, n_critic_updates=1, **NORMALIZED)
    rollout = rollout_tensors(model.rollout_buffer)
    model.train()
    head = model.policy.value_net
    mean_atol, std_rtol = _statistics_tolerances(rollout.returns.numpy())
    assert head.target_mean.item() == pytest.approx(rollout.returns.mean().item(), abs=mean_atol)
    assert head.target_std.item() == pytest.approx(rollout.returns.std(unbiased=False).item(), rel=std_rtol)
    normalized_error = head.normalized(_values(model, rollout.observations)) - head.normalized(rollout.returns)
    assert logged(model, "value_loss") == pytest.approx(float(torch.mean(normalized_error**2)), rel=1e-3)
    assert logged(model, "value_target_mean") == pytest.approx(head.target_mean.item())
    assert logged(model, "value_target_std") == pytest.approx(head.target_std.item())


def test_the_normalized_critic_starts_its_fit_at_the_returns_scale():
    # Pendulum's returns are hundreds below zero. One update of small minibatch Adam steps from the unit scale leaves
    # the values many spreads of the returns away from them (R^2 far below 0); in normalized units the first rollout
    # puts the critic at their mean and spread, and the fit starts from there.
    explained = {}
    for normalize in (False, True):
        model = filled(TRPO, normalize_value_targets=normalize)
        rollout = rollout_tensors(model.rollout_buffer)
        model._fit_critic(rollout.observations, rollout.returns)
        squared_error = torch.mean((_values(model, rollout.observations) - rollout.returns) ** 2)
        explained[normalize] = 1.0 - float(squared_error / rollout.returns.var())  # R^2: 0 for the returns' mean
    assert explained[True] > -1.0 > explained[False], explained


def test_a_saved_model_keeps_its_statistics_and_goes_on_learning(algo, tmp_path):
    model = algo("MlpPolicy", "Pendulum-v1", **{**TINY, **NORMALIZED})
    model.learn(2 * model.n_steps)
    model.save(tmp_path / "model")
    loaded = algo.load(tmp_path / "model", env=model.get_env())
    head, loaded_head = model.policy.value_net, loaded.policy.value_net
    assert isinstance(loaded_head, NormalizedValueHead)
    for name in ("target_mean", "target_var", "target_count", "weight", "bias"):
        assert torch.equal(getattr(loaded_head, name), getattr(head, name)), name
    assert any(param is loaded_head.weight for param in loaded.critic_parameters)
    loaded.learn(loaded.n_steps, reset_num_timesteps=False)
    assert loaded_head.target_count.item() == 3 * model.n_steps


def test_returns_that_do_not_vary_are_divided_by_the_smallest_std_and_keep_every_value_finite(algo):
    """Constant returns have a variance of 0: the targets are then divided by ``MIN_TARGET_STD``, so normalized values,
    the critic's loss and the rescaling of the layer when more constant returns arrive all stay finite."""
    model = algo("MlpPolicy", "Pendulum-v1", **{**TINY, **NORMALIZED})
    head = model.policy.value_net
    observations = torch.randn(32, 3, generator=torch.Generator().manual_seed(0))
    for _ in range(2):  # the first rollout sets the statistics, the second merges into them and rescales the layer
        head.add_targets(torch.full((16,), 5.0), Reducer())
        assert head.target_var.item() == 0.0
        assert head.target_std.item() == pytest.approx(MIN_TARGET_STD, rel=torch.finfo(torch.float32).eps)
        values = _values(model, observations)
        normalized = head.normalized(values)
        assert bool(torch.isfinite(values).all() and torch.isfinite(normalized).all())
        assert bool(torch.isfinite(head.weight).all() and torch.isfinite(head.bias).all())
        torch.testing.assert_close(normalized, (values - 5.0) / MIN_TARGET_STD)


def test_the_normalized_loss_is_the_squared_error_over_the_targets_variance(algo):
    """In normalized units the critic's loss is ``mean((V - R)^2) / var``: values and returns divided by the std."""
    model = algo("MlpPolicy", "Pendulum-v1", **{**TINY, **NORMALIZED})
    head = model.policy.value_net
    head.target_mean.fill_(0.5)
    head.target_var.fill_(4.0)  # a std of 2, which the variance is not
    generator = torch.Generator().manual_seed(0)
    observations = torch.randn(32, 3, generator=generator)
    values = _values(model, observations)
    returns = values + 1.0 + torch.rand(32, generator=generator)  # apart from the values: no cancellation
    loss = CriticFit(model.policy, list(model.critic_parameters), Reducer(), head).loss_with_gradient(observations, returns)
    expected = float(torch.mean((values.double() - returns.double()) ** 2)) / 4.0
    # float32: a rounding per subtraction and square, then a mean over 32 terms (at most 32 more relative roundings).
    assert loss.item() == pytest.approx(expected, rel=(32 + 8) * torch.finfo(torch.float32).eps)
    torch.testing.assert_close(head.normalized(returns), (returns - 0.5) / 2.0)


class _DeepValuePolicy(ActorCriticPolicy):
    def _build(self, lr_schedule):
        super()._build(lr_schedule)
        self.value_net = nn.Sequential(nn.Linear(self.mlp_extractor.latent_dim_vf, 1))


def test_a_value_layer_that_is_not_linear_is_refused(algo):
    with pytest.raises(ValueError, match="`normalize_value_targets=True` needs a linear value layer"):
        algo(_DeepValuePolicy, "Pendulum-v1", **{**TINY, **NORMALIZED})
