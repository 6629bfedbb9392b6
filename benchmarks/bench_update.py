"""Time one ``train()`` of sb3-contrib's TRPO, our TRPO and our NPG on identical rollout data, side by side.

    make bench-update    # = .venv/bin/python -m benchmarks.bench_update --out benchmarks/results/bench_update.json
    .venv/bin/python -m benchmarks.bench_update [--reps 15] [--configs CartPole-v1,Pendulum-v1] [--out FILE]

For each configuration, sb3-contrib's TRPO first trains for ``WARM_UP_UPDATES`` updates (so the critic and policy are
realistic, not freshly initialized); then one rollout is collected and shared by every model, and every model starts
each timed ``train()`` from those same parameters and a fresh critic optimizer. Contenders, all with the
configuration's hyperparameters:

- sb3-contrib's TRPO, the reference;
- our TRPO and NPG with the same option values;
- on Box actions of d > 1 dimensions, our TRPO and NPG with sb3-contrib's KL scale (``cg_damping`` and ``target_kl``
  times d, :func:`contrib_kl_scale`): sb3-contrib averages the KL over dimensions, so with the same values it solves
  a better-conditioned system with fewer CG iterations; these rows do the same CG work and take the same step;
- our TRPO and NPG with the recommended ``FAST_SETTINGS`` added;
- our ACKTR with the configuration's options it takes (its ``critic_learning_rate`` from ``learning_rate``): with
  the configuration's critic fit (the critic of its shipped MuJoCo entries), and with one step of its K-FAC critic
  (the paper's update: one natural-gradient step of actor and critic);
- SB3's A2C with the options it takes: one gradient step of actor and critic, the reference of the paper's claim
  that a K-FAC update costs 10-25% more than a first-order one (``ratio_to_a2c`` in the JSON).

They are timed in alternation (A B C ... A B C ...) after ``WARMUP`` untimed rounds, with one torch thread; the table
reports the median milliseconds per update and the median of the per-repetition ratios ours / sb3-contrib. Peak
memory is the growth of the resident set size during one update, measured in a forked child before any timing.
Work and critic quality of one update: its Fisher-vector products, the value loss on the rollout the critic was
fitted to, and the explained variance of the value on a second, held-out rollout of the same policy.
"""

from __future__ import annotations

import copy
import inspect
import math
import multiprocessing
import resource
import statistics
import time
from typing import Any

import numpy as np
import sb3_contrib
import torch
from gymnasium import spaces
from stable_baselines3 import A2C
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

from benchmarks.common import (
    CONTRIB_KL,
    TIMING_WARMUP_ROUNDS,
    UPDATE_CONFIGS,
    build_model,
    configs_parser,
    fill_rollout,
    run_configs,
)
from sb3_npg import ACKTR, FAST_SETTINGS, NPG, TRPO

#: (name, class, extra settings) of every contender; the first is the reference of the ratios.
CONTENDERS: list[tuple[str, type[OnPolicyAlgorithm], dict[str, Any]]] = [
    ("sb3_contrib.TRPO", sb3_contrib.TRPO, {}),
    ("sb3_npg.TRPO", TRPO, {}),
    ("sb3_npg.NPG", NPG, {}),
    ("sb3_npg.TRPO, KL as sb3-contrib", TRPO, {CONTRIB_KL: True}),
    ("sb3_npg.NPG, KL as sb3-contrib", NPG, {CONTRIB_KL: True}),
    ("sb3_npg.TRPO+fast", TRPO, dict(FAST_SETTINGS)),
    ("sb3_npg.NPG+fast", NPG, dict(FAST_SETTINGS)),
    ("sb3_npg.ACKTR", ACKTR, {"critic_fit": "minibatch"}),
    ("sb3_npg.ACKTR, one K-FAC critic step", ACKTR, {"critic_fit": "kfac", "n_critic_updates": 1}),
    ("stable_baselines3.A2C", A2C, {}),
]
#: The contenders that take only the configuration's options they know (the others take every one).
FOREIGN_OPTIONS = (ACKTR, A2C)
#: The contender the paper's K-FAC overhead is measured against, and the one measured.
FIRST_ORDER, KFAC_UPDATE = "stable_baselines3.A2C", "sb3_npg.ACKTR, one K-FAC critic step"
#: Updates sb3-contrib's TRPO trains before the shared rollout, so the timed update starts from a trained state.
WARM_UP_UPDATES = 5
KIB_PER_PAGE = resource.getpagesize() // 1024


