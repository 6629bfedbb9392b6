"""Does each algorithm learn? Train with documented settings, evaluate periodically, stop at the threshold.

The default test suite runs the same configurations (tests/test_learning.py). To reproduce the numbers in the
closing notes and docs/benchmarks.md::

    .venv/bin/python -m benchmarks.learning --seeds 0,1,2 --out benchmarks/results/learning.jsonl
    .venv/bin/python -m benchmarks.learning --table benchmarks/results/learning.jsonl   # the table of docs/benchmarks.md
    .venv/bin/python -m benchmarks.learning --fisher-solver kfac --out benchmarks/results/learning_kfac.jsonl

Each cell of the table is the best deterministic evaluation mean (10 episodes), the step count at which training
stopped (threshold reached, or the budget spent), and the wall time of ``learn()``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold
from stable_baselines3.common.env_util import make_vec_env

from benchmarks.common import LEARNING_CONFIGS, N_EVAL_EPISODES, hyperparams_entry
from sb3_npg import ACKTR, NPG, TRPO
from sb3_npg.common.algorithm import NaturalPolicyGradient
from sb3_npg.common.solvers import FISHER_SOLVERS
from sb3_npg.zoo import hyperparams_path

ALGOS: dict[str, type[NaturalPolicyGradient]] = {"npg": NPG, "trpo": TRPO, "acktr": ACKTR}
#: The algorithms that learn with their shipped Zoo entry (its ``n_envs`` and options) instead of the settings of
#: :data:`LEARNING_CONFIGS`, which are NPG's and TRPO's.
ZOO_ENTRY_ALGOS = {"acktr": "acktr"}
#: Keys of a Zoo entry that are not constructor options.
ZOO_ONLY_KEYS = ("n_envs", "n_timesteps", "policy")


def learning_settings(algo: str, env_id: str) -> tuple[int, dict[str, Any]]:
    """The number of environments and the constructor options ``algo`` learns ``env_id`` with."""
    config = LEARNING_CONFIGS[env_id]
    if algo not in ZOO_ENTRY_ALGOS:
        return config["n_envs"], dict(config["hyperparams"])
    entry = hyperparams_entry(hyperparams_path(ZOO_ENTRY_ALGOS[algo]), env_id)
    return int(entry.get("n_envs", 1)), {key: value for key, value in entry.items() if key not in ZOO_ONLY_KEYS}


@dataclass
class LearningResult:
    algo: str
    env_id: str
    seed: int
    best_mean_return: float
    timesteps: int
    wall_time_s: float
    threshold: float
    reached: bool


def run_learning(algo: str, env_id: str, seed: int = 0, settings: Mapping[str, Any] | None = None) -> LearningResult:
    """
    Train ``algo`` on ``env_id`` with :data:`LEARNING_CONFIGS` until the deterministic evaluation mean over 10
    episodes reaches the threshold or the budget is spent.

    :param algo: ``npg``, ``trpo`` or ``acktr`` (with its shipped Zoo entry)
    :param env_id: a key of :data:`LEARNING_CONFIGS`
    :param seed: the seed of the model and of the environments
    :param settings: options added to (or replacing) the environment's settings, e.g. ``sb3_npg.FAST_SETTINGS``
    :return: the best evaluation mean, when it was reached and how long it took
    """
    config = LEARNING_CONFIGS[env_id]
    n_envs, hyperparams = learning_settings(algo, env_id)
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    eval_env = make_vec_env(env_id, n_envs=1, seed=seed + 1000)
    stop = StopTrainingOnRewardThreshold(reward_threshold=config["threshold"], verbose=0)
    evaluation = EvalCallback(
        eval_env,
        callback_on_new_best=stop,
        n_eval_episodes=N_EVAL_EPISODES,
        eval_freq=max(config["eval_freq"] // n_envs, 1),
        deterministic=True,
        verbose=0,
    )
    model = ALGOS[algo]("MlpPolicy", env, seed=seed, device="cpu", **{**hyperparams, **(settings or {})})
    start = time.perf_counter()
    model.learn(config["budget"], callback=evaluation)
    wall = time.perf_counter() - start
    best = float(evaluation.best_mean_reward)
    return LearningResult(
        algo=algo,
        env_id=env_id,
        seed=seed,
        best_mean_return=best,
        timesteps=model.num_timesteps,
        wall_time_s=round(wall, 1),
        threshold=config["threshold"],
        reached=best >= config["threshold"],
    )


def _cell(row: dict[str, Any]) -> str:
    return f"{row['best_mean_return']:.1f} at {row['timesteps'] // 1000}k ({row['wall_time_s']:.0f} s)"


def markdown_table(results: list[dict[str, Any]]) -> str:
    """
    The table of docs/benchmarks.md: one row per algorithm and environment, one cell per seed.

    :param results: rows as written by :func:`main` (``LearningResult`` fields)
    :return: the markdown table
    """
    seeds = sorted({row["seed"] for row in results})
    header = "| algorithm | environment | threshold | " + " | ".join(f"seed {seed}" for seed in seeds) + " |"
    lines = [header, "|" + "---|" * (3 + len(seeds))]
    groups: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for row in results:
        groups.setdefault((row["algo"], row["env_id"]), {})[row["seed"]] = row
    for (algo, env_id), by_seed in groups.items():
        cells = [_cell(by_seed[seed]) if seed in by_seed else "-" for seed in seeds]
        threshold = LEARNING_CONFIGS[env_id]["threshold"]
        lines.append(f"| {ALGOS[algo].__name__} | {env_id} | {threshold:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", default="npg,trpo")
    parser.add_argument("--envs", default=",".join(LEARNING_CONFIGS))
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--fisher-solver", default="cg", choices=FISHER_SOLVERS, help="the algorithms' fisher_solver")
    parser.add_argument("--out", type=Path, help="also write the results here, one JSON object per line")
    parser.add_argument("--table", type=Path, help="only print the markdown table of a results file written by --out")
    args = parser.parse_args()
    if args.table is not None:
        rows = [json.loads(line) for line in args.table.read_text(encoding="utf-8").splitlines() if line]
        print(markdown_table(rows))
        return
    torch.set_num_threads(args.threads)
    lines = []
    for env_id in args.envs.split(","):
        for algo in args.algos.split(","):
            for seed in map(int, args.seeds.split(",")):
                settings = {"fisher_solver": args.fisher_solver} if algo in ("npg", "trpo") else {}
                lines.append(json.dumps(asdict(run_learning(algo, env_id, seed, settings))))
                print(lines[-1], flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(markdown_table([json.loads(line) for line in lines]))


if __name__ == "__main__":
    main()
