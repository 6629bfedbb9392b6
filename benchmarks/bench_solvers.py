"""K-FAC against plain conjugate gradient on real rollouts: products to a residual, directions, and update time.

    make bench-solvers    # = .venv/bin/python -m benchmarks.bench_solvers --out benchmarks/results/bench_solvers.json
    .venv/bin/python -m benchmarks.bench_solvers [--reps 5] [--configs CartPole-v1,Hopper-v5] [--out FILE]

Each configuration is our TRPO with the settings of our ``npg_trpo.yml`` (:func:`zoo_config`), on one seeded rollout,
at two policies: as initialized, and after ``WARM_UP_UPDATES`` updates of plain conjugate gradient (the rollout is
collected after them). At that rollout's base point, with one policy batch (the whole rollout), the gradient ``g`` and
the damped Fisher-vector product ``v -> (F + d I) v`` are built as the step builds them (:func:`step_problem`); then:

1. Fisher products and wall time for plain CG (``fisher_solver="cg"``) and for K-FAC-preconditioned CG
   (``"kfac_preconditioned_cg"``) to reach each relative residual of ``TOLERANCES`` (``||g - (F + d I) s||^2 <= tol
   ||g||^2``, CG's own stopping rule, at most ``MAX_STEPS`` products). The preconditioned time includes K-FAC's setup
   (the factors of the batch) and every application of its inverse (which eigendecomposes the damped factors each
   time it is applied, so the inversion is paid per iteration; both are also timed alone); neither time includes
   building the Fisher product, which the step does anyway. ``true_residual`` recomputes the relative residual with
   one more product (not counted): CG's recursive residual can drift from it in float32.
2. K-FAC's direction alone (``"kfac"``): its cosine with CG's direction at the tightest tolerance, and its relative
   residual ``||g - (F + d I) s||^2 / ||g||^2``; also plain CG at the configuration's own ``cg_max_steps`` and
   ``cg_residual_tol`` (what an update uses) with its residual and cosine, for scale.
3. One whole ``train()`` per solver on the same rollout, every model starting from the same parameters and critic
   optimizer state, as a ratio to CG's.

Times alternate between the contenders (A B A B ...) after ``TIMING_WARMUP_ROUNDS`` untimed rounds, with one torch
thread; the table reports medians (and the median of the per-round ratios for ``train()``).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from gymnasium import spaces
from stable_baselines3.common.utils import set_random_seed
from torch import nn

from benchmarks.common import (
    TIMING_WARMUP_ROUNDS,
    build_model,
    configs_parser,
    fill_rollout,
    hyperparams_entry,
    portable_path,
    run_configs,
)
from sb3_npg import TRPO
from sb3_npg.common.batches import Observations, first_tensor, normalized_advantages, policy_sample, rollout_tensors
from sb3_npg.common.distributions import frozen_copy
from sb3_npg.common.natural_gradient import MatVec, conjugate_gradient, flat_grad
from sb3_npg.zoo import hyperparams_path

#: The relative squared residuals both conjugate gradients are run to.
TOLERANCES = (1e-4, 1e-6, 1e-8)
#: A budget of products generous enough that a tolerance not reached is the solver's limit, not the budget's.
MAX_STEPS = 500
#: Updates of plain CG before the rollout of the "trained" policy.
WARM_UP_UPDATES = 5
#: The file the configurations' settings come from.
ZOO_ALGO = "npg_trpo"
SOLVERS = ("cg", "kfac", "kfac_preconditioned_cg")
#: Zoo entry keys that are not the algorithm's options.
NOT_OPTIONS = ("n_timesteps", "policy", "n_envs", "normalize")


def zoo_config(env_id: str) -> dict[str, Any]:
    """A configuration in :func:`~benchmarks.common.build_model`'s form from our ``npg_trpo.yml`` entry of ``env_id``."""
    entry = hyperparams_entry(hyperparams_path(ZOO_ALGO), env_id)
    hyperparams = {key: value for key, value in entry.items() if key not in NOT_OPTIONS}
    if isinstance(hyperparams.get("policy_kwargs"), str):
        hyperparams["policy_kwargs"] = eval(
            hyperparams["policy_kwargs"], {"nn": nn}
        )  # our own file's policy_kwargs, as the RL Zoo reads them
    if entry.get("policy", "MlpPolicy") != "MlpPolicy":
        raise ValueError(f"{env_id}: only MlpPolicy entries are benchmarked here")
    return {
        "env_id": env_id,
        "n_envs": entry.get("n_envs", 1),
        "normalize": bool(entry.get("normalize")),
        "hyperparams": hyperparams,
    }