def _rss_kib() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * KIB_PER_PAGE


def _peak_growth_child(model: OnPolicyAlgorithm, queue: Any) -> None:
    before = _rss_kib()
    model.train()
    queue.put(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)


def _peak_memory_mib(model: OnPolicyAlgorithm) -> float:
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_peak_growth_child, args=(model, queue))
    child.start()
    growth = queue.get()
    child.join()
    return max(growth, 0) / 1024


class _Contender:
    """A model and the state it is reset to before every timed update."""

    def __init__(self, name: str, model: OnPolicyAlgorithm, policy_state: dict[str, torch.Tensor]):
        self.name, self.model = name, model
        model.policy.load_state_dict(policy_state)
        self.policy_state = policy_state
        self.optimizer_state = model.policy.optimizer.state_dict()
        # ACKTR's running K-FAC statistics: every timed update starts from the same ones (none yet).
        self.statistics = [copy.deepcopy(module.state_dict()) for module in self._statistics_modules()]
        self.times: list[float] = []

    def _statistics_modules(self) -> list[torch.nn.Module]:
        names = ("kfac_statistics", "critic_kfac_statistics")
        return [module for module in (getattr(self.model, name, None) for name in names) if module is not None]

    def reset(self) -> None:
        self.model.policy.load_state_dict(self.policy_state)
        self.model.policy.optimizer.load_state_dict(self.optimizer_state)
        for module, state in zip(self._statistics_modules(), self.statistics, strict=True):
            module.load_state_dict(state)

    def timed_update(self) -> float:
        self.reset()
        start = time.perf_counter()
        self.model.train()
        return time.perf_counter() - start

    def critic_quality(self, fitted: RolloutBuffer, held_out: RolloutBuffer) -> dict[str, float]:
        """After one update: its Fisher-vector products, the value loss on the fitted rollout, the explained variance
        on the held-out one."""
        self.reset()
        products = self._count_fisher_products()
        with torch.no_grad():
            fitted_data = next(fitted.get(batch_size=None))
            loss = torch.mean(
                (self.model.policy.predict_values(fitted_data.observations).flatten() - fitted_data.returns) ** 2
            )
            held = next(held_out.get(batch_size=None))
            values = self.model.policy.predict_values(held.observations).flatten()
        residual_variance = torch.var(held.returns - values) / torch.var(held.returns)
        return {
            "fisher_products": products,
            "value_loss": float(loss),
            "held_out_explained_variance": float(1.0 - residual_variance),
        }

    def _count_fisher_products(self) -> int:
        """Run one update and count its Fisher-vector products (sb3-contrib: CG's and the step size's; ours: CG's)."""
        if isinstance(self.model, sb3_contrib.TRPO):
            calls = []
            product = self.model.hessian_vector_product
            self.model.hessian_vector_product = lambda *args, **kwargs: calls.append(1) or product(*args, **kwargs)  # type: ignore[method-assign]
            self.model.train()
            del self.model.hessian_vector_product
            return len(calls)  # including the product of CG's random start that sb3-contrib's solver computes
        self.model.train()
        iterations = self.model.logger.name_to_value.get("train/cg_iterations", 0)  # CG gives s^T F s: no product after
        return 0 if math.isnan(iterations) else int(iterations)  # ACKTR's K-FAC and A2C take no Fisher product


def _options_for(algo: type[OnPolicyAlgorithm], config: dict[str, Any]) -> dict[str, Any]:
    """The configuration with the options ``algo`` takes: all for NPG and TRPO; for ACKTR and A2C those their
    constructors name (ACKTR's critic takes the configuration's ``learning_rate`` and TRPO's critic epochs)."""
    if algo not in FOREIGN_OPTIONS:
        return config
    hyperparams = dict(config["hyperparams"])
    if algo is ACKTR:
        # The configuration's critic is TRPO's: its epochs default to TRPO's, its learning rate is ACKTR's critic's.
        hyperparams.setdefault("n_critic_updates", inspect.signature(TRPO).parameters["n_critic_updates"].default)
        if "learning_rate" in hyperparams:
            hyperparams["critic_learning_rate"] = hyperparams.pop("learning_rate")
    accepted = inspect.signature(algo).parameters
    return {**config, "hyperparams": {key: value for key, value in hyperparams.items() if key in accepted}}


