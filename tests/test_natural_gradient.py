import copy
import math

import pytest
import torch
from gymnasium import spaces
from stable_baselines3.common.distributions import (
    BernoulliDistribution,
    CategoricalDistribution,
    DiagGaussianDistribution,
    MultiCategoricalDistribution,
)
from stable_baselines3.common.policies import ActorCriticPolicy
from torch.func import functional_call

from sb3_npg.common.distributions import mean_kl
from sb3_npg.common.fisher import analytic_fisher_product
from sb3_npg.common.natural_gradient import (
    conjugate_gradient,
    fisher_vector_product,
    flat_grad,
    gauss_newton_vector_product,
    get_flat_params,
    kl_scaled_step_size,
    set_flat_params_,
)
from sb3_npg.common.policy_parameters import split_actor_critic_parameters


def _random_spd(n: int, generator: torch.Generator) -> torch.Tensor:
    a = torch.randn(n, n, generator=generator, dtype=torch.float64)
    return a @ a.T + 0.5 * torch.eye(n, dtype=torch.float64)


@pytest.mark.parametrize("n", [1, 5, 20])
def test_conjugate_gradient_matches_linear_solve(n):
    generator = torch.Generator().manual_seed(n)
    matrix = _random_spd(n, generator)
    b = torch.randn(n, generator=generator, dtype=torch.float64)
    result = conjugate_gradient(lambda v: matrix @ v, b, max_steps=4 * n, residual_tol=1e-20)
    # portable: float64: a small well-conditioned system, solved to convergence
    assert torch.allclose(result.solution, torch.linalg.solve(matrix, b), rtol=1e-6, atol=1e-8)
    assert result.converged and not result.curvature_failure
    residual = float(torch.sum((b - matrix @ result.solution) ** 2) / torch.sum(b**2))
    # portable: float64: a small well-conditioned system, solved to convergence
    assert result.residual == pytest.approx(residual, abs=1e-12)
    solution = result.solution
    # portable: float64: a small well-conditioned system, solved to convergence
    assert result.solution_curvature == pytest.approx(float(solution @ matrix @ solution), rel=1e-9)
    assert 1 <= result.iterations <= 4 * n


@pytest.mark.parametrize("scale", [1e-8, 1e-3, 1e6])
def test_conjugate_gradient_stops_relative_to_the_right_hand_side_so_scale_changes_nothing(scale):
    """The same iterations and the scaled solution for a scaled ``b``: the solve does not depend on the reward scale."""
    generator = torch.Generator().manual_seed(0)
    matrix = _random_spd(30, generator) / 30 + torch.eye(30, dtype=torch.float64)  # well conditioned: converges early
    b = torch.randn(30, generator=generator, dtype=torch.float64)
    reference = conjugate_gradient(lambda v: matrix @ v, b, max_steps=30, residual_tol=1e-10)
    scaled = conjugate_gradient(lambda v: matrix @ v, scale * b, max_steps=30, residual_tol=1e-10)
    assert 3 <= reference.iterations < 30 and scaled.iterations == reference.iterations
    # portable: float64: a small well-conditioned system, solved to convergence
    assert torch.allclose(scaled.solution, scale * reference.solution, rtol=1e-9, atol=0.0)
    # portable: float64: a small well-conditioned system, solved to convergence
    assert scaled.residual == pytest.approx(reference.residual, rel=1e-6)


def test_conjugate_gradient_respects_max_steps_and_consumes_no_random_numbers():
    generator = torch.Generator().manual_seed(0)
    matrix = _random_spd(30, generator)
    b = torch.randn(30, generator=generator, dtype=torch.float64)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = conjugate_gradient(lambda v: matrix @ v, b, max_steps=3, residual_tol=0.0)
    second = conjugate_gradient(lambda v: matrix @ v, b, max_steps=3, residual_tol=0.0)
    assert torch.equal(torch.get_rng_state(), state)
    assert first.iterations == 3 and not first.converged
    assert torch.equal(first.solution, second.solution)


def test_conjugate_gradient_stops_on_non_positive_curvature():
    matrix = -torch.eye(3, dtype=torch.float64)
    result = conjugate_gradient(lambda v: matrix @ v, torch.ones(3, dtype=torch.float64), max_steps=10, residual_tol=0.0)
    assert result.curvature_failure
    assert torch.equal(result.solution, torch.zeros(3, dtype=torch.float64))