CONFIG_NAMES = ("CartPole-v1", "Pendulum-v1", "HalfCheetah-v5", "Hopper-v5")


@dataclass
class StepProblem:
    """What a natural step solves, at its base point: ``(F + d I) s = g``."""

    gradient: torch.Tensor
    fisher: MatVec
    observations: Observations


def step_problem(model: TRPO) -> StepProblem:
    """The gradient and the damped Fisher product of one natural step on the model's whole rollout, built as
    ``ActorUpdate._update_actor`` and ``_natural_step`` build them (one process, one policy batch)."""
    model.policy.set_training_mode(True)
    rollout = rollout_tensors(model.rollout_buffer)
    normalize = partial(normalized_advantages, reducer=model._reducer) if model.normalize_advantage else None
    discrete = isinstance(model.action_space, spaces.Discrete)
    batch = policy_sample(rollout, model.sub_sampling_factor, discrete_actions=discrete, normalize=normalize)
    distribution = copy.copy(model.policy.get_distribution(batch.observations))
    frozen = frozen_copy(model.policy, batch.observations, distribution)
    objective = model.policy_objective(batch, distribution, frozen)
    gradient = flat_grad(objective.surrogate, model._actor_params, retain_graph=True)
    fisher = model._fisher_product(batch, distribution, frozen)
    return StepProblem(gradient.detach(), fisher, model._fisher_observations(batch))


def relative_residual(problem: StepProblem, direction: torch.Tensor) -> float:
    """``||g - (F + d I) s||^2 / ||g||^2``, with one Fisher product."""
    residual = problem.gradient - problem.fisher(direction)
    return float(torch.dot(residual, residual) / torch.dot(problem.gradient, problem.gradient))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """The cosine of the angle between two vectors (in float64)."""
    a, b = a.double(), b.double()
    return float(torch.dot(a, b) / (torch.linalg.vector_norm(a) * torch.linalg.vector_norm(b)))


def _solve(model: TRPO, problem: StepProblem, tolerance: float, preconditioned: bool, max_steps: int) -> Any:
    """Conjugate gradient on the problem; the preconditioned one builds K-FAC's inverse first (inside the call)."""
    preconditioner = model._kfac_inverse(problem.observations) if preconditioned else None
    return conjugate_gradient(problem.fisher, problem.gradient, max_steps, tolerance, preconditioner)


