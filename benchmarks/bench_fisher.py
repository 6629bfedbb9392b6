"""Time the Fisher-vector product implementations on real rollouts: build once, then ``cg_max_steps`` products.

    .venv/bin/python -m benchmarks.bench_fisher [--reps 15] [--configs CartPole-v1,Pendulum-v1]
        [--out benchmarks/results/bench_fisher.json]

Contenders, each over the actor parameters of the same policy on the same observations:

- ``autograd``: double backward through the mean KL (``fisher="autograd"``);
- ``analytic``: the Gauss-Newton product ``J^T M J v`` with the analytic Fisher, reverse mode only
  (``fisher="analytic"``);
- ``torch.func``: the same Gauss-Newton product with ``torch.func.jvp`` for ``J v`` and ``torch.func.vjp`` for
  ``J^T u`` (shown here only to justify the choice above; not used by the package).

Each is timed with the whole batch and with every 5th sample (``fisher_sub_sampling_factor=5``), alternating
A B C A B C after a warm-up, with one torch thread; the table reports medians and the ratio to ``autograd``.

With sub-sampling, one more contender, ``analytic, sliced``: the analytic product over every 5th row of the statistics
of the whole batch's forward pass (which a step computes anyway, so it is not timed), instead of a forward pass on the
subset. It saves that forward pass, but every product's backward pass then runs over the whole batch: this row shows
why the package runs the network on the subset.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks.common import TIMING_WARMUP_ROUNDS, UPDATE_CONFIGS, build_model, configs_parser, fill_rollout, write_results
from sb3_npg import TRPO
from sb3_npg.common.batches import select_rows
from sb3_npg.common.fisher import analytic_fisher_product, distribution_statistics, fisher_weights
from sb3_npg.common.natural_gradient import MatVec, fisher_vector_product, gauss_newton_vector_product
from sb3_npg.common.distributions import frozen_distribution, mean_kl

SUB_SAMPLING_FACTORS = (1, 5)
DAMPING = 0.1


class _Statistics(nn.Module):
    """``torch.func.functional_call`` runs a module's forward: this one's is the policy's distribution statistics."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, observations: Any) -> tuple[torch.Tensor, ...]:
        return distribution_statistics(self.policy.get_distribution(observations))


def _autograd(model: TRPO, observations: Any) -> MatVec:
    old = frozen_distribution(model.policy, observations)
    return fisher_vector_product(mean_kl(old, model.policy.get_distribution(observations)), model.actor_parameters, DAMPING)


def _analytic(model: TRPO, observations: Any) -> MatVec:
    return analytic_fisher_product(model.policy.get_distribution(observations), model.actor_parameters, DAMPING)


def _torch_func(model: TRPO, observations: Any) -> MatVec:
    wrapper = _Statistics(model.policy)
    names = {id(param): name for name, param in wrapper.named_parameters()}
    keys = [names[id(param)] for param in model.actor_parameters]
    primals = tuple(param.detach() for param in model.actor_parameters)
    shapes, sizes = [p.shape for p in primals], [p.numel() for p in primals]

    def statistics_of(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.func.functional_call(wrapper, dict(zip(keys, values, strict=True)), (observations,))

    outputs, pullback = torch.func.vjp(statistics_of, *primals)
    weights = [w / outputs[0].shape[0] for w in fisher_weights(model.policy.action_dist, outputs)]

    def product(vector: torch.Tensor) -> torch.Tensor:
        tangents = tuple(part.view(shape) for part, shape in zip(vector.split(sizes), shapes, strict=True))
        _, directional = torch.func.jvp(statistics_of, primals, tangents)
        grads = pullback(tuple(w * d for w, d in zip(weights, directional, strict=True)))
        return torch.cat([grad.reshape(-1) for grad in grads]) + DAMPING * vector

    return product


def analytic_sliced(model: TRPO, distribution: Any, factor: int) -> MatVec:
    """The analytic product over every ``factor``-th row of the statistics of ``distribution`` (the whole batch's)."""
    statistics = [statistic[::factor] for statistic in distribution_statistics(distribution)]
    weights = fisher_weights(distribution, [statistic.detach() for statistic in statistics])
    return gauss_newton_vector_product(statistics, list(model.actor_parameters), weights, DAMPING)


#: The contender with sliced statistics (timed with sub-sampling only).
SLICED = "analytic, sliced"

CONTENDERS: dict[str, Callable[[TRPO, Any], MatVec]] = {
    "autograd": _autograd,
    "analytic": _analytic,
    "torch.func": _torch_func,
}


def _time_once(build: Callable[[TRPO, Any], MatVec], model: TRPO, observations: Any, vector: torch.Tensor) -> float:
    start = time.perf_counter()
    product = build(model, observations)
    for _ in range(model.cg_max_steps):
        product(vector)
    return time.perf_counter() - start


def _time_sliced(model: TRPO, observations: Any, factor: int, vector: torch.Tensor) -> float:
    distribution = model.policy.get_distribution(observations)  # shared with the step's own forward pass: not timed
    start = time.perf_counter()
    product = analytic_sliced(model, distribution, factor)
    for _ in range(model.cg_max_steps):
        product(vector)
    return time.perf_counter() - start


def bench_config(name: str, config: dict[str, Any], reps: int, seed: int = 0) -> list[dict[str, Any]]:
    """Median time of one build plus ``cg_max_steps`` products per contender and sub-sampling factor."""
    model = build_model(TRPO, config, seed)
    fill_rollout(model)
    assert isinstance(model, TRPO)
    observations = next(model.rollout_buffer.get(batch_size=None)).observations
    vector = torch.randn(sum(p.numel() for p in model.actor_parameters), generator=torch.Generator().manual_seed(seed))
    rows = []
    for factor in SUB_SAMPLING_FACTORS:
        batch = select_rows(observations, slice(None, None, factor))
        times: dict[str, list[float]] = {contender: [] for contender in CONTENDERS}
        if factor > 1:
            times[SLICED] = []
        for rep in range(TIMING_WARMUP_ROUNDS + reps):
            for contender, build in CONTENDERS.items():
                elapsed = _time_once(build, model, batch, vector)
                if rep >= TIMING_WARMUP_ROUNDS:
                    times[contender].append(elapsed)
            if factor > 1 and rep >= TIMING_WARMUP_ROUNDS:
                times[SLICED].append(_time_sliced(model, observations, factor, vector))
        for contender, measured in times.items():
            ratios = [t / r for t, r in zip(measured, times["autograd"], strict=True)]
            rows.append(
                {
                    "config": name,
                    "fisher_samples": len(range(0, model.n_steps * model.n_envs, factor)),
                    "contender": contender,
                    "products": model.cg_max_steps,
                    "median_ms": 1000 * statistics.median(measured),
                    "median_ratio": statistics.median(ratios),
                }
            )
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One row per configuration, Fisher batch and contender."""
    lines = [
        "| configuration | Fisher samples | product | ms for build + products (median) | ratio to autograd (median) |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['config']} | {row['fisher_samples']} | {row['contender']} ({row['products']} products) | "
            f"{row['median_ms']:.1f} | {row['median_ratio']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    args = configs_parser(__doc__, UPDATE_CONFIGS).parse_args()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    for name in args.configs.split(","):
        rows.extend(new := bench_config(name, UPDATE_CONFIGS[name], args.reps))
        print(markdown_table(new), flush=True)
    print(f"\n{markdown_table(rows)}")
    if args.out is not None:
        write_results(args.out, rows)


if __name__ == "__main__":
    main()