def test_preconditioned_conjugate_gradient_stops_where_r_dot_z_underflows():
    # float32: r.r = 2e-44 (subnormal, above the zero threshold), r.z = 2e-46 underflows to 0
    result = conjugate_gradient(lambda v: 1e10 * v, torch.tensor([1e-22, 1e-22]), 5, 0.0, preconditioner=lambda r: r * 1e-2)
    assert result.preconditioner_failure and not result.curvature_failure and not result.converged
    assert bool(torch.isfinite(result.solution).all()) and math.isfinite(result.solution_curvature)


def test_preconditioned_conjugate_gradient_returns_the_last_iterate_before_an_indefinite_preconditioner():
    # A = I, M^-1 = diag(1, -1), b = (2, 1): r.z = 3 > 0, one step to x = 0.6 * (2, -1), then r.z = 0.64 - 2.56 < 0
    inverse = torch.tensor([1.0, -1.0], dtype=torch.float64)
    b = torch.tensor([2.0, 1.0], dtype=torch.float64)
    result = conjugate_gradient(lambda v: v, b, 10, 0.0, preconditioner=lambda r: inverse * r)
    assert result.preconditioner_failure and result.iterations == 1
    # portable: float64, one CG step on a 2-by-2 identity: a few roundings of numbers near 1
    assert torch.allclose(result.solution, torch.tensor([1.2, -0.6], dtype=torch.float64), rtol=0.0, atol=1e-15)


def test_flat_params_round_trip_and_flat_grad_zero_for_unused():
    layer = torch.nn.Linear(3, 2)
    unused = torch.nn.Parameter(torch.ones(4))
    params = [*layer.parameters(), unused]
    flat = get_flat_params(params)
    assert flat.numel() == 3 * 2 + 2 + 4
    set_flat_params_(params, flat + 1.0)
    assert torch.allclose(get_flat_params(params), flat + 1.0)
    grad = flat_grad(layer(torch.ones(1, 3)).sum(), params)
    assert torch.equal(grad[-4:], torch.zeros(4))
    assert torch.allclose(grad[:6], torch.ones(6))
    with pytest.raises(ValueError, match="flat vector"):
        set_flat_params_(params, torch.zeros(3))


def test_step_size_quadratic_model():
    assert kl_scaled_step_size(curvature=8.0, target_kl=0.01) == pytest.approx(math.sqrt(2 * 0.01 / 8.0))
    assert math.isnan(kl_scaled_step_size(curvature=0.0, target_kl=0.01))
    assert math.isnan(kl_scaled_step_size(curvature=math.inf, target_kl=0.01))


N_OBS = 3
BATCH = 7


def _categorical():
    return CategoricalDistribution(4), 4, lambda d, out, extra: d.proba_distribution(out)


def _gaussian():
    # State-independent log-std, as in SB3's MlpPolicy: an extra parameter beside the network.
    return DiagGaussianDistribution(2), 2, lambda d, out, extra: d.proba_distribution(out, extra)


def _multi_categorical():
    return MultiCategoricalDistribution([2, 3]), 5, lambda d, out, extra: d.proba_distribution(out)


def _bernoulli():
    return BernoulliDistribution(3), 3, lambda d, out, extra: d.proba_distribution(out)


