"""K-FAC's factors, products and damped inverse (``sb3_npg/common/kfac.py``), against dense and autograd references."""

import math

import pytest
import torch
from torch import nn
from torch.distributions import Bernoulli, Categorical, Normal, kl_divergence

from sb3_npg.common.kfac import (
    EIGENBASIS_DAMPING,
    FACTORED_DAMPING,
    KroneckerFactors,
    damped_factors,
    damped_inverse,
    expected_output_factors,
    gaussian_log_std_fisher,
    gaussian_mean_layer_factor,
    kfac_inverse,
    kfac_fisher_product,
    output_factors,
    pi_correction,
    sampled_log_likelihood,
    update_factors,
)
from sb3_npg.common.kfac_layers import input_factor, layer_matrices, layer_parameters, record_layers
from sb3_npg.common.natural_gradient import fisher_vector_product

DTYPE = torch.float64
OBS_DIM, ACTION_DIM, HIDDEN = 4, 3, 8
LOG_STD = (-0.7, 0.1, 0.9)
DECAY = 0.9


def _linear(in_features: int, out_features: int, seed: int, bias: bool = True) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features, bias=bias).to(DTYPE)


def _observations(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return 0.5 + torch.randn(n, OBS_DIM, generator=generator, dtype=DTYPE)  # not centred: the bias column matters


def _random_spd(n: int, scale: float, generator: torch.Generator) -> torch.Tensor:
    a = torch.randn(n, n, generator=generator, dtype=DTYPE)
    return scale * (a @ a.T / n + 0.1 * torch.eye(n, dtype=DTYPE))


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float(torch.linalg.norm(actual - expected) / torch.linalg.norm(expected))


def _gaussian_kfac_and_fisher(network: nn.Sequential, obs: torch.Tensor):
    """K-FAC with the closed-form ``G`` of every linear layer, and the exact Fisher product of the mean KL."""
    layers = [module for module in network if isinstance(module, nn.Linear)]
    std = torch.tensor(LOG_STD, dtype=DTYPE).exp()
    with record_layers(layers) as records:
        mean = network(obs)
    weights = [std.pow(-2).expand_as(mean)]
    output = expected_output_factors([mean], weights, [records[layer] for layer in layers])
    factors = [KroneckerFactors() for _ in layers]
    update_factors(factors, layers, records, output, decay=DECAY)
    kl = kl_divergence(Normal(mean.detach(), std), Normal(mean, std)).sum(-1).mean()
    exact = fisher_vector_product(kl, layer_parameters(layers), damping=0.0)
    return layers, factors, exact, output


def test_kfac_equals_the_fisher_of_a_linear_gaussian_policy_and_not_of_a_deeper_one():
    """One linear layer for the mean, a state-independent std: the Fisher is exactly ``kron(Sigma^-1, A)``."""
    obs = _observations(64, seed=0)
    generator = torch.Generator().manual_seed(1)
    layers, factors, exact, output = _gaussian_kfac_and_fisher(nn.Sequential(_linear(OBS_DIM, ACTION_DIM, 0)), obs)
    std = torch.tensor(LOG_STD, dtype=DTYPE).exp()
    # portable: float64 (DTYPE): closed forms against a few products and sums
    assert torch.allclose(output[0], gaussian_mean_layer_factor(std), rtol=1e-14, atol=0.0)
    # portable: float64 (DTYPE): closed forms against a few products and sums
    assert torch.allclose(output[0], torch.diag(std.pow(-2)), rtol=1e-14, atol=0.0)
    size = sum(param.numel() for param in layer_parameters(layers))
    for _ in range(5):
        vector = torch.randn(size, generator=generator, dtype=DTYPE)
        assert _relative_error(kfac_fisher_product(factors, layers, vector), exact(vector)) < 1e-12

    deep = nn.Sequential(_linear(OBS_DIM, HIDDEN, 2), nn.Tanh(), _linear(HIDDEN, ACTION_DIM, 3))
    layers, factors, exact, _ = _gaussian_kfac_and_fisher(deep, obs)
    size = sum(param.numel() for param in layer_parameters(layers))
    errors = [
        _relative_error(kfac_fisher_product(factors, layers, vector), exact(vector))
        for vector in torch.randn(5, size, generator=generator, dtype=DTYPE)
    ]
    assert min(errors) > 0.05


def test_kfac_product_is_kron_g_a_in_the_row_major_order_of_weight_then_bias():
    """The dense K-FAC matrix in the parameters' order is ``kron(G, A)`` permuted from the row-major order of ``[W | b]``."""
    layer = _linear(OBS_DIM, ACTION_DIM, 0)
    generator = torch.Generator().manual_seed(2)
    factors = KroneckerFactors()
    factors.update(_random_spd(OBS_DIM + 1, 1.0, generator), _random_spd(ACTION_DIM, 1.0, generator), decay=DECAY)
    size = ACTION_DIM * (OBS_DIM + 1)
    basis = torch.eye(size, dtype=DTYPE)
    dense = torch.stack([kfac_fisher_product([factors], [layer], column) for column in basis], dim=1)
    row_major = torch.stack([layer_matrices(column, [layer])[0].reshape(-1) for column in basis], dim=1)  # P
    weight_index = ACTION_DIM * OBS_DIM + 1  # W[0, 0] is flat 0; b[1] is flat weight_index, [W | b][1, OBS_DIM]
    assert row_major[OBS_DIM + 1, 0] == 0.0 and row_major[0, 0] == 1.0
    assert row_major[(OBS_DIM + 1) + OBS_DIM, weight_index] == 1.0
    input_, output = factors.factors()
    # portable: float64 (DTYPE): closed forms against a few products and sums
    assert torch.allclose(dense, row_major.T @ torch.kron(output, input_) @ row_major, rtol=1e-13, atol=1e-14)


def test_the_sampled_true_fisher_converges_to_the_closed_form_and_is_not_the_empirical_one():
    obs = _observations(20000, seed=3)
    layer = _linear(OBS_DIM, ACTION_DIM, 0)
    std = torch.tensor(LOG_STD, dtype=DTYPE).exp()
    with record_layers([layer]) as records:
        mean = layer(obs)
    policy = Normal(mean, std)
    sampled = output_factors(sampled_log_likelihood(policy, torch.Generator().manual_seed(4)), [records[layer]])[0]
    closed = gaussian_mean_layer_factor(std)
    assert _relative_error(sampled, closed) < 0.05
    again = output_factors(sampled_log_likelihood(policy, torch.Generator().manual_seed(4)), [records[layer]])[0]
    assert torch.equal(sampled, again)
    rollout_actions = mean.detach() + 3.0 * std  # the rollout's actions, far from the policy's: the empirical Fisher
    empirical = output_factors(policy.log_prob(rollout_actions).sum(), [records[layer]])[0]
    assert _relative_error(empirical, closed) > 1.0 and _relative_error(sampled, empirical) > 0.5


def test_the_sampled_fisher_of_a_deeper_gaussian_policy_converges_to_the_expected_one_at_every_layer():
    """Sampling and the square-root closed form agree at a hidden layer too, where ``G`` is not ``Sigma^-1``."""
    obs = _observations(20000, seed=18)
    network = nn.Sequential(_linear(OBS_DIM, HIDDEN, 19), nn.Tanh(), _linear(HIDDEN, ACTION_DIM, 20))
    layers = [network[0], network[2]]
    std = torch.tensor(LOG_STD, dtype=DTYPE).exp()
    with record_layers(layers) as records:
        mean = network(obs)
    chosen = [records[layer] for layer in layers]
    expected = expected_output_factors([mean], [std.pow(-2).expand_as(mean)], chosen)
    sampled = output_factors(sampled_log_likelihood(Normal(mean, std), torch.Generator().manual_seed(21)), chosen)
    for sampled_factor, expected_factor in zip(sampled, expected, strict=True):
        assert _relative_error(sampled_factor, expected_factor) < 0.05


@pytest.mark.parametrize("kind", ["categorical", "bernoulli"])
def test_the_sampled_fisher_of_discrete_policies_converges_to_the_expected_one(kind):
    """The square-root closed form (log-probabilities, weight ``p``) and sampling agree beyond the Gaussian too."""
    obs = _observations(20000, seed=5)
    layer = _linear(OBS_DIM, ACTION_DIM, 6)
    with record_layers([layer]) as records:
        logits = 2.0 * layer(obs)
    if kind == "categorical":
        policy = Categorical(logits=logits)
        statistics = [torch.log_softmax(logits, dim=-1)]
        weights = [policy.probs]
    else:
        policy = Bernoulli(logits=logits)
        statistics = [logits]
        weights = [policy.probs * (1.0 - policy.probs)]
    expected = expected_output_factors(statistics, weights, [records[layer]])[0]
    sampled = output_factors(sampled_log_likelihood(policy, torch.Generator().manual_seed(7)), [records[layer]])[0]
    assert _relative_error(sampled, expected) < 0.05


def test_the_damped_inverse_is_a_dense_solve_with_the_pi_corrected_damped_kronecker_product():
    generator = torch.Generator().manual_seed(8)
    in_ext, out, damping = OBS_DIM + 1, ACTION_DIM, 1e-2
    a, g = _random_spd(in_ext, 30.0, generator), _random_spd(out, 0.01, generator)  # unequal scales: pi far from 1
    pi = math.sqrt((float(torch.trace(a)) / in_ext) / (float(torch.trace(g)) / out))
    # portable: float64 (DTYPE): closed forms against a few products and sums
    assert pi_correction(a, g) == pytest.approx(pi, rel=1e-14) and pi > 10.0
    a_damped = a + pi * math.sqrt(damping) * torch.eye(in_ext, dtype=DTYPE)
    g_damped = g + math.sqrt(damping) / pi * torch.eye(out, dtype=DTYPE)
    for actual, expected in zip(damped_factors(a, g, damping), (a_damped, g_damped), strict=True):
        # portable: float64 (DTYPE): closed forms against a few products and sums
        assert torch.allclose(actual, expected, rtol=1e-14, atol=0.0)
    matrix = torch.randn(out, in_ext, generator=generator, dtype=DTYPE)
    dense = torch.linalg.solve(torch.kron(g_damped, a_damped), matrix.reshape(-1)).reshape(out, in_ext)
    assert _relative_error(damped_inverse(a, g, damping)(matrix), dense) < 1e-10

    layer = _linear(OBS_DIM, ACTION_DIM, 0)
    factors = KroneckerFactors()
    factors.update(a, g, decay=DECAY)
    direction = kfac_inverse([factors], [layer], damping)(_flat(matrix))
    assert _relative_error(direction, _flat(dense)) < 1e-10


#: Headroom over ``n * eps * condition`` for the constant factors of a backward-stable symmetric eigensolver's error.
EIGENSOLVER_SAFETY = 10.0


def test_eigenbasis_damping_is_the_dense_inverse_of_the_kronecker_product_plus_damping():
    """``(kron(G, A) + damping I)^-1 vec(V)`` computed densely in float64, against the eigenbasis map: the error bound
    is the dense system's condition number times its size times float64's epsilon (the eigensolver is backward
    stable), and a float32 ``V`` adds float32's rounding of the result."""
    generator = torch.Generator().manual_seed(9)
    in_ext, out, damping = OBS_DIM + 1, ACTION_DIM, 1e-2
    a, g = _random_spd(in_ext, 30.0, generator), _random_spd(out, 0.01, generator)  # unequal scales, as before
    dense_matrix = torch.kron(g, a) + damping * torch.eye(in_ext * out, dtype=DTYPE)
    eigenvalues = torch.linalg.eigvalsh(dense_matrix)
    condition = float(eigenvalues.max() / eigenvalues.min())
    tolerance = EIGENSOLVER_SAFETY * dense_matrix.shape[0] * torch.finfo(DTYPE).eps * condition
    assert tolerance < 1e-10, "the reference problem must be well enough conditioned to separate the two modes"
    matrix = torch.randn(out, in_ext, generator=generator, dtype=DTYPE)
    dense = torch.linalg.solve(dense_matrix, matrix.reshape(-1)).reshape(out, in_ext)
    assert _relative_error(damped_inverse(a, g, damping, EIGENBASIS_DAMPING)(matrix), dense) < tolerance

    single = matrix.to(torch.float32)
    dense_single = torch.linalg.solve(dense_matrix, single.to(DTYPE).reshape(-1)).reshape(out, in_ext)
    result = damped_inverse(a, g, damping, EIGENBASIS_DAMPING)(single)
    assert result.dtype == torch.float32
    assert _relative_error(result.to(DTYPE), dense_single) < tolerance + torch.finfo(torch.float32).eps

    layer = _linear(OBS_DIM, ACTION_DIM, 0)
    factors = KroneckerFactors()
    factors.update(a, g, decay=DECAY)
    direction = kfac_inverse([factors], [layer], damping, EIGENBASIS_DAMPING)(_flat(matrix))
    assert _relative_error(direction, _flat(dense)) < tolerance
    factored = damped_inverse(a, g, damping, FACTORED_DAMPING)(matrix)
    assert _relative_error(factored, dense) > 1e3 * tolerance, "the factored damping is another matrix"
    with pytest.raises(ValueError, match="damping mode"):
        damped_inverse(a, g, damping, "exact")


def _flat(matrix: torch.Tensor) -> torch.Tensor:
    """``[W | b]`` to the parameters' order ``[vec(W), b]``, written out independently of the module."""
    return torch.cat([matrix[:, :OBS_DIM].reshape(-1), matrix[:, OBS_DIM]])


def test_factors_are_exponential_moving_averages_set_outright_by_the_first_update():
    generator = torch.Generator().manual_seed(9)
    inputs = [_random_spd(OBS_DIM + 1, 1.0, generator) for _ in range(5)]
    outputs = [_random_spd(ACTION_DIM, 1.0, generator) for _ in range(5)]
    factors = KroneckerFactors()
    for input_, output in zip(inputs, outputs, strict=True):
        factors.update(input_, output, decay=DECAY)
    count = len(inputs)
    weights = [DECAY ** (count - 1)] + [(1.0 - DECAY) * DECAY ** (count - 1 - k) for k in range(1, count)]
    assert sum(weights) == pytest.approx(1.0)
    expected_a = sum(weight * input_ for weight, input_ in zip(weights, inputs, strict=True))
    expected_g = sum(weight * output for weight, output in zip(weights, outputs, strict=True))
    actual_a, actual_g = factors.factors()
    assert factors.updates == count
    # portable: float64 (DTYPE): closed forms against a few products and sums
    assert torch.allclose(actual_a, expected_a, rtol=1e-13, atol=0.0)
    # portable: float64 (DTYPE): closed forms against a few products and sums
    assert torch.allclose(actual_g, expected_g, rtol=1e-13, atol=0.0)
    with pytest.raises(ValueError, match="decay"):
        factors.update(inputs[0], outputs[0], decay=1.0)
    with pytest.raises(RuntimeError):
        KroneckerFactors().factors()


def test_the_input_factor_has_a_bias_column_of_ones():
    obs = _observations(50, seed=10)
    a = input_factor(_linear(OBS_DIM, ACTION_DIM, 0), obs)
    assert a.shape == (OBS_DIM + 1, OBS_DIM + 1)
    # portable: float64 (DTYPE): closed forms against a few products and sums
    assert float(a[-1, -1]) == pytest.approx(1.0, rel=1e-15)
    # portable: float64 (DTYPE): closed forms against a few products and sums
    assert torch.allclose(a[:-1, -1], obs.mean(dim=0), rtol=1e-13, atol=0.0)
    # portable: float64 (DTYPE): closed forms against a few products and sums
    assert torch.allclose(a[-1, :-1], obs.mean(dim=0), rtol=1e-13, atol=0.0)
    # portable: float64 (DTYPE): closed forms against a few products and sums
    assert torch.allclose(a[:-1, :-1], obs.T @ obs / len(obs), rtol=1e-13, atol=0.0)
    assert input_factor(_linear(OBS_DIM, ACTION_DIM, 0, bias=False), obs).shape == (OBS_DIM, OBS_DIM)


def test_the_log_std_block_is_the_hessian_of_the_mean_kl():
    obs = _observations(32, seed=11)
    layer = _linear(OBS_DIM, ACTION_DIM, 0)
    log_std = nn.Parameter(torch.tensor(LOG_STD, dtype=DTYPE))
    mean = layer(obs)
    old = Normal(mean.detach(), log_std.detach().exp())
    kl = kl_divergence(old, Normal(mean, log_std.exp())).sum(-1).mean()
    product = fisher_vector_product(kl, [log_std], damping=0.0)
    hessian = torch.stack([product(column) for column in torch.eye(ACTION_DIM, dtype=DTYPE)], dim=1)
    # portable: float64 (DTYPE): closed forms against a few products and sums
    assert torch.allclose(gaussian_log_std_fisher(log_std), hessian, rtol=1e-12, atol=1e-14)


def test_recording_removes_its_hooks_and_refuses_unsupported_layers():
    layer = _linear(OBS_DIM, ACTION_DIM, 0)
    obs = _observations(8, seed=12)
    with record_layers([layer]) as records:
        layer(obs)
    assert torch.equal(records[layer].inputs, obs) and records[layer].outputs.requires_grad
    records.clear()
    layer(obs)
    assert not records
    with pytest.raises(TypeError, match="Conv1d"), record_layers([nn.Conv1d(1, 1, 1)]):
        pass
    with pytest.raises(TypeError, match="groups=1"), record_layers([nn.Conv2d(2, 2, 1, groups=2)]):
        pass


def test_the_direction_inverts_the_product_layer_by_layer_and_a_zero_factor_leaves_pi_neutral():
    """Over two layers (with and without a bias), a vanishing damping makes the direction the product's inverse."""
    network = nn.Sequential(_linear(OBS_DIM, HIDDEN, 13), nn.Tanh(), _linear(HIDDEN, ACTION_DIM, 14, bias=False))
    layers, factors, _, _ = _gaussian_kfac_and_fisher(network, _observations(256, seed=15))
    size = sum(param.numel() for param in layer_parameters(layers))
    vector = torch.randn(size, generator=torch.Generator().manual_seed(16), dtype=DTYPE)
    direction = kfac_inverse(factors, layers, damping=1e-24)(vector)
    assert _relative_error(kfac_fisher_product(factors, layers, direction), vector) < 1e-8
    a = _random_spd(OBS_DIM, 1.0, torch.Generator().manual_seed(17))
    assert pi_correction(a, torch.zeros(ACTION_DIM, ACTION_DIM, dtype=DTYPE)) == 1.0
    with pytest.raises(ValueError, match="flat vector"):
        kfac_inverse(factors, layers, damping=1e-3)(vector[:-1])


def test_sampling_needs_a_known_distribution():
    with pytest.raises(TypeError, match="Gamma"):
        sampled_log_likelihood(torch.distributions.Gamma(torch.ones(3), torch.ones(3)), torch.Generator())