def _timed(function: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def compare_solvers(
    model: TRPO, reps: int, tolerances: tuple[float, ...] | None = None, max_steps: int | None = None
) -> dict[str, Any]:
    """
    Items 1 and 2 of the module's description on the model's rollout (``model`` built with a K-FAC solver, so that it
    has its K-FAC plan; its ``fisher_solver`` is not used here); ``TOLERANCES`` and ``MAX_STEPS`` by default.
    """
    tolerances = TOLERANCES if tolerances is None else tolerances
    max_steps = MAX_STEPS if max_steps is None else max_steps
    problem = step_problem(model)
    contenders = {"cg": False, "kfac_preconditioned_cg": True}
    times: dict[tuple[str, float], list[float]] = {(name, tol): [] for name in contenders for tol in tolerances}
    setup_times: list[float] = []
    apply_times: list[float] = []
    kfac_times: list[float] = []
    solved: dict[tuple[str, float], Any] = {}
    for rep in range(TIMING_WARMUP_ROUNDS + reps):
        for tol in tolerances:
            for name, preconditioned in contenders.items():
                elapsed, solved[name, tol] = _timed(partial(_solve, model, problem, tol, preconditioned, max_steps))
                if rep >= TIMING_WARMUP_ROUNDS:
                    times[name, tol].append(elapsed)
        elapsed, inverse = _timed(partial(model._kfac_inverse, problem.observations))
        kfac_elapsed, kfac_direction = _timed(partial(inverse, problem.gradient))
        if rep >= TIMING_WARMUP_ROUNDS:
            setup_times.append(elapsed)
            apply_times.append(kfac_elapsed)
            kfac_times.append(elapsed + kfac_elapsed)
    reference = solved["cg", tolerances[-1]].solution
    own = conjugate_gradient(problem.fisher, problem.gradient, model.cg_max_steps, model.cg_residual_tol)
    solves = []
    for (name, tol), result in solved.items():
        solves.append(
            {
                "solver": name,
                "tolerance": tol,
                "products": result.iterations,
                "converged": result.converged,
                "residual": result.residual,
                "true_residual": relative_residual(problem, result.solution),
                "cosine_to_cg": cosine(result.solution, reference),
                "median_ms": 1000 * statistics.median(times[name, tol]),
            }
        )
    return {
        "parameters": problem.gradient.numel(),
        "fisher_samples": len(first_tensor(problem.observations)),
        "solves": solves,
        "kfac_setup_ms": 1000 * statistics.median(setup_times),
        "kfac_apply_ms": 1000 * statistics.median(apply_times),
        "kfac": {
            "cosine_to_cg": cosine(kfac_direction, reference),
            "residual": relative_residual(problem, kfac_direction),
            "median_ms": 1000 * statistics.median(kfac_times),
        },
        "cg_own_settings": {
            "max_steps": model.cg_max_steps,
            "residual_tol": model.cg_residual_tol,
            "products": own.iterations,
            "residual": relative_residual(problem, own.solution),
            "cosine_to_cg": cosine(own.solution, reference),
        },
    }


class _Trainer:
    """A model of one solver on the shared rollout, reset to the shared parameters before every timed update."""

    def __init__(self, model: TRPO, policy_state: dict[str, torch.Tensor], rollout_buffer: Any):
        self.model = model
        model.policy.load_state_dict(policy_state)
        model.rollout_buffer = rollout_buffer
        self.policy_state = policy_state
        self.optimizer_state = copy.deepcopy(model.policy.optimizer.state_dict())
        self.times: list[float] = []

    def timed_update(self) -> float:
        self.model.policy.load_state_dict(self.policy_state)
        self.model.policy.optimizer.load_state_dict(self.optimizer_state)
        start = time.perf_counter()
        self.model.train()
        return time.perf_counter() - start


def time_train(config: dict[str, Any], source: TRPO, reps: int, seed: int) -> dict[str, dict[str, float]]:
    """Item 3: one whole ``train()`` per solver from the source model's parameters, on its rollout."""
    policy_state = {key: value.clone() for key, value in source.policy.state_dict().items()}
    trainers = {}
    for solver in SOLVERS:
        model = build_model(TRPO, config, seed, fisher_solver=solver)
        assert isinstance(model, TRPO)
        trainers[solver] = _Trainer(model, policy_state, source.rollout_buffer)
    for rep in range(TIMING_WARMUP_ROUNDS + reps):
        for trainer in trainers.values():
            elapsed = trainer.timed_update()
            if rep >= TIMING_WARMUP_ROUNDS:
                trainer.times.append(elapsed)
    reference = trainers["cg"].times
    result = {}
    for solver, trainer in trainers.items():
        ratios = [t / r for t, r in zip(trainer.times, reference, strict=True)]
        logged = trainer.model.logger.name_to_value
        result[solver] = {
            "median_ms": 1000 * statistics.median(trainer.times),
            "median_ratio": statistics.median(ratios),
            "cg_iterations": float(logged.get("train/cg_iterations", float("nan"))),
            "cg_residual": float(logged.get("train/cg_residual", float("nan"))),
        }
    return result


def bench_policy(config: dict[str, Any], model: TRPO, reps: int, seed: int) -> dict[str, Any]:
    """Solvers and ``train()`` on a fresh rollout of the model's policy (the model must have a K-FAC plan)."""
    fill_rollout(model)
    return {**compare_solvers(model, reps), "train": time_train(config, model, reps, seed)}


def bench_config(
    name: str, config: dict[str, Any], reps: int, seed: int = 0, warm_up_updates: int = WARM_UP_UPDATES
) -> dict[str, Any]:
    """Both policies of one configuration: as initialized, then after ``warm_up_updates`` updates of plain CG."""
    model = build_model(TRPO, config, seed, fisher_solver="kfac_preconditioned_cg")
    assert isinstance(model, TRPO)
    policies = {"initial": bench_policy(config, model, reps, seed)}
    if warm_up_updates:
        model.fisher_solver = "cg"  # the warm-up updates are plain CG's; the K-FAC plan stays for the comparison
        set_random_seed(seed)  # the timings before drew from the global generators as many times as --reps says
        model.learn(warm_up_updates * model.n_steps * model.n_envs)
        model.fisher_solver = "kfac_preconditioned_cg"
        policies[f"after {warm_up_updates} updates"] = bench_policy(config, model, reps, seed)
    return {
        "config": name,
        "hyperparams_file": portable_path(hyperparams_path(ZOO_ALGO)),
        "samples": model.n_steps * model.n_envs,
        "cg_damping": model.cg_damping,
        "policies": policies,
    }


def _products(solves: list[dict[str, Any]], solver: str) -> str:
    cells = []
    for solve in solves:
        if solve["solver"] == solver:
            mark = "" if solve["converged"] else " (not reached)"
            cells.append(f"{solve['products']}{mark} / {solve['median_ms']:.0f} ms")
    return ", ".join(cells)


def markdown_table(results: list[dict[str, Any]]) -> str:
    """One row per configuration and policy."""
    tolerances = (
        "/".join(f"{solve['tolerance']:g}" for solve in results[0]["policies"]["initial"]["solves"] if solve["solver"] == "cg")
        if results
        else ""
    )
    lines = [
        f"| configuration | policy | CG: products / ms to {tolerances} | K-FAC-preconditioned CG (setup included) "
        "| K-FAC ms: factors, one application | K-FAC alone: cosine to CG, residual "
        "| CG at its settings: products, residual, cosine "
        "| train() ms: CG, ratio K-FAC, ratio K-FAC-PCG |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for policy, row in result["policies"].items():
            own, kfac, train = row["cg_own_settings"], row["kfac"], row["train"]
            lines.append(
                f"| {result['config']} | {policy} | {_products(row['solves'], 'cg')} | "
                f"{_products(row['solves'], 'kfac_preconditioned_cg')} | "
                f"{row['kfac_setup_ms']:.1f}, {row['kfac_apply_ms']:.1f} | "
                f"{kfac['cosine_to_cg']:.3f}, {kfac['residual']:.3g} | "
                f"{own['products']}, {own['residual']:.2g}, {own['cosine_to_cg']:.3f} | "
                f"{train['cg']['median_ms']:.0f}, {train['kfac']['median_ratio']:.2f}, "
                f"{train['kfac_preconditioned_cg']['median_ratio']:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = configs_parser(__doc__, CONFIG_NAMES)
    parser.set_defaults(reps=5)
    args = parser.parse_args()
    configs = {name: zoo_config(name) for name in args.configs.split(",")}
    run_configs(args, configs, bench_config, markdown_table)


if __name__ == "__main__":
    main()
