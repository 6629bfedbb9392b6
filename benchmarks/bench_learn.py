"""End to end: train sb3-contrib's TRPO and ours with the same seeds and budget, interleaved; compare time and return.

    make bench-learn    # = .venv/bin/python -m benchmarks.bench_learn --seeds 0,1,2,3,4 \
                        #       --out benchmarks/results/bench_learn.jsonl
    .venv/bin/python -m benchmarks.bench_learn [--seeds 0,1,2,3,4] [--envs CartPole-v1,Pendulum-v1]
        [--contenders NAME,...] [--out FILE] [--table FILE]

Every contender trains with the RL Zoo's TRPO settings of the environment (``benchmarks.common.LEARNING_CONFIGS``)
for the whole budget (no early stopping), one torch thread, runs interleaved (seed by seed, environment by
environment, the contenders in turn). Recorded per run: wall time of ``learn()``, the time inside ``train()``, the
final deterministic evaluation (10 episodes on a separate environment), and the median over updates of the logged
``train/explained_variance`` (the critic fitted on the previous rollout, judged on the new one). Runs already in
``--out`` are skipped, so an interrupted benchmark resumes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import sb3_contrib
import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.logger import configure
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

from benchmarks.common import LEARNING_CONFIGS, N_EVAL_EPISODES, machine_description, read_jsonl
from sb3_npg import FAST_SETTINGS, NPG, TRPO

REFERENCE = "sb3_contrib.TRPO"
#: name -> (class, settings added to the environment's Zoo settings); "+fast" adds ``sb3_npg.FAST_SETTINGS``
CONTENDERS: dict[str, tuple[type[OnPolicyAlgorithm], dict[str, Any]]] = {
    REFERENCE: (sb3_contrib.TRPO, {}),
    "sb3_npg.TRPO": (TRPO, {}),
    "sb3_npg.TRPO+fast": (TRPO, dict(FAST_SETTINGS)),
    "sb3_npg.NPG+fast": (NPG, dict(FAST_SETTINGS)),
}
DEFAULT_CONTENDERS = (REFERENCE, "sb3_npg.TRPO", "sb3_npg.TRPO+fast", "sb3_npg.NPG+fast")
#: The evaluation environment's seed is the run's seed plus this, so it never replays a training episode.
EVAL_SEED_OFFSET = 10_000
#: The targets of the issue: our total wall time at most this fraction of sb3-contrib's ...
MAX_WALL_TIME_RATIO = 0.8
#: ... and our mean return at least sb3-contrib's mean minus this many of its standard deviations (over seeds).
RETURN_TOLERANCE_STDS = 1.0


class _TrainTimer:
    """Wraps a model's ``train()``: accumulates its time and the explained variance each update logs."""

    def __init__(self, model: OnPolicyAlgorithm):
        self.model, self.train = model, model.train
        self.seconds = 0.0
        self.explained_variances: list[float] = []
        model.train = self  # type: ignore[method-assign]

    def __call__(self) -> None:
        start = time.perf_counter()
        self.train()
        self.seconds += time.perf_counter() - start
        self.explained_variances.append(float(self.model.logger.name_to_value["train/explained_variance"]))


def run(contender: str, env_id: str, seed: int) -> dict[str, Any]:
    """Train one contender for the environment's budget; return its times, final return and critic quality."""
    algo, settings = CONTENDERS[contender]
    config = LEARNING_CONFIGS[env_id]
    env = make_vec_env(env_id, n_envs=config["n_envs"], seed=seed)
    model = algo("MlpPolicy", env, seed=seed, device="cpu", **{**config["hyperparams"], **settings})
    model.set_logger(configure(None, []))
    timer = _TrainTimer(model)
    start = time.perf_counter()
    model.learn(config["budget"])
    wall = time.perf_counter() - start
    eval_env = make_vec_env(env_id, n_envs=1, seed=seed + EVAL_SEED_OFFSET)
    mean_return, std_return = evaluate_policy(model, eval_env, n_eval_episodes=N_EVAL_EPISODES, deterministic=True)
    return {
        "contender": contender,
        "env_id": env_id,
        "seed": seed,
        "timesteps": model.num_timesteps,
        "wall_time_s": wall,
        "train_time_s": timer.seconds,
        "final_return_mean": float(mean_return),
        "final_return_std": float(std_return),
        "median_explained_variance": float(np.nanmedian(timer.explained_variances)),
    }


