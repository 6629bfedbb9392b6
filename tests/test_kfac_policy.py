"""K-FAC for an SB3 policy's actor (``sb3_npg/common/kfac_policy.py``): coverage, exactness, the damped inverse, gSDE."""

from types import SimpleNamespace

import pytest
import torch
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor, FlattenExtractor
from torch import nn

from sb3_npg import NPG
from sb3_npg.common.distributions import detached_distribution, mean_kl
from sb3_npg.common.fisher import analytic_fisher_product
from sb3_npg.common.kfac import KroneckerFactors, damped_factors
from sb3_npg.common.kfac_layers import record_layers
from sb3_npg.common.kfac_policy import (
    GAUSSIAN_LOG_STD,
    GSDE_LOG_STD,
    IDENTITY,
    KfacCurvature,
    batch_curvature,
    build_kfac_plan,
    kfac_natural_direction,
    kfac_product,
    to_actor_order,
    to_plan_order,
    true_fisher_output_factors,
)
from sb3_npg.common.natural_gradient import fisher_vector_product
from sb3_npg.common.policy_parameters import split_actor_critic_parameters

DTYPE = torch.float64
OBS_DIM = 3
OBSERVATIONS = spaces.Box(-5.0, 5.0, (OBS_DIM,))
BOX = spaces.Box(-1.0, 1.0, (2,))
DECAY = 0.5
DAMPING = 0.1


class Float64Flatten(FlattenExtractor):
    """SB3 preprocesses Box observations to float32: cast the features back up, so the whole actor runs in float64."""

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return super().forward(observations).to(DTYPE)


class LinearExtractor(BaseFeaturesExtractor):
    """A features extractor with a Linear layer of its own (part of the actor when shared or when it is the actor's)."""

    def __init__(self, observation_space: spaces.Box, features_dim: int = 5):
        super().__init__(observation_space, features_dim)
        self.net = nn.Sequential(nn.Linear(OBS_DIM, features_dim), nn.Tanh())

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.net(observations.to(self.net[0].weight.dtype))


class ScaledExtractor(LinearExtractor):
    """An extractor with a free parameter in no Linear layer: K-FAC has no block for it."""

    def __init__(self, observation_space: spaces.Box, features_dim: int = 5):
        super().__init__(observation_space, features_dim)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, OBS_DIM))

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return super().forward(observations * self.scale)


def _policy(action_space: spaces.Space, dtype: torch.dtype = DTYPE, **kwargs) -> ActorCriticPolicy:
    torch.manual_seed(0)
    kwargs.setdefault("features_extractor_class", Float64Flatten)
    policy = ActorCriticPolicy(OBSERVATIONS, action_space, lambda _: 1e-3, **kwargs).to(dtype)
    if hasattr(policy, "log_std"):
        with torch.no_grad():  # not all equal: a wrong pairing of standard deviations and dimensions shows
            policy.log_std.copy_(torch.linspace(-0.6, 0.4, policy.log_std.numel()).reshape(policy.log_std.shape))
    return policy


