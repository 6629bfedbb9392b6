"""K-FAC for the actor of a Stable-Baselines3 ``ActorCriticPolicy``: the adapter between a policy and :mod:`.kfac`.

ACKTR's solver and the K-FAC options of NPG and TRPO (``fisher_solver``) call it.

**The plan** (:func:`build_kfac_plan`) splits the actor parameters (``split_actor_critic_parameters(policy)[0]``, whose
order is the order of every flat vector the algorithm uses) into blocks, each parameter exactly once:

- the ``nn.Linear`` and ``nn.Conv2d`` layers whose weight and bias are all actor parameters (the actor's features
  extractor, ``NatureCNN``'s convolutions included, the ``mlp_extractor``'s policy network, ``action_net``), each a
  Kronecker-factored block ``kron(G, A)`` (:mod:`.kfac_layers`);
- a DiagGaussian's state-independent ``log_std``: its exact block ``2 I``;
- gSDE's ``log_std``: its exact block, derived in closed form (:func:`gsde_log_std_fisher`);
- anything else (a free parameter of a custom extractor, a grouped convolution): a ``ValueError`` naming it, unless
  ``identity_fallback=True`` gives it an identity block, that is the plain gradient (divided by ``1 + damping``).

Inside, vectors are permuted to the plan's order (the layers' parameters as :func:`.kfac.layer_parameters` orders them,
then each exact block's); every function here takes and returns flat vectors in the actor parameters' order.

**The curvature** of a batch (:func:`batch_curvature`) is the **true** Fisher's: ``G`` is the expectation over the
policy's own actions, in closed form where :mod:`.fisher` knows the distribution (Gaussian and gSDE, squashed or not:
mean and standard deviation, weights ``1 / sigma^2`` and ``2 / sigma^2``; Categorical and MultiCategorical:
log-probabilities, weights ``p``; Bernoulli: logits, weights ``p (1 - p)``), else (or when asked) estimated from one
action per sample drawn from the distribution with a ``torch.Generator``. :class:`KfacCurvature` keeps the running
averages of the factors and of the exact blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from stable_baselines3.common.distributions import DiagGaussianDistribution, Distribution, StateDependentNoiseDistribution
from stable_baselines3.common.policies import ActorCriticPolicy
from torch import nn

from sb3_npg.common.batches import PolicyInputs
from sb3_npg.common.distributions import policy_distribution
from sb3_npg.common.fisher import distribution_statistics, fisher_weights
from sb3_npg.common.kfac import (
    FACTORED_DAMPING,
    INVERSION_DTYPE,
    KroneckerFactors,
    expected_output_factors,
    gaussian_log_std_fisher,
    kfac_inverse,
    kfac_fisher_product,
    output_factors,
    sampled_log_likelihood,
)
from sb3_npg.common.kfac_layers import SUPPORTED_LAYERS, LayerRecord, input_factor, layer_parameters, record_layers

#: The exact block of a DiagGaussian's state-independent ``log_std`` (``GAUSSIAN_LOG_STD_FISHER * I``).
GAUSSIAN_LOG_STD = "gaussian_log_std"
#: The exact block of gSDE's ``log_std`` (:func:`gsde_log_std_fisher`).
GSDE_LOG_STD = "gsde_log_std"
#: The fallback block of a parameter in no supported layer: the identity, so its direction is the plain gradient.
IDENTITY = "identity"
#: The Fisher information of a Normal in its variance ``v`` is ``VARIANCE_FISHER_FACTOR / v^2``.
VARIANCE_FISHER_FACTOR = 0.5


@dataclass(frozen=True)
class ExactBlock:
    """
    A parameter outside the Kronecker-factored layers, with a dense block of its own.

    :param parameter: the parameter
    :param kind: ``GAUSSIAN_LOG_STD``, ``GSDE_LOG_STD`` or ``IDENTITY``
    """

    parameter: nn.Parameter
    kind: str


@dataclass(frozen=True)
class KfacPlan:
    """
    The blocks of the actor's K-FAC Fisher, and the permutation from the actor parameters' order to the plan's.

    :param layers: the Kronecker-factored layers, in the order their weights appear among the actor parameters
    :param blocks: the parameters with dense blocks
    :param order: ``plan_vector = actor_vector[order]``: the layers' parameters (weight then bias, layer by layer),
        then each block's parameter
    """

    layers: tuple[nn.Module, ...]
    blocks: tuple[ExactBlock, ...]
    order: torch.Tensor

    @property
    def layer_size(self) -> int:
        """How many values the layers hold (the first part of a vector in the plan's order)."""
        return sum(param.numel() for param in layer_parameters(self.layers))


def _actor_layers(policy: ActorCriticPolicy, positions: dict[int, int]) -> tuple[nn.Module, ...]:
    """The ``nn.Linear`` layers of ``policy`` whose every parameter is an actor parameter, by their weight's position."""
    layers = [
        module
        for module in policy.modules()
        if isinstance(module, SUPPORTED_LAYERS) and all(id(param) in positions for param in layer_parameters([module]))
    ]
    return tuple(sorted(layers, key=lambda layer: positions[id(layer.weight)]))


def _exact_block(policy: ActorCriticPolicy, parameter: nn.Parameter, identity_fallback: bool) -> ExactBlock:
    """The dense block of an actor parameter in no supported layer (see the module doc)."""
    if parameter is getattr(policy, "log_std", None):
        if isinstance(policy.action_dist, StateDependentNoiseDistribution):
            return ExactBlock(parameter, GSDE_LOG_STD)
        if isinstance(policy.action_dist, DiagGaussianDistribution):
            return ExactBlock(parameter, GAUSSIAN_LOG_STD)
    if identity_fallback:
        return ExactBlock(parameter, IDENTITY)
    names = [name for name, param in policy.named_parameters() if param is parameter]
    raise ValueError(
        f"K-FAC has no block for the actor parameter {names or list(parameter.shape)}: it belongs to no nn.Linear layer "
        "and is not a Gaussian's or gSDE's log_std (pass identity_fallback=True to precondition it by the identity)"
    )


def build_kfac_plan(
    policy: ActorCriticPolicy, actor_params: Sequence[nn.Parameter], identity_fallback: bool = False
) -> KfacPlan:
    """
    The K-FAC blocks of a policy's actor (see the module doc), each actor parameter in exactly one.

    :param policy: the policy
    :param actor_params: its actor parameters, in the order of the flat vectors (``split_actor_critic_parameters``)
    :param identity_fallback: give a parameter in no supported layer and no exact block an identity block, instead of
        refusing it
    :return: the plan
    :raises ValueError: for a parameter listed twice, or one without a block (unless ``identity_fallback``)
    """
    positions = {id(param): index for index, param in enumerate(actor_params)}
    if len(positions) != len(actor_params):
        raise ValueError("An actor parameter is listed more than once")
    layers = _actor_layers(policy, positions)
    in_layers = {id(param) for param in layer_parameters(layers)}
    blocks = tuple(_exact_block(policy, param, identity_fallback) for param in actor_params if id(param) not in in_layers)
    offsets, start = {}, 0
    for param in actor_params:
        offsets[id(param)] = start
        start += param.numel()
    device = actor_params[0].device if actor_params else None
    plan_params = [*layer_parameters(layers), *(block.parameter for block in blocks)]
    ranges = [torch.arange(offsets[id(p)], offsets[id(p)] + p.numel(), device=device) for p in plan_params]
    order = torch.cat(ranges) if ranges else torch.zeros(0, dtype=torch.long, device=device)
    if not torch.equal(torch.sort(order).values, torch.arange(start, device=device)):
        raise ValueError("The K-FAC blocks do not cover every actor parameter exactly once")
    return KfacPlan(layers, blocks, order)


def to_plan_order(plan: KfacPlan, vector: torch.Tensor) -> torch.Tensor:
    """
    A flat vector in the actor parameters' order, permuted to the plan's.

    :param plan: the plan
    :param vector: the vector
    :return: ``vector[plan.order]``
    :raises ValueError: when its length is not the actor parameters'
    """
    if vector.numel() != plan.order.numel():
        raise ValueError(f"The flat vector has {vector.numel()} values but the actor parameters hold {plan.order.numel()}")
    return vector[plan.order.to(vector.device)]


def to_actor_order(plan: KfacPlan, vector: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`to_plan_order`: a vector in the plan's order back in the actor parameters'."""
    result = torch.empty_like(vector)
    result[plan.order.to(vector.device)] = vector
    return result


def gsde_log_std_fisher(distribution: StateDependentNoiseDistribution, log_std: torch.Tensor) -> torch.Tensor:
    """
    The exact Fisher block of gSDE's ``log_std`` on a batch: the Hessian of the mean (summed over actions) KL in it.

    Derived in closed form: the action's variance is ``v = x^2 S + eps`` with ``x`` the (detached) latent of gSDE and
    ``S = std(log_std)^2`` the ``(latent, action)`` matrix of variance weights, linear in ``S``; a Normal's Fisher in its
    variance is ``1 / (2 v^2)`` (and zero across mean and variance), so in ``S`` it is, per action ``k``,
    ``E[x^2 (x^2)^T / (2 v_k^2)]``, and in ``log_std`` it is ``J^T (that) J`` with ``J = dS / dlog_std`` (from SB3's own
    ``get_std``: ``exp`` or ``expln``, full or not).

    :param distribution: gSDE's distribution on the batch, after ``proba_distribution``
    :param log_std: the parameter
    :return: ``(numel, numel)``
    """
    latent_squared = distribution._latent_sde.detach().pow(2)
    weights = VARIANCE_FISHER_FACTOR * distribution.distribution.scale.detach().pow(-4)
    variance_fisher = torch.einsum("ni,nk,nj->kij", latent_squared, weights, latent_squared) / latent_squared.shape[0]
    jacobian = torch.autograd.functional.jacobian(
        lambda value: distribution.get_std(value).pow(2), log_std.detach(), vectorize=True
    ).reshape(latent_squared.shape[1], weights.shape[1], log_std.numel())
    return torch.einsum("ikp,kij,jkq->pq", jacobian, variance_fisher, jacobian)


def _block_fisher(block: ExactBlock, distribution: Distribution) -> torch.Tensor:
    """The dense block of one parameter on a batch."""
    if block.kind == GAUSSIAN_LOG_STD:
        return gaussian_log_std_fisher(block.parameter.detach())
    if block.kind == GSDE_LOG_STD:
        if not isinstance(distribution, StateDependentNoiseDistribution):
            raise TypeError(f"gSDE's log_std block needs gSDE's distribution, not {type(distribution).__name__}")
        return gsde_log_std_fisher(distribution, block.parameter)
    parameter = block.parameter
    return torch.eye(parameter.numel(), dtype=parameter.dtype, device=parameter.device)


def true_fisher_output_factors(
    distribution: Distribution, records: Sequence[LayerRecord], generator: torch.Generator, sampled: bool = False
) -> list[torch.Tensor]:
    """
    Each layer's true-Fisher ``G`` from the policy's distribution: in closed form where :mod:`.fisher` knows it.

    :param distribution: the SB3 distribution on the batch, with its graph to the layers' outputs
    :param records: the layers' records from the forward pass that built it
    :param generator: the random source of the actions, when sampled
    :param sampled: estimate by sampling even where the closed form is known (one action per sample)
    :return: one ``(out, out)`` factor per record
    """
    if not sampled:
        try:
            statistics = distribution_statistics(distribution)
        except ValueError:
            sampled = True
    if not sampled:
        weights = fisher_weights(distribution, [statistic.detach() for statistic in statistics])
        pairs = [(statistic, weight) for statistic, weight in zip(statistics, weights, strict=True) if statistic.requires_grad]
        return expected_output_factors([pair[0] for pair in pairs], [pair[1] for pair in pairs], records)
    inner = getattr(distribution, "distribution", None)
    if inner is None:
        raise TypeError(f"No torch distribution to sample in {type(distribution).__name__}")
    return output_factors(sampled_log_likelihood(inner, generator), records)


@dataclass
class BatchCurvature:
    """
    One batch's curvature, in the plan's order of layers and blocks.

    :param layer_factors: each layer's ``(A, G)``, ready for :meth:`.kfac.KroneckerFactors.update`
    :param block_fishers: each exact block's dense Fisher
    """

    layer_factors: list[tuple[torch.Tensor, torch.Tensor]]
    block_fishers: list[torch.Tensor]

    def averaged(self, mean: Callable[[torch.Tensor], torch.Tensor]) -> BatchCurvature:
        """Every factor and block through ``mean`` (a reducer's mean across ranks): each is a mean over samples, so the
        result is the curvature of every rank's samples together, exactly."""
        return BatchCurvature(
            [(mean(inputs), mean(outputs)) for inputs, outputs in self.layer_factors],
            [mean(block) for block in self.block_fishers],
        )


def batch_curvature(
    plan: KfacPlan,
    policy: ActorCriticPolicy,
    observations: PolicyInputs,
    generator: torch.Generator,
    sampled: bool = False,
) -> BatchCurvature:
    """
    The true-Fisher K-FAC factors and exact blocks of the policy's actor on a batch of observations.

    Runs the actor forward once (``policy.get_distribution``) with the layers recorded. A layer called more than once
    in that pass keeps its last call (weight sharing is not supported).

    :param plan: the policy's plan
    :param policy: the policy
    :param observations: the batch
    :param generator: the random source of the sampled Fisher (on the policy's device)
    :param sampled: sample the actions even where the closed form is known
    :return: the batch's curvature
    :raises RuntimeError: when a layer of the plan took no part in the forward pass
    """
    with torch.enable_grad(), record_layers(plan.layers) as records:
        distribution = policy_distribution(policy, observations)
    missing = [layer for layer in plan.layers if layer not in records]
    if missing:
        raise RuntimeError(f"The actor's forward pass did not call {missing}")
    layer_records = [records[layer] for layer in plan.layers]
    outputs = true_fisher_output_factors(distribution, layer_records, generator, sampled) if plan.layers else []
    inputs = [input_factor(layer, record.inputs) for layer, record in zip(plan.layers, layer_records, strict=True)]
    blocks = [_block_fisher(block, distribution).detach() for block in plan.blocks]
    return BatchCurvature(list(zip(inputs, outputs, strict=True)), blocks)


@dataclass
class KfacCurvature:
    """
    The running curvature of a plan: each layer's Kronecker factors and each exact block, as moving averages.

    :param layer_factors: one :class:`.kfac.KroneckerFactors` per layer of the plan
    :param block_fishers: one dense block per exact block; ``None`` before the first update
    """

    layer_factors: list[KroneckerFactors] = field(default_factory=list)
    block_fishers: list[torch.Tensor | None] = field(default_factory=list)

    @classmethod
    def for_plan(cls, plan: KfacPlan) -> KfacCurvature:
        """Empty running curvature for ``plan``."""
        return cls([KroneckerFactors() for _ in plan.layers], [None for _ in plan.blocks])

    def update(self, batch: BatchCurvature, decay: float) -> None:
        """
        Average a batch's curvature in: ``F <- decay * F + (1 - decay) * F_new``, the first update setting it outright.

        :param batch: the batch's curvature (:func:`batch_curvature`)
        :param decay: the weight of the past, in ``[0, 1)``
        """
        for running, (input_, output) in zip(self.layer_factors, batch.layer_factors, strict=True):
            running.update(input_, output, decay)
        for index, fisher in enumerate(batch.block_fishers):
            previous = self.block_fishers[index]
            self.block_fishers[index] = fisher.clone() if previous is None else decay * previous + (1.0 - decay) * fisher

    def blocks(self) -> list[torch.Tensor]:
        """The exact blocks; raises before the first update."""
        if any(fisher is None for fisher in self.block_fishers):
            raise RuntimeError("The exact blocks have not been updated yet")
        return [fisher for fisher in self.block_fishers if fisher is not None]


def _split(plan: KfacPlan, vector: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A vector in the plan's order split into its layers' part and each exact block's part."""
    sizes = [block.parameter.numel() for block in plan.blocks]
    layer_part, *block_parts = torch.split(vector, [plan.layer_size, *sizes])
    return layer_part, list(block_parts)


def kfac_product(plan: KfacPlan, curvature: KfacCurvature, vector: torch.Tensor) -> torch.Tensor:
    """
    The block-diagonal K-FAC Fisher times a vector, undamped: ``kron(G, A)`` per layer, each exact block dense.

    :param plan: the plan
    :param curvature: its running curvature
    :param vector: in the actor parameters' order
    :return: the product, in the actor parameters' order
    """
    layer_part, block_parts = _split(plan, to_plan_order(plan, vector))
    parts = [kfac_fisher_product(curvature.layer_factors, plan.layers, layer_part)] if plan.layers else []
    parts += [fisher.to(part.dtype) @ part for fisher, part in zip(curvature.blocks(), block_parts, strict=True)]
    return to_actor_order(plan, torch.cat(parts))


def _damped_block(fisher: torch.Tensor, damping: float) -> torch.Tensor:
    """An exact block plus ``damping I``, in ``INVERSION_DTYPE``."""
    return fisher.to(INVERSION_DTYPE) + damping * torch.eye(len(fisher), dtype=INVERSION_DTYPE, device=fisher.device)


def kfac_natural_inverse(
    plan: KfacPlan, curvature: KfacCurvature, damping: float, mode: str = FACTORED_DAMPING
) -> Callable[[torch.Tensor], torch.Tensor]:
    """
    The K-FAC natural-gradient map ``g -> about (F + damping I)^-1 g``, its inverses computed once, here.

    Each layer's block is inverted by :func:`.kfac.kfac_inverse`: with ``mode="factored"`` as ``kron(G_d, A_d)^-1``
    with the damping split by the pi-correction, which is not exactly ``kron(G, A) + damping I``; with
    ``mode="eigenbasis"`` as ``(kron(G, A) + damping I)^-1`` exactly. Each exact block is solved with
    ``block + damping I`` exactly (in ``INVERSION_DTYPE``), in either mode.

    :param plan: the plan
    :param curvature: its running curvature
    :param damping: the Tikhonov damping, > 0
    :param mode: one of :data:`.kfac.DAMPING_MODES`
    :return: the map from a gradient to its direction, both in the actor parameters' order
    """
    if not damping > 0.0:
        raise ValueError(f"The damping must be positive, not {damping}")
    layers = kfac_inverse(curvature.layer_factors, plan.layers, damping, mode) if plan.layers else None
    blocks = [
        torch.linalg.inv(
            fisher.to(INVERSION_DTYPE) + damping * torch.eye(len(fisher), dtype=INVERSION_DTYPE, device=fisher.device)
        )
        for fisher in curvature.blocks()
    ]

    def apply(gradient: torch.Tensor) -> torch.Tensor:
        layer_part, block_parts = _split(plan, to_plan_order(plan, gradient))
        parts = [layers(layer_part)] if layers is not None else []
        parts += [
            (inverse @ part.to(INVERSION_DTYPE)).to(part.dtype) for inverse, part in zip(blocks, block_parts, strict=True)
        ]
        return to_actor_order(plan, torch.cat(parts))

    return apply


def kfac_natural_direction(plan: KfacPlan, curvature: KfacCurvature, gradient: torch.Tensor, damping: float) -> torch.Tensor:
    """The K-FAC natural-gradient direction of one gradient (:func:`kfac_natural_inverse`)."""
    return kfac_natural_inverse(plan, curvature, damping)(gradient)