def _shared_rollouts(config: dict[str, Any], seed: int) -> tuple[OnPolicyAlgorithm, RolloutBuffer, RolloutBuffer]:
    """sb3-contrib's model after its warm-up updates, its fitted rollout and a held-out one of the same policy."""
    contrib = build_model(sb3_contrib.TRPO, config, seed)
    contrib.learn(WARM_UP_UPDATES * contrib.n_steps * contrib.n_envs)
    held_out = contrib.rollout_buffer
    contrib.rollout_buffer = type(held_out)(
        contrib.n_steps, contrib.observation_space, contrib.action_space, device="cpu", gamma=contrib.gamma,
        gae_lambda=contrib.gae_lambda, n_envs=contrib.n_envs,
    )  # fmt: skip
    fill_rollout(contrib)
    fitted = contrib.rollout_buffer
    held_out.reset()
    contrib.rollout_buffer = held_out
    fill_rollout(contrib)
    contrib.rollout_buffer = fitted
    # A fresh critic optimizer, as every other contender has: no one starts with the warm-up's Adam moments.
    contrib.policy.optimizer = contrib.policy.optimizer_class(
        contrib.policy.parameters(), lr=contrib.lr_schedule(1), **contrib.policy.optimizer_kwargs
    )
    return contrib, fitted, held_out


def bench_config(name: str, config: dict[str, Any], reps: int, seed: int = 0) -> dict[str, Any]:
    """Time every contender on one shared rollout; return medians, ratios, peak memory and critic quality."""
    contrib, fitted, held_out = _shared_rollouts(config, seed)
    policy_state = {key: value.clone() for key, value in contrib.policy.state_dict().items()}
    contenders = []
    is_multi_dimensional_box = isinstance(contrib.action_space, spaces.Box) and int(np.prod(contrib.action_space.shape)) > 1
    for label, algo, extra in CONTENDERS:
        if extra.get(CONTRIB_KL) and not is_multi_dimensional_box:
            continue  # one action dimension: both KLs agree, the row would repeat the plain one
        model = contrib if algo is sb3_contrib.TRPO else build_model(algo, _options_for(algo, config), seed, **extra)
        model.rollout_buffer = fitted
        contenders.append(_Contender(label, model, policy_state))
    memory = {c.name: _peak_memory_mib(c.model) for c in contenders}
    quality = {c.name: c.critic_quality(fitted, held_out) for c in contenders}
    np.random.seed(seed)
    for rep in range(TIMING_WARMUP_ROUNDS + reps):
        for contender in contenders:
            elapsed = contender.timed_update()
            if rep >= TIMING_WARMUP_ROUNDS:
                contender.times.append(elapsed)
    reference = contenders[0].times
    result: dict[str, Any] = {"config": name, "samples": contrib.n_steps * contrib.n_envs, "models": {}}
    first_order = next(c.times for c in contenders if c.name == FIRST_ORDER)
    for contender in contenders:
        ratios = [t / r for t, r in zip(contender.times, reference, strict=True)]
        result["models"][contender.name] = {
            "median_ms": 1000 * statistics.median(contender.times),
            "median_ratio": statistics.median(ratios),
            "ratio_to_a2c": statistics.median([t / r for t, r in zip(contender.times, first_order, strict=True)]),
            "peak_memory_mib": memory[contender.name],
            **quality[contender.name],
        }
    return result


def markdown_table(results: list[dict[str, Any]]) -> str:
    """One row per configuration and model."""
    lines = [
        "| configuration | samples | model | ms / update (median) | ratio to sb3-contrib (median) | peak memory (MiB) "
        "| Fisher products | value loss after | held-out explained variance |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for model, row in result["models"].items():
            lines.append(
                f"| {result['config']} | {result['samples']} | {model} | {row['median_ms']:.1f} | "
                f"{row['median_ratio']:.2f} | {row['peak_memory_mib']:.1f} | {row['fisher_products']} | "
                f"{row['value_loss']:.4g} | {row['held_out_explained_variance']:.3f} |"
            )
    return "\n".join(lines)


def main() -> None:
    run_configs(configs_parser(__doc__, UPDATE_CONFIGS).parse_args(), UPDATE_CONFIGS, bench_config, markdown_table)


if __name__ == "__main__":
    main()