def _observations(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (0.5 + torch.randn(n, OBS_DIM, generator=generator)).float()  # not centred: the bias column matters


def _curvature(policy: ActorCriticPolicy, observations: torch.Tensor, sampled: bool = False, **plan_kwargs):
    actor, _ = split_actor_critic_parameters(policy)
    plan = build_kfac_plan(policy, actor, **plan_kwargs)
    curvature = KfacCurvature.for_plan(plan)
    curvature.update(batch_curvature(plan, policy, observations, torch.Generator().manual_seed(7), sampled), DECAY)
    return actor, plan, curvature


def _exact_fisher(policy: ActorCriticPolicy, actor, observations: torch.Tensor):
    """The algorithm's own Fisher-vector product: the Hessian of the mean KL at the base point, undamped."""
    distribution = policy.get_distribution(observations)
    return fisher_vector_product(mean_kl(detached_distribution(distribution), distribution), actor, damping=0.0)


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float(torch.linalg.norm(actual - expected) / torch.linalg.norm(expected))


def _mask(actor, chosen) -> torch.Tensor:
    """A 0/1 vector in the actor parameters' order, 1 on the parameters in ``chosen``."""
    ids = {id(param) for param in chosen}
    return torch.cat([torch.full((param.numel(),), float(id(param) in ids), dtype=DTYPE) for param in actor])


def _dense(product, size: int) -> torch.Tensor:
    return torch.stack([product(column) for column in torch.eye(size, dtype=DTYPE)], dim=1)


COVERAGE = {
    "box": (BOX, {"net_arch": [8]}, [GAUSSIAN_LOG_STD]),
    "discrete": (spaces.Discrete(3), {"net_arch": [8]}, []),
    "gsde": (BOX, {"net_arch": [8], "use_sde": True}, [GSDE_LOG_STD]),
    "multi_discrete": (spaces.MultiDiscrete([2, 3]), {"net_arch": [8]}, []),
    "multi_binary": (spaces.MultiBinary(3), {"net_arch": [8]}, []),
    "deeper_pi": (BOX, {"net_arch": {"pi": [8, 6], "vf": [4]}}, [GAUSSIAN_LOG_STD]),
    "shared_extractor": (BOX, {"net_arch": [8], "features_extractor_class": LinearExtractor}, [GAUSSIAN_LOG_STD]),
    "separate_extractor": (
        spaces.Discrete(3),
        {"net_arch": [8], "features_extractor_class": LinearExtractor, "share_features_extractor": False},
        [],
    ),
}


@pytest.mark.parametrize("case", sorted(COVERAGE))
def test_every_actor_parameter_is_in_exactly_one_block(case):
    action_space, kwargs, block_kinds = COVERAGE[case]
    policy = _policy(action_space, **kwargs)
    actor, plan, curvature = _curvature(policy, _observations(32, seed=0))
    expected_layers = [*policy.pi_features_extractor.modules(), *policy.mlp_extractor.policy_net, policy.action_net]
    assert set(plan.layers) == {module for module in expected_layers if isinstance(module, nn.Linear)}
    assert [block.kind for block in plan.blocks] == block_kinds
    planned = [param for layer in plan.layers for param in layer.parameters()] + [block.parameter for block in plan.blocks]
    assert sorted(map(id, planned)) == sorted(map(id, actor))
    size = sum(param.numel() for param in actor)
    assert torch.equal(torch.sort(plan.order).values, torch.arange(size))
    vector = torch.randn(size, generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    assert torch.equal(to_actor_order(plan, to_plan_order(plan, vector)), vector)
    for result in (kfac_product(plan, curvature, vector), kfac_natural_direction(plan, curvature, vector, DAMPING)):
        assert result.shape == vector.shape and torch.isfinite(result).all()


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_the_plan_covers_the_algorithms_actor_parameters(env_id):
    model = NPG("MlpPolicy", env_id, n_steps=64, batch_size=32, policy_kwargs={"net_arch": [8]}, device="cpu", seed=0)
    plan = build_kfac_plan(model.policy, model.actor_parameters)
    assert plan.order.numel() == sum(param.numel() for param in model.actor_parameters)
    assert {id(layer) for layer in plan.layers} == {id(model.policy.mlp_extractor.policy_net[0]), id(model.policy.action_net)}
    assert [block.kind for block in plan.blocks] == ([GAUSSIAN_LOG_STD] if env_id == "Pendulum-v1" else [])


def test_a_parameter_in_no_block_is_refused_or_preconditioned_by_the_identity():
    policy = _policy(BOX, net_arch=[8], features_extractor_class=ScaledExtractor)
    actor, _ = split_actor_critic_parameters(policy)
    with pytest.raises(ValueError, match="identity_fallback"):
        build_kfac_plan(policy, actor)
    actor, plan, curvature = _curvature(policy, _observations(32, seed=0), identity_fallback=True)
    assert [block.kind for block in plan.blocks] == [GAUSSIAN_LOG_STD, IDENTITY]
    assert plan.blocks[1].parameter is policy.features_extractor.scale
    gradient = torch.randn(plan.order.numel(), generator=torch.Generator().manual_seed(2), dtype=DTYPE)
    mask = _mask(actor, [policy.features_extractor.scale]).bool()
    direction = kfac_natural_direction(plan, curvature, gradient, DAMPING)
    # portable: float64 policy (DTYPE): a few products and sums
    assert torch.allclose(direction[mask], gradient[mask] / (1.0 + DAMPING), rtol=1e-12, atol=0.0)


def test_kfac_is_the_exact_fisher_of_a_linear_gaussian_actor_and_not_of_a_deeper_one():
    """``net_arch=[]``: the mean is ``action_net`` on the observations, the std state-independent: F = kron(Sigma^-1, A)."""
    observations = _observations(64, seed=3)
    policy = _policy(BOX, net_arch=[])
    assert len(policy.mlp_extractor.policy_net) == 0 and policy.action_net.in_features == OBS_DIM
    actor, plan, curvature = _curvature(policy, observations)
    exact = _exact_fisher(policy, actor, observations)
    analytic = analytic_fisher_product(policy.get_distribution(observations), actor, damping=0.0)
    for vector in torch.randn(4, plan.order.numel(), generator=torch.Generator().manual_seed(4), dtype=DTYPE):
        product = kfac_product(plan, curvature, vector)
        assert _relative_error(product, exact(vector)) < 1e-10
        assert _relative_error(product, analytic(vector)) < 1e-10

    policy = _policy(BOX, net_arch=[16])
    actor, plan, curvature = _curvature(policy, observations)
    exact = _exact_fisher(policy, actor, observations)
    # SB3 initialises action_net with gain 0.01: the hidden layer's block is small beside log_std's, so compare it alone
    # (its own block, not the cross terms K-FAC drops): the Kronecker factorisation itself is approximate there
    hidden = _mask(actor, list(policy.mlp_extractor.policy_net.parameters()))
    vectors = hidden * torch.randn(4, plan.order.numel(), generator=torch.Generator().manual_seed(5), dtype=DTYPE)
    errors = [_relative_error(hidden * kfac_product(plan, curvature, vector), hidden * exact(vector)) for vector in vectors]
    assert min(errors) > 0.01


@pytest.mark.parametrize("use_sde", [False, True])
def test_the_output_layer_and_log_std_blocks_stay_exact_under_a_hidden_layer(use_sde):
    """With a state-independent std (or gSDE's, whose latent is detached), ``action_net``'s block is ``kron(Sigma^-1, A)``
    and the ``log_std`` block exact, whatever lies below: the K-FAC product restricted to them is the Fisher's."""
    observations = _observations(64, seed=6)
    policy = _policy(BOX, net_arch=[8, 6], use_sde=use_sde)
    actor, plan, curvature = _curvature(policy, observations)
    exact = _exact_fisher(policy, actor, observations)
    chosen = [policy.action_net.weight, policy.action_net.bias] if not use_sde else []
    mask = _mask(actor, [*chosen, policy.log_std])
    for vector in torch.randn(3, plan.order.numel(), generator=torch.Generator().manual_seed(8), dtype=DTYPE):
        vector = vector * mask
        assert _relative_error(kfac_product(plan, curvature, vector) * mask, exact(vector) * mask) < 1e-10


@pytest.mark.parametrize("full_std", [True, False])
@pytest.mark.parametrize("use_expln", [False, True])
def test_the_gsde_log_std_block_is_the_hessian_of_the_mean_kl(full_std, use_expln):
    observations = _observations(48, seed=9)
    policy = _policy(BOX, net_arch=[8], use_sde=True, full_std=full_std, use_expln=use_expln)
    with torch.no_grad():  # both sides of expln's threshold
        policy.log_std.copy_(torch.linspace(-1.0, 0.8, policy.log_std.numel()).reshape(policy.log_std.shape))
    _, _, curvature = _curvature(policy, observations)
    (block,) = curvature.blocks()
    hessian = _dense(_exact_fisher(policy, [policy.log_std], observations), policy.log_std.numel())
    # portable: float64 policy (DTYPE): a few products and sums
    assert torch.allclose(block, hessian, rtol=1e-10, atol=1e-12 * float(hessian.abs().max()))


@pytest.mark.parametrize("use_sde", [False, True])
def test_the_direction_is_the_dense_solve_with_the_damped_factors(use_sde):
    """Exactly true: the direction solves ``kron(G_d, A_d)`` (pi-split damping) per layer and ``B + damping I`` per block."""
    observations = _observations(32, seed=10)
    policy = _policy(BOX, net_arch=[8], use_sde=use_sde)
    _, plan, curvature = _curvature(policy, observations)
    damped = KfacCurvature([KroneckerFactors() for _ in plan.layers], [])
    for running, base in zip(damped.layer_factors, curvature.layer_factors, strict=True):
        running.update(*damped_factors(*base.factors(), DAMPING), decay=DECAY)
    size = plan.order.numel()
    damped.block_fishers = [block + DAMPING * torch.eye(block.shape[0], dtype=DTYPE) for block in curvature.blocks()]
    dense = _dense(lambda vector: kfac_product(plan, damped, vector), size)
    gradient = torch.randn(size, generator=torch.Generator().manual_seed(11), dtype=DTYPE)
    direction = kfac_natural_direction(plan, curvature, gradient, DAMPING)
    assert _relative_error(direction, torch.linalg.solve(dense, gradient)) < 1e-10
    undamped_plus = _dense(lambda vector: kfac_product(plan, curvature, vector) + DAMPING * vector, size)
    assert _relative_error(direction, torch.linalg.solve(undamped_plus, gradient)) > 1e-6  # the pi-split is not + damping I


SAMPLED = {
    "discrete": (spaces.Discrete(3), {}),
    "multi_discrete": (spaces.MultiDiscrete([2, 3]), {}),
    "multi_binary": (spaces.MultiBinary(3), {}),
    "box": (BOX, {}),
    "squashed_gsde": (BOX, {"use_sde": True, "squash_output": True}),
}


@pytest.mark.parametrize("case", sorted(SAMPLED))
def test_the_sampled_true_fisher_approaches_the_closed_form(case):
    action_space, kwargs = SAMPLED[case]
    policy = _policy(action_space, net_arch=[8], **kwargs)
    observations = _observations(20000, seed=12)
    _, _, closed = _curvature(policy, observations)
    _, _, sampled = _curvature(policy, observations, sampled=True)
    for exact, estimate in zip(closed.layer_factors, sampled.layer_factors, strict=True):
        assert torch.equal(exact.factors()[0], estimate.factors()[0])
        assert _relative_error(estimate.factors()[1], exact.factors()[1]) < 0.08  # measured: at most 0.04


def test_a_distribution_without_a_closed_form_is_sampled():
    """A distribution ``fisher.py`` does not know (here a stand-in holding a torch Normal) falls back to sampling."""
    policy = _policy(BOX, net_arch=[8])
    _, plan, _ = _curvature(policy, _observations(4, seed=0))
    with record_layers(plan.layers) as records:
        distribution = policy.get_distribution(_observations(64, seed=16))
    layer_records = [records[layer] for layer in plan.layers]
    unknown = SimpleNamespace(distribution=distribution.distribution)
    fallback = true_fisher_output_factors(unknown, layer_records, torch.Generator().manual_seed(3))
    forced = true_fisher_output_factors(distribution, layer_records, torch.Generator().manual_seed(3), sampled=True)
    closed = true_fisher_output_factors(distribution, layer_records, torch.Generator().manual_seed(3))
    assert all(torch.equal(one, two) for one, two in zip(fallback, forced, strict=True))
    assert not torch.allclose(fallback[-1], closed[-1])
    with pytest.raises(TypeError, match="No torch distribution"):
        true_fisher_output_factors(SimpleNamespace(), layer_records, torch.Generator())


def test_the_sampled_fisher_is_reproducible_with_the_generator():
    policy = _policy(spaces.Discrete(3), net_arch=[8])
    observations = _observations(64, seed=13)
    _, _, first = _curvature(policy, observations, sampled=True)
    _, _, second = _curvature(policy, observations, sampled=True)
    for one, two in zip(first.layer_factors, second.layer_factors, strict=True):
        assert torch.equal(one.factors()[1], two.factors()[1])


def test_running_averages_and_arguments_are_checked():
    policy = _policy(BOX, net_arch=[8], use_sde=True)
    actor, plan, curvature = _curvature(policy, _observations(16, seed=14))
    second = batch_curvature(plan, policy, _observations(16, seed=15), torch.Generator().manual_seed(0))
    (first_block,) = curvature.blocks()
    curvature.update(second, DECAY)
    assert torch.allclose(curvature.blocks()[0], DECAY * first_block + (1 - DECAY) * second.block_fishers[0])
    assert curvature.layer_factors[0].updates == 2
    with pytest.raises(RuntimeError, match="not been updated"):
        KfacCurvature.for_plan(plan).blocks()
    with pytest.raises(ValueError, match="damping must be positive"):
        kfac_natural_direction(plan, curvature, torch.zeros(plan.order.numel(), dtype=DTYPE), 0.0)
    with pytest.raises(ValueError, match="values but the actor parameters hold"):
        kfac_product(plan, curvature, torch.zeros(3, dtype=DTYPE))
    with pytest.raises(ValueError, match="more than once"):
        build_kfac_plan(policy, [*actor, actor[0]])


#: A decay that is not 1/2: a running average that swapped the past's weight and the new batch's would show.
ASYMMETRIC_DECAY = 0.75


def test_the_running_average_of_an_exact_block_weighs_the_past_by_the_decay():
    """``KfacCurvature.update`` averages each exact block as ``decay * past + (1 - decay) * new``, as the factors."""
    policy = _policy(BOX, net_arch=[8], use_sde=True)  # gSDE's log_std block depends on the batch
    _, plan, curvature = _curvature(policy, _observations(16, seed=14))
    (first_block,) = curvature.blocks()
    first_factors = [factor.clone() for factor in curvature.layer_factors[0].factors()]
    second = batch_curvature(plan, policy, _observations(16, seed=15), torch.Generator().manual_seed(0))
    assert _relative_error(second.block_fishers[0], first_block) > 0.01  # the two batches' blocks differ
    curvature.update(second, ASYMMETRIC_DECAY)
    expected = ASYMMETRIC_DECAY * first_block + (1 - ASYMMETRIC_DECAY) * second.block_fishers[0]
    # portable: float64 policy (DTYPE): a few products and sums
    torch.testing.assert_close(curvature.blocks()[0], expected, rtol=1e-12, atol=0.0)  # float64, two products and a sum
    for running, first, new in zip(curvature.layer_factors[0].factors(), first_factors, second.layer_factors[0], strict=True):
        expected_factor = ASYMMETRIC_DECAY * first + (1 - ASYMMETRIC_DECAY) * new.to(first.dtype)
        # portable: float64 policy (DTYPE): a few products and sums
        torch.testing.assert_close(running, expected_factor, rtol=1e-12, atol=1e-15)