@pytest.mark.parametrize("make", [_categorical, _gaussian, _multi_categorical, _bernoulli], ids=lambda f: f.__name__[1:])
def test_fisher_vector_product_equals_hessian_of_mean_kl(make):
    torch.manual_seed(0)
    distribution, n_out, build = make()
    net = torch.nn.Sequential(torch.nn.Linear(N_OBS, 5), torch.nn.Tanh(), torch.nn.Linear(5, n_out)).double()
    log_std = torch.nn.Parameter(0.3 * torch.randn(n_out, dtype=torch.float64))
    obs = torch.randn(BATCH, N_OBS, dtype=torch.float64)
    names = [name for name, _ in net.named_parameters()]
    params = [*net.parameters(), log_std]
    shapes = [p.shape for p in params]
    theta0 = get_flat_params(params)

    def dist_at(flat):
        pieces, offset = [], 0
        for shape in shapes:
            numel = math.prod(shape)
            pieces.append(flat[offset : offset + numel].view(shape))
            offset += numel
        out = functional_call(net, dict(zip(names, pieces[:-1], strict=True)), (obs,))
        return copy.copy(build(distribution, out, pieces[-1]))

    old = dist_at(theta0.detach())

    def kl_of(flat):
        return mean_kl(old, dist_at(flat))

    hessian = torch.autograd.functional.hessian(kl_of, theta0)
    kl = mean_kl(old, copy.copy(build(distribution, net(obs), log_std)))
    product = fisher_vector_product(kl, params, damping=0.0)
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        vector = torch.randn(theta0.numel(), generator=generator, dtype=torch.float64)
        # portable: float64: two exact derivatives of the same KL
        assert torch.allclose(product(vector), hessian @ vector, rtol=1e-6, atol=1e-10)
    assert torch.allclose(fisher_vector_product(kl, params, damping=0.5)(vector), hessian @ vector + 0.5 * vector)


def test_gauss_newton_product_equals_explicit_jacobian_form():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(N_OBS, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()
    unused = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    params = [*net.parameters(), unused]
    obs = torch.randn(BATCH, N_OBS, dtype=torch.float64)
    names = [name for name, _ in net.named_parameters()]
    out = net(obs)
    statistics = (out, out.exp())
    weights = (torch.rand(BATCH, 2, dtype=torch.float64), torch.rand(BATCH, 2, dtype=torch.float64))

    def flat_statistics(*values):
        result = functional_call(net, dict(zip(names, values, strict=True)), (obs,))
        return torch.cat([result.reshape(-1), result.exp().reshape(-1)])

    jacobians = torch.autograd.functional.jacobian(flat_statistics, tuple(p.detach() for p in net.parameters()))
    jacobian = torch.cat([j.reshape(j.shape[0], -1) for j in jacobians], dim=1)
    metric = torch.diag(torch.cat([w.reshape(-1) for w in weights])) / BATCH
    expected = jacobian.T @ metric @ jacobian
    product = gauss_newton_vector_product(statistics, params, weights, damping=0.25)
    vector = torch.randn(expected.shape[0] + 2, dtype=torch.float64)
    result = product(vector)
    # portable: float64: one product against its explicit Jacobian form
    assert torch.allclose(result[:-2], expected @ vector[:-2] + 0.25 * vector[:-2], rtol=1e-10)
    assert torch.allclose(result[-2:], 0.25 * vector[-2:]), "a parameter the statistics ignore gets only the damping"


ACTION_SPACES = {
    "Discrete": (spaces.Discrete(4), {}),
    "Box": (spaces.Box(-1.0, 1.0, (3,)), {}),
    "Box-gSDE": (spaces.Box(-1.0, 1.0, (3,)), {"use_sde": True}),
    "MultiDiscrete": (spaces.MultiDiscrete([3, 2, 4]), {}),
    "MultiBinary": (spaces.MultiBinary(3), {}),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("space", list(ACTION_SPACES))
def test_analytic_fisher_product_equals_the_autograd_product(space, seed):
    torch.manual_seed(seed)
    action_space, kwargs = ACTION_SPACES[space]
    observation_space = spaces.Box(-1.0, 1.0, (5,))
    policy = ActorCriticPolicy(observation_space, action_space, lambda _: 1e-3, net_arch=[32, 32], log_std_init=-0.5, **kwargs)
    if kwargs.get("use_sde"):
        policy.reset_noise(4)
    actor, _ = split_actor_critic_parameters(policy)
    observations = 2 * torch.randn(256, 5)
    with torch.no_grad():
        old = copy.copy(policy.get_distribution(observations))
    autograd = fisher_vector_product(mean_kl(old, policy.get_distribution(observations)), actor, damping=0.1)
    analytic = analytic_fisher_product(policy.get_distribution(observations), actor, damping=0.1)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(3):
        vector = torch.randn(sum(p.numel() for p in actor), generator=generator)
        expected = autograd(vector)
        assert float(torch.linalg.vector_norm(analytic(vector) - expected) / torch.linalg.vector_norm(expected)) < 1e-5