def run_all(seeds: list[int], envs: list[str], contenders: list[str], out: Path | None) -> list[dict[str, Any]]:
    """Every (seed, environment, contender) run, interleaved; runs already in ``out`` are kept, not repeated."""
    results = read_jsonl(out)
    done = {(r["contender"], r["env_id"], r["seed"]) for r in results}
    if out is not None and not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"meta": machine_description()}) + "\n", encoding="utf-8")
    for index, (seed, env_id) in enumerate((seed, env_id) for seed in seeds for env_id in envs):
        shift = index % len(contenders)  # rotate who goes first, so no contender always runs on a cold machine
        for contender in contenders[shift:] + contenders[:shift]:
            if (contender, env_id, seed) in done:
                continue
            result = run(contender, env_id, seed)
            results.append(result)
            print(json.dumps(result), flush=True)
            if out is not None:
                with out.open("a", encoding="utf-8") as stream:
                    stream.write(json.dumps(result) + "\n")
    return results


def _summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    returns = [r["final_return_mean"] for r in rows]
    return {
        "mean": statistics.mean(returns),
        "std": statistics.pstdev(returns),
        "wall": sum(r["wall_time_s"] for r in rows),
        "train": sum(r["train_time_s"] for r in rows),
        "ev": statistics.mean(r["median_explained_variance"] for r in rows),
    }


def markdown_table(results: list[dict[str, Any]]) -> str:
    """Per environment and contender: returns per seed, mean +- std, total times and their ratios to sb3-contrib."""
    lines = [
        "| environment | contender | final return per seed | mean +- std | wall time (s) | wall ratio "
        "| train() time (s) | train() ratio | median explained variance | meets targets |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for env_id in dict.fromkeys(r["env_id"] for r in results):
        by_contender: dict[str, list[dict[str, Any]]] = {}
        for r in sorted((r for r in results if r["env_id"] == env_id), key=lambda r: r["seed"]):
            by_contender.setdefault(r["contender"], []).append(r)
        if REFERENCE not in by_contender:
            continue
        reference = _summary(by_contender[REFERENCE])
        seeds = [r["seed"] for r in by_contender[REFERENCE]]
        for contender, rows in by_contender.items():
            if [r["seed"] for r in rows] != seeds:
                continue  # incomplete: compare only over the same seeds
            summary = _summary(rows)
            wall_ratio, train_ratio = summary["wall"] / reference["wall"], summary["train"] / reference["train"]
            verdict = "reference"
            if contender != REFERENCE:
                fast = wall_ratio <= MAX_WALL_TIME_RATIO
                good = summary["mean"] >= reference["mean"] - RETURN_TOLERANCE_STDS * reference["std"]
                misses = [name for name, met in (("time", fast), ("return", good)) if not met]
                verdict = f"no ({', '.join(misses)})" if misses else "yes"
            per_seed = " / ".join(f"{r['final_return_mean']:.1f}" for r in rows)
            lines.append(
                f"| {env_id} | {contender} | {per_seed} | {summary['mean']:.1f} +- {summary['std']:.1f} | "
                f"{summary['wall']:.1f} | {wall_ratio:.2f} | {summary['train']:.1f} | {train_ratio:.2f} | "
                f"{summary['ev']:.3f} | {verdict} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--envs", default="CartPole-v1,Pendulum-v1")
    parser.add_argument("--contenders", default=",".join(DEFAULT_CONTENDERS), help=f"names among {list(CONTENDERS)}")
    parser.add_argument("--out", type=Path, help="JSON lines, appended run by run (and read back to resume)")
    parser.add_argument("--table", type=Path, help="only print the table of an existing results file")
    args = parser.parse_args()
    if args.table is not None:
        print(markdown_table(read_jsonl(args.table)))
        return
    torch.set_num_threads(1)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    results = run_all(seeds, args.envs.split(","), args.contenders.split(","), args.out)
    print(f"\n{markdown_table(results)}")


if __name__ == "__main__":
    main()
