"""
How much a float64 update moves when only the order of its batch's rows changes, with conjugate gradient stopped at
its default residual tolerance and run to convergence: why ``tests/test_distributed.py`` runs CG to convergence.

    .venv/bin/python -m benchmarks.row_order_spread     # writes benchmarks/results/row_order_spread.json

One seeded rollout of ``N_SAMPLES`` steps, then one float64 update on it as collected and one on its rows permuted
(the same sums in another order, as two ranks' halves against one batch); the result is
``||step_permuted - step|| / ||step||`` over every policy parameter, per algorithm, task and CG setting.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.logger import configure

from benchmarks.common import write_results
from sb3_npg import NPG, TRPO
from tests.float_comparisons import float64_policy_kwargs, relative_step_difference, to_float64

OUT = Path(__file__).parent / "results" / "row_order_spread.json"
N_SAMPLES = 256
FIELDS = ("observations", "actions", "rewards", "advantages", "returns", "episode_starts", "values", "log_probs")
#: CG settings: the constructor's defaults, and run to convergence (the test's ``CONVERGED_CG``).
CG_SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "converged": {"cg_max_steps": 60, "cg_residual_tol": 1e-20},
}
CASES = [(NPG, "Pendulum-v1"), (TRPO, "Pendulum-v1"), (NPG, "CartPole-v1")]
SETTINGS = {"n_steps": N_SAMPLES, "batch_size": N_SAMPLES, "n_critic_updates": 3, "seed": 0, "device": "cpu"}


def _batch(algo: type, env_id: str) -> dict[str, np.ndarray]:
    model = algo("MlpPolicy", env_id, policy_kwargs={"net_arch": [16]}, **SETTINGS)
    _, callback = model._setup_learn(N_SAMPLES)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, N_SAMPLES)
    return {field: getattr(model.rollout_buffer, field).copy() for field in FIELDS}


def _update(algo: type, env_id: str, batch: dict[str, np.ndarray], rows: Any, cg: dict[str, Any]) -> tuple[Any, Any, dict]:
    """The parameters before and after one float64 update on ``batch[rows]``, and the update's CG diagnostics."""
    kwargs = float64_policy_kwargs({"policy_kwargs": {"net_arch": [16]}, **SETTINGS, **cg})
    model = to_float64(algo("MlpPolicy", env_id, **kwargs))
    start = torch.cat([param.detach().flatten() for param in model.policy.parameters()]).clone()
    for field in FIELDS:
        getattr(model.rollout_buffer, field)[:] = batch[field][rows]
    model.rollout_buffer.full, model.rollout_buffer.generator_ready = True, False
    model.set_logger(configure(None, []))
    model.train()
    after = torch.cat([param.detach().flatten() for param in model.policy.parameters()])
    logged = model.logger.name_to_value
    return start, after, {key: float(logged[f"train/{key}"]) for key in ("cg_iterations", "cg_residual")}


def measure() -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    permutation = np.random.default_rng(1).permutation(N_SAMPLES)
    results = []
    for algo, env_id in CASES:
        batch = _batch(algo, env_id)
        for name, cg in CG_SETTINGS.items():
            start, plain, diagnostics = _update(algo, env_id, batch, slice(None), cg)
            _, permuted, _ = _update(algo, env_id, batch, permutation, cg)
            difference = relative_step_difference(permuted, plain, start)
            results.append(
                {"algo": algo.__name__, "env_id": env_id, "cg": name, "relative_step_difference": difference, **diagnostics}
            )
            print(f"{algo.__name__:5s} {env_id:12s} {name:15s} {difference:.1e}  {diagnostics}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    write_results(parser.parse_args().out, measure())


if __name__ == "__main__":
    main()
